#!/usr/bin/env bash
# Runs GoogleTest programs whole, each split into SHARDS processes (GTEST_TOTAL_SHARDS), at most
# JOBS processes at once, each printing to its own log; fails if any process fails, printing its
# log. Every test still runs exactly once. Why not a process per test (ctest): under the
# sanitizers a process per test repeats each suite's setup and the sanitizer's own start, and
# trunk_pack_tests took 16.0 s that way under ASan against 6.6 s as two shards. Why shards at all:
# a TSan process slows down as it runs on (it keeps the history of every thread and lock its tests
# made): pipeline_tests took 434 s in one process, 80 s as two shards at once on 2 cores.
#
# Usage: scripts/gtest-shards.sh JOBS SHARDS BINARY... [-- GTEST ARGS...]
set -u
jobs=$1 shards=$2
shift 2
binaries=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  binaries+=("$1")
  shift
done
[ $# -gt 0 ] && shift  # the "--"
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

running=0
for bin in "${binaries[@]}"; do
  for ((i = 0; i < shards; i++)); do
    if ((running >= jobs)); then
      wait -n
      running=$((running - 1))
    fi
    log="$logs/$(basename "$bin").$i"
    (
      start=$EPOCHREALTIME
      GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i "$bin" "$@" > "$log" 2>&1
      echo $? > "$log.rc"
      awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f s", b - a }' > "$log.time"
    ) &
    running=$((running + 1))
  done
done
wait

failed=0
for bin in "${binaries[@]}"; do
  for ((i = 0; i < shards; i++)); do
    log="$logs/$(basename "$bin").$i"
    if [ "$(cat "$log.rc" 2> /dev/null)" = 0 ]; then
      echo "$bin shard $i: $(tail -n 1 "$log") ($(cat "$log.time"))"
    else
      echo "$bin shard $i of $shards failed:" >&2
      cat "$log" >&2
      failed=1
    fi
  done
done
exit $failed
