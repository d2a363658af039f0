"""`specdec profile`: bandwidth, plain step time against the roofline, verify-cost curve v(n), draft ratio c.

v(n) = t(n) / t(1), the time of one target forward over n new positions at a realistic context
relative to a single-token decode step. c = draft step time / target step time.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from specdec.model.transformer import Transformer
from specdec.policy.measure import forward_seconds, prefill_price, ragged_fn

VERIFY_SIZES = (1, 2, 3, 5, 9, 17, 33)
POOL_ROWS = (1, 4, 16)  # a server's rows drafting together (one ragged draft forward), timed against one


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_seconds(fn, device: torch.device, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return best


def weight_bytes(model: Transformer) -> int:
    """Bytes of weights read per decode step: every weight once (a layer on GGUF blocks counts its
    blocks), except the input embedding, of which a step gathers one row; a tied embedding is read
    once, as the head; a mixture's experts at k / E of their bytes (a step reads k experts a layer)."""
    def storage(module: torch.nn.Module) -> set:
        return {t.data_ptr() for t in (*module.parameters(), *module.buffers())}
    cfg = model.config
    share = cfg.experts_per_token / cfg.num_experts if cfg.num_experts else 1.0
    embed = model.model.embed_tokens
    skip = storage(embed) - storage(model.lm_head)
    seen, total = set(), 0.0
    for name, t in (*model.named_parameters(), *model.named_buffers()):
        if name.startswith("rope_") or t.data_ptr() in skip or t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size() * (share if ".mlp.experts." in name else 1.0)
    return round(total)


def roofline_rounds(model: Transformer, context: int, rounds: int, bandwidth_mb: int) -> dict:
    """Bandwidth and plain step time measured in alternating pairs, so that both see the same
    machine. On this shared host the attainable bandwidth swings between about 15 and 37 GB/s
    from one second to the next; a bandwidth taken apart from the step (or the best of several
    probes against a typical step) turns that swing into a roofline gap. Each round times one
    GEMV pass over as many bytes as a step reads (a 2 GB buffer, larger than any cache, read
    repeatedly with torch's GEMV), then
    one plain step; the result is the median over rounds of the per-round ratio (and the medians
    of its two parts)."""
    device = model.device
    nbytes = weight_bytes(model)
    cols = 4096
    w = torch.ones(bandwidth_mb * (1 << 20) // 4 // cols, cols, dtype=torch.float32, device=device)  # [rows, cols]
    v = torch.ones(cols, 1, dtype=torch.float32, device=device)
    passes = max(1, round(nbytes / (w.numel() * 4)))

    readers = [lambda: w @ v]  # torch's GEMV (MKL on CPU)

    def stream_with(read):
        for _ in range(passes):
            read()
    cache = model.new_cache(context + 1)
    cache.advance(context)
    x = torch.randint(0, model.config.vocab_size, (1, 1), device=device)
    model(x, cache, context)  # warm-up
    for read in readers:
        stream_with(read)
    bws, steps, fractions = [], [], []
    for _ in range(rounds):
        bw = passes * w.numel() * 4 / min(best_seconds(lambda: stream_with(r), device, 1) for r in readers) / 1e9
        step = best_seconds(lambda: model(x, cache, context), device, 1)
        bws.append(bw)
        steps.append(step)
        fractions.append(nbytes / step / (bw * 1e9))
    return {"bandwidth_gbs": statistics.median(bws), "step_seconds": statistics.median(steps),
            "roofline_fraction": statistics.median(fractions),
            "rounds": [{"bandwidth_gbs": round(b, 2), "step_seconds": round(s, 5), "fraction": round(f, 3)}
                       for b, s, f in zip(bws, steps, fractions)]}


def forward_fn(model: Transformer, n: int, context: int):
    """A callable running one forward over n new positions after `context` cached positions."""
    device = model.device
    cache = model.new_cache(context + n)
    cache.advance(context)
    x = torch.randint(0, model.config.vocab_size, (1, n), device=device)
    return lambda: model(x, cache, context)


def interleaved_seconds(fns: dict, device: torch.device, repeats: int) -> dict:
    """Each callable timed once per round, the rounds interleaving all of them (after one warm-up
    round), so that the host's drift hits every one alike: {key: [seconds per round]}."""
    times = {key: [] for key in fns}
    for r in range(repeats + 1):
        for key, fn in fns.items():
            synchronize(device)
            t0 = time.perf_counter()
            fn()
            synchronize(device)
            if r:
                times[key].append(time.perf_counter() - t0)
    return times


def profile(target: Transformer, draft: Transformer | None, context: int = 512, repeats: int = 7,
            bandwidth_mb: int = 2048, head=None) -> dict:
    """v(n) and c are medians of per-round ratios to the target's one-token step timed in the same
    round (sizes interleaved), so a drift of the host's bandwidth between sizes does not bend the curve;
    a draft's d(n) (draft_rows) likewise, to its one-row ragged forward.
    head: a self-drafting head's one-token callable (a drafter's entry()): its c as head_cost_ratio."""
    device = target.device
    paired = roofline_rounds(target, context, 2 * repeats + 1, bandwidth_mb)
    fns = {n: forward_fn(target, n, context) for n in VERIFY_SIZES}
    if draft is not None:
        fns["draft"] = forward_fn(draft, 1, context)
        fns.update({f"rows{n}": ragged_fn(draft, n, context) for n in POOL_ROWS})
    if head is not None:
        fns["head"] = head
    times = interleaved_seconds(fns, device, repeats)
    t = {key: statistics.median(ts) for key, ts in times.items()}

    def ratio(key, over=1) -> float:
        return statistics.median(a / b for a, b in zip(times[key], times[over]))
    roofline = paired["bandwidth_gbs"] * 1e9 / weight_bytes(target)
    result = {"device": str(device), "dtype": str(target.dtype),
              "weight_dtype": target.weight_format, "context": context,
              "bandwidth_gbs": round(paired["bandwidth_gbs"], 2), "weight_bytes": weight_bytes(target),
              "step_seconds": round(paired["step_seconds"], 5),
              "plain_tokens_per_second": round(1 / paired["step_seconds"], 3),
              "roofline_tokens_per_second": round(roofline, 3),
              "roofline_fraction": round(paired["roofline_fraction"], 3),
              "roofline_rounds": paired["rounds"],
              "forward_seconds": {str(n): round(t[n], 5) for n in VERIFY_SIZES},
              "verify_cost": {str(n): round(ratio(n), 3) for n in VERIFY_SIZES}}
    if head is not None:
        result.update({"head_step_seconds": round(t["head"], 5), "head_cost_ratio": round(ratio("head"), 3)})
    if draft is not None:
        rows, floor = {}, 1.0  # d(n): a pooled draft position over n rows (a server's) against one row's
        for n in POOL_ROWS:  # more rows never cost less
            floor = rows[str(n)] = round(max(floor, ratio(f"rows{n}", "rows1")), 3)
        # the draft's prefill as the drafter runs it (the LM head scores the last position only:
        # scoring all 512 would add a 512-row full-vocabulary GEMM), at a short and a context-long
        # prompt: a fixed part per forward and a part per token (policy.CostModel.prefill)
        fixed, per_token, quadratic = prefill_price(
            draft, lambda n: forward_seconds(draft, n, 0, 3 if n <= context else 1, last_only=True) / t[1],
            max(context // 8, 1), context)
        result.update({"draft_step_seconds": round(t["draft"], 5), "draft_cost_ratio": round(ratio("draft"), 3),
                       "draft_prefill_cost": round(per_token, 5), "draft_prefill_fixed": round(fixed, 4),
                       "draft_prefill_quadratic": round(quadratic, 9), "draft_rows": rows})
    return result


def print_profile(r: dict) -> None:
    print(f"bandwidth {r['bandwidth_gbs']} GB/s | weights {r['weight_bytes'] / 1e9:.2f} GB | "
          f"plain {r['plain_tokens_per_second']} tok/s vs roofline {r['roofline_tokens_per_second']} tok/s "
          f"({100 * r['roofline_fraction']:.0f}%)")
    print("v(n): " + "  ".join(f"v({n})={v}" for n, v in r["verify_cost"].items()))
    if "draft_cost_ratio" in r:
        print(f"draft step {r['draft_step_seconds'] * 1000:.1f} ms, c = {r['draft_cost_ratio']}, "
              f"draft prefill {r.get('draft_prefill_fixed', 0)} + {r.get('draft_prefill_cost', 0)} plain steps "
              f"per prompt token + {r.get('draft_prefill_quadratic', 0)} per token squared")
        if "draft_rows" in r:
            print("pooled draft rows: " + "  ".join(f"d({n})={d}" for n, d in r["draft_rows"].items()))
    if "head_cost_ratio" in r:
        print(f"head entry {r['head_step_seconds'] * 1000:.1f} ms, c = {r['head_cost_ratio']}")


def write_profile(r: dict, out: str) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(r, indent=1))
