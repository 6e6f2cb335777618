#!/usr/bin/env bash
# Fuzzes every target of a K3_FUZZ build for SECONDS each, starting from the committed seeds,
# JOBS targets at once (default: the cores; each target is one process).
# Usage: fuzz/run.sh SECONDS FUZZ_BUILD_DIR [JOBS]
# New inputs go to FUZZ_BUILD_DIR/fuzz-corpus/<target> (kept between runs, never committed);
# a crash leaves FUZZ_BUILD_DIR/fuzz-artifacts/<target>-crash-*, and the script fails naming
# it. To keep a crash as a regression test, fix it and copy the file to fuzz/corpus/<target>/.
set -uo pipefail

seconds=${1:?usage: fuzz/run.sh SECONDS FUZZ_BUILD_DIR [JOBS]}
build=${2:?usage: fuzz/run.sh SECONDS FUZZ_BUILD_DIR [JOBS]}
jobs=${3:-$(nproc)}
src=$(cd "$(dirname "$0")" && pwd)
list="$build/fuzz/fuzzers.txt"
[[ -f "$list" ]] || { echo "fuzz: $list missing (configure with -DK3_FUZZ=ON)" >&2; exit 2; }
artifacts="$build/fuzz-artifacts"
mkdir -p "$artifacts"

# One target for SECONDS; its verdict goes to the log's last line, read back below.
fuzz_one() {
  local name=$1 opts=$2 work="$build/fuzz-corpus/$1" log="$artifacts/$1.log"
  mkdir -p "$work"
  # -rss_limit_mb: a parser that allocates what a file merely claims fails here, not in the
  # kernel's OOM killer. -max_len: the seeds are small and so are the interesting mutations.
  # shellcheck disable=SC2086
  "$build/fuzz/$name" -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=65536 \
    -timeout=10 -print_final_stats=1 -artifact_prefix="$artifacts/$name-" $opts \
    "$work" "$src/corpus/$name" >"$log" 2>&1
  echo "fuzz-exit: $?" >>"$log"
}

names=()
running=0
while read -r name opts; do
  [[ -n "$name" ]] || continue
  names+=("$name")
  if ((running >= jobs)); then
    wait -n
    running=$((running - 1))
  fi
  fuzz_one "$name" "$opts" </dev/null &
  running=$((running + 1))
done <"$list"
wait

failed=()
for name in "${names[@]}"; do
  log="$artifacts/$name.log"
  rc=$(sed -n 's/^fuzz-exit: //p' "$log" | tail -1)
  execs=$(grep -m1 '^stat::number_of_executed_units' "$log" | awk '{print $2}')
  if [[ "$rc" == 0 ]]; then
    printf 'fuzz: %-22s ok   %10s runs in %ss\n' "$name" "${execs:-?}" "$seconds"
  else
    printf 'fuzz: %-22s FAIL (exit %s), see %s\n' "$name" "${rc:-?}" "$log"
    grep -E 'ERROR|runtime error|Test unit written' "$log" | head -5 | sed 's/^/    /'
    failed+=("$name")
  fi
done

if ((${#failed[@]})); then
  echo "fuzz: ${#failed[@]} target(s) failed: ${failed[*]}" >&2
  exit 1
fi
