#!/bin/sh
# Does the volume keep its rate while the cores compute? `k3 bench` runs once with the cores idle
# and once with every core spinning in a busy loop, alternating, REPEAT rounds. A run's I/O floor
# (docs/BENCHMARKS.md) is replayed with the cores idle, so where the loaded figure falls well
# below the idle one, no run that computes while it reads can reach that floor: the volume (a
# virtual disk whose host copies the data on the cores the guest computes on, for instance)
# slows down, not the engine (docs/PERFORMANCE.md, "The disk under load").
#
# Usage: bench/io/under_load.sh K3_BENCH_FLAGS...
#   env: BUILD (build), REPEAT (3), BUSY (the number of busy loops: nproc)
# With --raw it compares the probe's GB/s; with a model it compares the replay of the run's
# reads (the floor) and s/token.
# Examples: bench/io/under_load.sh --raw --model SLICE --queue-depth 32 --reads 192 --nofio
#           bench/io/under_load.sh --model SLICE --trunk E3 --preset ultra --tokens 6 \
#             --storage-profile bw=5000MB/s
set -eu
BUILD=${BUILD:-build}
REPEAT=${REPEAT:-3}
BUSY=${BUSY:-$(nproc)}
K3="$BUILD/apps/k3"
OUT=$(mktemp -d)
PIDS=""
stop_busy() {
  # shellcheck disable=SC2086  # a list of process ids
  [ -z "$PIDS" ] || kill $PIDS 2> /dev/null || true
  PIDS=""
}
trap 'stop_busy; rm -rf "$OUT"' EXIT
trap 'exit 130' INT TERM

for round in $(seq 1 "$REPEAT"); do
  for mode in idle loaded; do
    echo "round $round, cores $mode" >&2
    if [ "$mode" = loaded ]; then
      for _ in $(seq 1 "$BUSY"); do
        nice -n 19 sh -c "while :; do :; done" &
        PIDS="$PIDS $!"
      done
    fi
    "$K3" bench "$@" --repeat 1 --quiet --out-json "$OUT/$mode.$round.json" > /dev/null
    stop_busy
  done
done
/usr/bin/python3 - "$OUT" "$REPEAT" "$BUSY" <<'PY'
import json, statistics, sys
out, repeat, busy = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def rate(mode, r):
    row = json.load(open(f"{out}/{mode}.{r}.json"))["results"][0]
    if "gbps_median" in row:  # k3 bench --raw
        return row["gbps_median"], ""
    floor = row["runs"][0]["io_floor"]  # seconds: the fastest of the run's replays
    ratio = row["ratio_to_io_floor"]  # null when the replays make no floor (io_floor_note)
    ratio = "-" if ratio is None else f"{ratio:.2f}"
    return (floor["bytes"] / 1e9 / floor["seconds"],
            f'{row["seconds_per_token"]:.3f} ({ratio})')
print(f"| round | idle GB/s | {busy} busy loops GB/s | loaded / idle |"
      " idle s/token (x floor) | loaded s/token (x floor) |")
print("|---|---|---|---|---|---|")
ratios = []
for r in range(1, repeat + 1):
    (idle, idle_spt), (loaded, loaded_spt) = rate("idle", r), rate("loaded", r)
    ratios.append(loaded / idle)
    print(f"| {r} | {idle:.2f} | {loaded:.2f} | {loaded / idle:.2f} | {idle_spt} | {loaded_spt} |")
print(f"median loaded / idle: {statistics.median(ratios):.2f}")
PY
