"""The checkpoint side of the fp32 reference (k3_reference.py): safetensors parsed by hand,
MXFP4 decoded, config.json read and checked (MODEL.md sections 0-1).
"""

import json
import math
import os
import struct

import numpy as np
import torch

PREFIX = "language_model."

# E2M1 (OCP FP4) code -> value; codes 8..15 are the negatives (code 8 is -0.0).
E2M1_LUT = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                     -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float64)


class RefError(Exception):
    """A user-facing error: printed as one line, then exit with `code`."""

    def __init__(self, message, code=1):
        super().__init__(message)
        self.code = code


# ----------------------------------------------------------------------------
# safetensors, parsed by hand
# ----------------------------------------------------------------------------

# dtype -> (numpy little-endian element type, bytes per element)
_ST_DTYPES = {"BF16": ("<u2", 2), "F16": ("<f2", 2), "F32": ("<f4", 4), "U8": ("u1", 1)}


def read_safetensors_header(path):
    """Return (header dict without __metadata__, absolute offset of the data section)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            raw_len = f.read(8)
            if len(raw_len) != 8:
                raise RefError(f"{path}: truncated safetensors file (no header length)")
            (n,) = struct.unpack("<Q", raw_len)
            if 8 + n > size:
                raise RefError(f"{path}: header length {n} exceeds file size {size}")
            header = json.loads(f.read(n).decode("utf-8"))
    except OSError as e:
        raise RefError(f"{path}: cannot read: {e.strerror}")
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RefError(f"{path}: invalid safetensors JSON header: {e}")
    if not isinstance(header, dict):
        raise RefError(f"{path}: safetensors header is not a JSON object")
    header.pop("__metadata__", None)
    data_start = 8 + n
    for name, meta in header.items():
        _check_tensor_meta(path, name, meta, size - data_start)
    return header, data_start


def _check_tensor_meta(path, name, meta, data_len):
    """Validate one header entry so that later reads cannot go out of bounds."""
    try:
        dtype, shape, (begin, end) = meta["dtype"], meta["shape"], meta["data_offsets"]
    except (KeyError, TypeError, ValueError):
        raise RefError(f"{path}: tensor {name}: malformed header entry")
    if dtype not in _ST_DTYPES:
        raise RefError(f"{path}: tensor {name}: unsupported dtype {dtype}")
    count = math.prod(shape)
    if end - begin != count * _ST_DTYPES[dtype][1] or begin < 0 or end > data_len:
        raise RefError(f"{path}: tensor {name}: data_offsets [{begin}, {end}) do not match "
                       f"{dtype}{shape} or the file size")


class Checkpoint:
    """Lazy access to the tensors of a checkpoint directory (single file or sharded)."""

    def __init__(self, model_dir):
        self.dir = model_dir
        self._where = {}    # tensor name -> (file path, header entry, data start)
        self._maps = {}     # file path -> np.memmap of the whole file
        index = os.path.join(model_dir, "model.safetensors.index.json")
        single = os.path.join(model_dir, "model.safetensors")
        if os.path.isfile(index):
            self._load_index(index)
        elif os.path.isfile(single):
            self._add_file(single, None)
        else:
            raise RefError(f"{index}: not found (nor {single})")

    def _load_index(self, index):
        try:
            with open(index, "r", encoding="utf-8") as f:
                weight_map = json.load(f)["weight_map"]
        except OSError as e:
            raise RefError(f"{index}: cannot read: {e.strerror}")
        except (json.JSONDecodeError, KeyError, TypeError):
            raise RefError(f"{index}: invalid index (expected a JSON object with weight_map)")
        shards = {}
        for name, shard in weight_map.items():
            shards.setdefault(shard, set()).add(name)
        for shard, names in sorted(shards.items()):
            path = os.path.join(self.dir, shard)
            if not os.path.isfile(path):
                raise RefError(f"{path}: shard listed in {index} not found")
            self._add_file(path, names)

    def _add_file(self, path, expected_names):
        header, data_start = read_safetensors_header(path)
        for name in (expected_names if expected_names is not None else header):
            if name not in header:
                raise RefError(f"{path}: tensor {name} (listed in the index) is missing")
            self._where[name] = (path, header[name], data_start)

    def has(self, name):
        return PREFIX + name in self._where

    def shape(self, name):
        full = PREFIX + name
        if full not in self._where:
            raise RefError(f"{self.dir}: tensor {full} not found in the checkpoint")
        return list(self._where[full][1]["shape"])

    def raw(self, name):
        """The tensor as a numpy array of its stored dtype (BF16 as uint16 bit patterns)."""
        full = PREFIX + name
        if full not in self._where:
            raise RefError(f"{self.dir}: tensor {full} not found in the checkpoint")
        path, meta, data_start = self._where[full]
        if path not in self._maps:
            self._maps[path] = np.memmap(path, dtype=np.uint8, mode="r")
        begin, end = meta["data_offsets"]
        blob = self._maps[path][data_start + begin:data_start + end]
        np_type = _ST_DTYPES[meta["dtype"]][0]
        return np.array(blob.view(np_type)).reshape(meta["shape"]), meta["dtype"]

    def float(self, name, shape=None):
        """The tensor widened exactly to fp32, optionally checking its shape."""
        arr, dtype = self.raw(name)
        if dtype == "U8":
            raise RefError(f"tensor {PREFIX + name}: expected a float tensor, found U8")
        if dtype == "BF16":
            # bf16 is the high half of an fp32: shifting it up is an exact widening.
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        t = torch.from_numpy(arr.astype(np.float32))
        if shape is not None:
            expect_shape(name, t, shape)
        return t


def expect_shape(name, tensor, shape):
    if list(tensor.shape) != list(shape):
        raise RefError(f"tensor {PREFIX + name}: shape {list(tensor.shape)}, expected {list(shape)}")


# ----------------------------------------------------------------------------
# MXFP4 (section 3.3)
# ----------------------------------------------------------------------------

def decode_mxfp4(packed, scales, name="mxfp4 tensor"):
    """Decode U8 packed [R, K/2] + E8M0 scales [R, K/32] into fp32 [R, K], exactly.

    Byte (r, c) holds element (r, 2c) in its LOW nibble and (r, 2c+1) in its high
    nibble; element (r, k) is E2M1[nibble] * 2^(scale[r, k // 32] - 127).
    """
    packed = np.asarray(packed, dtype=np.uint8)
    scales = np.asarray(scales, dtype=np.uint8)
    rows, half = packed.shape
    k = 2 * half
    if k % 32 != 0 or scales.shape != (rows, k // 32):
        raise RefError(f"{name}: packed {list(packed.shape)} and scales {list(scales.shape)} "
                       f"do not form an MXFP4 matrix with groups of 32")
    if np.any(scales == 0xFF):
        raise RefError(f"{name}: E8M0 scale byte 0xFF (NaN) found: corrupt checkpoint")
    codes = np.empty((rows, k), dtype=np.uint8)
    codes[:, 0::2] = packed & 0x0F
    codes[:, 1::2] = packed >> 4
    # float64 holds LUT * 2^(s-127) exactly for every s in 0..254; the cast to fp32
    # is then exact too (2^-127 and below are fp32 subnormals, still exact).
    scale = np.ldexp(1.0, scales.astype(np.int32) - 127)
    values = E2M1_LUT[codes] * np.repeat(scale, 32, axis=1)
    return values.astype(np.float32)


def load_matrix(ckpt, name, shape):
    """A projection weight `name` ([out, in]), MXFP4 if `name_packed` exists, else float."""
    if ckpt.has(name + "_packed"):
        packed, dt_p = ckpt.raw(name + "_packed")
        scales, dt_s = ckpt.raw(name + "_scale")
        if dt_p != "U8" or dt_s != "U8":
            raise RefError(f"tensor {PREFIX + name}_packed/_scale: expected U8")
        t = torch.from_numpy(decode_mxfp4(packed, scales, PREFIX + name))
        expect_shape(name + " (decoded)", t, shape)
        return t
    return ckpt.float(name, shape)


# ----------------------------------------------------------------------------
# Configuration (section 0 "Config forms", section 1.2)
# ----------------------------------------------------------------------------

REQUIRED = object()

# (canonical name, where in the nested form, key in the flat form, type, default).
# Nested locations: "tc" = text_config, "lac" = text_config.linear_attn_config.
CONFIG_FIELDS = [
    ("hidden_size", "tc", "hidden_size", "int", REQUIRED),
    ("num_hidden_layers", "tc", "num_hidden_layers", "int", REQUIRED),
    ("vocab_size", "tc", "vocab_size", "int", REQUIRED),
    ("rms_norm_eps", "tc", "rms_norm_eps", "float", 1e-5),
    ("hidden_act", "tc", "hidden_act", "str", "situ"),
    ("situ_beta", "tc", "activation_situ_beta", "float", 4.0),
    ("situ_linear_beta", "tc", "activation_situ_linear_beta", "float", 25.0),
    ("kda_num_heads", "lac", "num_heads", "int", REQUIRED),
    ("kda_head_dim", "lac", "head_dim", "int", REQUIRED),
    ("short_conv_kernel_size", "lac", "short_conv_kernel_size", "int", 4),
    ("gate_lower_bound", "lac", "gate_lower_bound", "float", -5.0),
    ("full_attn_layers", "lac", "full_attn_layers", "intlist", REQUIRED),
    ("kda_layers", "lac", "kda_layers", "intlist", None),
    ("num_attention_heads", "tc", "num_attention_heads", "int", REQUIRED),
    ("kv_lora_rank", "tc", "kv_lora_rank", "int", REQUIRED),
    ("qk_nope_head_dim", "tc", "qk_nope_head_dim", "int", REQUIRED),
    ("qk_rope_head_dim", "tc", "qk_rope_head_dim", "int", REQUIRED),
    ("v_head_dim", "tc", "v_head_dim", "int", REQUIRED),
    ("mla_use_nope", "tc", "mla_use_nope", "bool", True),
    ("mla_use_output_gate", "tc", "mla_use_output_gate", "bool", True),
    ("num_experts", "tc", "num_experts", "int", REQUIRED),
    ("num_experts_per_token", "tc", "num_experts_per_token", "int", REQUIRED),
    ("num_shared_experts", "tc", "num_shared_experts", "int", 2),
    ("routed_scaling_factor", "tc", "routed_scaling_factor", "float", 1.0),
    ("moe_renormalize", "tc", "moe_renormalize", "bool", True),
    ("moe_router_activation_func", "tc", "moe_router_activation_func", "str", "sigmoid"),
    ("num_expert_group", "tc", "num_expert_group", "int", 1),
    ("topk_group", "tc", "topk_group", "int", 1),
    ("latent_moe_use_norm", "tc", "latent_moe_use_norm", "bool", True),
    ("first_k_dense_replace", "tc", "first_k_dense_replace", "int", 1),
    ("moe_layer_freq", "tc", "moe_layer_freq", "int", 1),
    ("attn_res_block_size", "tc", "attn_res_block_size", "int", 12),
    ("tie_word_embeddings", "tc", "tie_word_embeddings", "bool", False),
]

# In the flat form these fields are spelled differently from the nested form.
FLAT_KEYS = {"kda_num_heads": "kda_num_heads", "kda_head_dim": "kda_head_dim",
             "situ_beta": "situ_beta", "situ_linear_beta": "situ_linear_beta"}


def _type_ok(value, kind):
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    return isinstance(value, list) and all(_type_ok(v, "int") for v in value)


def parse_config(raw, path):
    """Map either config form to one flat dict; list every problem at once on failure."""
    errors = []
    if not isinstance(raw, dict):
        raise RefError(f"{path}: not a JSON object")
    if "text_config" in raw:          # release form: wrapper -> text_config -> linear_attn_config
        tc = raw["text_config"]
        if not isinstance(tc, dict):
            raise RefError(f"{path}: text_config is not an object")
        lac = tc.get("linear_attn_config")
        if not isinstance(lac, dict):
            errors.append("text_config.linear_attn_config (missing or not an object)")
            lac = {}
        places, names = {"tc": (tc, "text_config."), "lac": (lac, "text_config.linear_attn_config.")}, None
    else:                              # flat form of the kimi-k3-in-c tiny checkpoints
        places, names = None, FLAT_KEYS
    cfg, bad = {}, set()
    for name, where, nested_key, kind, default in CONFIG_FIELDS:
        if places is not None:
            src, label_prefix = places[where]
            key = nested_key
        else:
            src, label_prefix, key = raw, "", names.get(name, nested_key)
        label = label_prefix + key
        if key not in src or (src[key] is None and default is not REQUIRED):
            if default is REQUIRED:
                errors.append(f"{label} (missing)")
                bad.add(name)
            cfg[name] = default
        elif not _type_ok(src[key], kind):
            errors.append(f"{label} (expected {kind}, got {src[key]!r})")
            bad.add(name)
        else:
            cfg[name] = float(src[key]) if kind == "float" else src[key]
    errors += _semantic_errors(cfg, bad)
    if errors:
        raise RefError(f"{path}: invalid config: " + "; ".join(errors))
    return cfg


def _semantic_errors(cfg, bad):
    """Value checks across fields (layer partition, supported options).

    Fields in `bad` already failed the type check and are skipped, so that one
    message can list every problem at once.
    """
    def ok(*names):
        return not bad.intersection(names)

    errors = []
    for name in ("hidden_size", "num_hidden_layers", "vocab_size", "kda_num_heads", "kda_head_dim",
                 "short_conv_kernel_size", "num_attention_heads", "kv_lora_rank",
                 "qk_nope_head_dim", "v_head_dim", "num_experts", "num_experts_per_token",
                 "attn_res_block_size", "moe_layer_freq"):
        if ok(name) and cfg[name] <= 0:
            errors.append(f"{name} (must be positive, got {cfg[name]})")
    for name in ("qk_rope_head_dim", "num_shared_experts", "first_k_dense_replace"):
        if ok(name) and cfg[name] < 0:
            errors.append(f"{name} (must be >= 0, got {cfg[name]})")
    if ok("num_experts", "num_experts_per_token") and cfg["num_experts_per_token"] > cfg["num_experts"]:
        errors.append("num_experts_per_token (larger than num_experts)")
    if ok("num_hidden_layers", "full_attn_layers"):
        n, full = cfg["num_hidden_layers"], cfg["full_attn_layers"]
        if any(not 1 <= x <= n for x in full) or len(set(full)) != len(full):
            errors.append(f"full_attn_layers (must be distinct ONE-based indices in 1..{n})")
        elif ok("kda_layers") and cfg["kda_layers"] is not None:
            if sorted(cfg["kda_layers"] + full) != list(range(1, n + 1)):
                errors.append(f"kda_layers (together with full_attn_layers must partition 1..{n})")
    unsupported = [("hidden_act", "situ"), ("moe_router_activation_func", "sigmoid"),
                   ("mla_use_nope", True), ("num_expert_group", 1), ("topk_group", 1)]
    for name, wanted in unsupported:
        if ok(name) and cfg[name] != wanted:
            errors.append(f"{name} (only {wanted!r} is supported, got {cfg[name]!r})")
    return errors


def load_config(model_dir):
    path = os.path.join(model_dir, "config.json")
    try:
        with open(path, "r", encoding="utf-8") as f:
            raw = json.load(f)
    except OSError as e:
        raise RefError(f"{path}: cannot read: {e.strerror}")
    except json.JSONDecodeError as e:
        raise RefError(f"{path}: invalid JSON: {e}")
    return parse_config(raw, path)
