#!/usr/bin/env bash
# Kimi K3 at its own size, without the disk (docs/MEMORY.md, "Kimi K3 at full size"):
#   1. writes the release's layout as a sparse checkpoint (497,052 tensors of the language model
#      in 96 shards, data left as holes: 1.56 TB apparent, ~130 MB on disk), and the same as one
#      file, and times opening each (k3 inspect);
#   2. prints k3 inspect's per-preset plan and forecast at the disk rate k3 doctor measures here;
#   3. runs `k3 generate --ids 1,2,3 -n 3` at --preset ultra and at --ram-gb 8 and checks each
#      run's peak RSS against its budget plus the documented fixed overhead.
# Reads of holes return zeros at memory speed: the run times show the compute and memory traffic
# of real dimensions, not a disk; the forecast column is the disk's.
# Usage: bench/memory/full_size.sh WORKDIR [BUILD_DIR]     (WORKDIR: ~300 MB free; cleaned up)
set -euo pipefail

work=${1:?usage: bench/memory/full_size.sh WORKDIR [BUILD_DIR]}
build=${2:-build}
k3="$build/apps/k3"
python=/usr/bin/python3
overhead=$((64 << 20))  # docs/MEMORY.md: the fixed overhead on top of the budget
[[ -x "$k3" ]] || { echo "full_size: no $k3 (make build first)" >&2; exit 2; }
mkdir -p "$work"
sharded="$work/k3-full" single="$work/k3-full-one-file"
trap 'rm -rf "$sharded" "$single" "$work"/full-*.json "$work"/full-*.err' EXIT

seconds() {
  local t0 t1
  t0=$(date +%s%N)
  "$@" >/dev/null
  t1=$(date +%s%N)
  printf '%d.%03d' $(((t1 - t0) / 1000000000)) $((((t1 - t0) / 1000000) % 1000))
}

echo "== writing the sparse checkpoints"
echo "96 shards:  $(seconds "$k3" synth --preset full --sparse --out "$sharded" --quiet) s," \
     "$(du -sh "$sharded" | cut -f1) on disk, $(du -sh --apparent-size "$sharded" | cut -f1) apparent"
echo "one file:   $(seconds "$k3" synth --preset full --sparse --single-file --out "$single" --quiet) s"

echo "== opening (k3 inspect, which opens and checks every header; 3 runs each)"
for dir in "$sharded" "$single"; do
  for i in 1 2 3; do echo "$(basename "$dir"): $(seconds "$k3" inspect --model "$dir" --disk-gbps 1) s"; done
done

echo "== the disk rate (k3 doctor, on a temp file of the cache directory: a real disk)"
"$k3" doctor --out-json "$work/full-doctor.json" >/dev/null || true
rate=$("$python" -c "import json,sys; print(json.load(open(sys.argv[1])).get('read_bytes_per_second', 0) / 1e9)" "$work/full-doctor.json")
echo "disk rate: $rate GB/s"

echo "== k3 inspect at that rate"
"$k3" inspect --model "$sharded" --disk-gbps "$rate" | sed -n '/^preset/,$p'

echo "== k3 generate --ids 1,2,3 -n 3"
status=0
for setting in "--preset ultra" "--ram-gb 8"; do
  tag=$(echo "$setting" | tr -dc 'a-z0-9')
  # shellcheck disable=SC2086
  /usr/bin/time -f "%M" -o "$work/full-$tag.rss" "$k3" generate --model "$sharded" --ids 1,2,3 \
      -n 3 --ignore-eos $setting --report-json "$work/full-$tag.json" >/dev/null \
      2>"$work/full-$tag.err" || { echo "$setting: failed"; tail -3 "$work/full-$tag.err"; status=1; continue; }
  grep -a -A9 '^memory plan' "$work/full-$tag.err"
  "$python" - "$setting" "$work/full-$tag.json" "$(cat "$work/full-$tag.rss")" "$overhead" <<'PY' || status=1
import json, sys
setting, path, time_kb, overhead = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
r = json.load(open(path))
plan, pre = r["memory_plan"], r["prefill"]
budget, rss = plan["budget_bytes"], r["peak_rss_bytes"]
ok = rss <= budget + overhead
print(f"{setting}: budget {budget/1e9:.2f} GB (minimum {plan['minimum_bytes']/1e9:.2f} GB), "
      f"peak RSS {rss/1e9:.2f} GB (time -v {time_kb*1024/1e9:.2f} GB): "
      f"{'within' if ok else 'OVER'} budget + {overhead >> 20} MiB")
print(f"  time to first token {pre['seconds']:.1f} s (prompt of 3: reads {sum(pre['bytes_read'].values())/1e9:.1f} GB, "
      f"waits {pre['io_wait_seconds']:.1f} s, of it trunk {pre['trunk_wait_seconds']:.1f} s, expert compute "
      f"{pre['time']['expert_compute_seconds']:.1f} s); decode {r['seconds_per_token']:.1f} s/token "
      f"(reads {sum(r['bytes_read'].values())/1e9/max(1, len(r['generated_ids'])-1):.1f} GB/token, waits "
      f"{r['io_wait_seconds']:.1f} s of {r['seconds']:.1f} s, disk busy {r['disk_busy_fraction']:.0%})")
sys.exit(0 if ok else 1)
PY
done
exit $status
