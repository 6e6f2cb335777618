#!/bin/sh
# Soak: 500 decode tokens on the demo model at the minimum budget (every token streams trunk
# and experts), once clean and once with 1 % of reads failing transiently (K3_FAULTS). The two
# runs must give the same tokens, resident memory must stay flat after warm-up, and a permanent
# fault must end the run with an error naming the file and offset (exit 1).
# Usage: scripts/soak.sh [BUILD_DIR]   (default build)
set -eu
BUILD=${1:-build}
K3="$BUILD/apps/k3"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$K3" synth --preset demo --router-skew 1 --out "$WORK/m" --quiet
run() {
  "$K3" generate -m "$WORK/m" --ids 5,17,300,42,7,99 -n 501 --preset ultra --ignore-eos \
    --quiet --report-json "$1" > /dev/null
}
run "$WORK/clean.json"
K3_FAULTS=random=0.01,seed=7 run "$WORK/faulty.json"
/usr/bin/python3 - "$WORK/clean.json" "$WORK/faulty.json" <<'PY'
import json, sys
clean, faulty = (json.load(open(p)) for p in sys.argv[1:3])
same = clean["generated_ids"] == faulty["generated_ids"]
rss = [t["rss_bytes"] for t in faulty["per_token"]]
warm = rss[50]
growth = max(rss[50:]) - warm
print(f"tokens: {len(faulty['generated_ids'])}, identical to the clean run: {same}")
print(f"RSS after warm-up (token 50): {warm / 1e6:.1f} MB, largest later growth: {growth / 1e6:.2f} MB, "
      f"final {rss[-1] / 1e6:.1f} MB, peak {faulty['peak_rss_bytes'] / 1e6:.1f} MB")
sys.exit(0 if same and growth < 4e6 else 1)
PY
# A permanent bad sector inside the first expert of layer 1.
OFFSET=$("$K3" inspect -m "$WORK/m" --json 2>/dev/null | /usr/bin/python3 -c \
  'import json,sys; print(json.load(sys.stdin)["first_expert_offset"])' 2>/dev/null || echo "")
if [ -z "$OFFSET" ]; then OFFSET=4200000; fi
set +e
K3_FAULTS="eio-offset=$OFFSET" "$K3" generate -m "$WORK/m" --ids 5,17,300 -n 50 --preset ultra \
  --quiet > /dev/null 2> "$WORK/err"
CODE=$?
set -e
echo "permanent fault at byte $OFFSET: exit $CODE: $(tail -n 1 "$WORK/err")"
[ "$CODE" -eq 1 ] && grep -q "offset" "$WORK/err"
