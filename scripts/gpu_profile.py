"""Where a GPU step's time goes, kernel by kernel: a decode step and a 5-row verify of a model in a real
shape (random weights, bf16, a 512-token context), on the torch path and on the Triton layer loop
(--gpu-kernels), run eagerly (a CUDA graph replays the same kernels, without their launches' host time);
then the attention kernel's key split swept at two contexts. torch.profiler gives each kernel's device
time; the weights a step reads, at the copy bandwidth measured beside it, against the step's sum of
kernel times is its share of the memory roofline (`roofline_share`).

    PYTHONPATH=. python3 scripts/gpu_profile.py --out runs/gpu-profile.json
    PYTHONPATH=. python3 scripts/gpu_profile.py --device cpu --target tiny-target --out /tmp/p.json
      (on the CPU: the code runs, the kernels in Triton's interpreter under TRITON_INTERPRET=1; CPU op times)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from specdec.bench.profile import synchronize, weight_bytes
from specdec.bench.synthetic import SHAPES, successor_model
from specdec.model import gpu_forward, gpu_kernels

MODES = ("torch", "kernels")
SPLITS = (32, 64, 128, 256, 512)


def steps(model, context: int, capacity: int) -> dict:
    """{name: a callable running one forward of that size at the context's end} (the cache is not moved)."""
    device = model.device
    cache = model.new_cache(capacity)
    prompt = torch.randint(0, model.config.vocab_size, (1, context), generator=torch.Generator().manual_seed(0))
    model(prompt.to(device), cache, 0, last_only=True)
    cache.advance(context)
    tokens = {n: torch.zeros(1, n, dtype=torch.long, device=device) for n in (1, 5)}
    return {"decode": lambda: model(tokens[1], cache, context, last_only=True),
            "verify5": lambda: model(tokens[5], cache, context)}


def kernel_table(fn, device: torch.device, repeats: int, top: int) -> dict:
    """fn's kernels (on a CPU: its operators) by device time a call, most first, with the call's sum."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    for _ in range(3):
        fn()
    synchronize(device)
    with profile(activities=activities) as prof:
        for _ in range(repeats):
            fn()
        synchronize(device)
    rows = []
    for e in prof.key_averages():
        if device.type == "cuda":
            us = e.self_device_time_total if e.device_type.name == "CUDA" else 0.0
        else:
            us = e.self_cpu_time_total if e.key.startswith("aten::") else 0.0
        if us > 0:
            rows.append((e.key, us / repeats, e.count / repeats))
    rows.sort(key=lambda r: -r[1])
    total = sum(r[1] for r in rows)
    return {"step_us": round(total, 1), "kernels_per_step": round(sum(r[2] for r in rows), 1),
            "top": [{"name": name[:120], "us": round(us, 1), "share": round(us / total, 3), "calls": round(n, 1)}
                    for name, us, n in rows[:top]]}


def copy_bandwidth(device: torch.device, mb: int) -> float:
    """Bytes a second of a device-to-device copy (read + write), best of 5."""
    src = torch.empty(mb << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        synchronize(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() / best


def split_sweep(model, contexts: list[int], capacity: int, repeats: int) -> dict:
    """The attention kernel alone (one layer, a decode step) at each key split: microseconds a call."""
    cfg, device, dtype = model.config, model.device, model.dtype
    width = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
    qkv = torch.randn(1, 1, width, device=device, dtype=dtype)
    k, v = (torch.randn(1, cfg.num_kv_heads, capacity, cfg.head_dim, device=device, dtype=dtype) for _ in range(2))
    rows = torch.zeros(1, dtype=torch.long, device=device)
    out = {}
    for context in contexts:
        slots = torch.full((1, 1), context, dtype=torch.long, device=device)
        times = {}
        for split in SPLITS:
            fn = lambda: gpu_kernels.attention(qkv, k, v, rows, slots, None, cfg.num_heads, 0.1,  # noqa: E731
                                               split_keys=split)
            fn()
            runs = []
            for _ in range(repeats):
                synchronize(device)
                t0 = time.perf_counter()
                fn()
                synchronize(device)
                runs.append(time.perf_counter() - t0)
            times[str(split)] = round(statistics.median(runs) * 1e6, 1)
        out[str(context)] = times
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--target", default="qwen2.5-coder-1.5b", choices=sorted(SHAPES))
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--capacity", type=int, default=4096)
    ap.add_argument("--sweep-contexts", default="512,2048")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--bandwidth-mb", type=int, default=2048)
    args = ap.parse_args()
    modes = args.modes.split(",")
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"unknown mode {bad[0]!r}; modes are {', '.join(MODES)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda needs a GPU; use --device cpu")
    try:
        sweep = [int(c) for c in args.sweep_contexts.split(",")]
    except ValueError:
        ap.error(f"--sweep-contexts takes comma-separated token counts, got {args.sweep_contexts!r}")
    if not all(0 < c < args.capacity for c in [args.context, *sweep]):
        ap.error(f"--context and --sweep-contexts must lie between 0 and --capacity ({args.capacity}), exclusive")
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "target": args.target, "dtype": args.dtype, "context": args.context, "modes": {}}
    bandwidth = copy_bandwidth(device, args.bandwidth_mb)
    report["copy_bandwidth_gbs"] = round(bandwidth / 1e9, 1)
    for mode in modes:
        model, _ = successor_model(args.target, args.device, dtype, 0)
        if mode == "kernels":
            gpu_forward.enable(model)
        roofline_us = weight_bytes(model) / bandwidth * 1e6
        tables = {name: kernel_table(fn, device, args.repeats, args.top)
                  for name, fn in steps(model, args.context, args.capacity).items()}
        for table in tables.values():
            table["roofline_share"] = round(roofline_us / table["step_us"], 5)
        report["modes"][mode] = {"weights_roofline_us": round(roofline_us, 1), **tables}
        if mode == "kernels":
            report["attention_split_us"] = split_sweep(model, sweep, args.capacity, args.repeats)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
