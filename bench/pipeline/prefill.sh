#!/bin/sh
# Long prompts: time to first token, GB read and stall of a prompt, --prefill-chunk 64 against
# auto (whole prompts per layer pass), cold and from a warm --prompt-cache (docs/PERFORMANCE.md,
# "Long prompts", has the table this prints).
#
# For each prompt length, each of REPEAT rounds runs, alternating, one fresh process each:
#   chunk64  --prefill-chunk 64, no prompt cache
#   auto     --prefill-chunk auto (the default), no prompt cache
#   cache    auto with a new, empty prompt cache: cold, and it stores the state a token short of
#            the prompt's end (the prompt runs as two chunks, so the trunk is read once more)
#   warm     the same again over that cache: one token runs
# and prints one row per run from its --report-json; then the medians per length and mode, and
# the ratio of GB read to the floor (the streamed trunk once, as a one-token step reads it, plus
# each (layer, expert) the prompt touches once, as auto's one chunk asks for them).
#
# Usage: bench/pipeline/prefill.sh MODEL_DIR "MEMORY FLAGS"
#   env: BUILD (build), REPEAT (3), LENGTHS ("16 256 2048"), MODES ("chunk64 auto cache warm"),
#        IDS_BELOW (30000: the prompt's ids, below the model's vocabulary and its special tokens)
# Example: bench/pipeline/prefill.sh /var/tmp/slice "--ram-gb 4.6"
set -eu
MODEL=$1
MEMORY=$2
BUILD=${BUILD:-build}
REPEAT=${REPEAT:-3}
LENGTHS=${LENGTHS:-16 256 2048}
MODES=${MODES:-chunk64 auto cache warm}
IDS_BELOW=${IDS_BELOW:-30000}
K3="$BUILD/apps/k3"
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

for n in $LENGTHS; do
  # The same ids every run: spread over the vocabulary's lower part, never a special token.
  ids=$(/usr/bin/python3 -c "print(','.join(str((i * 7919) % ($IDS_BELOW - 5) + 5) for i in range($n)))")
  for round in $(seq 1 "$REPEAT"); do
    rm -rf "$OUT/cache"
    for mode in $MODES; do
      case $mode in
        chunk64) flags="--prefill-chunk 64" ;;
        auto) flags="" ;;
        cache | warm) flags="--prompt-cache $OUT/cache" ;;
      esac
      # shellcheck disable=SC2086  # the memory flags are words
      "$K3" generate --model "$MODEL" --ids "$ids" -n 2 $MEMORY $flags --quiet \
        --report-json "$OUT/r-$n-$mode-$round.json" > /dev/null
    done
  done
done
/usr/bin/python3 - "$OUT" "$MEMORY" "$REPEAT" "$LENGTHS" "$MODES" <<'PY'
import json, statistics, sys
out, memory, repeat, lengths, modes = sys.argv[1], sys.argv[2], int(sys.argv[3]), \
    sys.argv[4].split(), sys.argv[5].split()
def row(n, mode, rnd):
    r = json.load(open(f"{out}/r-{n}-{mode}-{rnd}.json"))
    p = r["prefill"]
    b = p["bytes_read"]
    gb = sum(b.values()) / 1e9
    stall = p["io_wait_seconds"] + p["trunk_wait_seconds"]
    ttft = r["time_to_first_token_seconds"]
    return {"ttft": ttft, "gb": gb, "trunk": b["trunk"] / 1e9, "stall": stall,
            "stall_pct": 100 * stall / ttft if ttft else 0, "rss": r["peak_rss_bytes"] / 1e9,
            "budget": r["memory_plan"]["budget_bytes"] / 1e9,
            "chunk": r["settings"]["prefill_chunk"], "requests": p["cache"]["requests"],
            "expert_gb": (b["expert_demand"] + b["expert_prefetch_used"]) / 1e9,
            "experts": p.get("experts_demand_read", 0),
            "cached": r.get("prompt_cache", {}).get("cached_tokens", 0),
            "decode_trunk": r["bytes_read"]["trunk"] / 1e9}
print(f"memory: {memory}")
print("| prompt | mode | round | chunk | TTFT s | GB read | trunk GB | stall s | stall % "
      "| peak RSS GB | budget GB | cached |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
rows = {}
for n in lengths:
    for rnd in range(1, repeat + 1):
        for mode in modes:
            x = row(n, mode, rnd)
            rows.setdefault((n, mode), []).append(x)
            print(f"| {n} | {mode} | {rnd} | {x['chunk']} | {x['ttft']:.2f} | {x['gb']:.2f} | "
                  f"{x['trunk']:.2f} | {x['stall']:.2f} | {x['stall_pct']:.1f} | {x['rss']:.2f} | "
                  f"{x['budget']:.2f} | {x['cached']} |")
print()
print("medians of the rounds; floor = one pass of the streamed trunk + each touched expert once")
print("| prompt | mode | TTFT s | x chunk64 | GB read | / floor | stall % |")
print("|---|---|---|---|---|---|---|")
for n in lengths:
    med = {m: {k: statistics.median(x[k] for x in rows[(n, m)]) for k in ("ttft", "gb", "stall_pct")}
           for m in modes}
    floor = None
    if "auto" in modes:
        a = rows[(n, "auto")][0]
        # the decode step (one token) read the streamed trunk once; auto's chunk asked for each
        # touched (layer, expert) once, at the bytes of one expert
        per_expert = a["expert_gb"] / max(1, a["requests"]) if a["requests"] else 0
        floor = a["decode_trunk"] + a["requests"] * per_expert
    for m in modes:
        ratio = med[m]["ttft"] / med["chunk64"]["ttft"] if "chunk64" in med else 0
        f = f"{med[m]['gb'] / floor:.2f}" if floor else "-"
        print(f"| {n} | {m} | {med[m]['ttft']:.2f} | {ratio:.3f} | {med[m]['gb']:.2f} | {f} | "
              f"{med[m]['stall_pct']:.1f} |")
PY
