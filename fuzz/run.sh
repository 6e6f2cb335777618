#!/usr/bin/env bash
# Fuzzes every target of a K3_FUZZ build for SECONDS each, starting from the committed seeds.
# Usage: fuzz/run.sh SECONDS FUZZ_BUILD_DIR
# New inputs go to FUZZ_BUILD_DIR/fuzz-corpus/<target> (kept between runs, never committed);
# a crash leaves FUZZ_BUILD_DIR/fuzz-artifacts/<target>-crash-*, and the script fails naming
# it. To keep a crash as a regression test, fix it and copy the file to fuzz/corpus/<target>/.
set -uo pipefail

seconds=${1:?usage: fuzz/run.sh SECONDS FUZZ_BUILD_DIR}
build=${2:?usage: fuzz/run.sh SECONDS FUZZ_BUILD_DIR}
src=$(cd "$(dirname "$0")" && pwd)
list="$build/fuzz/fuzzers.txt"
[[ -f "$list" ]] || { echo "fuzz: $list missing (configure with -DK3_FUZZ=ON)" >&2; exit 2; }

failed=()
while read -r name opts; do
  [[ -n "$name" ]] || continue
  work="$build/fuzz-corpus/$name"
  artifacts="$build/fuzz-artifacts"
  mkdir -p "$work" "$artifacts"
  log="$artifacts/$name.log"
  # -rss_limit_mb: a parser that allocates what a file merely claims fails here, not in the
  # kernel's OOM killer. -max_len: the seeds are small and so are the interesting mutations.
  # shellcheck disable=SC2086
  "$build/fuzz/$name" -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=65536 \
    -timeout=10 -print_final_stats=1 -artifact_prefix="$artifacts/$name-" $opts \
    "$work" "$src/corpus/$name" >"$log" 2>&1
  rc=$?
  execs=$(grep -m1 '^stat::number_of_executed_units' "$log" | awk '{print $2}')
  if ((rc == 0)); then
    printf 'fuzz: %-22s ok   %10s runs in %ss\n' "$name" "${execs:-?}" "$seconds"
  else
    printf 'fuzz: %-22s FAIL (exit %d), see %s\n' "$name" "$rc" "$log"
    grep -E 'ERROR|runtime error|Test unit written' "$log" | head -5 | sed 's/^/    /'
    failed+=("$name")
  fi
done <"$list"

if ((${#failed[@]})); then
  echo "fuzz: ${#failed[@]} target(s) failed: ${failed[*]}" >&2
  exit 1
fi
