#!/usr/bin/env python3
"""Conformance check of the PyTorch reference against fixtures made outside this project.

Checks:
  1. reference-tiny, prompt [3, 7, 11, 5, 9]: the logits at the last prompt position match
     ref_logits.json within 5e-4 x max|ref|, and 8 greedy ids equal the published ones.
  2. The MXFP4 decoder reproduces the real released bytes of released-mxfp4.json bit for
     bit, and differs from the nibble-swapped trap; a 0xFF scale is refused.
  3. The same checkpoint re-packed in the release layout (nested config.json, two shards
     plus model.safetensors.index.json) gives bit-identical logits and the same ids.
  4. Input errors: a token id >= vocab_size exits with 2.

The fixture directory is $K3_SHARED_DIR/fixtures (default: ../shared next to the repo root).
Exits non-zero on any failure.
"""

import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import k3_reference  # noqa: E402  (the module under test, next to this file)

REFERENCE = os.path.join(HERE, "k3_reference.py")
PROMPT = [3, 7, 11, 5, 9]
EXPECTED_IDS = [92, 168, 13, 3, 49, 208, 214, 208]
REL_TOL = 5e-4

failures = []


def check(condition, message):
    print(("ok   " if condition else "FAIL ") + message)
    if not condition:
        failures.append(message)


def shared_dir():
    repo_root = os.path.dirname(os.path.dirname(HERE))
    return os.environ.get("K3_SHARED_DIR") or os.path.join(repo_root, "..", "shared")


def run_reference(model_dir, workdir, tag, extra=()):
    """Run the reference CLI; return (returncode, last-prompt logits, report or None)."""
    logits_path = os.path.join(workdir, tag + ".f32")
    report_path = os.path.join(workdir, tag + ".json")
    cmd = [sys.executable, REFERENCE, "--model", model_dir, "--ids", ",".join(map(str, PROMPT)),
           "--n-predict", str(len(EXPECTED_IDS)), "--dump-logits", logits_path,
           "--report-json", report_path, *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stderr.strip(), file=sys.stderr)
        return proc.returncode, None, None
    with open(report_path, encoding="utf-8") as f:
        report = json.load(f)
    return 0, np.fromfile(logits_path, dtype="<f4"), report


# -- 1. logits and greedy ids on reference-tiny ---------------------------------

def check_tiny(tiny_dir, workdir):
    with open(os.path.join(tiny_dir, "ref_logits.json"), encoding="utf-8") as f:
        ref_json = json.load(f)
    check(ref_json["prompt_ids"] == PROMPT, "ref_logits.json is for prompt [3, 7, 11, 5, 9]")
    ref = np.array(ref_json["logits_bits"], dtype=np.uint32).view(np.float32)
    rc, logits, report = run_reference(tiny_dir, workdir, "tiny")
    check(rc == 0, f"reference runs on reference-tiny (exit code {rc})")
    if rc != 0:
        return None, None
    diff = float(np.max(np.abs(logits.astype(np.float64) - ref)))
    bound = REL_TOL * float(np.max(np.abs(ref)))
    print(f"     max |logit - ref| = {diff:.3e} (bound {bound:.3e}, max |ref| {np.max(np.abs(ref)):.4f})")
    check(logits.shape == ref.shape and diff <= bound, "last-prompt logits within 5e-4 x max|ref|")
    print(f"     generated ids = {report['generated_ids']}")
    check(report["generated_ids"] == EXPECTED_IDS, f"greedy ids == {EXPECTED_IDS}")
    norms = report["layer_norms"]
    check(len(norms) == report["num_hidden_layers"] + 1 and all(np.isfinite(norms))
          and min(norms) > 0, "per-layer hidden norms are finite and non-zero")
    return logits, report


# -- 2. MXFP4 on real released bytes --------------------------------------------

def check_mxfp4(path):
    with open(path, encoding="utf-8") as f:
        fx = json.load(f)

    def array(entry, dtype):
        shape = json.loads(entry["shape"]) if isinstance(entry["shape"], str) else entry["shape"]
        data = json.loads(entry["data"]) if isinstance(entry["data"], str) else entry["data"]
        return np.array(data, dtype=dtype).reshape(shape)

    packed = array(fx["packed"], np.uint8)
    scales = array(fx["scales"], np.uint8)
    expected = array(fx["expected"], np.float32)
    decoded = k3_reference.decode_mxfp4(packed, scales, fx.get("source", "fixture"))
    # Compare bit patterns, so that -0.0 versus +0.0 counts as a difference too.
    exact = decoded.shape == expected.shape and np.array_equal(decoded.view(np.uint32),
                                                               expected.view(np.uint32))
    check(exact, f"MXFP4 decode of {fx.get('source')} is bit-exact ({decoded.size} values)")
    trap = fx["expected_swapped_nibbles"]
    first = json.loads(trap["first64"]) if isinstance(trap["first64"], str) else trap["first64"]
    swapped = np.array(first, dtype=np.float32)
    head = decoded.reshape(-1)[:swapped.size]
    check(not np.array_equal(head.view(np.uint32), swapped.view(np.uint32)),
          "MXFP4 decode differs from the nibble-swapped trap")
    bad = scales.copy()
    bad[3, 5] = 0xFF
    try:
        k3_reference.decode_mxfp4(packed, bad, "trap.weight")
        refused = False
    except k3_reference.RefError as e:
        refused = "trap.weight" in str(e)
    check(refused, "an E8M0 scale byte 0xFF is refused, naming the tensor")


# -- 3. release layout: nested config + shards ------------------------------------

def nested_config(flat):
    """The flat tiny config rewritten in the release's nested form."""
    lac_keys = {"kda_num_heads": "num_heads", "kda_head_dim": "head_dim",
                "short_conv_kernel_size": "short_conv_kernel_size",
                "gate_lower_bound": "gate_lower_bound", "full_attn_layers": "full_attn_layers"}
    renamed = {"situ_beta": "activation_situ_beta", "situ_linear_beta": "activation_situ_linear_beta"}
    text = {renamed.get(k, k): v for k, v in flat.items() if k not in lac_keys}
    lac = {new: flat[old] for old, new in lac_keys.items()}
    n = flat["num_hidden_layers"]
    lac["kda_layers"] = [i for i in range(1, n + 1) if i not in flat["full_attn_layers"]]
    text["linear_attn_config"] = lac
    text["model_type"] = "kimi_linear"
    return {"model_type": "kimi_k3", "architectures": ["KimiK3ForConditionalGeneration"],
            "text_config": text}


def read_tensors(path):
    """name -> (dtype, shape, raw bytes) of a safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items()}


def write_safetensors(path, tensors):
    header, chunks, offset = {}, [], 0
    for name, (dtype, shape, blob) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        chunks.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def check_release_layout(tiny_dir, workdir, flat_logits, flat_report):
    out = os.path.join(workdir, "release-layout")
    os.makedirs(out)
    with open(os.path.join(tiny_dir, "config.json"), encoding="utf-8") as f:
        flat = json.load(f)
    with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as f:
        json.dump(nested_config(flat), f)
    tensors = read_tensors(os.path.join(tiny_dir, "model.safetensors"))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2],
              "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for shard, members in shards.items():
        write_safetensors(os.path.join(out, shard), {n: tensors[n] for n in members})
        weight_map.update({n: shard for n in members})
    with open(os.path.join(out, "model.safetensors.index.json"), "w", encoding="utf-8") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    rc, logits, report = run_reference(out, workdir, "release")
    check(rc == 0, f"reference runs on the sharded, nested-config copy (exit code {rc})")
    if rc == 0 and flat_logits is not None:
        check(np.array_equal(logits, flat_logits) and report["generated_ids"] == flat_report["generated_ids"],
              "sharded + nested config gives bit-identical logits and the same ids")


# -- 4. input errors ------------------------------------------------------------

def check_input_errors(tiny_dir):
    proc = subprocess.run([sys.executable, REFERENCE, "--model", tiny_dir, "--ids", "3,256"],
                          capture_output=True, text=True)
    check(proc.returncode == 2 and "256" in proc.stderr, "a token id >= vocab_size exits with 2")


def main():
    fixtures = os.path.join(shared_dir(), "fixtures")
    tiny_dir = os.path.join(fixtures, "reference-tiny")
    for path in (tiny_dir, os.path.join(fixtures, "released-mxfp4.json")):
        if not os.path.exists(path):
            print(f"check_fixture: {path} not found (set K3_SHARED_DIR)", file=sys.stderr)
            return 1
    with tempfile.TemporaryDirectory(prefix="k3ref-") as workdir:
        flat_logits, flat_report = check_tiny(tiny_dir, workdir)
        check_mxfp4(os.path.join(fixtures, "released-mxfp4.json"))
        check_release_layout(tiny_dir, workdir, flat_logits, flat_report)
        check_input_errors(tiny_dir)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
