#!/usr/bin/env bash
# Raw read bandwidth of k3's io layer against fio, side by side in one run: the same shard files,
# the same block size (one expert, rounded up to 4 KiB), the same queue depths, O_DIRECT, random
# offsets, the same number of bytes per measurement. Runs alternate (k3, fio, k3, fio, ...) so
# both see the same noise; medians of the repeats are compared.
#
# usage: bench/io/raw_vs_fio.sh MODEL_DIR [--queue-depth 1,4,16,32] [--repeat 3] [--reads 96]
# env:   K3=path/to/k3 (default: build/apps/k3 under the repository)
#        FIO_ENGINE=io_uring|libaio (default io_uring)
#        FIO_BUFFERS="--fixedbufs --registerfiles" (default for io_uring; empty for plain buffers)
#        K3_ARGS="..." extra flags for k3 bench (e.g. --nohuge-pages, --chunk-kib 1024)
set -euo pipefail

usage() {
  echo "usage: $0 MODEL_DIR [--queue-depth 1,4,16,32] [--repeat 3] [--reads 96]" >&2
  exit 2
}

[[ $# -ge 1 ]] || usage
model=$1
shift
depths=1,4,16,32
repeat=3
reads=96
while [[ $# -gt 0 ]]; do
  case $1 in
    --queue-depth) depths=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --reads) reads=$2; shift 2 ;;
    *) usage ;;
  esac
done

root=$(cd "$(dirname "$0")/../.." && pwd)
k3=${K3:-$root/build/apps/k3}
engine=${FIO_ENGINE:-io_uring}
# k3 reads into registered buffers; so does fio, or it pins the pages of every 17.5 MB buffer
# per read and measures that rather than the disk (FIO_BUFFERS= to see the difference).
fio_buffers=${FIO_BUFFERS---fixedbufs --registerfiles}
[[ $engine == io_uring ]] || fio_buffers=${FIO_BUFFERS-}
command -v fio >/dev/null || { echo "$0: fio is not installed (apt-get install fio)" >&2; exit 1; }
[[ -x $k3 ]] || { echo "$0: no k3 binary at $k3 (set K3=...)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The expert size and the shard files that hold experts, as k3 sees them.
"$k3" bench --raw --nofio --quiet --model "$model" --queue-depth 1 --repeat 1 --reads 1 \
  --out-json "$work/meta.json" >/dev/null
read -r expert_bytes files < <(python3 - "$work/meta.json" <<'EOF'
import json, sys
v = json.load(open(sys.argv[1]))["volumes"][0]
print(v["expert_bytes"], ":".join(f.replace(":", "\\:") for f in v["expert_files"]))
EOF
)
bs=$(( (expert_bytes + 4095) / 4096 * 4096 ))
io_size=$(( bs * reads ))

echo "model $model: expert $expert_bytes bytes, fio block $bs, $reads reads per run," \
  "$repeat runs per depth, fio ioengine=$engine" >&2
for qd in ${depths//,/ }; do
  for ((run = 1; run <= repeat; run++)); do
    # shellcheck disable=SC2086
    "$k3" bench --raw --nofio --quiet --model "$model" --queue-depth "$qd" --repeat 1 \
      --reads "$reads" --out-json "$work/k3-$qd-$run.json" ${K3_ARGS:-} >/dev/null
    # shellcheck disable=SC2086  # $fio_buffers is a list of flags
    fio --name=raw --filename="$files" --ioengine="$engine" --direct=1 --rw=randread \
      --bs="$bs" --iodepth="$qd" --io_size="$io_size" --randrepeat=0 --norandommap \
      $fio_buffers --output-format=json >"$work/fio-$qd-$run.json"
    echo "qd $qd run $run done" >&2
  done
done

python3 - "$work" "$depths" "$repeat" <<'EOF'
import json, statistics, sys
work, depths, repeat = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
print("| queue depth | k3 GB/s (median of %d) | fio GB/s (median of %d) | k3/fio |" % (repeat, repeat))
print("|---|---|---|---|")
for qd in depths:
    k3 = [json.load(open(f"{work}/k3-{qd}-{r}.json"))["results"][0]["gbps_median"]
          for r in range(1, repeat + 1)]
    fio = [json.load(open(f"{work}/fio-{qd}-{r}.json"))["jobs"][0]["read"]["bw_bytes"] / 1e9
           for r in range(1, repeat + 1)]
    k, f = statistics.median(k3), statistics.median(fio)
    print(f"| {qd} | {k:.2f} | {f:.2f} | {k / f:.2f} |")
EOF
