#!/usr/bin/env bash
# k3 on a real network volume: a throwaway sshd on 127.0.0.1 serves a tiny synthetic checkpoint
# over SFTP, sshfs mounts it, and the same checkpoint is run from the local directory and from
# the mount. The storage profiles only emulate a slow volume; this is the one test where the
# bytes really cross a network file system (FUSE, an SSH connection, a user-space server), so
# it checks that `k3 bench --model LOCAL,REMOTE` measures both and that the tokens do not depend
# on where the checkpoint lives. It also prints what O_DIRECT did on the mount.
#
# Usage: K3_BIN=build/apps/k3 tests/apps/sshfs_volume_test.sh   (or the binary as $1)
# Exit: 0 pass, 1 fail, 77 skip (no FUSE here, or no sshd/sshfs: scripts/setup-deps.sh).
set -euo pipefail

k3=${K3_BIN:-${1:-}}
python=${K3_PYTHON:-python3}
# Every command below that touches the mount is bounded, so a hung FUSE request fails the test
# with a message instead of running into ctest's timeout with nothing said.
step_timeout=60

say() { echo "sshfs_volume_test: $*"; }
fail() {
  say "FAIL: $*" >&2
  exit 1
}
skip() {
  say "SKIP: $*"
  exit 77
}

[[ -n "$k3" ]] || fail "set K3_BIN to the k3 binary (or pass it as the first argument)"
[[ -x "$k3" ]] || fail "K3_BIN=$k3 is not an executable"
command -v "$python" >/dev/null || fail "no $python to read the JSON reports with"

# What the test needs from the machine; only these absences are skips (a missing package is not
# a bug in k3), and scripts/setup-deps.sh installs them.
sshd_bin=/usr/sbin/sshd
[[ -x "$sshd_bin" ]] || skip "no $sshd_bin (Debian: openssh-server)"
for tool in sshfs ssh ssh-keygen; do
  command -v "$tool" >/dev/null || skip "no $tool (Debian: sshfs, openssh-client)"
done
[[ -e /dev/fuse ]] || skip "no /dev/fuse: FUSE is not available here (a container without it?)"
unmount_cmd=()
if command -v fusermount3 >/dev/null; then
  unmount_cmd=(fusermount3 -u)
elif command -v fusermount >/dev/null; then
  unmount_cmd=(fusermount -u)
else
  skip "no fusermount3 or fusermount (Debian: fuse3)"
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/k3-sshfs.XXXXXX")
tmp=$(cd "$tmp" && pwd -P)  # sshd wants absolute paths, and the mount point must not move
mnt="$tmp/mnt"
sshd_pid=""
sshfs_pid=""
mounted=0

# Runs on every exit, pass or fail: unmount first, so that sshfs and sshd's per-connection child
# end while their parents can still reap them, then stop sshd, then remove the files. Each step is
# allowed to fail (the point is to leave nothing behind, not to report a second error).
cleanup() {
  local status=$?
  set +e
  if ((mounted)) || mountpoint -q "$mnt" 2>/dev/null; then
    "${unmount_cmd[@]}" "$mnt" 2>/dev/null || "${unmount_cmd[@]}" -z "$mnt" 2>/dev/null ||
      umount -l "$mnt" 2>/dev/null
    if mountpoint -q "$mnt" 2>/dev/null; then
      say "warning: could not unmount $mnt" >&2
    fi
  fi
  if [[ -n "$sshfs_pid" ]]; then
    # Unmounting ends sshfs; give it 2 s, then stop it by its process id.
    for _ in $(seq 1 20); do
      kill -0 "$sshfs_pid" 2>/dev/null || break
      sleep 0.1
    done
    kill "$sshfs_pid" 2>/dev/null
    wait "$sshfs_pid" 2>/dev/null
  fi
  if [[ -n "$sshd_pid" ]]; then
    # Children first (a connection still open if the unmount failed), then the listener; both by
    # process id, never by name, so another sshd on the machine is never touched.
    # The listener reaps its children only while it runs, so it waits (up to 2 s) for them to go.
    for child in $(pgrep -P "$sshd_pid" 2>/dev/null); do kill "$child" 2>/dev/null; done
    for _ in $(seq 1 20); do
      pgrep -P "$sshd_pid" >/dev/null 2>&1 || break
      sleep 0.1
    done
    kill "$sshd_pid" 2>/dev/null
    wait "$sshd_pid" 2>/dev/null
  fi
  if mountpoint -q "$mnt" 2>/dev/null; then
    say "warning: leaving $tmp in place: $mnt is still mounted" >&2
  else
    rm -rf "$tmp"
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The smallest checkpoint there is (`tiny`, ~4 MB, what the other k3 bench tests use).
local_dir="$tmp/model"
"$k3" synth --preset tiny --out "$local_dir" --quiet >"$tmp/synth.log" 2>&1 ||
  fail "k3 synth failed: $(cat "$tmp/synth.log")"

# Throwaway keys: a host key for sshd and a key the test logs in with. Nothing under ~/.ssh or
# /etc/ssh is read or written.
ssh-keygen -q -t ed25519 -N '' -C k3-sshfs-host -f "$tmp/host_key"
ssh-keygen -q -t ed25519 -N '' -C k3-sshfs-user -f "$tmp/user_key"
cp "$tmp/user_key.pub" "$tmp/authorized_keys"
user=$(id -un)

# sshd refuses to start without its privilege separation directory, which only the service's
# start-up creates (tmpfiles.d on systemd); a machine that never started ssh.service lacks it.
if [[ ! -d /run/sshd ]]; then
  mkdir -p /run/sshd 2>/dev/null || fail "sshd needs /run/sshd and it cannot be created (not root?)"
  chmod 0755 /run/sshd
fi

free_port() {
  "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Starts sshd on a free port and waits until it accepts connections. The port is free when
# chosen but another process may take it before sshd binds, so a few ports are tried.
start_sshd() {
  local attempt port
  for attempt in 1 2 3 4 5; do
    port=$(free_port)
    # Only the test's key, only SFTP, only on the loopback address: the server can do nothing
    # but serve files to this test, and dies with it.
    cat >"$tmp/sshd_config" <<EOF
ListenAddress 127.0.0.1
Port $port
HostKey $tmp/host_key
PidFile $tmp/sshd.pid
AuthorizedKeysFile $tmp/authorized_keys
AllowUsers $user
StrictModes no
UsePAM no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
AuthenticationMethods publickey
DisableForwarding yes
PermitTTY no
PrintMotd no
Subsystem sftp internal-sftp
ForceCommand internal-sftp
EOF
    "$sshd_bin" -t -f "$tmp/sshd_config" 2>"$tmp/sshd.log" ||
      fail "sshd rejects its configuration: $(cat "$tmp/sshd.log")"
    "$sshd_bin" -f "$tmp/sshd_config" -D -e 2>"$tmp/sshd.log" &
    sshd_pid=$!
    for _ in $(seq 1 100); do  # 10 s: sshd starts in milliseconds when it starts at all
      if ! kill -0 "$sshd_pid" 2>/dev/null; then
        break  # it exited (the port was taken, most likely): try another port
      fi
      # A bare TCP connect (bash's /dev/tcp) is enough to know sshd accepts; it leaves one
      # "kex_exchange_identification" line in sshd.log, which is harmless.
      if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        ssh_port=$port
        return 0
      fi
      sleep 0.1
    done
    if kill -0 "$sshd_pid" 2>/dev/null; then
      fail "sshd runs but does not accept connections on 127.0.0.1:$port after 10 s: $(cat "$tmp/sshd.log")"
    fi
    wait "$sshd_pid" 2>/dev/null || true
    sshd_pid=""
    say "sshd did not start on port $port (attempt $attempt): $(tail -n 3 "$tmp/sshd.log")"
  done
  fail "sshd did not start on any of 5 free ports: $(cat "$tmp/sshd.log")"
}
ssh_port=""
start_sshd
say "sshd (pid $sshd_pid) listening on 127.0.0.1:$ssh_port"

# sshfs runs in the foreground (-f) as this script's child: a daemonised sshfs would be
# re-parented to init, and this way cleanup can wait for it by process id and reap it.
# -F /dev/null: the user's ~/.ssh/config must not change what this test does. BatchMode: a
# prompt would hang the test; fail instead.
mkdir -p "$mnt"
sshfs -f -F /dev/null -p "$ssh_port" \
  -o "IdentityFile=$tmp/user_key,IdentitiesOnly=yes,BatchMode=yes,ConnectTimeout=10" \
  -o "StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,LogLevel=ERROR" \
  "$user@127.0.0.1:$local_dir" "$mnt" 2>"$tmp/sshfs.log" &
sshfs_pid=$!
for _ in $(seq 1 300); do  # 30 s: the mount appears once ssh has logged in
  mountpoint -q "$mnt" && break
  kill -0 "$sshfs_pid" 2>/dev/null || break
  sleep 0.1
done
if ! mountpoint -q "$mnt"; then
  if kill -0 "$sshfs_pid" 2>/dev/null; then
    fail "sshfs did not mount 127.0.0.1:$local_dir within 30 s: $(cat "$tmp/sshfs.log")"
  fi
  wait "$sshfs_pid" 2>/dev/null || true
  sshfs_pid=""
  # FUSE that exists but cannot be used (no permission on /dev/fuse, a container without
  # CAP_SYS_ADMIN, no fuse module) is a property of the machine: skip. Anything else (ssh
  # refused the key, sshd died) is a failure of the test's set-up and must be seen.
  if grep -qE 'fuse: |fusermount3?: |/dev/fuse' "$tmp/sshfs.log"; then
    skip "FUSE is present but mounting fails here: $(cat "$tmp/sshfs.log")"
  fi
  fail "sshfs could not mount 127.0.0.1:$local_dir: $(cat "$tmp/sshfs.log"); sshd said: $(cat "$tmp/sshd.log")"
fi
mounted=1
fs_type=$(findmnt -n -o FSTYPE --target "$mnt" 2>/dev/null || echo unknown)
say "mounted $user@127.0.0.1:$local_dir on $mnt ($fs_type)"
cmp -s "$local_dir/config.json" "$mnt/config.json" ||
  fail "config.json on the mount differs from the local one"

# What the mount does with O_DIRECT, asked directly: open with O_DIRECT and read one aligned
# 4 KiB block of an expert shard, as the read engine does.
shards=("$mnt"/model-*.safetensors)  # the second shard holds layer 1's experts
probe_file=${shards[1]}
direct_probe=$(timeout "$step_timeout" "$python" - "$probe_file" <<'PY'
import errno, mmap, os, sys
try:
    fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT)
except OSError as e:
    print(f"open(O_DIRECT) refused: {errno.errorcode.get(e.errno, e.errno)}")
    sys.exit(0)
buf = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT wants
try:
    n = os.preadv(fd, [buf], 0)
    print(f"open(O_DIRECT) accepted, aligned 4 KiB read returned {n} bytes")
except OSError as e:
    print(f"open(O_DIRECT) accepted, but the read failed: {errno.errorcode.get(e.errno, e.errno)}")
finally:
    os.close(fd)
PY
) || fail "the O_DIRECT probe of $probe_file failed"

# The benchmark on both volumes. The `ultra` budget caches 2 of the 96 experts and streams the
# trunk, so every decode step reads from the volume; short settings keep it to seconds.
timeout "$step_timeout" "$k3" bench --model "$local_dir,$mnt" --storage-profile direct \
  --queue-depth 4 --prefetch-distance 0 --tokens 4 --repeat 1 --reads 8 --preset ultra \
  --out-json "$tmp/bench.json" >"$tmp/bench.out" 2>"$tmp/bench.err" ||
  fail "k3 bench failed (exit $?): $(cat "$tmp/bench.err")"
cat "$tmp/bench.out"

# Sanity bounds only: both volumes measured, every figure finite and positive, bytes really
# read during decode, and the two speeds within a factor no loopback mount should reach either
# way (timing ratios themselves would flake on a loaded machine).
remote_direct=$("$python" - "$tmp/bench.json" "$local_dir" "$mnt" <<'PY'
import json, math, sys
report, local, remote = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
def check(ok, what):
    if not ok:
        sys.exit(f"bench.json: {what}")
rows = {r["volume"]: r for r in report["results"]}
check(set(rows) == {local, remote}, f"expected one row per volume, got {sorted(rows)}")
for name, row in rows.items():
    for field in ("seconds_per_token", "gb_per_token", "raw_gbps"):
        v = row[field]
        check(isinstance(v, (int, float)) and math.isfinite(v) and v > 0,
              f"{name}: {field} is {v!r}, expected a finite positive number")
    check(len(row["runs"]) == 1 and row["runs"][0]["decode"]["tokens"] == 4,
          f"{name}: expected one run of 4 decode tokens")
ratio = rows[remote]["seconds_per_token"] / rows[local]["seconds_per_token"]
check(0.05 <= ratio <= 200, f"remote/local s/token = {ratio:.3g}, outside [0.05, 200]")
volumes = {v["dir"]: v for v in report["volumes"]}
check(set(volumes) == {local, remote}, f"expected both volumes described, got {sorted(volumes)}")
print(f"s/token local {rows[local]['seconds_per_token']:.4g}, "
      f"remote {rows[remote]['seconds_per_token']:.4g} (remote/local {ratio:.2f}); "
      f"raw GB/s local {rows[local]['raw_gbps']:.3g}, remote {rows[remote]['raw_gbps']:.3g}",
      file=sys.stderr)
print("accepted" if volumes[remote]["o_direct"] else "refused")
PY
) || fail "the bench report does not hold up (above)"

# The same prompt, greedy, from both places: the tokens must be identical (where the bytes come
# from changes the speed, never the answer).
generate() {
  timeout "$step_timeout" "$k3" generate --model "$1" --ids 5,17,42,99,7,200 --greedy \
    --ignore-eos -n 8 --preset ultra --quiet --report-json "$tmp/$2.json" \
    >"$tmp/$2.out" 2>"$tmp/$2.err" || fail "k3 generate on $1 failed (exit $?): $(cat "$tmp/$2.err")"
}
generate "$local_dir" gen_local
generate "$mnt" gen_remote
"$python" - "$tmp/gen_local.json" "$tmp/gen_remote.json" <<'PY' || fail "the tokens differ (above)"
import json, sys
local, remote = (json.load(open(p))["generated_ids"] for p in sys.argv[1:3])
if len(local) != 8:
    sys.exit(f"expected 8 generated ids, got {local}")
if local != remote:
    sys.exit(f"generated ids differ: local {local}, sshfs {remote}")
print(f"sshfs_volume_test: generated ids identical on both volumes: {local}")
PY
cmp -s "$tmp/gen_local.out" "$tmp/gen_remote.out" || fail "generated text differs between the volumes"

# What O_DIRECT did: the probe, the bench report's verdict, and any fallback notice (`k3: ...
# refuses O_DIRECT ...`) the engine printed. Either outcome passes; it is reported, not judged.
notices=$(grep -h 'refuses O_DIRECT' "$tmp/bench.err" "$tmp/gen_remote.err" 2>/dev/null | sort -u || true)
say "O_DIRECT on the sshfs mount: probe: $direct_probe; k3 bench: $remote_direct"
if [[ -n "$notices" ]]; then
  say "the engine fell back to buffered reads on the mount:"
  while IFS= read -r line; do echo "    $line"; done <<<"$notices"
else
  say "no fallback notice: the engine read the mount with O_DIRECT (each read goes to sshfs, not the page cache)"
fi
say "PASS"
