#!/bin/sh
# Where the trunk streams: a verbatim trunk pack against a compressed one (`k3 pack --codec
# bf16-e3`) at several memory budgets (docs/PERFORMANCE.md, "Compressed trunk", has the table
# this prints).
#
# For each memory setting given, REPEAT rounds; in each round `k3 generate` runs once from each
# pack, alternating (the machine's speed drifts; the ratio is taken within a round), each a fresh
# process reading with O_DIRECT: 8 prompt tokens, N decode tokens, --ignore-eos. The raw read
# bandwidth of the same binary is measured before and after (`k3 bench --raw`, 4 MiB reads at
# queue depth 32); the engine's own runs may sustain more than that short probe, so the
# bandwidth of a run's I/O floor (its bytes read per token over it) is the higher of the probe
# and the best any disk-bound run of the table sustained (GB/token over s/token, disk busy
# >= 95 %), unless FLOOR_GBS gives it (for an emulated --storage-profile, whose bandwidth the
# probe does not see).
#
# Usage: bench/pipeline/trunk_bound.sh MODEL_DIR RAW_PACK_DIR CODEC_PACK_DIR "MEMORY FLAGS" ...
#   env: BUILD (build), REPEAT (3), N (6), FLOOR_GBS (measured)
# Example: bench/pipeline/trunk_bound.sh /var/tmp/slice /var/tmp/raw /var/tmp/e3 \
#            "--ram-gb 4.6" "--trunk-gb 4 --cache-gb 1" "--trunk-gb 9 --cache-gb 2.5"
set -eu
MODEL=$1 RAW=$2 CODEC=$3
shift 3
BUILD=${BUILD:-build}
REPEAT=${REPEAT:-3}
N=${N:-6}
K3="$BUILD/apps/k3"
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
IDS=$(/usr/bin/python3 -c "print(','.join(str((i*7919)%4000+5) for i in range(8)))")

raw() { "$K3" bench --raw --model "$MODEL" --queue-depth 32 --reads 96 --repeat 3 --quiet \
          --out-json "$OUT/raw$1.json" > /dev/null; }
raw 1
i=0
for memory in "$@"; do
  i=$((i + 1))
  echo "$memory" > "$OUT/memory$i"
  for round in $(seq 1 "$REPEAT"); do
    for pack in raw codec; do
      dir=$RAW
      [ "$pack" = codec ] && dir=$CODEC
      echo "$memory: round $round, $pack pack" >&2
      # shellcheck disable=SC2086  # the memory flags are words
      "$K3" generate --model "$MODEL" --trunk "$dir" --ids "$IDS" -n "$N" --ignore-eos $memory \
        --quiet --report-json "$OUT/$i.$pack.$round.json" > "$OUT/$i.$pack.$round.txt"
    done
  done
done
raw 2
/usr/bin/python3 - "$OUT" "$REPEAT" "$#" "${FLOOR_GBS:-0}" <<'PY'
import json, statistics, sys
out, repeat, settings, floor_gbs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
def raw_gbs(i):
    return json.load(open(f"{out}/raw{i}.json"))["results"][0]["gbps_median"]
def load(i, p, r):
    return json.load(open(f"{out}/{i}.{p}.{r}.json"))
def steps(x):  # decode steps: every token after the prompt's
    return max(1, len(x["per_token"]) - 1)
def gb_per_token(x, kind=""):
    return sum(v for k, v in x["bytes_read"].items() if k.startswith(kind)) / steps(x) / 1e9
probe = statistics.median([raw_gbs(1), raw_gbs(2)])
sustained = max([gb_per_token(x) / x["seconds_per_token"]
                 for i in range(1, settings + 1) for p in ("raw", "codec")
                 for x in [load(i, p, r) for r in range(1, repeat + 1)]
                 if x["disk_busy_fraction"] >= 0.95] + [0])
bw = floor_gbs if floor_gbs > 0 else max(probe, sustained)
print(f"raw read bandwidth: {raw_gbs(1):.2f} GB/s before, {raw_gbs(2):.2f} GB/s after; "
      f"best sustained by a disk-bound run {sustained:.2f}; the floor uses {bw:.2f}")
print()
print("| memory | pack | s/token | x raw | GB/token | trunk GB | experts GB | x I/O floor |"
      " decode s/token | decoded in the products | stall s/token | disk busy |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for i in range(1, settings + 1):
    memory = open(f"{out}/memory{i}").read().strip()
    runs = {p: [load(i, p, r) for r in range(1, repeat + 1)] for p in ("raw", "codec")}
    # The generated tokens are the same from both packs, round by round.
    for r in range(repeat):
        a = open(f"{out}/{i}.raw.{r + 1}.txt").read()
        b = open(f"{out}/{i}.codec.{r + 1}.txt").read()
        assert a == b, f"{memory}: round {r + 1}: the packs generated different text"
    ratios = [c["seconds_per_token"] / w["seconds_per_token"]
              for w, c in zip(runs["raw"], runs["codec"])]
    for p in ("raw", "codec"):
        def m(f): return statistics.median(f(x) for x in runs[p])
        fused = lambda d: 100 * d["fused"] / max(1, d["fused"] + d["whole"])
        spt = m(lambda x: x["seconds_per_token"])
        trunk = m(lambda x: gb_per_token(x, "trunk"))
        experts = m(lambda x: gb_per_token(x, "expert"))
        gb = trunk + experts
        ratio = "1" if p == "raw" else f"{statistics.median(ratios):.2f} ({', '.join(f'{q:.2f}' for q in ratios)})"
        print(f"| `{memory}` | {p} | {spt:.3f} | {ratio} | {gb:.2f} | {trunk:.2f} | {experts:.2f} | "
              f"{spt / (gb / bw) if gb > 0 else 0:.2f} | "
              f"{m(lambda x: x['trunk_decode_seconds'] / steps(x)):.3f} | "
              f"{m(lambda x: fused(x['trunk_pieces_decoded'])):.0f}% | "
              f"{m(lambda x: x['io_wait_seconds'] / steps(x)):.3f} | "
              f"{m(lambda x: x['disk_busy_fraction']):.2f} |")
PY
