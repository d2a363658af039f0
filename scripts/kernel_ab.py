"""Our kernel against torch's GEMMs inside the model, A/B in one process: one forward over n new
positions at context 512, with every PackedLinear switched to our kernel (on) and back to torch's
(off: MKL for one row, oneDNN-prepacked for several on the target, MKL on the unpacked draft),
alternated over rounds so that both see the same machine. Since session 10 "on" also means our
fused RMSNorm, RoPE and attention, and both arms run q/k/v and gate/up as one GEMM each
(scripts/fused_ab.py measures the fusion alone). Prints JSON.

Usage: python scripts/kernel_ab.py [--models qwen2.5-coder-1.5b-instruct,qwen2.5-coder-0.5b-instruct]
                                   [--rows 1,2,3,5,8,9] [--rounds 3] > docs/results/kernel-ab.json

The target is loaded as the engine loads it (prepacked copy kept); a model whose name does not
contain "1.5b" is loaded as the engine loads a draft model (no prepacked copy).
"""

import argparse
import json
import statistics

from specdec.bench.profile import forward_seconds
from specdec.model import load_model
from specdec.model.cpu_linear import PackedLinear
from specdec.model.transformer import Attention, RMSNorm


def switch(model, on: bool) -> None:
    for mod in model.modules():
        if isinstance(mod, PackedLinear):
            mod.skinny = on
        elif isinstance(mod, (Attention, RMSNorm)):
            mod.cpu_ops = on  # our fused ops go with the kernel; off: torch's RMSNorm, RoPE and attention


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="qwen2.5-coder-1.5b-instruct,qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--rows", default="1,2,3,5,8,9")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5, help="forwards per timing (median)")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    out = {}
    for name in args.models.split(","):
        model = load_model(name, progress=lambda *a: None, pack="1.5b" in name).module
        times = {}
        for _ in range(args.rounds):
            for on in (True, False):
                switch(model, on)
                for n in rows:
                    times.setdefault((on, n), []).append(forward_seconds(model, n, 512, args.repeats))
        out[name] = {str(n): {"kernel_ms": round(1e3 * statistics.median(times[(True, n)]), 1),
                              "torch_ms": round(1e3 * statistics.median(times[(False, n)]), 1),
                              "ratio": round(statistics.median(times[(True, n)]) / statistics.median(times[(False, n)]), 3)}
                     for n in rows}
        del model
    print(json.dumps({"context": 512, "rounds": args.rounds, "results": out}, indent=1))


if __name__ == "__main__":
    main()
