#!/usr/bin/env python3
"""Runs k3_bench_kernels with repetitions and prints each median as a fraction of the median
single-thread read bandwidth measured in the same run (DESIGN.md 5: every figure a ratio taken
in one run). Times are CPU times of the benchmark thread, except for */real_time entries.

Usage: summarize.py path/to/k3_bench_kernels [--repetitions N] [extra benchmark flags...]
"""
import argparse
import json
import subprocess
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("binary")
    parser.add_argument("--repetitions", type=int, default=3)
    args, extra = parser.parse_known_args()
    cmd = [args.binary, f"--benchmark_repetitions={args.repetitions}",
           "--benchmark_report_aggregates_only=true", "--benchmark_format=json", *extra]
    print("$", " ".join(cmd), file=sys.stderr)
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    medians = {b["run_name"]: b for b in out["benchmarks"] if b.get("aggregate_name") == "median"}
    bw = medians.get("BM_ReadBandwidth/threads:1", {}).get("bytes_per_second")
    ctx = out["context"]
    print(f"target {ctx.get('kernel_target')}, {ctx.get('num_cpus')} CPUs, "
          f"{args.repetitions} repetitions, medians")
    if bw:
        print(f"read bandwidth (1 thread): {bw / 1e9:.2f} GB/s")
    print(f"{'benchmark':<48} {'time':>12} {'GB/s':>8} {'of bw':>7} {'GFLOP/s':>8}")
    for name, b in medians.items():
        rate = b.get("bytes_per_second")
        flops = b.get("flops")
        frac = f"{rate / bw:7.1%}" if rate and bw else ""
        time = b["real_time"] if "real_time" in name else b["cpu_time"]
        print(f"{name:<48} {time:>9.1f} {b['time_unit']:<2} "
              f"{(rate or 0) / 1e9:>8.2f} {frac:>7} {(flops or 0) / 1e9:>8.1f}")
    t1 = medians.get("BM_Mxfp4MatMulCold/3072x3584/T:1")
    t16 = medians.get("BM_Mxfp4MatMulCold/3072x3584/T:16")
    if t1 and t16:
        print(f"MXFP4 batched T=16 / T=1 time: {t16['cpu_time'] / t1['cpu_time']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
