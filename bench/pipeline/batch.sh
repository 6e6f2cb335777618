#!/bin/sh
# Batched generation: aggregate throughput and bytes read per emitted token against the batch
# size (docs/PERFORMANCE.md, "Batched generation", has the table this prints).
#
# For each memory setting given, runs `k3 generate --prompts` on the same PROMPTS prompts
# (8 prompt tokens each, N tokens generated each, --ignore-eos) at --batch 1, 2, 4 and 8, the
# batch sizes alternating within each of REPEAT rounds (the machine's speed drifts; the ratios
# against --batch 1 are taken within a round). Each run is a fresh process (cold: O_DIRECT).
#
# Usage: bench/pipeline/batch.sh MODEL_DIR "MEMORY FLAGS" ["MEMORY FLAGS" ...]
#   env: BUILD (build), REPEAT (2), PROMPTS (8), N (6), BATCHES ("1 2 4 8")
# Example: bench/pipeline/batch.sh /var/tmp/slice "--ram-gb 4.6" "--trunk-gb 9 --cache-gb 2"
set -eu
MODEL=$1
shift
BUILD=${BUILD:-build}
REPEAT=${REPEAT:-2}
PROMPTS=${PROMPTS:-8}
N=${N:-6}
BATCHES=${BATCHES:-1 2 4 8}
K3="$BUILD/apps/k3"
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
/usr/bin/python3 - "$PROMPTS" "$N" > "$OUT/prompts.jsonl" <<'PY'
import json, sys
prompts, n = int(sys.argv[1]), int(sys.argv[2])
for p in range(prompts):
    print(json.dumps({"id": p, "ids": [(p * 131 + i * 7919) % 4000 + 5 for i in range(8)],
                      "n_predict": n}))
PY

printf '%-28s %5s %6s %9s %9s %8s %10s %10s %8s %8s %7s\n' memory batch round "tokens/s" "x B=1" \
  "s/token" "GB/token" "trunk GB" "experts" "busy" "union"
for memory in "$@"; do
  for round in $(seq 1 "$REPEAT"); do
    for b in $BATCHES; do
      # shellcheck disable=SC2086  # the memory flags are words
      "$K3" generate --model "$MODEL" --prompts "$OUT/prompts.jsonl" --batch "$b" --ignore-eos \
        $memory --quiet --report-json "$OUT/r-$b.json" > /dev/null
    done
    /usr/bin/python3 - "$OUT" "$memory" "$round" $BATCHES <<'PY'
import json, statistics, sys
out, memory, rnd, batches = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
base = None
for b in batches:
    r = json.load(open(f"{out}/r-{b}.json"))
    m, tokens = r["metrics"], max(1, r["sampled_tokens"])
    bytes_read = m["bytes_read"]
    experts = sum(v for k, v in bytes_read.items() if k.startswith("expert")) / tokens / 1e9
    trunk = bytes_read["trunk"] / tokens / 1e9
    tps = r["tokens_per_second"]
    base = base or tps
    per_seq = statistics.median(r["seconds_per_token_per_sequence"] or [0])
    busy = m["disk_busy_fraction"]
    print(f"{memory:<28} {b:>5} {rnd:>6} {tps:9.3f} {tps / base:9.2f} {per_seq:8.3f} "
          f"{experts + trunk:10.3f} {trunk:10.3f} {experts:8.3f} {busy:8.2f} "
          f"{r['experts_per_layer_step']:7.1f}")
PY
  done
done
