#!/bin/sh
# What a client of GET /k3/events costs the engine: one k3 serve, the same request of N decode
# tokens run without and with a `curl -N /k3/events` client attached, the two alternating in
# each of REPEAT rounds (the order swapped every round). Per run: the engine's seconds per step
# (from /metrics: k3_step_seconds_total over k3_steps_total, the step alone) and the request's
# wall time per token (the step and what the engine thread does between steps, where the
# figures are gathered and published). Prints a row per round, the ratios with/without of the
# sums and the median of the rounds' ratios (on a machine busy with other work, the median is
# the figure to read).
#
# Usage: bench/server/events_overhead.sh MODEL_DIR ["MEMORY FLAGS"]
#   env: BUILD (build), REPEAT (5), N (128 tokens a request)
# Example: bench/server/events_overhead.sh k3-demo "--trunk-gb 0.1 --cache-gb 0.03"
set -eu
MODEL=$1
MEMORY=${2:-}
BUILD=${BUILD:-build}
REPEAT=${REPEAT:-5}
N=${N:-128}
K3="$BUILD/apps/k3"
OUT=$(mktemp -d)
PID=
LISTENER=
cleanup() {
  [ -n "$LISTENER" ] && kill "$LISTENER" 2> /dev/null
  [ -n "$PID" ] && kill "$PID" 2> /dev/null && wait "$PID" 2> /dev/null
  rm -rf "$OUT"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# shellcheck disable=SC2086  # the memory flags are words
"$K3" serve --model "$MODEL" $MEMORY --batch 1 --saved-states 0 --prompt-cache none --port 0 \
  --quiet 2> "$OUT/serve.err" &
PID=$!
URL=
for _ in $(seq 600); do
  URL=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$OUT/serve.err")
  [ -n "$URL" ] && break
  sleep 0.1
done
[ -n "$URL" ] || { echo "k3 serve did not start: $(cat "$OUT/serve.err")" >&2; exit 1; }

BODY="{\"model\": \"m\", \"prompt\": [5, 6, 7, 8, 9, 10, 11, 12], \"max_tokens\": $N,
       \"temperature\": 0, \"ignore_eos\": true}"
metric() { curl -s "$URL/metrics" | sed -n "s/^$1 //p"; }
# One request; prints "STEPS STEP_SECONDS_BEFORE STEP_SECONDS_AFTER WALL_SECONDS".
run() {
  steps0=$(metric k3_steps_total)
  secs0=$(metric k3_step_seconds_total)
  wall=$(curl -s -o /dev/null -w '%{time_total}' -H 'Content-Type: application/json' \
    --data "$BODY" "$URL/v1/completions")
  echo "$(($(metric k3_steps_total) - steps0)) $secs0 $(metric k3_step_seconds_total) $wall"
}
# Runs the request with (1) or without (0) an events client; appends to $OUT/runs.
measure() {
  if [ "$1" = 1 ]; then
    curl -s -N "$URL/k3/events" > "$OUT/events.txt" &
    LISTENER=$!
    sleep 0.5  # connected
  fi
  figures=$(run)
  events=0
  if [ "$1" = 1 ]; then
    kill "$LISTENER"
    wait "$LISTENER" 2> /dev/null || true
    LISTENER=
    events=$(grep -c '^event: step' "$OUT/events.txt" || true)
  fi
  echo "$2 $1 $figures $events" >> "$OUT/runs"
}

run > /dev/null  # warm: the trunk and the cache as every measured run finds them
for r in $(seq "$REPEAT"); do
  if [ $((r % 2)) = 1 ]; then order="0 1"; else order="1 0"; fi
  for with in $order; do measure "$with" "$r"; done
done

/usr/bin/python3 - "$OUT/runs" "$N" <<'PY'
import sys
runs = [l.split() for l in open(sys.argv[1])]
n = int(sys.argv[2])
by = {}
for r, with_, steps, s0, s1, wall, events in runs:
    by.setdefault(int(r), {})[int(with_)] = (int(steps), float(s1) - float(s0), float(wall), int(events))
print("| round | without: ms/step | with: ms/step | ratio | without: ms/token (wall) | "
      "with: ms/token (wall) | ratio | step events received |")
print("|---|---|---|---|---|---|---|---|")
tot = {0: [0, 0.0, 0.0], 1: [0, 0.0, 0.0]}
for r in sorted(by):
    row = by[r]
    for w in (0, 1):
        tot[w][0] += row[w][0]; tot[w][1] += row[w][1]; tot[w][2] += row[w][2]
    step = {w: 1e3 * row[w][1] / row[w][0] for w in (0, 1)}
    tok = {w: 1e3 * row[w][2] / n for w in (0, 1)}
    print(f"| {r} | {step[0]:.3f} | {step[1]:.3f} | {step[1] / step[0]:.3f} | "
          f"{tok[0]:.3f} | {tok[1]:.3f} | {tok[1] / tok[0]:.3f} | {row[1][3]} |")
ratios = sorted((by[r][1][1] / by[r][1][0]) / (by[r][0][1] / by[r][0][0]) for r in by)
step = {w: tot[w][1] / tot[w][0] for w in (0, 1)}
wall = {w: tot[w][2] for w in (0, 1)}
print(f"| all | {1e3 * step[0]:.3f} | {1e3 * step[1]:.3f} | {step[1] / step[0]:.3f} | "
      f"{1e3 * wall[0] / (n * len(by)):.3f} | {1e3 * wall[1] / (n * len(by)):.3f} | "
      f"{wall[1] / wall[0]:.3f} | |")
print(f"median of the rounds' ratios, ms/step with/without: {ratios[len(ratios) // 2]:.3f}")
PY
