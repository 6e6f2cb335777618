#!/usr/bin/env python3
"""The reference runs every synthetic checkpoint `k3 synth` writes, and their activations are
healthy: finite, non-trivial hidden states through every layer, and varied greedy tokens.

Checks, for the tiny preset in each float storage (release BF16/F32 mix, all F16, all F32) and
for a two-seed pair:
  1. the reference loads the checkpoint (nested config, shards, index, MXFP4 experts);
  2. every layer's output norm at the last prompt position is finite and its RMS lies in
     [0.05, 20] (weights are scaled so the stream neither dies nor explodes);
  3. the logits are finite and not flat, and 8 greedy tokens are not all the same id;
  4. different seeds give different logits; F16 and F32 storage give close logits when the
     routing agrees (a coarse check that F16 is decoded as F16, not as BF16).

Needs $K3_BIN (the k3 binary). Exits non-zero on any failure.
"""

import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = os.path.join(HERE, "k3_reference.py")
PROMPT = "3,7,11,5,9,2,200"
failures = []


def check(condition, message):
    print(("ok   " if condition else "FAIL ") + message)
    if not condition:
        failures.append(message)


def synth(out, *args):
    subprocess.run([os.environ["K3_BIN"], "synth", "--quiet", "--out", out, *args], check=True)


def reference(model, work, tag):
    logits_path = os.path.join(work, tag + ".f32")
    report_path = os.path.join(work, tag + ".json")
    subprocess.run([sys.executable, REFERENCE, "--model", model, "--ids", PROMPT, "--n-predict", "8",
                    "--dump-logits", logits_path, "--report-json", report_path],
                   check=True, capture_output=True)
    with open(report_path, encoding="utf-8") as f:
        report = json.load(f)
    return np.fromfile(logits_path, dtype="<f4"), report


def check_health(tag, logits, report, hidden):
    norms = report["layer_norms"]
    rms = [n / math.sqrt(hidden) for n in norms]
    check(all(math.isfinite(r) and 0.05 <= r <= 20 for r in rms),
          f"{tag}: per-layer RMS in [0.05, 20]: {', '.join(f'{r:.2f}' for r in rms)}")
    check(np.all(np.isfinite(logits)) and float(logits.std()) > 1e-3,
          f"{tag}: logits finite and not flat (std {float(logits.std()):.4f})")
    ids = report["generated_ids"]
    check(len(set(ids)) > 1, f"{tag}: greedy tokens vary: {ids}")


def main():
    with tempfile.TemporaryDirectory(prefix="k3-synth-ref-") as work:
        results = {}
        for tag, args in [("release", ["--seed", "1"]), ("f16", ["--seed", "1", "--dtype", "f16"]),
                          ("f32", ["--seed", "1", "--dtype", "f32"]), ("seed2", ["--seed", "2"])]:
            model = os.path.join(work, tag)
            synth(model, *args)
            logits, report = reference(model, work, tag)
            check_health(tag, logits, report, hidden=128)
            results[tag] = logits
        check(not np.array_equal(results["release"], results["seed2"]),
              "different seeds give different logits")
        diff = float(np.max(np.abs(results["f16"] - results["f32"])))
        scale = float(np.max(np.abs(results["f32"])))
        check(diff <= 0.2 * scale, f"F16 vs F32 storage: max |dlogit| {diff:.4f} of {scale:.4f}")
    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
