#!/bin/sh
# Several drives at once, emulated on one disk (docs/STORAGE.md, "Several drives", has the table
# this prints). Each emulated drive is a directory with its own storage profile holding hard
# links to the model's shards (a directory with a profile of its own counts as its own drive);
# the model's directory is the first drive, with --storage-profile. Every row decodes the same
# tokens cold (a fresh process, O_DIRECT) at a budget of about 12 % of the checkpoint, so a token
# is expert-bound, and prints the read rate during decode (bytes read over decode seconds), the
# ideal time of the set (bytes over the summed caps), each drive's share of the bytes, and
# whether the tokens equal the one-drive run's.
#
#   one        the model's directory alone, capped at 1 GB/s
#   three      three drives of 1 GB/s (the model's directory and two volumes)
#   mixed      three drives of 2, 1 and 0.2 GB/s
#   striped    k3 stripe over three directories of 1 GB/s (weights 1,1,1, the default layout:
#              every expert sliced over the three), the model's directory uncapped but holding
#              no striped expert that is read
#   striped-mixed    the same over drives of 2, 1 and 0.2 GB/s (weights 2,1,0.2)
#   striped-experts  whole experts dealt over three of 1 GB/s (--layout experts), for comparison
#   disk1      the real disk, one directory
#   disk2      the real disk, two directories (one queue)
#
# Emulation can only slow the real disk down: the caps must sum to less than it delivers (the
# summed caps are 3.0 and 3.2 GB/s). UNIT (MB/s, default 1000) scales every cap: UNIT=500 halves
# them for a disk that gives less than about 3.5 GB/s to three readers.
#
# ROWS (default: all, in the order above) picks rows; "one" always runs (the reference).
#
# Usage: [UNIT=500] [ROWS="three striped"] bench/io/drives.sh MODEL_DIR [BUILD_DIR] [REPEAT]
#        (MODEL_DIR e.g. a `k3 synth --preset bench`)
set -eu
MODEL=$1
BUILD=${2:-build}
REPEAT=${3:-2}
K3="$BUILD/apps/k3"
PY=/usr/bin/python3
RAM=$($PY -c "import os,sys; d=sys.argv[1]; print(round(0.12*sum(os.path.getsize(os.path.join(d,f)) for f in os.listdir(d))/1e9,2))" "$MODEL")
TOKENS=${TOKENS:-12}
UNIT=${UNIT:-1000}
cap() { echo "bw=$(( $1 * UNIT / 10 ))MB/s"; }  # tenths of the unit
OUT=$(mktemp -d "${TMPDIR:-/var/tmp}/k3-drives.XXXXXX")
trap 'rm -rf "$OUT"' EXIT
# The volumes live beside the model, on its file system (hard links need that).
VOL=$(mktemp -d "$MODEL/../k3-drives-volumes.XXXXXX")
trap 'rm -rf "$OUT" "$VOL"' EXIT
ROWS=${ROWS:-three mixed striped striped-mixed striped-experts disk1 disk2}
ROWS="one $(echo "$ROWS" | tr ' ' '\n' | grep -vx one | tr '\n' ' ')"
has() { case " $ROWS " in *" $1 "*) return 0 ;; esac; return 1; }
mkdir -p "$VOL/b" "$VOL/c"
for f in "$MODEL"/*.safetensors; do ln "$f" "$VOL/b/"; ln "$f" "$VOL/c/"; done
stripe() {  # ROW WEIGHTS FLAGS...: the row's three directories $VOL/ROW.1 .. .3
  if has "$1"; then
    echo "striping the experts for $1 (weights $2)" >&2
    dirs="$VOL/$1.1,$VOL/$1.2,$VOL/$1.3" weights=$2
    shift 2
    "$K3" stripe -m "$MODEL" --out "$dirs" --weights "$weights" --quiet "$@" >&2
  fi
}
stripe striped 1,1,1
stripe striped-mixed 2,1,0.2
stripe striped-experts 1,1,1 --layout experts
IDS=$($PY -c "print(','.join(str((i*7919)%32000+5) for i in range(8)))")

run() {  # NAME REP FLAGS... (nothing unless ROWS has NAME)
  has "$1" || return 0
  name=$1 rep=$2
  shift 2
  "$K3" generate -m "$MODEL" --ids "$IDS" -n "$TOKENS" --ignore-eos --ram-gb "$RAM" --quiet \
    --report-json "$OUT/$name.$rep.json" "$@" > /dev/null
}

echo "budget --ram-gb $RAM, $TOKENS tokens, $REPEAT cold runs each" >&2
for rep in $(seq 1 "$REPEAT"); do
  echo "run $rep" >&2
  run one "$rep" --storage-profile "$(cap 10)"
  run three "$rep" --storage-profile "$(cap 10)" --volume "$VOL/b@$(cap 10)" \
    --volume "$VOL/c@$(cap 10)"
  run mixed "$rep" --storage-profile "$(cap 20)" --volume "$VOL/b@$(cap 10)" \
    --volume "$VOL/c@$(cap 2)"
  for s in striped striped-experts; do
    run $s "$rep" --volume "$VOL/$s.1@$(cap 10)" --volume "$VOL/$s.2@$(cap 10)" \
      --volume "$VOL/$s.3@$(cap 10)"
  done
  run striped-mixed "$rep" --volume "$VOL/striped-mixed.1@$(cap 20)" \
    --volume "$VOL/striped-mixed.2@$(cap 10)" --volume "$VOL/striped-mixed.3@$(cap 2)"
  run disk1 "$rep"
  run disk2 "$rep" --volume "$VOL/b"
done

$PY - "$OUT" "$REPEAT" "$UNIT" $ROWS <<'EOF'
import json, statistics, sys
out, repeat, unit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) / 1000
caps = {k: v * unit for k, v in {"one": 1.0, "three": 3.0, "mixed": 3.2, "striped": 3.0,
                                 "striped-mixed": 3.2, "striped-experts": 3.0}.items()}
rows, base = {}, None
for name in sys.argv[4:]:
    runs = [json.load(open(f"{out}/{name}.{r}.json")) for r in range(1, repeat + 1)]
    per_run = []
    for j in runs:
        n = len(j["per_token"]) - 1  # decode steps
        b = j["bytes_read"]
        decode_bytes = sum(b.values())
        per_run.append((j["seconds"] / max(n, 1), decode_bytes / max(n, 1), decode_bytes / j["seconds"]))
    s = statistics.median(x[0] for x in per_run)
    gb = statistics.median(x[1] for x in per_run) / 1e9
    rate = statistics.median(x[2] for x in per_run) / 1e9
    devices = runs[0]["devices"]
    total = sum(d["bytes"] for d in devices) or 1
    shares = " / ".join(f"{100 * d['bytes'] / total:.0f}%" for d in devices)
    same = all(j["generated_ids"] == runs[0]["generated_ids"] for j in runs)
    rows[name] = (s, gb, rate, shares, runs[0]["generated_ids"], same)
ref = rows["one"][4]
print(f"caps in units of {unit:g} GB/s; GB/s below are 1e9 bytes a second")
print("| setting | s/token | GB/token | read GB/s | sum of caps GB/s | x ideal | speed-up vs one | drive shares | same tokens |")
print("|---|---:|---:|---:|---:|---:|---:|---|---|")
for name, (s, gb, rate, shares, ids, same) in rows.items():
    cap = caps.get(name)
    ideal = f"{s / (gb / cap):.2f}" if cap else "-"
    print(f"| {name} | {s:.3f} | {gb:.2f} | {rate:.2f} | {f'{cap:g}' if cap else '-'} | {ideal} | "
          f"{rows['one'][0] / s:.2f} | {shares} | {'yes' if same and ids == ref else 'NO'} |")
EOF
