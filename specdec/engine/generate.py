"""Single-sequence speculative generation, streaming: the step (specdec.engine.step) over one sequence.

Plain decoding is the same loop with a drafter that proposes nothing (k = 0 per step).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from specdec.config import GenerationConfig
from specdec.drafters.base import Drafter
from specdec.engine.step import Sequence, check_fits, make_generator, prefill, step
from specdec.metrics import GenerationStats
from specdec.model.transformer import Transformer
from specdec.policy import FixedPolicy

__all__ = ["GenerationResult", "SpeculativeGenerator", "make_generator"]


@dataclass
class GenerationResult:
    tokens: list[int]  # new tokens only (an end-of-sequence token, if hit, is the last one)
    stats: GenerationStats
    finish_reason: str  # "stop" (end-of-sequence) or "length"
    logprobs: list | None = None  # TokenLogprob per new token, where cfg.logprobs asks
    prompt_logprobs: list | None = None  # per prompt token (the first: None), where cfg.prompt_logprobs asks


class SpeculativeGenerator:
    """Generates with one target and one drafter; reuses the target's KV cache across requests.

    With a policy (specdec.policy.AdaptivePolicy), cfg.k is the largest draft length and the policy
    picks each step's action (0 = a plain step) from its cost model and the acceptance seen so far."""

    def __init__(self, target: Transformer, drafter: Drafter, capacity: int, policy=None, cache=None):
        """cache: share another generator's KV cache (generators used one at a time)."""
        self.target = target
        self.drafter = drafter
        self.cache = cache if cache is not None else target.new_cache(capacity)
        self.policy = policy

    def check_fits(self, prompt: list[int], max_new_tokens: int) -> None:
        check_fits(self.cache.capacity, self.drafter, prompt, max_new_tokens)

    def sequence(self, prompt: list[int], cfg: GenerationConfig, eos_ids: set[int] = frozenset(),
                 on_tokens: Callable[[list[int]], None] | None = None, constraint=None) -> Sequence:
        """A new sequence on this generator's cache, drafter and policy (not prefilled yet); constraint:
        its grammar (a specdec.constraints.Constraint, fresh), or None."""
        self.check_fits(prompt, cfg.max_new_tokens)
        return Sequence(list(prompt), len(prompt), cfg, set(eos_ids), make_generator(cfg.sampling.seed, self.cache.k.device),
                        self.cache, self.drafter, self.policy if self.policy is not None else FixedPolicy(),
                        on_tokens=on_tokens, constraint=constraint)

    def generate(self, prompt: list[int], cfg: GenerationConfig, eos_ids: set[int] = frozenset(),
                 on_tokens: Callable[[list[int]], None] | None = None, constraint=None) -> GenerationResult:
        t_start = time.perf_counter()
        seq = self.sequence(prompt, cfg, eos_ids, on_tokens, constraint)
        reason = prefill(self.target, seq)
        while reason is None:
            report = step(self.target, self.cache, [seq])
            if report.failed:
                raise report.failed[0][1]
            reason = seq.finish_reason
        seq.stats.new_tokens = seq.num_new
        seq.stats.seconds = time.perf_counter() - t_start
        return GenerationResult(seq.new_tokens, seq.stats, reason, seq.logprobs, seq.prompt_logprobs)
