"""Fused projections and ops against separate ones inside the model, A/B in one process.

"fused" is the model as the engine loads it on a CPU with our kernels: q/k/v and gate/up as one
GEMM each, RMSNorm, RoPE and attention on our fused ops (cpu_linear.fuse_for_cpu). "separate" is
session 9's engine: q, k, v, gate and up as separate GEMMs (row views of the fused weights, on
the same kernel) and torch's ops for RMSNorm, RoPE and attention. One forward over n new positions
at context 512 (--context), the two arms alternated forward by forward, and the ratio taken per
pair, so that both see the same machine. Prints JSON.

Usage: python scripts/fused_ab.py [--models qwen2.5-coder-1.5b-instruct,qwen2.5-coder-0.5b-instruct]
                                  [--rows 1,2,3,5,8] [--pairs 40] [--context 512] > docs/results/fused-ab.json
"""

import argparse
import json
import statistics
import time

import torch
from torch import nn

from specdec.model import load_model
from specdec.model.cpu_linear import PackedLinear
from specdec.model.transformer import MLP, Attention, RMSNorm


def split_views(fused: PackedLinear, sizes: list[int]) -> list[PackedLinear]:
    """PackedLinears (our kernel, no packed copy) over consecutive row blocks of a fused weight."""
    out, r = [], 0
    for n in sizes:
        lin = nn.Linear(fused.weight.shape[1], n, bias=fused.bias is not None)
        lin.weight = nn.Parameter(fused.weight.detach()[r:r + n], requires_grad=False)
        if fused.bias is not None:
            lin.bias = nn.Parameter(fused.bias.detach()[r:r + n], requires_grad=False)
        out.append(PackedLinear(lin, skinny=True, pack=False))
        r += n
    return out


def prepare(model) -> list:
    """For each fused module, (module, fused state, separate state) to switch between."""
    arms = []
    for m in model.modules():
        if isinstance(m, Attention):
            q, k, v = split_views(m.qkv_proj, m.qkv_sizes)
            arms.append((m, dict(qkv_proj=m.qkv_proj, q_proj=None, k_proj=None, v_proj=None, cpu_ops=True),
                         dict(qkv_proj=None, q_proj=q, k_proj=k, v_proj=v, cpu_ops=False)))
        elif isinstance(m, MLP):
            half = m.gate_up_proj.weight.shape[0] // 2
            g, u = split_views(m.gate_up_proj, [half, half])
            arms.append((m, dict(gate_up_proj=m.gate_up_proj, gate_proj=None, up_proj=None),
                         dict(gate_up_proj=None, gate_proj=g, up_proj=u)))
        elif isinstance(m, RMSNorm):
            arms.append((m, dict(cpu_ops=True), dict(cpu_ops=False)))
    return arms


def switch(arms, fused: bool) -> None:
    for m, on, off in arms:
        for key, value in (on if fused else off).items():
            setattr(m, key, value)


def paired(model, arms, n: int, context: int, pairs: int) -> dict:
    """One forward per arm in turn (the order flipped every pair), `pairs` times: the median time of
    each arm and the median of the per-pair ratios fused / separate. Pairs a fraction of a second
    apart see the same host; rounds of several forwards each did not (this host's bandwidth drifts
    by 10-30% within minutes)."""
    device = model.lm_head.weight.device
    cache = model.new_cache(context + n)
    cache.advance(context)
    x = torch.randint(0, model.config.vocab_size, (1, n), device=device)
    times = {True: [], False: []}
    for fused in (True, False):  # warm both
        switch(arms, fused)
        model(x, cache, context)
    for i in range(pairs):
        for fused in ((True, False) if i % 2 == 0 else (False, True)):
            switch(arms, fused)
            t0 = time.perf_counter()
            model(x, cache, context)
            times[fused].append(time.perf_counter() - t0)
    switch(arms, True)
    return {"fused_ms": round(1e3 * statistics.median(times[True]), 1),
            "separate_ms": round(1e3 * statistics.median(times[False]), 1),
            "ratio": round(statistics.median(f / s for f, s in zip(times[True], times[False])), 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="qwen2.5-coder-1.5b-instruct,qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--rows", default="1,2,3,5,8")
    ap.add_argument("--pairs", type=int, default=40, help="forward pairs per row count")
    ap.add_argument("--context", type=int, default=512, help="cached positions before the forward")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    out = {}
    for name in args.models.split(","):
        model = load_model(name, progress=lambda *a: None).module  # no prepacked copy: 1..8 rows never use it
        if not any(isinstance(m, Attention) and m.qkv_proj is not None for m in model.modules()):
            raise SystemExit(f"{name} loaded without our CPU kernels; nothing to compare")
        arms = prepare(model)
        out[name] = {str(n): paired(model, arms, n, args.context, args.pairs) for n in rows}
        del model, arms
    print(json.dumps({"context": args.context, "pairs": args.pairs, "results": out}, indent=1))


if __name__ == "__main__":
    main()
