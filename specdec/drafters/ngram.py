"""Prompt lookup (n-gram) drafting: find the last n tokens earlier in the text, propose what followed.

Deterministic, so q is one-hot (DraftTree.q = None). Tries n = max_n down to min_n; among the
matches it takes the most recent one that still has k tokens after it, else the one with the
longest continuation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specdec.drafters.base import BaseDrafter, DraftState
from specdec.drafters.registry import Entry
from specdec.errors import SpecdecError
from specdec.tree import DraftTree


@dataclass(frozen=True)
class NgramConfig:
    """Prompt lookup: match the last n tokens (max_n down to min_n) earlier in the text."""

    max_n: int = 3
    min_n: int = 1

    def __post_init__(self):
        if self.min_n < 1 or self.max_n < self.min_n:
            raise SpecdecError(
                f"n-gram sizes need 1 <= min_n <= max_n, got min_n={self.min_n}, max_n={self.max_n}")


def ngram_continuation(tokens: np.ndarray, k: int, max_n: int, min_n: int) -> np.ndarray:
    """Up to k tokens that followed an earlier occurrence of the sequence's last n tokens.

    tokens: # [length] int64; returns # [<= k] (empty when nothing matches)
    """
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)  # [length - n, n]
        starts = np.flatnonzero((windows == tokens[-n:]).all(axis=1)) + n  # continuation starts
        if starts.size:
            full = starts[starts + k <= length]
            start = full[-1] if full.size else starts[0]
            return tokens[start:start + k]
    return tokens[:0]


class NgramDrafter(BaseDrafter):
    def __init__(self, max_n: int = 3, min_n: int = 1):
        self.max_n, self.min_n = max_n, min_n

    def start(self, prompt: list[int]) -> None:
        pass

    def propose(self, state: DraftState) -> DraftTree:
        cont = ngram_continuation(np.asarray(state.tokens, dtype=np.int64), state.k, self.max_n, self.min_n)
        return DraftTree.chain(torch.from_numpy(cont.copy()))



def add_flags(p) -> None:
    p.add_argument("--ngram-max", type=int, default=3, help="prompt lookup: largest n-gram to match")
    p.add_argument("--ngram-min", type=int, default=1, help="prompt lookup: smallest n-gram to match")


def _build(parts, options, note):
    s = options.of("ngram")
    return NgramDrafter(s.max_n, s.min_n)


DRAFTERS = [(Entry("ngram", _build, settings=NgramConfig, flags=add_flags, chain_theory=True,
                   from_flags=lambda v: NgramConfig(v["ngram_max"], v["ngram_min"]),
                   switch="draft by n-gram prompt lookup instead of a model; with --draft MODEL or --head H: both "
                          "(hybrid: lookup when the last 3 tokens occurred before, the model or head otherwise)"),
             {})]
