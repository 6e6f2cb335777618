#!/bin/sh
# Where the trunk streams: a verbatim trunk pack against a compressed one (`k3 pack --codec
# bf16-e3`) at several memory budgets (docs/PERFORMANCE.md, "Compressed trunk", has the table
# this prints).
#
# For each memory setting given, REPEAT rounds; in each round `k3 bench` runs once from each
# pack, alternating (the machine's speed drifts; the ratio is taken within a round), each a fresh
# process reading with O_DIRECT: a 16-token prompt, N greedy decode steps, then the decode steps'
# reads replayed alone (io/read_replay.h). That replay is the run's own I/O floor: the same
# requests from the same files, right after the run, so it sees the rate the volume gave those
# files at that time. (A virtual disk may serve one file from its host's cache and another from
# the device: two packs' replays can differ by more than their bytes, docs/PERFORMANCE.md.) As
# in `k3 bench` (docs/BENCHMARKS.md), a row's floor is its fastest replay and "x floor" is its
# median s/token over that floor; in brackets, each round's run over its own replay (a shared
# disk's rate drifts between rounds, so these can sit below or above the row's figure).
#
# Usage: bench/pipeline/trunk_bound.sh MODEL_DIR RAW_PACK_DIR CODEC_PACK_DIR "MEMORY FLAGS" ...
#   env: BUILD (build), REPEAT (3), N (6)
#   The memory flags may add --storage-profile (an emulated volume: its replay is emulated too).
# Example: bench/pipeline/trunk_bound.sh /var/tmp/slice /var/tmp/raw /var/tmp/e3 \
#            "--preset ultra" "--trunk-gb 2.6 --cache-gb 1" "--trunk-gb 9 --cache-gb 2.5"
set -eu
MODEL=$1 RAW=$2 CODEC=$3
shift 3
BUILD=${BUILD:-build}
REPEAT=${REPEAT:-3}
N=${N:-6}
K3="$BUILD/apps/k3"
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

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
      "$K3" bench --model "$MODEL" --trunk "$dir" $memory --queue-depth 32 --prefetch-distance 0 \
        --tokens "$N" --repeat 1 --quiet --out-json "$OUT/$i.$pack.$round.json" > /dev/null
    done
  done
done
/usr/bin/python3 - "$OUT" "$REPEAT" "$#" <<'PY'
import json, statistics, sys
out, repeat, settings = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def load(i, p, r):
    x = json.load(open(f"{out}/{i}.{p}.{r}.json"))
    row = x["results"][0]
    return row, row["runs"][0]
def per_token(run, value):
    return value / run["decode"]["tokens"]
def floor_per_token(run):
    return per_token(run, run["io_floor"]["seconds"])
def listed(values):
    return ", ".join(f"{v:.2f}" for v in values)
def gb_per_token(run, kind):
    d = run["decode"]
    return per_token(run, sum(v for k, v in d["bytes_read"].items() if k.startswith(kind)) / 1e9)
print("| memory | pack | s/token | x raw | GB/token | trunk GB | experts GB | floor s/token |"
      " floor GB/s | x floor | decode s/token | decoded in the products | stall s/token |"
      " disk busy | probe GB/s |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for i in range(1, settings + 1):
    memory = open(f"{out}/memory{i}").read().strip()
    runs = {p: [load(i, p, r) for r in range(1, repeat + 1)] for p in ("raw", "codec")}
    # The same tokens from both packs, round by round.
    for r in range(repeat):
        a, b = runs["raw"][r][1]["ids"], runs["codec"][r][1]["ids"]
        assert a == b, f"{memory}: round {r + 1}: the packs decoded different tokens: {a} {b}"
    ratios = [c["seconds_per_token"] / w["seconds_per_token"]
              for (_, w), (_, c) in zip(runs["raw"], runs["codec"])]
    for p in ("raw", "codec"):
        def m(f): return statistics.median(f(run) for _, run in runs[p])
        fused = lambda d: 100 * d["fused"] / max(1, d["fused"] + d["whole"])
        spt = m(lambda x: x["seconds_per_token"])
        trunk = m(lambda x: gb_per_token(x, "trunk"))
        experts = m(lambda x: gb_per_token(x, "expert"))
        floor = min(floor_per_token(x) for _, x in runs[p])
        floor_gbs = max(x["io_floor"]["bytes"] / 1e9 / x["io_floor"]["seconds"]
                        for _, x in runs[p])
        probe = statistics.median(row["raw_gbps"] for row, _ in runs[p])
        own = listed(x["seconds_per_token"] / floor_per_token(x) for _, x in runs[p])
        ratio = "1" if p == "raw" else f"{statistics.median(ratios):.2f} ({listed(ratios)})"
        print(f"| `{memory}` | {p} | {spt:.3f} | {ratio} | {trunk + experts:.2f} | {trunk:.2f} | "
              f"{experts:.2f} | {floor:.3f} | {floor_gbs:.2f} | {spt / floor:.2f} ({own}) | "
              f"{m(lambda x: per_token(x, x['decode']['trunk_decode_seconds'])):.3f} | "
              f"{m(lambda x: fused(x['decode']['trunk_pieces_decoded'])):.0f}% | "
              f"{m(lambda x: per_token(x, x['decode']['io_wait_seconds'])):.3f} | "
              f"{m(lambda x: x['decode']['disk_busy_fraction']):.2f} | {probe:.2f} |")
PY
