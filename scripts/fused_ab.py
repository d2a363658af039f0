"""Fused projections and ops against separate ones inside the model, A/B in one process.

"fused" is the model as the engine loads it on a CPU with our kernels: q/k/v and gate/up as one
GEMM each, RMSNorm, RoPE and attention on our fused ops (cpu_linear.fuse_for_cpu). "separate" is
session 9's engine: q, k, v, gate and up as separate GEMMs (row views of the fused weights, on
the same kernel) and torch's ops for RMSNorm, RoPE and attention. One forward over n new positions
at context 512, the two arms alternated over rounds so that both see the same machine. Prints JSON.

Usage: python scripts/fused_ab.py [--models qwen2.5-coder-1.5b-instruct,qwen2.5-coder-0.5b-instruct]
                                  [--rows 1,2,3,5,8] [--rounds 5] > docs/results/fused-ab.json
"""

import argparse
import json
import statistics

from torch import nn

from specdec.bench.profile import forward_seconds
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
            hq, hkv = m.n_heads * m.hd, m.n_kv * m.hd
            q, k, v = split_views(m.qkv_proj, [hq, hkv, hkv])
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="qwen2.5-coder-1.5b-instruct,qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--rows", default="1,2,3,5,8")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=5, help="forwards per timing (median)")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    out = {}
    for name in args.models.split(","):
        model = load_model(name, progress=lambda *a: None).module  # no prepacked copy: 1..8 rows never use it
        if not any(isinstance(m, Attention) and m.qkv_proj is not None for m in model.modules()):
            raise SystemExit(f"{name} loaded without our CPU kernels; nothing to compare")
        arms = prepare(model)
        times = {}
        for _ in range(args.rounds):
            for fused in (True, False):
                switch(arms, fused)
                for n in rows:
                    times.setdefault((fused, n), []).append(forward_seconds(model, n, 512, args.repeats))
        out[name] = {str(n): {"fused_ms": round(1e3 * statistics.median(times[(True, n)]), 1),
                              "separate_ms": round(1e3 * statistics.median(times[(False, n)]), 1),
                              "ratio": round(statistics.median(times[(True, n)]) / statistics.median(times[(False, n)]), 3)}
                     for n in rows}
        del model, arms
    print(json.dumps({"context": 512, "rounds": args.rounds, "results": out}, indent=1))


if __name__ == "__main__":
    main()
