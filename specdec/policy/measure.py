"""Costs measured on this machine: v(n) for the target and, for a draft model, c, the prefill's
price (fixed + per token) and, for a server's slots drafting together, d(n), a pooled draft forward over
n rows against one row's, timed with bare forwards in a few seconds, and kept per host, model pair,
weight format and kernel build under $SPECDEC_HOME/costs (`cached_costs`), so a start with a draft
does not pay the measurement again.

Every ratio is taken against plain steps timed right beside it (t1, the step, t1, the step, ...), so a
busy spell of the host while measuring scales both sides alike instead of pricing one of them high."""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch

from specdec.config import SamplingParams
from specdec.drafters.device_chain import DeviceChains
from specdec.errors import SpecdecError
from specdec.model import cpu_kernels
from specdec.model.registry import specdec_home
from specdec.model.timing import sync, timed  # noqa: F401 (sync re-exported: specdec.policy.sync)
from specdec.policy.costs import CostModel, fit_prefill, quadratic_part
from specdec.sampling.verify import ragged_inputs

if TYPE_CHECKING:
    from specdec.model.transformer import Transformer


def forward_seconds(model: Transformer, n: int, context: int, repeats: int, last_only: bool = False) -> float:
    """Median time of a forward over n new positions after `context` cached positions (last_only:
    logits for the last position alone, as a drafter's prefill asks)."""
    device = model.device
    cache = model.new_cache(context + n)
    cache.advance(context)
    x = torch.randint(0, model.config.vocab_size, (1, n), device=device)
    return statistics.median(timed(lambda: model(x, cache, context, last_only=last_only), device, repeats))


def measure_costs(target: Transformer, draft: Transformer | None = None, sizes=(1, 2, 3, 5, 9), context: int = 256,
                  repeats: int = 3, batches=()) -> CostModel:
    """v(n) for the target, and c and the prefill cost per prompt token for a draft model, timed on
    this machine (a few seconds: no forward here is a long prefill); d(n) at the row counts `batches`
    for a draft model that drafts a server's rows together.

    target/draft: Transformer modules. Each forward runs at `context` cached positions."""
    return _measure(target, draft, sizes, context, repeats, batches)[0]


def ragged_fn(model: Transformer, n: int, context: int, cache=None) -> Callable[[], torch.Tensor]:
    """A callable running a ragged forward of one new token in each of n cache rows (of `cache`, default
    one of its own) at `context` cached positions: a pooled draft position (drafters/draft_model.py,
    propose_chains)."""
    device = model.device
    cache = model.new_cache(context + 1, batch=n) if cache is None else cache
    tokens, slots, positions, mask = ragged_inputs([context] * n, [[1]] * n, device)
    rows = torch.arange(n, device=device)
    return lambda: model(tokens, cache, 0, positions=positions, mask=mask, slots=slots, rows=rows)


def ragged_seconds(model: Transformer, n: int, context: int, repeats: int) -> float:
    """Median time of ragged_fn's forward."""
    return statistics.median(timed(ragged_fn(model, n, context), model.device, repeats))


@torch.inference_mode()
def _measure(target: Transformer, draft: Transformer | None, sizes, context: int = 256,
             repeats: int = 3, batches=()) -> tuple[CostModel, float]:
    """measure_costs, and the spread of its plain steps (slowest over fastest)"""
    caches = {}

    def step_seconds(model, n: int) -> float:
        # `context` slots taken without a prefill: attention costs the same whatever the cached values
        cache = caches.setdefault(id(model), model.new_cache(context + max(sizes) + 1))
        if cache.length == 0:
            cache.advance(context)
        x = torch.randint(0, model.config.vocab_size, (1, n), device=cache.k.device)
        times = sorted(timed(lambda: model(x, cache, context), cache.k.device, repeats))
        return times[len(times) // 2]

    ones: list[float] = []  # every plain step timed, beside each other measurement

    def relative(seconds: Callable[[], float]) -> float:
        """seconds() over the plain steps timed just before and just after it"""
        before = step_seconds(target, 1)
        value = seconds()
        after = step_seconds(target, 1)
        ones.extend((before, after))
        return value / ((before + after) / 2)

    curve, floor = {1: 1.0}, 1.0
    for n in sorted(set(sizes) - {1}):  # more positions never cost less: timing noise must not make v(n) dip
        floor = curve[n] = max(floor, relative(lambda: step_seconds(target, n)))
    if draft is None:
        if not ones:
            ones.append(step_seconds(target, 1))
        return CostModel(curve, 0.0, statistics.median(ones)), spread(ones)
    if draft.graphs is None:
        c = relative(lambda: step_seconds(draft, 1))
    else:  # its chains are drafted on the device, one graph a chain: c as a chain pays it
        cache = caches.setdefault(id(draft), draft.new_cache(context + max(sizes) + 1))
        c = relative(lambda: chain_token_seconds(draft, cache, context, CHAIN, repeats))
    fixed, per_token, quadratic = prefill_price(
        draft, lambda n: relative(lambda: forward_seconds(draft, n, 0, 1, last_only=True)),
        max(context // 8, 1), max(context // 2, 2))
    rows = {1: 1.0}
    if any(n > 1 for n in batches):
        one, floor = relative(lambda: ragged_seconds(draft, 1, context, repeats)), 1.0
        for n in sorted(set(batches) - {1}):  # more rows never cost less
            floor = rows[n] = max(floor, relative(lambda: ragged_seconds(draft, n, context, repeats)) / one)
    return CostModel(curve, c, statistics.median(ones), per_token, fixed, quadratic, rows), spread(ones)


def chain_token_seconds(draft: Transformer, cache, context: int, k: int, repeats: int) -> float:
    """A draft model's price a token where it drafts on the device (device_chain.py; one CUDA graph a chain
    where the model replays graphs): the median time of feeding one token at `context` cached positions and
    drafting a k-token greedy chain from it, over k. The cache is left at `context`."""
    chains = DeviceChains(draft.graphs is not None)

    def run():
        cache.truncate(context)
        chains.draft(draft, cache, [1], k, SamplingParams(), None, draft.config.vocab_size, False)
    cache.truncate(context)
    seconds = statistics.median(timed(run, cache.k.device, repeats)) / k
    cache.truncate(context)
    return seconds


def prefill_price(draft: Transformer, cost: Callable[[int], float], short: int, long: int) -> tuple[float, float, float]:
    """The draft's prefill price in plain steps, (fixed, per token, per token squared), from cost(n), a
    prefill of n prompt tokens timed in plain steps: the affine part through a short and a long prompt,
    attention's square from a LONG_PREFILL-token one where the draft holds that many."""
    fixed, per_token = fit_prefill((short, cost(short)), (long, cost(long)))
    if draft.config.max_position_embeddings < LONG_PREFILL or LONG_PREFILL <= long:
        return fixed, per_token, 0.0
    return fixed, per_token, quadratic_part(fixed, per_token, (LONG_PREFILL, cost(LONG_PREFILL)))


def spread(times: list[float]) -> float:
    """How far a run's plain steps strayed: the second slowest over the second fastest (one cold or
    stalled step alone does not count), or slowest over fastest where there are fewer than six."""
    s = sorted(times)
    return s[-2] / s[1] if len(s) >= 6 else s[-1] / s[0]


def fingerprint(model: Transformer) -> str:
    """What identifies a loaded model's step time: its shape, its weight format and each layer's block
    types and first bytes (the same file loaded the same way gives the same string). A CPU-backend
    model says so itself (`fingerprint_key`: its file's tensors and how they were loaded), so that a
    draft not loaded yet (model.DeferredModule) has the same fingerprint as when it is."""
    h = hashlib.sha256(repr((model.config, getattr(model, "weight_format", None))).encode())
    key = getattr(model, "fingerprint_key", None)
    if key is not None:
        h.update(key.encode())
        return h.hexdigest()[:16]
    for name, module in model.named_modules():
        parts = getattr(module, "parts", None)
        if parts:
            for qtype, data in parts:
                h.update(f"{name}:{qtype}:{tuple(data.shape)}".encode())
                h.update(data.reshape(-1)[:64].cpu().numpy().tobytes())
        elif isinstance(module, torch.nn.Linear):
            h.update(f"{name}:{module.weight.dtype}:{tuple(module.weight.shape)}".encode())
            h.update(module.weight.reshape(-1)[:16].detach().cpu().float().numpy().tobytes())
    return h.hexdigest()[:16]


def host_key(device: torch.device) -> str:
    """The host as far as speed goes: the CPU's model name and flags, its threads, the kernel build."""
    cpu = ""
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = "\n".join(sorted({line for line in info if line.startswith(("model name", "flags"))}))
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    return f"{cpu}|{os.cpu_count()}|{torch.get_num_threads()}|{cpu_kernels.build_id()}|{gpu}|{torch.__version__}"


COSTS_VERSION = 2  # 2: the prefill's part per token squared
CHAIN = 4  # the chain a device-drafting draft model's c is timed on (the default k)
LONG_PREFILL = 1024  # the draft prefill's length that prices attention's square (a RAG or summary prompt's)
RECHECK = 1.5  # a cached plain step this much slower than a fresh one is measured again


def step_mode(model: Transformer | None) -> str:
    """How a CUDA model's steps run, which changes their time and not its fingerprint: under CUDA graphs,
    through the fused GPU loop ("" elsewhere)."""
    if model is None or model.device.type != "cuda":
        return ""
    return f"graphs={model.graphs is not None}|loop={type(model.layer_loop).__name__}"


def _cost_path(target: Transformer, draft: Transformer | None, sizes, batches=()) -> Path:
    modes = [step_mode(target), step_mode(draft)]
    key = json.dumps([COSTS_VERSION, host_key(target.device), fingerprint(target),
                      fingerprint(draft) if draft is not None else None, sorted(sizes)] + (modes if any(modes) else [])
                     + ([sorted(batches)] if batches else []))
    return specdec_home() / "costs" / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


@torch.inference_mode()
def cached_costs(target: Transformer, draft: Transformer | None = None, sizes=(1, 2, 3, 5, 9),
                 progress: Callable[[str], None] = lambda m: None, batches=()) -> CostModel:
    """measure_costs, kept in $SPECDEC_HOME/costs under the host, both models' fingerprints, the kernel
    build, the sizes and the pooled draft's row counts. A cached entry is used as it is, with no step
    timed at start: the costs are ratios to a plain step, and the policy's calibration scales them by the
    live step times from the first steps on. Live plain steps faster by RECHECK than the entry's (it was measured on a busy host)
    mark the entry stale (mark_stale, from policy/calibration.py), and the next start measures again. A
    measurement whose plain steps spread by more than RECHECK (a busy host) is not kept; where a
    cached entry exists, that entry is used instead (measured on a quiet host, it is the better guess)."""
    path = _cost_path(target, draft, sizes, batches)
    try:
        data = json.loads(path.read_text())
        cached = CostModel({int(n): v for n, v in data["verify_cost"].items()}, data["draft_cost"],
                           data["step_seconds"], data["prefill_cost"], data["prefill_fixed"],
                           data["prefill_quadratic"], {int(n): d for n, d in data.get("draft_rows", {1: 1.0}).items()},
                           source=str(path))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, SpecdecError):
        cached = None
    if cached is not None and cached.step_seconds and not data.get("stale"):
        progress(f"policy costs: from {path}")
        return cached
    t0 = time.perf_counter()
    costs, spread = _measure(target, draft, sizes, batches=batches)
    if spread <= RECHECK:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"verify_cost": costs.verify_cost, "draft_cost": costs.draft_cost,
                                   "step_seconds": costs.step_seconds, "prefill_cost": costs.prefill_cost,
                                   "prefill_fixed": costs.prefill_fixed,
                                   "prefill_quadratic": costs.prefill_quadratic, "draft_rows": costs.draft_rows,
                                   "measured_seconds":
                                   round(time.perf_counter() - t0, 2), "measured_at": time.time()}))
        os.replace(tmp, path)
        costs.source = str(path)
    elif cached is not None:
        progress(f"policy costs: plain steps spread {spread:.2f}x while measuring (a busy host); the cached "
                 f"entry is used, {path}")
        return cached
    else:
        progress(f"policy costs: plain steps spread {spread:.2f}x while measuring (a busy host); not kept")
    return costs


def mark_stale(costs: CostModel) -> None:
    """Live plain steps ran RECHECK times faster than the cached entry `costs` came from says (it was
    measured on a busy host): the entry is marked stale, so that the next start measures afresh (and
    keeps the entry should that measurement be noisy too). This run keeps the costs: the policy's
    calibration scales them by the live step times."""
    if not costs.source:
        return
    path, costs.source = Path(costs.source), None
    try:
        data = json.loads(path.read_text())
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({**data, "stale": True}))
        os.replace(tmp, path)
    except (OSError, ValueError, TypeError):
        pass  # gone or unreadable: the next start measures anyway
