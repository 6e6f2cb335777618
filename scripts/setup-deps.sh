#!/usr/bin/env bash
# Installs what k3 needs to build and test, from Debian only, and only what is missing.
# Idempotent: when everything is present it only runs dpkg-query and returns in well under 5 s.
# Usage: scripts/setup-deps.sh [BUILD_DIR]   (the npm tokenizer oracle goes into BUILD_DIR/oracle)
set -euo pipefail

build_dir=${1:-build}
packages=(
  g++ cmake make pkg-config git
  liburing-dev libtbb-dev libabsl-dev libgtest-dev libbenchmark-dev nlohmann-json3-dev
  libsimdjson-dev libpcre2-dev libhwy-dev libxxhash-dev
  libcpp-httplib-dev curl  # k3 serve, and the client its tests use beside the Node SDK
  python3 python3-torch python3-numpy
  fio clang-format
  clang libclang-rt-14-dev  # the fuzz targets: clang and libFuzzer's runtime (make fuzz)
  # tests/apps/sshfs_volume_test.sh: a real network volume (the test runs its own sshd on
  # 127.0.0.1; where systemd runs, Debian's openssh-server also enables ssh.service on port 22)
  openssh-server openssh-client sshfs fuse3
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
# Node.js and npm: any installation will do; Debian's packages when there is none.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)

if ((${#missing[@]})); then
  echo "setup: installing from Debian: ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -q
  "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# The npm packages the tests run live inside the build tree, never in the repository: the
# tokenizer oracle (`tiktoken`, a WebAssembly build of the reference tokenizer) and the real
# client of k3 serve's tests (`openai`, the official OpenAI Node SDK).
oracle="$build_dir/oracle"
for pkg in tiktoken@1 openai@4; do
  name=${pkg%@*}
  if [[ ! -f "$oracle/node_modules/$name/package.json" ]]; then
    echo "setup: installing the npm package $name into $oracle"
    mkdir -p "$oracle"
    npm install --silent --no-audit --no-fund --prefix "$oracle" "$pkg" >/dev/null
  fi
done
