#!/bin/bash
# Expert parallelism end to end: `mpirun -np 2` and `-np 3` on localhost give the tokens and the
# logits of one process, bit for bit, and a rank that dies or hangs ends the job with an error
# naming it and its host within the stated timeout, and a rank on another SIMD target is refused
# at start. Skipped (77) where mpirun is missing.
#   mpi_test.sh CASE K3_BIN SHARED_DIR
# CASE: generate-demo, generate-oracle, batch-demo, batch-oracle, serve, rank-fails,
# simd-mismatch.
set -u
case_name=${1:?usage: mpi_test.sh CASE K3_BIN SHARED_DIR}
k3=${2:?K3_BIN}
shared=${3:?SHARED_DIR}
command -v mpirun >/dev/null 2>&1 || { echo "mpirun not found: skipped"; exit 77; }
py=/usr/bin/python3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# In the ASan build: Open MPI (not built with ASan) keeps allocations past MPI_Finalize in
# components it has unloaded by then, which LeakSanitizer reports with no frame a suppression
# could match; under mpirun the leak check is off (every other ASan check stays on), and the runs
# of one process keep it.
mpi=(env "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" mpirun --oversubscribe)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
mpi+=(-np)
# Generous: a test never depends on how fast the machine is, only on an answer within this.
bound=300
fail() { echo "FAIL: $*"; exit 1; }

demo_model() {
  "$k3" synth --preset demo --set num_hidden_layers=3 --set full_attn_layers=3 --out "$dir/m" \
    --quiet || fail "synth"
  echo "$dir/m"
}
model_for() { [ "$1" = oracle ] && echo "$shared/fixtures/reference-tiny" || demo_model; }

# run NAME NP ARGS...: k3 ARGS alone (NP 1) or under mpirun -np NP; stdout/stderr to files.
run() {
  local name=$1 np=$2
  shift 2
  if [ "$np" = 1 ]; then
    timeout $bound "$k3" "$@" >"$dir/$name.out" 2>"$dir/$name.err"
  else
    timeout $bound "${mpi[@]}" "$np" "$k3" "$@" >"$dir/$name.out" 2>"$dir/$name.err"
  fi
  local rc=$?
  [ $rc = 0 ] || { cat "$dir/$name.err"; fail "$name exited $rc"; }
}

same_json_field() {  # FILE_A FILE_B FIELD: the reports agree on FIELD
  $py - "$1" "$2" "$3" <<'PY' || fail "$3 differs between $1 and $2"
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
sys.exit(0 if a[sys.argv[3]] == b[sys.argv[3]] else 1)
PY
}

case "$case_name" in
generate-demo | generate-oracle)
  model=$(model_for "${case_name#generate-}")
  # Greedy with a prompt of several chunks (many rows an expert), sampled, serial (no overlap),
  # with the lookahead's guesses sent to the ranks owning them, and a budget whose cache holds
  # a fraction of the experts (every rank reads as it goes).
  for variant in greedy sampled serial lookahead small-budget; do
    args=(generate -m "$model" --ids 3,7,11,5,9,2,4,6,8 -n 8 --prefill-chunk 4)
    [ $variant = sampled ] && args+=(--temp 1.3 --top-k 0 --top-p 1 --seed 7)
    [ $variant = serial ] && args+=(--no-overlap)
    [ $variant = lookahead ] && args+=(--prefetch-distance 2)
    [ $variant = small-budget ] && args+=(--max-context 512 --ram-gb 0.05)
    run "$variant-1" 1 "${args[@]}" --dump-logits "$dir/$variant-1.f32" \
      --report-json "$dir/$variant-1.json"
    for np in 2 3; do
      run "$variant-$np" $np "${args[@]}" --dump-logits "$dir/$variant-$np.f32" \
        --report-json "$dir/$variant-$np.json"
      cmp "$dir/$variant-1.f32" "$dir/$variant-$np.f32" || fail "$variant: logits differ at -np $np"
      same_json_field "$dir/$variant-1.json" "$dir/$variant-$np.json" generated_ids
      grep -q "ranks  *$np (expert parallelism)" "$dir/$variant-$np.err" || fail "no ranks line"
      $py - "$dir/$variant-$np.json" $np <<'PY' || fail "report: no traffic per rank"
import json, sys
r = json.load(open(sys.argv[1]))["ranks"]
assert len(r) == int(sys.argv[2]) - 1, r
assert all(x["bytes_out"] > 0 and x["bytes_back"] > 0 and x["layers"] > 0 for x in r), r
PY
    done
  done
  ;;
batch-demo | batch-oracle)
  model=$(model_for "${case_name#batch-}")
  cat >"$dir/prompts.jsonl" <<'JSONL'
{"id": "a", "ids": [3, 7, 11], "n_predict": 6}
{"id": "b", "ids": [5, 9, 2, 4, 6, 8, 10], "n_predict": 9}
{"id": "c", "ids": [1, 2], "n_predict": 5, "temperature": 1.2, "seed": 5}
{"id": "d", "ids": [12, 13, 14, 15], "n_predict": 4}
JSONL
  for np in 1 2 3; do
    run "batch-$np" $np generate -m "$model" --prompts "$dir/prompts.jsonl" --batch 3 \
      --out "$dir/batch-$np.jsonl"
  done
  for np in 2 3; do
    $py - "$dir/batch-1.jsonl" "$dir/batch-$np.jsonl" <<'PY' || fail "batch differs at -np $np"
import json, sys
a, b = ([(j["id"], j["ids"], j["finish_reason"]) for j in map(json.loads, open(f))]
        for f in sys.argv[1:3])
assert len(a) == 4 and a == b, (a, b)
PY
  done
  ;;
serve)
  model=$(demo_model)
  for np in 1 2 3; do
    if [ $np = 1 ]; then
      "$k3" serve -m "$model" --port 0 --prompt-cache none --batch 2 2>"$dir/serve-$np.err" &
    else
      "${mpi[@]}" $np "$k3" serve -m "$model" --port 0 --prompt-cache none --batch 2 \
        2>"$dir/serve-$np.err" &
    fi
    pid=$!
    port=
    for _ in $(seq $((bound * 10))); do
      port=$(grep -o "listening on http://127.0.0.1:[0-9]*" "$dir/serve-$np.err" | grep -o "[0-9]*$")
      [ -n "$port" ] && break
      kill -0 $pid 2>/dev/null || { cat "$dir/serve-$np.err"; fail "serve -np $np exited"; }
      sleep 0.1
    done
    [ -n "$port" ] || fail "serve -np $np did not listen"
    ask() {  # PROMPT OUT: a completion with the log probabilities of every token
      curl -s --max-time $bound "http://127.0.0.1:$port/v1/completions" \
        -H 'content-type: application/json' \
        -d "{\"prompt\": \"$1\", \"max_tokens\": 6, \"logprobs\": 3, \"echo\": true, \"temperature\": 0}" \
        >"$2"
    }
    # Two at once (one batched step for both), then one alone.
    ask "The capital of France" "$dir/a-$np.json" &
    ask "Once upon a time there" "$dir/b-$np.json" &
    wait %2 %3 2>/dev/null || wait
    ask "Hello" "$dir/c-$np.json"
    kill -TERM $pid
    wait $pid 2>/dev/null
    for q in a b c; do
      [ -s "$dir/$q-$np.json" ] || fail "serve -np $np: no answer to $q"
    done
  done
  for np in 2 3; do
    for q in a b c; do
      $py - "$dir/$q-1.json" "$dir/$q-$np.json" <<'PY' || fail "serve: $q differs at -np $np"
import json, sys
a, b = (json.load(open(f))["choices"] for f in sys.argv[1:3])
assert a == b and a[0]["logprobs"]["token_logprobs"][1] is not None, (a, b)
PY
    done
  done
  ;;
rank-fails)
  model=$(demo_model)
  host=$(hostname)
  # kill: SIGKILL (a crash, the OOM killer); exit: leaves in the middle of a job; hang: never
  # answers, so rank 0's wait of K3_RANK_TIMEOUT=5 s ends the job.
  for mode in kill exit hang; do
    K3_RANK_TIMEOUT=5 K3_RANK_FAULT=1:1:$mode timeout $bound "${mpi[@]}" 3 "$k3" generate \
      -m "$model" --ids 3,7,11,5 -n 6 >"$dir/$mode.out" 2>"$dir/$mode.err"
    rc=$?
    [ $rc = 124 ] && fail "$mode: still running after ${bound}s"
    [ $rc != 0 ] || fail "$mode: exited 0"
    # mpirun's line for a killed process, or k3's own naming the rank and its host.
    case $mode in
    kill) named="process rank 1 with PID [0-9]+ on node $host exited on signal 9" ;;
    exit) named="rank 1 on $host exits before rank 0 ended the job" ;;
    hang) named="layer [0-9]+: rank 1 on $host did not answer within 5s" ;;
    esac
    grep -qE "$named" "$dir/$mode.err" || { cat "$dir/$mode.err"; fail "$mode: no '$named'"; }
    echo "$mode: exit $rc: $(grep -m1 -E "$named" "$dir/$mode.err")"
  done
  # A server whose rank hangs ends too (no server left up answering errors).
  K3_RANK_TIMEOUT=5 K3_RANK_FAULT=1:1:hang "${mpi[@]}" 3 "$k3" serve -m "$model" --port 0 \
    --prompt-cache none 2>"$dir/serve.err" &
  pid=$!
  port=
  for _ in $(seq $((bound * 10))); do
    port=$(grep -o "listening on http://127.0.0.1:[0-9]*" "$dir/serve.err" | grep -o "[0-9]*$")
    [ -n "$port" ] && break
    sleep 0.1
  done
  [ -n "$port" ] || { kill $pid; fail "serve did not listen"; }
  curl -s --max-time $bound "http://127.0.0.1:$port/v1/completions" \
    -H 'content-type: application/json' -d '{"prompt": "Hello", "max_tokens": 4}' >/dev/null
  for _ in $(seq $((bound * 10))); do
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  kill -0 $pid 2>/dev/null && { kill $pid; fail "serve still up ${bound}s after its rank hung"; }
  wait $pid
  rc=$?
  [ $rc != 0 ] || fail "serve: exited 0 after its rank hung"
  grep -qE "layer [0-9]+: rank 1 on $host did not answer" "$dir/serve.err" ||
    { cat "$dir/serve.err"; fail "serve: rank 1 on $host not named"; }
  echo "serve, hang: exit $rc"
  ;;
simd-mismatch)
  model=$(demo_model)
  host=$(hostname)
  # Rank 1 says its kernels run on another target (K3_FAKE_SIMD_TARGET, for tests): rank 0
  # refuses it at start, naming it and both targets, and every rank exits (2: a configuration
  # error).
  args=(generate -m "$model" --ids 3,7,11,5 -n 4)
  timeout $bound "${mpi[@]}" 1 "$k3" "${args[@]}" : -np 1 env K3_FAKE_SIMD_TARGET=EMU128 "$k3" \
    "${args[@]}" >"$dir/simd.out" 2>"$dir/simd.err"
  rc=$?
  [ $rc = 2 ] || { cat "$dir/simd.err"; fail "exited $rc, not 2"; }
  named="k3 generate: rank 1 on $host runs the kernels on SIMD target EMU128 where rank 0 on $host runs them on [A-Z0-9_]+"
  grep -qE "$named" "$dir/simd.err" || { cat "$dir/simd.err"; fail "no '$named'"; }
  grep -q "runs them on EMU128" "$dir/simd.err" && fail "rank 0 faked its target too"
  [ -s "$dir/simd.out" ] && fail "tokens came out"
  echo "exit $rc: $(grep -m1 -E "$named" "$dir/simd.err")"
  ;;
*) fail "unknown case $case_name" ;;
esac
echo "ok: $case_name"
