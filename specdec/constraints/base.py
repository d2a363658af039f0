"""The constraint protocol the engine drives, and the walks any constraint gets from its masks_along:
the mask after a drafted prefix (what a drafter drafts under) and the masks of a draft tree's rows.

Rows after a stop id, and rows of draft nodes on a path the grammar rejects, allow nothing (all False):
no token may follow there."""

from __future__ import annotations

from typing import Protocol

import torch

from specdec.tree import DraftTree


class ConstraintProtocol(Protocol):
    """One sequence's grammar state (specdec.constraints.Constraint is the real one)."""

    vocab_size: int

    @property
    def finished(self) -> bool: ...

    def allowed(self) -> torch.Tensor: ...                         # [vocab] bool
    def masks_along(self, tokens: list[int]) -> torch.Tensor: ...  # [m + 1, vocab] bool
    def advance(self, tokens: list[int]) -> None: ...
    def forced(self, limit: int, after: list[int] | tuple = ()) -> list[int]: ...  # after drafted `after`
    def mask_after(self, drafted: list[int]) -> torch.Tensor | None: ...                # [vocab] bool
    def tree_masks(self, tokens: list[int], parents: list[int]) -> torch.Tensor: ...   # [n + 1, vocab] bool


def walk_masks(constraint, drafted: list[int]) -> torch.Tensor | None:
    """bool [vocab]: what the grammar allows after the committed tokens and `drafted`; None where it
    rejects a drafted token or allows nothing after them (a stop id was drafted)."""
    masks = constraint.masks_along(drafted)  # [m + 1, vocab]
    if masks.shape[0] <= len(drafted) or not masks[-1].any():
        return None
    return masks[-1]


def tree_masks(constraint, tokens: list[int], parents: list[int]) -> torch.Tensor:
    """bool [n + 1, vocab]: row 0 the mask now, row i + 1 the mask after node i's path from the root
    (parents[i]: node i's parent, -1 for the root, parents[i] < i); all False where the grammar rejects
    a token on that path. One masks_along per leaf."""
    rows = torch.zeros(len(tokens) + 1, constraint.vocab_size, dtype=torch.bool)  # [n + 1, vocab]
    rows[0] = constraint.allowed()
    tree = DraftTree(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long))
    for path in tree.paths():
        masks = constraint.masks_along([tokens[j] for j in path])  # [m + 1, vocab]
        rows[[j + 1 for j in path[:masks.shape[0] - 1]]] = masks[1:]
    return rows
