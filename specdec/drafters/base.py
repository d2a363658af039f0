"""The Drafter protocol: propose a DraftTree from the committed tokens; observe the outcome."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from specdec.config import SamplingParams
from specdec.tree import DraftTree


@dataclass
class DraftState:
    """What a drafter sees: the committed sequence and how much to propose."""

    tokens: list[int]  # prompt + generated tokens so far (committed)
    k: int  # maximum number of draft tokens to propose (for a tree: its maximum depth)
    sampling: SamplingParams
    generator: torch.Generator | None  # for stochastic drafters; None under greedy
    max_nodes: int | None = None  # a tree may have at most this many nodes (the context room left)
    tree: bool = True  # False: a drafter configured for trees proposes a chain this step (the policy's choice)
    # A confidence rule (the adaptive policy's): a drafter that knows its own confidence may draft up to
    # k_stop tokens (>= k) and calls stop(i, p) before drafting token i + 1 (i drafted so far), p the top
    # probability of its distribution there: END (0) ends the chain without it, LAST (1) drafts it and
    # ends, GO_ON (2) drafts it and goes on. Other drafters ignore both.
    stop: Callable[[int, float], int] | None = None
    k_stop: int = 0

    @property
    def limit(self) -> int:
        """The most tokens a chain may have: k, or k_stop under a confidence rule."""
        return max(self.k, self.k_stop) if self.stop is not None else self.k


END, LAST, GO_ON = 0, 1, 2  # a confidence rule's answers (DraftState.stop)


class Drafter(Protocol):
    def start(self, prompt: list[int]) -> None:
        """A new sequence begins with this prompt."""

    def propose(self, state: DraftState) -> DraftTree:
        """Propose up to state.k draft tokens to follow state.tokens."""

    def observe(self, num_accepted: int) -> None:
        """How many of the last proposal's tokens the target accepted."""


class NoDrafter:
    """Plain decoding through the same engine: proposes nothing."""

    def start(self, prompt: list[int]) -> None:
        pass

    def propose(self, state: DraftState) -> DraftTree:
        return DraftTree.empty()

    def observe(self, num_accepted: int) -> None:
        pass
