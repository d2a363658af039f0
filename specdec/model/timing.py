"""Wall-clock seconds of work on a device: the device synchronized before and after each call, so a
CUDA kernel's time counts where it runs, not where it was queued. The policy's cost measurements
(policy/measure.py) and a drafter timing its own draft token (drafters/base.py) share it."""

from __future__ import annotations

import time
from typing import Callable

import torch


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
