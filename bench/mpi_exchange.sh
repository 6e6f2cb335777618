#!/usr/bin/env bash
# Expert parallelism's exchange on one machine: for N = 1..4 ranks (`mpirun -np N k3 generate`),
# the bytes on the wire per token, the round trip of one decode layer's job and products to a
# rank (measured by k3 at start, no compute: the exchange's cost a layer), rank 0's wait for the
# other ranks' products per token (what the exchange and their work added beyond its own), and
# the decode time per token; then a projection for Kimi K3 over 10, 25 and 100 Gb/s links.
# Not a test: figures depend on the machine and on what else runs on it.
# Usage: bench/mpi_exchange.sh [K3_BINARY] [SCRATCH_DIR] [PRESETS] [TOKENS] [RAM_GB]
#   PRESETS: synth presets, default "bench slice" (bench ~16 GB written; slice ~24 GB, written
#   --sparse: file holes that read as zeros, so its experts' products are zeros but every byte
#   of the exchange is the real size). RAM_GB: each rank's --ram-gb (the ranks share the host).
set -euo pipefail
k3=${1:-build/apps/k3}
scratch=${2:-/var/tmp}
presets=${3:-bench slice}
tokens=${4:-8}
ram=${5:-3}
command -v mpirun >/dev/null || { echo "mpirun not found (scripts/setup-deps.sh test)" >&2; exit 1; }
mpi=(mpirun --oversubscribe -np)
[ "$(id -u)" = 0 ] && mpi=(mpirun --oversubscribe --allow-run-as-root -np)
work=$(mktemp -d "$scratch/k3-mpi-exchange.XXXXXX")
trap 'rm -rf "$work"' EXIT

printf '| model | ranks | s/token | exchange KB/token | round trip us/layer | rank 0 waits ms/token |\n'
printf '|---|---|---|---|---|---|\n'
for preset in $presets; do
  sparse=()
  [ "$preset" = slice ] && sparse=(--sparse)
  "$k3" synth --preset "$preset" --out "$work/$preset" --quiet "${sparse[@]}"
  for n in 1 2 3 4; do
    args=(generate -m "$work/$preset" --ids 3,7,11,5 -n "$tokens" --ram-gb "$ram"
          --max-context 4096 --quiet --report-json "$work/r.json")
    if [ "$n" = 1 ]; then "$k3" "${args[@]}" >/dev/null; else
      "${mpi[@]}" "$n" "$k3" "${args[@]}" >/dev/null; fi
    /usr/bin/python3 - "$work/r.json" "$preset" "$n" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
decoded = max(1, r["tokens"])  # the report's totals are the decode steps'
ranks = r.get("ranks", [])
per_job = 1e6 * sum(x["ping_seconds"] for x in ranks) / len(ranks) if ranks else 0.0
print(f"| {sys.argv[2]} | {sys.argv[3]} | {r['seconds_per_token']:.3f} | "
      f"{r['exchange_bytes'] / decoded / 1e3:.1f} | {per_job:.0f} | "
      f"{1e3 * r['time']['exchange_wait_seconds'] / decoded:.2f} |")
PY
  done
  rm -rf "${work:?}/$preset"
done

# Kimi K3: 92 MoE layers, top-16 of 896 experts, 3,584-float (14,336-byte) latent rows. Per
# token and layer, rank 0 sends the token's row once to each other rank holding one of its 16
# experts and gets one product row back per such expert (the fixed-order sum needs each one).
/usr/bin/python3 - <<'PY'
layers, top, experts, row = 92, 16, 896, 3584 * 4
print("\nKimi K3 projection (decode, one token; bytes both ways; rtt = one round trip a layer)")
print("| ranks | KB/token | 10 Gb/s ms | 25 Gb/s ms | 100 Gb/s ms |")
print("|---|---|---|---|---|")
for n in (2, 3, 4, 8):
    away = top * (n - 1) / n                      # experts on other ranks
    hit = (n - 1) * (1 - (1 - 1 / n) ** top)      # other ranks holding at least one
    per_layer = (hit + away) * row + 8 * (3 + 3 * away)
    total = layers * per_layer
    ms = [1e3 * total * 8 / (g * 1e9) for g in (10, 25, 100)]
    print(f"| {n} | {total / 1e3:.0f} | " + " | ".join(f"{m:.2f} + 92 rtt" for m in ms) + " |")
PY
