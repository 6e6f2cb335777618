#!/usr/bin/env python3
"""Independent fp32 PyTorch reference for Kimi K3 (spec: MODEL.md, sections 0-3).

Written from the specification only, so that the C++ engine can be compared
against it. It favours obviously-correct code over speed: every generation step
recomputes the whole sequence, KDA runs the naive per-token recurrence and MLA
uses the plain (non-absorbed) form. It is meant for small checkpoints.

Example:
    python3 k3_reference.py --model DIR --ids 3,7,11,5,9 --n-predict 8 \
        --dump-logits last.f32 --report-json report.json
"""

import argparse
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# decode_mxfp4 and RefError are re-exported: check_fixture.py and op_vectors.py use them here.
from k3_checkpoint import (  # noqa: E402,F401  (next to this file)
    PREFIX, Checkpoint, RefError, decode_mxfp4, expect_shape, load_config, load_matrix)

DEFAULT_STOP_IDS = (163585, 163586)  # [EOS], <|end_of_msg|> (section 0 Q12)
MLA_LORA_EPS = 1e-6                   # section 0 Q1
KDA_L2_EPS = 1e-6                     # added to the sum of squares (section 2.4 step 3)
ROUTER_RENORM_EPS = 1e-20             # section 0 Q10

# ----------------------------------------------------------------------------
# Elementary operations (all fp32)
# ----------------------------------------------------------------------------

def rms_norm(x, weight, eps):
    """weight * x / sqrt(mean(x^2) + eps) over the last dimension."""
    return weight * (x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps))


def situ(gate, up, beta1, beta2):
    """SiTU-GLU: [b1 tanh(g/b1) * sigmoid(g)] * [b2 tanh(u/b2)]; the sigmoid sees the uncapped g."""
    return (beta1 * torch.tanh(gate / beta1) * torch.sigmoid(gate)) * (beta2 * torch.tanh(up / beta2))


def attn_res(candidates, norm_w, proj_w, eps):
    """Block Attention Residual: softmax over candidates of <g*w, RMSNorm(v_i)>, mix of raw v_i.

    candidates: list of [T, d] tensors (one value per token and candidate).
    """
    v = torch.stack(candidates)                               # [m, T, d]
    keys = v / torch.sqrt(v.pow(2).mean(dim=-1, keepdim=True) + eps)
    scores = keys @ (norm_w * proj_w.reshape(-1))             # [m, T]
    weights = torch.softmax(scores, dim=0)
    return (weights.unsqueeze(-1) * v).sum(dim=0)


def short_conv_silu(x, w):
    """Causal depthwise conv, tap K-1 on the current token, zeros before the start, then SiLU.

    x: [T, C], w: [C, 1, K].
    """
    k = w.shape[-1]
    t = x.shape[0]
    padded = torch.cat([x.new_zeros(k - 1, x.shape[1]), x])
    y = sum(w[:, 0, j] * padded[j:j + t] for j in range(k))
    return torch.nn.functional.silu(y)


# ----------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------

class K3Reference:
    """Weights are fetched lazily per layer and cached; forward() recomputes everything."""

    def __init__(self, model_dir):
        self.cfg = load_config(model_dir)
        self.ckpt = Checkpoint(model_dir)
        c = self.cfg
        self.d = c["hidden_size"]
        self.eps = c["rms_norm_eps"]
        self.mla_layers = {x - 1 for x in c["full_attn_layers"]}  # config lists are ONE-based
        self._cache = {}
        d, v = self.d, c["vocab_size"]
        self.embed = self.ckpt.float("model.embed_tokens.weight", [v, d])
        if self.ckpt.has("lm_head.weight") or not c["tie_word_embeddings"]:
            self.lm_head = self.ckpt.float("lm_head.weight", [v, d])
        else:
            self.lm_head = self.embed
        self.final_norm = self.ckpt.float("model.norm.weight", [d])
        self.out_res = (self.ckpt.float("model.output_attn_res_norm.weight", [d]),
                        self.ckpt.float("model.output_attn_res_proj.weight", [1, d]))

    # -- layer classification ------------------------------------------------

    def is_mla(self, layer):
        return layer in self.mla_layers

    def is_moe(self, layer):
        c = self.cfg
        return layer >= c["first_k_dense_replace"] and layer % c["moe_layer_freq"] == 0

    def layer_kind(self, layer):
        return ("mla" if self.is_mla(layer) else "kda") + ("+moe" if self.is_moe(layer) else "+dense")

    def _get(self, key, loader):
        if key not in self._cache:
            self._cache[key] = loader()
        return self._cache[key]

    # -- KDA (section 2.4) -------------------------------------------------------

    def _kda_weights(self, layer):
        c, ck, d = self.cfg, self.ckpt, self.d
        h, dh, k = c["kda_num_heads"], c["kda_head_dim"], c["short_conv_kernel_size"]
        p = f"model.layers.{layer}.self_attn."
        pw = h * dh
        w = {n: ck.float(p + n + ".weight", [pw, d]) for n in ("q_proj", "k_proj", "v_proj", "g_proj")}
        for n in ("q_conv1d", "k_conv1d", "v_conv1d"):
            w[n] = ck.float(p + n + ".weight", [pw, 1, k])
        w["f_a_proj"] = ck.float(p + "f_a_proj.weight")        # rank comes from the shape
        rank = w["f_a_proj"].shape[0]
        expect_shape(p + "f_a_proj.weight", w["f_a_proj"], [rank, d])
        w["f_b_proj"] = ck.float(p + "f_b_proj.weight", [pw, rank])
        w["b_proj"] = ck.float(p + "b_proj.weight", [h, d])
        a_log = ck.float(p + "A_log").reshape(-1)
        if a_log.numel() < h:                                   # section 0 Q2
            raise RefError(f"tensor {PREFIX + p}A_log: {a_log.numel()} entries, need >= {h}")
        w["A_log"] = a_log[:h]
        w["dt_bias"] = ck.float(p + "dt_bias").reshape(-1)
        expect_shape(p + "dt_bias", w["dt_bias"], [pw])
        w["o_norm"] = ck.float(p + "o_norm.weight", [dh])
        w["o_proj"] = ck.float(p + "o_proj.weight", [d, pw])
        return w

    def kda(self, layer, x):
        """Kimi Delta Attention over the whole sequence x [T, d] with the naive recurrence."""
        w = self._get(("kda", layer), lambda: self._kda_weights(layer))
        c = self.cfg
        h, dh = c["kda_num_heads"], c["kda_head_dim"]
        t = x.shape[0]
        q = short_conv_silu(x @ w["q_proj"].T, w["q_conv1d"]).reshape(t, h, dh)
        k = short_conv_silu(x @ w["k_proj"].T, w["k_conv1d"]).reshape(t, h, dh)
        v = short_conv_silu(x @ w["v_proj"].T, w["v_conv1d"]).reshape(t, h, dh)
        # L2 norm per head with the epsilon on the SUM of squares; then scale q only.
        q = q / torch.sqrt(q.pow(2).sum(-1, keepdim=True) + KDA_L2_EPS) * dh ** -0.5
        k = k / torch.sqrt(k.pow(2).sum(-1, keepdim=True) + KDA_L2_EPS)
        beta = torch.sigmoid(x @ w["b_proj"].T)                                  # [T, H]
        z = (x @ w["f_a_proj"].T) @ w["f_b_proj"].T                              # [T, H*D]
        # Decay: A_log per head, dt_bias per channel, added before the exp(A) scale;
        # the lower bound multiplies the sigmoid (it is not a clamp).
        a_scale = torch.exp(w["A_log"]).repeat_interleave(dh)                    # [H*D]
        g = c["gate_lower_bound"] * torch.sigmoid(a_scale * (z + w["dt_bias"]))
        alpha = torch.exp(g).reshape(t, h, dh)
        o = self._kda_recurrence(q, k, v, beta, alpha)
        # Output: RMSNorm per head (shared o_norm weight), THEN the sigmoid gate.
        gate = torch.sigmoid(x @ w["g_proj"].T).reshape(t, h, dh)
        o = rms_norm(o, w["o_norm"], self.eps) * gate
        return o.reshape(t, h * dh) @ w["o_proj"].T

    @staticmethod
    def _kda_recurrence(q, k, v, beta, alpha):
        """S[h] is [key i, value j]: decay rows, delta-rule write, read the UPDATED state."""
        t, h, dh = q.shape
        s = q.new_zeros(h, dh, v.shape[-1])
        out = []
        for i in range(t):
            s = alpha[i].unsqueeze(-1) * s                               # Diag(alpha) S
            u = torch.einsum("hij,hi->hj", s, k[i])                      # S'^T k
            s = s + beta[i].reshape(h, 1, 1) * k[i].unsqueeze(-1) * (v[i] - u).unsqueeze(1)
            out.append(torch.einsum("hij,hi->hj", s, q[i]))              # S_t^T q
        return torch.stack(out)

    # -- MLA (section 2.5) -------------------------------------------------------

    def _mla_weights(self, layer):
        c, ck, d = self.cfg, self.ckpt, self.d
        nh, nope, rope = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"]
        vd, kvr = c["v_head_dim"], c["kv_lora_rank"]
        p = f"model.layers.{layer}.self_attn."
        w = {"q_a_proj": ck.float(p + "q_a_proj.weight")}     # q LoRA rank from the shape
        qr = w["q_a_proj"].shape[0]
        expect_shape(p + "q_a_proj.weight", w["q_a_proj"], [qr, d])
        w["q_a_layernorm"] = ck.float(p + "q_a_layernorm.weight", [qr])
        w["q_b_proj"] = ck.float(p + "q_b_proj.weight", [nh * (nope + rope), qr])
        w["kv_a_proj"] = ck.float(p + "kv_a_proj_with_mqa.weight", [kvr + rope, d])
        w["kv_a_layernorm"] = ck.float(p + "kv_a_layernorm.weight", [kvr])
        w["kv_b_proj"] = ck.float(p + "kv_b_proj.weight", [nh * (nope + vd), kvr])
        if c["mla_use_output_gate"]:
            w["g_proj"] = ck.float(p + "g_proj.weight", [nh * vd, d])
        w["o_proj"] = ck.float(p + "o_proj.weight", [d, nh * vd])
        return w

    def mla(self, layer, x):
        """Gated MLA without positional encoding, plain (expanded K/V) form, causal."""
        w = self._get(("mla", layer), lambda: self._mla_weights(layer))
        c = self.cfg
        nh, nope, rope = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"]
        vd, kvr = c["v_head_dim"], c["kv_lora_rank"]
        t = x.shape[0]
        cq = rms_norm(x @ w["q_a_proj"].T, w["q_a_layernorm"], MLA_LORA_EPS)
        q = (cq @ w["q_b_proj"].T).reshape(t, nh, nope + rope)
        q_nope, q_pe = q[..., :nope], q[..., nope:]
        kv = x @ w["kv_a_proj"].T
        c_kv = rms_norm(kv[:, :kvr], w["kv_a_layernorm"], MLA_LORA_EPS)
        k_pe = kv[:, kvr:]                                   # one vector shared by all heads
        kvb = (c_kv @ w["kv_b_proj"].T).reshape(t, nh, nope + vd)
        k_nope, v = kvb[..., :nope], kvb[..., nope:]
        scores = torch.einsum("thd,shd->hts", q_nope, k_nope) + torch.einsum("thd,sd->hts", q_pe, k_pe)
        scores = scores / math.sqrt(nope + rope)             # 1/sqrt(qk_nope + qk_rope)
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        o = torch.einsum("hts,shd->thd", probs, v).reshape(t, nh * vd)
        if c["mla_use_output_gate"]:                          # gate only, no norm
            o = o * torch.sigmoid(x @ w["g_proj"].T)
        return o @ w["o_proj"].T

    # -- FFNs (sections 2.6, 2.7) ------------------------------------------------

    def _glu(self, x, gate_w, up_w, down_w):
        c = self.cfg
        return situ(x @ gate_w.T, x @ up_w.T, c["situ_beta"], c["situ_linear_beta"]) @ down_w.T

    def _dense_weights(self, layer):
        ck, d = self.ckpt, self.d
        p = f"model.layers.{layer}.mlp."
        gate = ck.float(p + "gate_proj.weight")
        width = gate.shape[0]
        expect_shape(p + "gate_proj.weight", gate, [width, d])
        return (gate, ck.float(p + "up_proj.weight", [width, d]),
                ck.float(p + "down_proj.weight", [d, width]))

    def dense_ffn(self, layer, x):
        return self._glu(x, *self._get(("dense", layer), lambda: self._dense_weights(layer)))

    def _moe_weights(self, layer):
        c, ck, d = self.cfg, self.ckpt, self.d
        ne = c["num_experts"]
        p = f"model.layers.{layer}.block_sparse_moe."
        w = {"gate": ck.float(p + "gate.weight", [ne, d]),
             "bias": ck.float(p + "gate.e_score_correction_bias").reshape(-1),
             "down": ck.float(p + "routed_expert_down_proj.weight")}
        expect_shape(p + "gate.e_score_correction_bias", w["bias"], [ne])
        latent = w["down"].shape[0]                          # latent width from the shape
        expect_shape(p + "routed_expert_down_proj.weight", w["down"], [latent, d])
        w["up"] = ck.float(p + "routed_expert_up_proj.weight", [d, latent])
        if c["latent_moe_use_norm"]:
            w["norm"] = ck.float(p + "routed_expert_norm.weight", [latent])
        if c["num_shared_experts"] > 0:
            sg = ck.float(p + "shared_experts.gate_proj.weight")
            width = sg.shape[0]
            expect_shape(p + "shared_experts.gate_proj.weight", sg, [width, d])
            w["shared"] = (sg, ck.float(p + "shared_experts.up_proj.weight", [width, d]),
                           ck.float(p + "shared_experts.down_proj.weight", [d, width]))
        w["latent"] = latent
        return w

    def _expert(self, layer, e, latent):
        """(w1 gate, w3 up, w2 down) of routed expert e, decoded to fp32 and cached."""
        def load():
            p = f"model.layers.{layer}.block_sparse_moe.experts.{e}."
            # The expert width is the row count of w1 (packed or not).
            mx = self.ckpt.has(p + "w1.weight_packed")
            inter = self.ckpt.shape(p + ("w1.weight_packed" if mx else "w1.weight"))[0]
            return (load_matrix(self.ckpt, p + "w1.weight", [inter, latent]),
                    load_matrix(self.ckpt, p + "w3.weight", [inter, latent]),
                    load_matrix(self.ckpt, p + "w2.weight", [latent, inter]))
        return self._get(("expert", layer, e), load)

    def route(self, w, x):
        """Sigmoid router: top-k of (s + bias), ties to the lower index; weights from unbiased s.

        Returns (indices [T, k], weights [T, k]), each row in descending selection-score order.
        """
        c = self.cfg
        scores = torch.sigmoid(x @ w["gate"].T)                        # [T, E]
        select = scores + w["bias"]
        # A stable sort of the negated scores puts equal scores in ascending index order.
        order = torch.sort(-select, dim=-1, stable=True).indices
        top = order[:, :c["num_experts_per_token"]]
        weights = torch.gather(scores, 1, top)
        if c["moe_renormalize"] and c["num_experts_per_token"] > 1:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + ROUTER_RENORM_EPS)
        return top, weights * c["routed_scaling_factor"]

    def moe(self, layer, x):
        """Stable LatentMoE: route on the full width, experts in the latent, norm the aggregate."""
        w = self._get(("moe", layer), lambda: self._moe_weights(layer))
        c = self.cfg
        top, weights = self.route(w, x)
        z = x @ w["down"].T                                              # [T, latent]
        agg = torch.zeros_like(z)
        for t in range(x.shape[0]):
            # Sum in descending-score order, one expert at a time, as section 0 Q10 fixes it.
            for j in range(top.shape[1]):
                w1, w3, w2 = self._expert(layer, int(top[t, j]), w["latent"])
                a = situ(w1 @ z[t], w3 @ z[t], c["situ_beta"], c["situ_linear_beta"])
                agg[t] = agg[t] + weights[t, j] * (w2 @ a)
        if c["latent_moe_use_norm"]:
            agg = rms_norm(agg, w["norm"], self.eps)
        out = agg @ w["up"].T
        if "shared" in w:                                               # full width, unweighted
            out = out + self._glu(x, *w["shared"])
        return out

    # -- whole model (section 2.2) -----------------------------------------------

    def _layer_norms(self, layer):
        ck, d = self.ckpt, self.d
        p = f"model.layers.{layer}."
        return {n: ck.float(p + n + ".weight", [1, d] if n.endswith("_proj") else [d])
                for n in ("input_layernorm", "post_attention_layernorm", "self_attention_res_norm",
                          "self_attention_res_proj", "mlp_res_norm", "mlp_res_proj")}

    def forward(self, ids, probe=None):
        """Logits [T, vocab] for token ids; if probe is a position, also per-layer norms there."""
        c, eps = self.cfg, self.eps
        p_in = self.embed[torch.tensor(ids, dtype=torch.long)]        # no embedding scale
        blocks = []                                                    # AttnRes snapshots B
        norms = []
        for layer in range(c["num_hidden_layers"]):
            n = self._get(("norms", layer), lambda: self._layer_norms(layer))
            h = attn_res(blocks + [p_in], n["self_attention_res_norm"], n["self_attention_res_proj"],
                         eps) if blocks else p_in
            # A boundary pushes the incoming prefix only AFTER it served as the last candidate.
            if layer % c["attn_res_block_size"] == 0:
                blocks.append(p_in)
                prefix = None
            else:
                prefix = p_in
            x = rms_norm(h, n["input_layernorm"], eps)
            a = self.mla(layer, x) if self.is_mla(layer) else self.kda(layer, x)
            prefix = a if prefix is None else prefix + a
            h2 = attn_res(blocks + [prefix], n["mlp_res_norm"], n["mlp_res_proj"], eps)
            x2 = rms_norm(h2, n["post_attention_layernorm"], eps)
            f = self.moe(layer, x2) if self.is_moe(layer) else self.dense_ffn(layer, x2)
            p_in = prefix + f
            if probe is not None:
                norms.append(float(p_in[probe].norm()))
        h = attn_res(blocks + [p_in], *self.out_res, eps)
        hidden = rms_norm(h, self.final_norm, eps)
        if probe is not None:
            norms.append(float(hidden[probe].norm()))
        return hidden @ self.lm_head.T, norms


# ----------------------------------------------------------------------------
# Generation and command line
# ----------------------------------------------------------------------------

def greedy_argmax(logits_row):
    """Largest logit, ties to the lower id (numpy argmax returns the first maximum)."""
    return int(np.argmax(logits_row.numpy()))


def generate(model, prompt, n_predict, stop_ids):
    """Greedy decoding with a full recompute of the whole sequence at every step.

    Returns (generated ids, prompt-only logits [P, V], teacher-forcing logits over
    prompt + generated[:-1], per-layer norms at the last prompt position).
    """
    prompt_logits, norms = model.forward(prompt, probe=len(prompt) - 1)
    generated, last_logits = [], prompt_logits
    while len(generated) < n_predict:
        if generated:
            last_logits, _ = model.forward(prompt + generated)
        token = greedy_argmax(last_logits[-1])
        generated.append(token)
        if token in stop_ids:
            break
    return generated, prompt_logits, last_logits, norms


def parse_ids(text, vocab_size):
    try:
        ids = [int(s) for s in text.split(",") if s.strip() != ""]
    except ValueError:
        raise RefError(f"--ids: not a comma-separated list of integers: {text!r}", code=2)
    if not ids:
        raise RefError("--ids: empty prompt", code=2)
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise RefError(f"--ids: token ids {bad} out of range [0, {vocab_size})", code=2)
    return ids


def write_f32(path, tensor):
    try:
        with open(path, "wb") as f:
            f.write(tensor.detach().contiguous().numpy().astype("<f4").tobytes())
    except OSError as e:
        raise RefError(f"{path}: cannot write: {e.strerror}")


def build_parser():
    ap = argparse.ArgumentParser(description="Kimi K3 fp32 PyTorch reference (greedy).")
    ap.add_argument("--model", required=True, help="checkpoint directory (config.json + safetensors)")
    ap.add_argument("--ids", required=True, help="prompt token ids, comma separated (no BOS added)")
    ap.add_argument("--n-predict", type=int, default=0, help="number of greedy tokens to generate")
    ap.add_argument("--dump-logits", metavar="FILE",
                    help="float32 LE logits [vocab] at the last prompt position")
    ap.add_argument("--dump-all-logits", metavar="FILE",
                    help="float32 LE logits [positions x vocab] over prompt + generated[:-1]")
    ap.add_argument("--report-json", metavar="FILE", help="JSON report (ids, per-layer norms)")
    ap.add_argument("--stop-id", type=int, action="append",
                    help="stop id (repeatable); default 163585 and 163586 when < vocab_size")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    return ap


def run(args):
    if args.n_predict < 0:
        raise RefError("--n-predict: must be >= 0", code=2)
    if args.threads < 1:
        raise RefError("--threads: must be >= 1", code=2)
    torch.set_num_threads(args.threads)
    if not os.path.isdir(args.model):
        raise RefError(f"{args.model}: model directory not found")
    model = K3Reference(args.model)
    vocab = model.cfg["vocab_size"]
    prompt = parse_ids(args.ids, vocab)
    if args.stop_id is not None:
        stop_ids = set(args.stop_id)
    else:
        stop_ids = {s for s in DEFAULT_STOP_IDS if s < vocab}

    with torch.no_grad():
        generated, prompt_logits, all_logits, norms = generate(model, prompt, args.n_predict, stop_ids)

    if args.dump_logits:
        write_f32(args.dump_logits, prompt_logits[-1])
    if args.dump_all_logits:
        write_f32(args.dump_all_logits, all_logits)
    if args.report_json:
        layers = model.cfg["num_hidden_layers"]
        report = {
            "model": args.model,
            "prompt_ids": prompt,
            "generated_ids": generated,
            "stop_ids": sorted(stop_ids),
            "vocab_size": vocab,
            "num_hidden_layers": layers,
            "last_prompt_argmax": greedy_argmax(prompt_logits[-1]),
            "all_logits_positions": int(all_logits.shape[0]),
            # layer_norms[l] = |P| after layer l (l < L), last entry = |RMSNorm(final h)|,
            # all at the last prompt position.
            "layer_norms": norms,
            "layer_kinds": [model.layer_kind(l) for l in range(layers)] + ["final_norm"],
        }
        try:
            with open(args.report_json, "w", encoding="utf-8") as f:
                json.dump(report, f, indent=1)
                f.write("\n")
        except OSError as e:
            raise RefError(f"{args.report_json}: cannot write: {e.strerror}")
    print("generated: " + ",".join(str(i) for i in generated))


def main(argv=None):
    args = build_parser().parse_args(argv)       # usage errors exit 2 via argparse
    try:
        run(args)
    except RefError as e:
        print(f"k3_reference: error: {e}", file=sys.stderr)
        return e.code
    return 0


if __name__ == "__main__":
    sys.exit(main())
