#!/bin/sh
# Runs one GoogleTest binary as SHARDS processes at once (GTEST_TOTAL_SHARDS), each printing to
# its own log, and fails if any shard fails, printing that shard's log. Every test still runs
# exactly once. For the TSan suites: a TSan process slows down as it runs on (it keeps the
# history of every thread and lock its tests made), so shorter processes win more than the
# second core: pipeline_tests took 434 s in one process, 80 s as two shards at once on 2 cores
# (user time 7.5 min against 1.7), 77 s as four.
#
# Usage: scripts/gtest-shards.sh SHARDS BINARY [GTEST ARGS...]
set -u
shards=$1 bin=$2
shift 2
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
i=0
while [ "$i" -lt "$shards" ]; do
  GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i "$bin" "$@" > "$logs/$i" 2>&1 &
  echo $! > "$logs/$i.pid"
  i=$((i + 1))
done
failed=0
i=0
while [ "$i" -lt "$shards" ]; do
  if wait "$(cat "$logs/$i.pid")"; then
    tail -n 1 "$logs/$i" | sed "s/^/shard $i: /"
  else
    echo "shard $i of $bin failed:" >&2
    cat "$logs/$i" >&2
    failed=1
  fi
  i=$((i + 1))
done
exit $failed
