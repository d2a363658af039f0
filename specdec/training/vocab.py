"""The draft vocabulary: the most frequent token ids of the training data (FR-Spec), with the end
tokens always in, stored as EAGLE-3 stores it: d2t[i] = target id of draft id i minus i, and t2d a
bool mask over the target's vocabulary."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch

from specdec.errors import SpecdecError


@dataclass(frozen=True)
class DraftVocab:
    ids: torch.Tensor   # [draft_vocab] int64, ascending target ids

    @property
    def size(self) -> int:
        return int(self.ids.numel())

    def d2t(self) -> torch.Tensor:  # [draft_vocab] int64 offsets: target id = i + d2t[i]
        return self.ids - torch.arange(self.size)

    def t2d(self, vocab_size: int) -> torch.Tensor:  # [vocab] bool
        mask = torch.zeros(vocab_size, dtype=torch.bool)
        mask[self.ids] = True
        return mask

    def target_to_draft(self, vocab_size: int) -> torch.Tensor:  # [vocab] int64, -1 outside the draft vocab
        index = torch.full((vocab_size,), -1, dtype=torch.int64)
        index[self.ids] = torch.arange(self.size)
        return index

    @staticmethod
    def from_d2t(d2t: torch.Tensor) -> "DraftVocab":  # d2t [draft_vocab] offsets
        return DraftVocab(d2t.long() + torch.arange(d2t.numel()))


def token_counts(sequences: Iterable[list[int]], vocab_size: int) -> torch.Tensor:  # [vocab] int64
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for seq in sequences:
        ids = torch.as_tensor(seq, dtype=torch.int64)
        if ids.numel() and (int(ids.max()) >= vocab_size or int(ids.min()) < 0):
            raise SpecdecError(f"a training token id lies outside the model's vocabulary of {vocab_size}")
        counts += torch.bincount(ids, minlength=vocab_size)
    return counts


def select_vocab(counts: torch.Tensor, size: int, always: Iterable[int] = ()) -> DraftVocab:
    """The `size` most frequent ids of counts # [vocab] (ties: lower id first), `always` included."""
    vocab_size = counts.numel()
    if size < 1:
        raise SpecdecError(f"--draft-vocab must be >= 1, got {size}")
    if size > vocab_size:
        raise SpecdecError(f"--draft-vocab {size} is larger than the model's vocabulary ({vocab_size} tokens); "
                           f"use at most {vocab_size}")
    forced = sorted({int(i) for i in always if 0 <= int(i) < vocab_size})
    if len(forced) > size:
        raise SpecdecError(f"--draft-vocab {size} cannot hold the {len(forced)} end tokens; use a larger one")
    score = counts.double() - torch.arange(vocab_size, dtype=torch.float64) / (2.0 * vocab_size)  # ties: low id
    score[forced] = float("inf")
    chosen = torch.topk(score, size).indices
    return DraftVocab(torch.sort(chosen).values)
