#!/bin/sh
# k3 serve under concurrent clients: CLIENTS streaming completions sent at once through the
# OpenAI Node SDK (tests/apps/serve_client.cjs), against a server with --batch 1 (one sequence
# at a time, the others queued) and --batch CLIENTS (all in one batch), the two alternating
# within each of REPEAT rounds. Prints the wall time of each round and the ratio.
#
# Usage: bench/server/concurrent_clients.sh MODEL_DIR ["MEMORY FLAGS"]
#   env: BUILD (build), REPEAT (3), CLIENTS (8), N (32 tokens per client)
set -eu
MODEL=$1
MEMORY=${2:-}
BUILD=${BUILD:-build}
REPEAT=${REPEAT:-3}
CLIENTS=${CLIENTS:-8}
N=${N:-32}
K3="$BUILD/apps/k3"
ORACLE="$BUILD/oracle"
CLIENT="$(dirname "$0")/../../tests/apps/serve_client.cjs"
OUT=$(mktemp -d)
PID=
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
  rm -rf "$OUT"
}
trap cleanup EXIT
/usr/bin/python3 - "$CLIENTS" "$N" > "$OUT/requests.json" <<'PY'
import json, sys
clients, n = int(sys.argv[1]), int(sys.argv[2])
print(json.dumps([{"endpoint": "completions",
                   "params": {"model": "m", "prompt": [(c * 131 + i * 7919) % 4000 + 5 for i in range(8)],
                              "max_tokens": n, "temperature": 0, "stream": True}}
                  for c in range(clients)]))
PY
# Starts the server with --batch $1; sets PID and URL.
start() {
  # shellcheck disable=SC2086
  "$K3" serve --model "$MODEL" $MEMORY --batch "$1" --max-queue "$CLIENTS" --port 0 --quiet \
    2> "$OUT/serve.err" &
  PID=$!
  for _ in $(seq 600); do
    URL=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$OUT/serve.err")
    [ -n "$URL" ] && return 0
    sleep 0.1
  done
  echo "k3 serve did not start: $(cat "$OUT/serve.err")" >&2
  exit 1
}
stop() {
  kill "$PID"
  wait "$PID" || true
  PID=
}
printf '| round | --batch 1: s | --batch %s: s | ratio |\n|---|---|---|---|\n' "$CLIENTS"
for r in $(seq "$REPEAT"); do
  line="| $r"
  for b in 1 "$CLIENTS"; do
    start "$b"
    t0=$(date +%s.%N)
    node "$CLIENT" "$ORACLE" "$URL/v1" "$OUT/requests.json" "$OUT/out.json"
    t1=$(date +%s.%N)
    stop
    /usr/bin/python3 -c "import json,sys; r=json.load(open(sys.argv[1])); assert all(x['ok'] and x['done'] for x in r), r" "$OUT/out.json"
    s=$(/usr/bin/python3 -c "print($t1 - $t0)")
    line="$line | $(printf %.2f "$s")"
    eval "t_$b=$s"
  done
  eval "one=\$t_1; many=\$t_$CLIENTS"
  echo "$line | $(/usr/bin/python3 -c "print(f'{$one / $many:.2f}')") |"
done
