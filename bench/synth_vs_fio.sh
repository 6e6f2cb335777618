#!/usr/bin/env bash
# Measures `k3 synth --preset bench` (~16 GB written) against fio's sequential write speed on
# the same file system, in one run, and prints both figures and their ratio.
# Usage: bench/synth_vs_fio.sh [K3_BINARY] [SCRATCH_DIR]   (needs ~17 GB free in SCRATCH_DIR)
set -euo pipefail
k3=${1:-build/apps/k3}
scratch=${2:-/var/tmp}
work=$(mktemp -d "$scratch/k3-synth-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT

# fio: 8 GiB sequential, O_DIRECT, 8 MiB blocks (the writer's block size), fsync at the end.
fio_json=$(fio --name=seqwrite --filename="$work/fio.tmp" --rw=write --bs=8M --size=8G \
  --direct=1 --ioengine=libaio --iodepth=4 --end_fsync=1 --output-format=json)
rm -f "$work/fio.tmp"
fio_bps=$(printf '%s' "$fio_json" | /usr/bin/python3 -c \
  'import json,sys; print(json.load(sys.stdin)["jobs"][0]["write"]["bw_bytes"])')

start=$(date +%s.%N)
"$k3" synth --preset bench --out "$work/bench" --quiet
end=$(date +%s.%N)
bytes=$(du -sb "$work/bench" | cut -f1)

/usr/bin/python3 - "$fio_bps" "$bytes" "$start" "$end" <<'PY'
import sys
fio, size, t0, t1 = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
synth = size / (t1 - t0)
print(f"fio sequential write (8 MiB, O_DIRECT, QD4): {fio / 1e9:.2f} GB/s")
print(f"k3 synth --preset bench: {size / 1e9:.2f} GB in {t1 - t0:.1f} s = {synth / 1e9:.2f} GB/s")
print(f"ratio: {100 * synth / fio:.0f} % of fio")
PY
