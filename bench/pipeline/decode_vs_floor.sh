#!/bin/sh
# Decode and prefill against the I/O floor on the `bench` checkpoint (issue: the pipeline's
# performance targets; docs/PERFORMANCE.md has the table this prints).
#
# For each setting (lookahead distance 0..3 and the serial --no-overlap baseline) runs
# `k3 generate` cold (a fresh process, O_DIRECT) REPEAT times with 16 prompt tokens and 24
# decode tokens at a RAM budget of about 12 % of the checkpoint, and REPEAT times a 64-token
# prefill with and without its lookahead (--prefill-prefetch-distance 0 and 1).
# The raw read bandwidth of the same binary at the same queue depth is measured in the same run
# (`k3 bench --raw`), before and after, and the floor is bytes read per token over it.
#
# Usage: bench/pipeline/decode_vs_floor.sh MODEL_DIR [BUILD_DIR] [REPEAT]
set -eu
MODEL=$1
BUILD=${2:-build}
REPEAT=${3:-3}
K3="$BUILD/apps/k3"
QD=32
RAM=$(/usr/bin/python3 -c "import os,sys; d=sys.argv[1]; print(round(0.12*sum(os.path.getsize(os.path.join(d,f)) for f in os.listdir(d))/1e9,2))" "$MODEL")
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
IDS16=$(/usr/bin/python3 -c "print(','.join(str((i*7919)%32000+5) for i in range(16)))")
IDS64=$(/usr/bin/python3 -c "print(','.join(str((i*7919)%32000+5) for i in range(64)))")

raw() { "$K3" bench --raw --model "$MODEL" --queue-depth $QD --reads 96 --repeat 3 --quiet \
          --out-json "$OUT/raw$1.json" > /dev/null; }
echo "budget --ram-gb $RAM (12 % of the checkpoint), queue depth $QD, $REPEAT runs each" >&2
raw 1
for rep in $(seq 1 "$REPEAT"); do
  for setting in d0 d1 d2 d3 serial; do
    case $setting in
      serial) flags="--no-overlap" ;;
      *) flags="--prefetch-distance ${setting#d}" ;;
    esac
    echo "run $rep: $setting" >&2
    "$K3" generate -m "$MODEL" --ids "$IDS16" -n 25 --ignore-eos --ram-gb "$RAM" \
      --queue-depth $QD $flags --quiet --report-json "$OUT/$setting.$rep.json" > /dev/null
  done
done
for rep in $(seq 1 "$REPEAT"); do
  for pd in 0 1; do
    echo "run $rep: prefill, lookahead $pd" >&2
    "$K3" generate -m "$MODEL" --ids "$IDS64" -n 1 --ram-gb "$RAM" --queue-depth $QD \
      --prefill-prefetch-distance $pd --quiet --report-json "$OUT/prefill$pd.$rep.json" > /dev/null
  done
done
raw 2
/usr/bin/python3 - "$OUT" "$REPEAT" <<'PY'
import json, statistics, sys
out, repeat = sys.argv[1], int(sys.argv[2])
def raw_gbs(i):
    return json.load(open(f"{out}/raw{i}.json"))["results"][0]["gbps_median"]
bw = statistics.median([raw_gbs(1), raw_gbs(2)])
print(f"raw read bandwidth at QD 32: {raw_gbs(1):.2f} GB/s before, {raw_gbs(2):.2f} GB/s after; floor uses {bw:.2f}")
print()
print("| setting | s/token | GB read/token | I/O floor s | x floor | stall s/token | compute s/token | disk busy | hit rate | precision | recall |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
med = {}
for s in ["serial", "d0", "d1", "d2", "d3"]:
    runs = [json.load(open(f"{out}/{s}.{r}.json")) for r in range(1, repeat + 1)]
    def m(f): return statistics.median(f(r) for r in runs)
    steps = lambda r: len(r["per_token"]) - 1
    spt = m(lambda r: r["seconds_per_token"])
    gb = m(lambda r: sum(r["bytes_read"].values()) / steps(r) / 1e9)
    med[s] = spt
    name = "--no-overlap" if s == "serial" else f"distance {s[1]}"
    # Without lookahead nothing is predicted: no precision or recall to show.
    def accuracy(k):
        if m(lambda r: r["prefetch"]["predicted"]) == 0: return "-"
        return f"{m(lambda r: r['prefetch'][k]):.2f}"
    print(f"| {name} | {spt:.3f} | {gb:.2f} | {gb / bw:.3f} | {spt / (gb / bw):.2f} | "
          f"{m(lambda r: r['io_wait_seconds'] / steps(r)):.3f} | "
          f"{m(lambda r: r['time']['expert_compute_seconds'] / steps(r)):.3f} | "
          f"{m(lambda r: r['disk_busy_fraction']):.2f} | {m(lambda r: r['cache']['hit_rate']):.2f} | "
          f"{accuracy('precision')} | {accuracy('recall')} |")
print()
print(f"speed-up over --no-overlap: " + ", ".join(f"distance {s[1]} {med['serial'] / med[s]:.2f}x" for s in ("d0", "d1", "d2", "d3")))
print(f"speed-up over distance 0: " + ", ".join(f"distance {s[1]} {med['d0'] / med[s]:.2f}x" for s in ("d1", "d2", "d3")))
for pd in (0, 1):
    runs = sorted((json.load(open(f"{out}/prefill{pd}.{r}.json")) for r in range(1, repeat + 1)),
                  key=lambda p: p["prefill_seconds"])
    p = runs[len(runs) // 2]  # the median run (by time), so its figures belong together
    f = p["prefill"]
    pb = sum(f["bytes_read"].values())
    used = f["bytes_read"]["expert_prefetch_used"] // 17547264  # bytes of a bench (and Kimi K3) expert
    spread = ", ".join(f"{r['prefill_seconds']:.2f}" for r in runs)
    print(f"prefill of 64 tokens, lookahead {pd}: {p['prefill_seconds']:.2f} s (median of {spread}), "
          f"{f['cache']['requests']} (layer, expert) pairs needed, {f['experts_demand_read']} read by "
          f"demand and {used} by prefetch, {pb / 1e9:.2f} GB; floor {pb / 1e9 / bw:.2f} s -> "
          f"{p['prefill_seconds'] / (pb / 1e9 / bw):.2f}x; expert compute "
          f"{f['time']['expert_compute_seconds']:.2f} s, stall {f['io_wait_seconds']:.2f} s")
PY
