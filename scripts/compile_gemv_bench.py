"""Issue 4's "torch.compile with the C++ GEMM template", measured on the 1.5B model's own matrix
shapes: eager F.linear (MKL, as the engine's single-row path) against inductor's max-autotune with
the CPP GEMM template allowed, for 1 and 5 rows, fp32. Reports each as weight GB/s (bytes of the
matrix / seconds), medians over interleaved repetitions (this host's bandwidth drifts).

    python scripts/compile_gemv_bench.py --out runs/perf/compile-gemv.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = {  # name: (in_features, out_features), Qwen2.5-Coder-1.5B
    "q_proj": (1536, 1536), "gate_proj": (1536, 8960), "down_proj": (8960, 1536), "lm_head": (1536, 151936),
}


def seconds(fn, x, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(x)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,5")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import torch._inductor.config as cfg
    cfg.max_autotune_gemm_backends = "CPP,ATEN"
    results = {"torch": torch.__version__, "threads": torch.get_num_threads(), "shapes": {}}
    for name, (k, n) in SHAPES.items():
        w = torch.randn(n, k) * 0.02
        nbytes = w.numel() * 4
        for m in [int(r) for r in args.rows.split(",")]:
            x = torch.randn(m, k)
            eager = lambda a: F.linear(a, w)  # noqa: E731
            t0 = time.perf_counter()
            compiled = torch.compile(lambda a: F.linear(a, w), mode="max-autotune", dynamic=False)
            with torch.no_grad():
                torch.testing.assert_close(compiled(x), eager(x), rtol=1e-4, atol=1e-4)
            compile_s = time.perf_counter() - t0
            e, c = [], []
            with torch.no_grad():
                for _ in range(args.rounds):  # interleaved: both see the same machine
                    e += seconds(eager, x, args.repeats)
                    c += seconds(compiled, x, args.repeats)
            row = {"eager_gbs": round(nbytes / statistics.median(e) / 1e9, 2),
                   "compiled_gbs": round(nbytes / statistics.median(c) / 1e9, 2),
                   "compile_seconds": round(compile_s, 1)}
            row["compiled_over_eager"] = round(row["compiled_gbs"] / row["eager_gbs"], 3)
            results["shapes"][f"{name} M={m}"] = row
            print(f"{name:10s} M={m}: eager {row['eager_gbs']} GB/s, compiled {row['compiled_gbs']} GB/s "
                  f"({row['compiled_over_eager']}x), compile {row['compile_seconds']} s", flush=True)
            torch._dynamo.reset()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
