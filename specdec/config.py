"""Frozen, validated configuration objects. Flags map 1:1 to these fields."""

from __future__ import annotations

from dataclasses import dataclass

from specdec.errors import SpecdecError


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are chosen. temperature == 0 means greedy (argmax)."""

    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    seed: int | None = None

    def __post_init__(self):
        if not self.temperature >= 0:
            raise SpecdecError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise SpecdecError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise SpecdecError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and not 0 <= self.seed < 2**64:
            raise SpecdecError(f"seed must be in [0, 2**64), got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class TreeConfig:
    """Draft trees for the draft-model drafter.

    Dynamic (EAGLE-2 style): expand the `topk` best nodes of each depth by cumulative draft
    probability, each into its `topk` most likely children, down to `depth`; keep the best `budget`
    nodes. Static: `choices`, Medusa-style rank paths ([[0], [1], [0, 0], ...]: child rank at each depth).
    """

    budget: int = 16
    depth: int = 4
    topk: int = 4
    choices: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self):
        if self.choices is not None:
            return  # validated by specdec.tree.choices_to_parents
        if self.depth < 1 or self.topk < 1:
            raise SpecdecError(f"tree depth and topk must be >= 1, got depth={self.depth}, topk={self.topk}")
        if self.budget < self.depth:
            raise SpecdecError(f"tree budget ({self.budget}) must be at least its depth ({self.depth}): "
                               "a tree of that depth needs that many nodes")


@dataclass(frozen=True)
class GenerationConfig:
    """One request: token budget, draft length and sampling; and whether to score the tokens.

    logprobs: None = not asked; n >= 0 = each new token's logprob under the target's raw
    distribution (before temperature, top-k, top-p) and the n most likely alternatives.
    prompt_logprobs: also every prompt token's logprob (all prompt positions are computed)."""

    max_new_tokens: int = 128
    k: int = 4
    sampling: SamplingParams = SamplingParams()
    stop_at_eos: bool = True
    logprobs: int | None = None
    prompt_logprobs: bool = False

    def __post_init__(self):
        if self.logprobs is not None and self.logprobs < 0:
            raise SpecdecError(f"logprobs (top alternatives per token) must be >= 0, got {self.logprobs}")
        if self.prompt_logprobs and self.logprobs is None:
            raise SpecdecError("prompt_logprobs needs logprobs (the number of top alternatives) too")
        if self.k < 1:
            raise SpecdecError(f"k (draft length) must be >= 1, got {self.k}")
        if self.max_new_tokens < 1:
            raise SpecdecError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
