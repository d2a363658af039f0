"""Costs measured on this machine: v(n) for the target and, for a draft model, c and the prefill's
price (fixed + per token), timed with bare forwards in a few seconds."""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Callable

import torch

from specdec.policy.costs import CostModel, fit_prefill

if TYPE_CHECKING:
    from specdec.model.transformer import Transformer


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, repeats: int) -> list[float]:
    """Seconds of each of `repeats` calls of fn, after one warm-up call."""
    times = []
    for _ in range(repeats + 1):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return times[1:]


def forward_seconds(model: Transformer, n: int, context: int, repeats: int, last_only: bool = False) -> float:
    """Median time of a forward over n new positions after `context` cached positions (last_only:
    logits for the last position alone, as a drafter's prefill asks)."""
    device = model.device
    cache = model.new_cache(context + n)
    cache.advance(context)
    x = torch.randint(0, model.config.vocab_size, (1, n), device=device)
    return statistics.median(timed(lambda: model(x, cache, context, last_only=last_only), device, repeats))


@torch.inference_mode()
def measure_costs(target: Transformer, draft: Transformer | None = None, sizes=(1, 2, 3, 5, 9), context: int = 256,
                  repeats: int = 3) -> CostModel:
    """v(n) for the target, and c and the prefill cost per prompt token for a draft model, timed on
    this machine (a few seconds: no forward here is a long prefill).

    target/draft: Transformer modules. Each forward runs at `context` cached positions."""
    caches = {}

    def step_seconds(model, n: int) -> float:
        # `context` slots taken without a prefill: attention costs the same whatever the cached values
        cache = caches.setdefault(id(model), model.new_cache(context + max(sizes) + 1))
        if cache.length == 0:
            cache.advance(context)
        x = torch.randint(0, model.config.vocab_size, (1, n), device=cache.k.device)
        times = sorted(timed(lambda: model(x, cache, context), cache.k.device, repeats))
        return times[len(times) // 2]

    t1 = step_seconds(target, 1)
    curve, floor = {}, 1.0
    for n in sorted(sizes):  # more positions never cost less: timing noise must not make v(n) dip
        floor = curve[n] = 1.0 if n == 1 else max(floor, step_seconds(target, n) / t1)
    if draft is None:
        return CostModel(curve, 0.0, t1)
    c = step_seconds(draft, 1) / t1
    short, long = max(context // 8, 1), max(context // 2, 2)  # the prefill's price: fixed + per token,
    fixed, per_token = fit_prefill(*((n, forward_seconds(draft, n, 0, 1, last_only=True) / t1)  # through two lengths
                                     for n in (short, long)))
    return CostModel(curve, c, t1, per_token, fixed)
