#!/usr/bin/env bash
# Installs what k3 needs, from Debian only, and only what is missing. Two sets:
#   run   what the k3 binary needs to build and run (`make run`): a compiler, CMake and the
#         libraries it links; nothing that only the tests, the benchmarks or the fuzzers use.
#   test  the run set plus what `make test` uses: GoogleTest and Google Benchmark, clang and
#         libFuzzer's runtime, ccache, the PyTorch reference, fio, the sshfs volume test's
#         sshd and FUSE, chromium for the page's browser tests, Open MPI, Node.js with the npm
#         packages the tests run.
# Idempotent: when everything is present it only runs dpkg-query and returns in well under 5 s.
# Usage: scripts/setup-deps.sh run|test [BUILD_DIR]   (npm packages go into BUILD_DIR/oracle)
set -euo pipefail

set_name=${1:?usage: scripts/setup-deps.sh run|test [BUILD_DIR]}
build_dir=${2:-build}
run_packages=(
  g++ cmake make ninja-build pkg-config
  liburing-dev libtbb-dev libabsl-dev nlohmann-json3-dev libsimdjson-dev libpcre2-dev
  libhwy-dev libxxhash-dev
  libcpp-httplib-dev  # k3 serve
)
test_packages=(
  git ccache clang-format
  libgtest-dev libbenchmark-dev  # the test binaries and bench/ (CMake skips them without)
  curl                           # the client of k3 serve's tests beside the Node SDK
  python3 python3-torch python3-numpy  # the PyTorch reference (tests/reference)
  fio                                  # k3 bench --raw's cross-check, in the bench tests
  clang libclang-rt-14-dev             # the fuzz targets: clang and libFuzzer's runtime
  # tests/apps/sshfs_volume_test.sh: a real network volume (the test runs its own sshd on
  # 127.0.0.1; where systemd runs, Debian's openssh-server also enables ssh.service on port 22)
  openssh-server openssh-client sshfs fuse3
  python3-yaml  # tests/apps/deploy_manifests.py reads deploy/k8s
  chromium      # the page's browser tests (tests/browser), driven by playwright-core
  libopenmpi-dev openmpi-bin  # expert parallelism over MPI and its mpirun tests
)
case "$set_name" in
  run) packages=("${run_packages[@]}") ;;
  test) packages=("${run_packages[@]}" "${test_packages[@]}") ;;
  *) echo "usage: scripts/setup-deps.sh run|test [BUILD_DIR]" >&2 && exit 2 ;;
esac

# One dpkg-query for the whole list: the packages it reports installed, the rest are missing.
installed=$(dpkg-query -W -f='${Package} ${Status}\n' "${packages[@]}" 2>/dev/null |
  awk '$2 == "install" && $3 == "ok" && $4 == "installed" {print $1}' || true)
missing=()
for p in "${packages[@]}"; do
  grep -qxF "$p" <<<"$installed" || missing+=("$p")
done
if [[ "$set_name" == test ]]; then
  # Node.js and npm: any installation will do; Debian's packages when there is none.
  command -v node >/dev/null 2>&1 || missing+=(nodejs)
  command -v npm >/dev/null 2>&1 || missing+=(npm)
fi

if ((${#missing[@]})); then
  echo "setup: installing from Debian: ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -q
  "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
[[ "$set_name" == test ]] || exit 0

# The npm packages the tests run live inside the build tree, never in the repository: the
# tokenizer oracle (`tiktoken`, a WebAssembly build of the reference tokenizer) and the real
# clients of k3 serve's tests (`openai`, the official OpenAI Node SDK, and `@anthropic-ai/sdk`,
# Anthropic's TypeScript SDK for the Messages API) and `ajv`, the JSON-schema
# validator that checks the tool calls and structured output those tests receive; and
# `playwright-core`, which drives Debian's chromium in the page's browser tests (it downloads no
# browser of its own).
oracle="$build_dir/oracle"
for pkg in tiktoken@1 openai@4 ajv@8 @anthropic-ai/sdk@1 playwright-core@1; do
  name=${pkg%@*}
  if [[ ! -f "$oracle/node_modules/$name/package.json" ]]; then
    echo "setup: installing the npm package $name into $oracle"
    mkdir -p "$oracle"
    npm install --silent --no-audit --no-fund --prefix "$oracle" "$pkg" >/dev/null
  fi
done
