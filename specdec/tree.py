"""Draft trees as data. A chain is a tree with one branch (parents = -1, 0, 1, ...)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DraftTree:
    """Draft tokens proposed after the last committed token.

    parents[i] is the index of node i's parent, or -1 for a child of the root
    (the root is the last committed token, which is not part of the draft).
    """

    tokens: torch.Tensor  # [n] int64
    parents: torch.Tensor  # [n] int64
    q: torch.Tensor | None = None  # [n, vocab] draft probabilities; None = deterministic (one-hot)

    @staticmethod
    def chain(tokens: torch.Tensor, q: torch.Tensor | None = None) -> "DraftTree":
        n = tokens.numel()
        return DraftTree(tokens.reshape(n), torch.arange(-1, n - 1), q)

    @staticmethod
    def empty(device: torch.device | str = "cpu") -> "DraftTree":
        return DraftTree.chain(torch.empty(0, dtype=torch.long, device=device))

    def __len__(self) -> int:
        return self.tokens.numel()

    @property
    def is_chain(self) -> bool:
        return bool(torch.equal(self.parents.cpu(), torch.arange(-1, len(self) - 1)))
