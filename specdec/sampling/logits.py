"""Pure logit processing: temperature, min-p, top-k, top-p -> fp32 probabilities; and sampling.

The same `probs_from_logits` turns target logits into p and draft logits into q, so both sides of
rejection sampling see identical processing. Everything stays on the logits' device.
"""

from __future__ import annotations

import math
import threading

import torch

from specdec.config import SamplingParams
from specdec.sampling.infill import infill_mask, infill_values

TOP_P_FIRST = 64  # the top tokens top-p ranks first (more, fourfold, while a nucleus is wider)


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Processed probabilities, fp32, same shape as `logits`.

    logits: # [..., vocab], any float dtype, any device
    temperature == 0 gives a one-hot at the argmax. Otherwise, in params.order (vLLM's unless told:
    temperature, min_p, top_k, top_p; llama.cpp's: top_k, top_p, min_p, temperature): divide by the
    temperature, drop the tokens below min_p x the top token's probability, keep the top_k largest (ties
    at the k-th value are all kept), keep the nucleus of mass top_p of what is left (the top token always
    stays); then renormalise.
    """
    return processed(logits, params, on_host=logits.device.type == "cpu")


def processed(logits: torch.Tensor, params: SamplingParams, on_host: bool) -> torch.Tensor:
    """probs_from_logits, by the host's path (on_host: top-k and top-p found by topk, reading a few values
    back to choose; on the CPU a read back costs nothing) or the device's (whole-vocabulary masks and a
    sort: no value read back, so it runs inside a CUDA graph and adds no host sync). Both keep the same
    tokens at the same probabilities (tests/test_sampling.py)."""
    logits = logits.float()
    if params.greedy:
        return _one_hot_argmax(logits)
    if on_host and 0 < params.top_k < logits.shape[-1] and _top_k_may_lead(params):
        probs = _top_k_probs(logits, params)
        if probs is not None:
            return probs
    for step in params.order:
        logits = _apply(step, logits, params, on_host)
    return torch.softmax(logits, dim=-1)


def _apply(step: str, logits: torch.Tensor, params: SamplingParams, on_host: bool) -> torch.Tensor:
    """One step of params.order on logits # [..., vocab] (a cut that is off leaves them as they are)."""
    if step == "temperature":
        return logits / params.temperature
    if step == "min_p" and params.min_p > 0.0:
        return _min_p_mask(logits, params.min_p)
    if step == "top_k" and params.top_k > 0:
        return _top_k_mask(logits, params.top_k)
    if step == "top_p" and params.top_p < 1.0:
        return _top_p_mask(logits, params.top_p) if on_host else _top_p_sorted(logits, params.top_p)
    if step == "infill":
        return infill_mask(logits, params.infill_vocab)
    return logits


def _top_k_may_lead(params: SamplingParams) -> bool:
    """Whether top-k may be taken first whatever the order: the temperature keeps the ranking and min-p's
    floor hangs on the top token alone, so only a top-p or the infill sampler before it changes what it
    keeps."""
    steps = [s for s in params.order if s in ("top_k", "top_p", "infill")]
    cuts = [s for s in steps if s != "top_k" and (s == "infill" or params.top_p < 1.0)]
    return not cuts or steps.index("top_k") < min(steps.index(s) for s in cuts)


def sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token id per distribution: probs # [..., vocab] (any non-negative weights) -> int64 # [...].

    Inverts each row's cumulative sum at one uniform draw: the token i with cdf[i - 1] <= u * total <
    cdf[i], so a token of weight 0 is never drawn. The sums are float64, so each token keeps its share
    of the mass to about 1e-16 of the total. torch.multinomial and the exponential race draw a random
    number per vocabulary entry: about 3 ms a row at 151,936 entries on this CPU, a tenth of a decode
    step; this takes about 0.25 ms. `generator` lives on probs' device; no host sync.
    """
    rows = probs.numel() // probs.shape[-1]
    u = torch.rand(rows, 1, generator=generator, device=probs.device, dtype=torch.float64)  # [rows, 1]
    return sample_at(probs, u)


def sample_at(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """sample() at given uniforms u # [rows, 1] float64 in [0, 1), one per row of probs # [..., vocab]
    (drawn before, e.g. outside a CUDA graph) -> int64 # [...]."""
    flat = probs.reshape(-1, probs.shape[-1])  # [rows, vocab]
    # a row at a time, each into the kept buffer (rows are few: one per sequence)
    tokens = torch.cat([_invert_cdf(row, u[i]) for i, row in enumerate(flat)])  # [rows]
    return tokens.reshape(probs.shape[:-1])


def _invert_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """weights # [vocab], u # [1] uniform in [0, 1) -> # [1] int64."""
    cdf = torch.cumsum(weights, 0, dtype=torch.float64, out=_cdf_buffer(weights))  # [vocab]
    return torch.searchsorted(cdf, u * cdf[-1], right=True).clamp_(max=weights.numel() - 1)


_buffers = threading.local()


def _cdf_buffer(weights: torch.Tensor) -> torch.Tensor:
    """A float64 buffer like weights, kept per thread, device and size: a fresh 1.2 MB tensor per token
    faulted its pages in every time here (1.0 ms a cumsum against 0.13 ms into a kept buffer). A normal
    tensor, even where the first call runs under inference mode: written under it and outside it alike."""
    cache = _buffers.__dict__.setdefault("cdf", {})
    key = (weights.device, weights.numel())
    if key not in cache:
        with torch.inference_mode(False):  # an inference tensor could not be written outside inference mode
            cache[key] = torch.empty(weights.numel(), dtype=torch.float64, device=weights.device)
    return cache[key]


def _one_hot_argmax(logits: torch.Tensor) -> torch.Tensor:
    """logits # [..., vocab] fp32 -> one-hot # [..., vocab] at the argmax."""
    best = logits.argmax(dim=-1, keepdim=True)  # [..., 1]
    return torch.zeros_like(logits).scatter_(-1, best, 1.0)


def _top_k_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor | None:
    """probs_from_logits' result where top_k cuts the vocabulary and may go first (_top_k_may_lead): the
    other steps worked out on the k best logits alone, in params.order, then scattered into the
    vocabulary (a few O(vocab) passes fewer than masking it whole). None where a row ties at its k-th
    value: all the ties are kept, the caller's whole-vocabulary path."""
    values, order = logits.topk(params.top_k, dim=-1)  # [..., k], best first
    if ((logits >= values[..., -1:]).sum(dim=-1) > params.top_k).any():
        return None
    for step in params.order:
        if step == "infill":
            values = infill_values(values, order, params.infill_vocab)
            if values is None:  # a row falls back to its end token, which may lie outside the k best
                return None
        elif step != "top_k":
            values = _apply(step, values, params, on_host=True)
    return torch.zeros_like(logits).scatter_(-1, order, torch.softmax(values, dim=-1))


def _min_p_mask(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """logits # [..., vocab] -> same, -inf where the probability is below min_p x the top one's
    (p_i / p_max = exp(l_i - l_max), so no softmax is needed; the top token always stays)."""
    floor = logits.amax(dim=-1, keepdim=True) + math.log(min_p)  # [..., 1]
    return logits.masked_fill(logits < floor, float("-inf"))


def _top_k_mask(logits: torch.Tensor, k: int) -> torch.Tensor:
    """logits # [..., vocab] -> same, -inf below the k-th largest value (ties at it are kept)."""
    if k >= logits.shape[-1]:
        return logits
    kth = logits.topk(k, dim=-1).values[..., -1:]  # [..., 1]
    return logits.masked_fill(logits < kth, float("-inf"))


def _top_p_mask(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """logits # [..., vocab] -> same, -inf outside the smallest top set whose mass reaches top_p.

    A token is kept when the mass of the tokens ranked above it is still below top_p, so the top
    token (mass above it: 0) is always kept. The ranking comes from topk over the best n tokens, n
    growing fourfold until every row's nucleus closes inside them, not from sorting the vocabulary:
    a sort of 151,936 logits took 13.9 ms a row on a 2-core Zen 4, this 0.8 ms (real logits:
    docs/results/raw/sampler-zen4/sampling_cost.json).
    """
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)  # [..., 1]
    vocab = logits.shape[-1]
    n = min(vocab, TOP_P_FIRST)
    while True:
        values, order = logits.topk(n, dim=-1)  # [..., n], best first
        probs = (values - lse).exp()
        keep = probs.cumsum(dim=-1) - probs < top_p  # the mass ranked above each is below top_p
        if n == vocab or not (keep[..., -1] & torch.isfinite(values[..., -1])).any():
            break  # no row keeps its n-th token, or nothing is left past it: every nucleus closed
        n = min(vocab, 4 * n)
    kept = values.masked_fill(~keep, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter_(-1, order, kept)


def _top_p_sorted(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """_top_p_mask by a sort of the whole vocabulary: no value is read back (the device's path)."""
    sorted_probs, order = torch.softmax(logits, dim=-1).sort(dim=-1, descending=True)  # [..., vocab]
    mass_above = sorted_probs.cumsum(dim=-1) - sorted_probs  # [..., vocab]
    keep = torch.zeros_like(mass_above, dtype=torch.bool).scatter_(-1, order, mass_above < top_p)
    return logits.masked_fill(~keep, float("-inf"))


def align_vocab(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """Cut or pad (with -inf) draft logits # [draft_vocab] to the target's vocab size."""
    if logits.shape[-1] >= vocab:
        return logits[..., :vocab]
    pad = logits.new_full((*logits.shape[:-1], vocab - logits.shape[-1]), float("-inf"))
    return torch.cat([logits, pad], dim=-1)
