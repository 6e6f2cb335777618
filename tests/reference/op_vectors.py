#!/usr/bin/env python3
"""Writes adversarial inputs and the reference's answers for the engine's op tests.

Usage: op_vectors.py OUT.json

Every expected value comes from the functions of k3_reference.py (situ, rms_norm, attn_res,
short_conv_silu, K3Reference._kda_recurrence, K3Reference.route) except the KDA decay, which
the reference computes inline in K3Reference.kda; it is restated here with the same
expression. The inputs are chosen to catch the classic mistakes: SiTU inputs far past both
caps, an AttnRes candidate list whose raw and normalised forms disagree, A_log spread across
heads (per-channel indexing fails), a router bias that reorders the top-k and exact ties,
and a KDA recurrence of 10 steps carrying state.
"""

import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k3_reference as ref  # noqa: E402

rng = np.random.default_rng(20261129)


def t(a):
    return torch.tensor(np.asarray(a, dtype=np.float32))


def flat(x):
    return [float(v) for v in x.detach().reshape(-1).tolist()]


def situ_case():
    gate = np.concatenate([np.linspace(-300, 300, 61), rng.normal(0, 8, 64)]).astype(np.float32)
    up = np.concatenate([np.linspace(400, -400, 61), rng.normal(0, 40, 64)]).astype(np.float32)
    return {"gate": flat(t(gate)), "up": flat(t(up)), "beta1": 4.0, "beta2": 25.0,
            "out": flat(ref.situ(t(gate), t(up), 4.0, 25.0))}


def attn_res_case():
    d = 32
    scales = [1.0, 40.0, 0.02, 3.0]  # raw magnitudes that normalised keys must ignore
    cands = [rng.normal(0, s, (1, d)).astype(np.float32) for s in scales]
    norm_w = rng.normal(1, 0.2, d).astype(np.float32)
    proj_w = rng.normal(0, 0.5, d).astype(np.float32)
    out = ref.attn_res([t(c) for c in cands], t(norm_w), t(proj_w), 1e-5)
    return {"candidates": [flat(t(c)) for c in cands], "fold": flat(t(norm_w) * t(proj_w)),
            "eps": 1e-5, "out": flat(out)}


def short_conv_case():
    steps, channels, kernel = 7, 6, 4
    x = rng.normal(0, 2, (steps, channels)).astype(np.float32)
    w = rng.normal(0, 0.7, (channels, 1, kernel)).astype(np.float32)
    return {"x": flat(t(x)), "w": flat(t(w)), "steps": steps, "channels": channels,
            "kernel": kernel, "out": flat(ref.short_conv_silu(t(x), t(w)))}


def kda_decay_case():
    heads, dim, lower_bound = 4, 8, -5.0
    a_log = np.array([-2.0, 0.0, 1.5, 3.0], dtype=np.float32)  # spread: per-head indexing shows
    z = rng.normal(0, 2, heads * dim).astype(np.float32)
    dt_bias = rng.normal(0, 1, heads * dim).astype(np.float32)
    # As K3Reference.kda: A_log per head, dt_bias per channel, lower bound times the sigmoid.
    a_scale = torch.exp(t(a_log)).repeat_interleave(dim)
    alpha = torch.exp(lower_bound * torch.sigmoid(a_scale * (t(z) + t(dt_bias))))
    return {"z": flat(t(z)), "a_log": flat(t(a_log)), "dt_bias": flat(t(dt_bias)), "dim": dim,
            "lower_bound": lower_bound, "alpha": flat(alpha)}


def kda_recurrence_case():
    steps, heads, dim = 10, 3, 8
    q = rng.normal(0, 1, (steps, heads, dim)).astype(np.float32)
    k = rng.normal(0, 1, (steps, heads, dim)).astype(np.float32)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.normal(0, 1, (steps, heads, dim)).astype(np.float32)
    beta = rng.uniform(0.05, 0.95, (steps, heads)).astype(np.float32)
    alpha = np.exp(rng.uniform(-5, 0, (steps, heads, dim))).astype(np.float32)
    o = ref.K3Reference._kda_recurrence(t(q), t(k), t(v), t(beta), t(alpha))
    return {"steps": steps, "heads": heads, "dim": dim, "q": flat(t(q)), "k": flat(t(k)),
            "v": flat(t(v)), "beta": flat(t(beta)), "alpha": flat(t(alpha)), "out": flat(o)}


class _RouterConfig:
    def __init__(self, top_k):
        self.cfg = {"num_experts_per_token": top_k, "moe_renormalize": True,
                    "routed_scaling_factor": 1.0}


def router_case():
    experts, top_k = 16, 4
    logits = rng.normal(0, 1, experts).astype(np.float32)
    bias = np.zeros(experts, dtype=np.float32)
    # The bias lifts the experts with the lowest scores into the top-k (a reordering that the
    # unbiased scores would never give), and makes two selection scores tie exactly.
    low = np.argsort(logits)[:2]
    bias[low] = 2.0
    logits[5], logits[9], bias[5], bias[9] = 0.25, 0.25, 0.5, 0.5
    w = {"gate": torch.eye(experts), "bias": t(bias)}
    top, weights = ref.K3Reference.route(_RouterConfig(top_k), w, t(logits).reshape(1, -1))
    return {"logits": flat(t(logits)), "bias": flat(t(bias)), "top_k": top_k,
            "experts": [int(e) for e in top[0]], "weights": flat(weights[0])}


def main():
    cases = {"situ": situ_case(), "attn_res": attn_res_case(), "short_conv": short_conv_case(),
             "kda_decay": kda_decay_case(), "kda_recurrence": kda_recurrence_case(),
             "router": router_case()}
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        json.dump(cases, f)


if __name__ == "__main__":
    main()
