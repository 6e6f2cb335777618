#!/usr/bin/env python3
"""Writes a synthetic incremental-decode expert trace for `k3 cache-sim`.

The recorded Kimi K3 trace (../traces/) was taken in full-recompute mode: every step re-ran
the whole prefix. An engine with a KV cache decodes incrementally: each token makes one pass
over the MoE layers, choosing top-k experts per layer. This script models that, so cache
policies can be compared on the workload the engine actually runs (docs/CACHE.md):

  * per layer, expert popularity follows a Zipf law with exponent --zipf over a random
    permutation of the experts (0: uniform routing);
  * --rho: token-to-token correlation; each expert of the previous token at the same layer is
    chosen again with this probability, the rest are drawn by popularity without replacement.

Output: little-endian int32 pairs (layer, expert), layers 1..L in order for every token.
Only the standard library; the same arguments give the same bytes.

  python3 bench/pipeline/make_decode_trace.py --tokens 300 --zipf 0.8 --rho 0 --seed 1 \\
      --out zipf08.bin
  k3 cache-sim --trace zipf08.bin --capacity-gb 8,16,32,64,128 --policy all
"""
import argparse
import bisect
import itertools
import random
import struct
import sys


def layer_weights(rng, experts, zipf):
    weights = [1.0 / (rank + 1) ** zipf for rank in range(experts)]
    order = list(range(experts))
    rng.shuffle(order)
    out = [0.0] * experts
    for rank, expert in enumerate(order):
        out[expert] = weights[rank]
    return out


def draw_without_replacement(rng, cumulative, total, count, taken):
    """Draws `count` distinct experts by weight, skipping those in `taken` (rejection)."""
    chosen = []
    while len(chosen) < count:
        e = bisect.bisect_right(cumulative, rng.random() * total)
        e = min(e, len(cumulative) - 1)
        if e not in taken:
            taken.add(e)
            chosen.append(e)
    return chosen


def generate(tokens, layers, experts, top_k, zipf, rho, seed):
    rng = random.Random(seed)
    cumulative = []
    for _ in range(layers):
        cumulative.append(list(itertools.accumulate(layer_weights(rng, experts, zipf))))
    previous = [[] for _ in range(layers)]
    for _ in range(tokens):
        for layer in range(layers):
            kept = [e for e in previous[layer] if rng.random() < rho]
            taken = set(kept)
            cum = cumulative[layer]
            chosen = kept + draw_without_replacement(rng, cum, cum[-1], top_k - len(kept), taken)
            previous[layer] = chosen
            for e in chosen:
                yield layer + 1, e


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=300)
    p.add_argument("--layers", type=int, default=92)
    p.add_argument("--experts", type=int, default=896)
    p.add_argument("--top-k", type=int, default=16)
    p.add_argument("--zipf", type=float, default=0.8)
    p.add_argument("--rho", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    if not 0 < a.top_k <= a.experts or not 0 <= a.rho <= 1 or a.zipf < 0:
        sys.exit("make_decode_trace.py: need 0 < top-k <= experts, 0 <= rho <= 1, zipf >= 0")
    with open(a.out, "wb") as f:
        for layer, expert in generate(a.tokens, a.layers, a.experts, a.top_k, a.zipf, a.rho,
                                      a.seed):
            f.write(struct.pack("<ii", layer, expert))


if __name__ == "__main__":
    main()
