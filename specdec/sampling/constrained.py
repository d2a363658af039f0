"""A draft under a grammar (structured output): what the step verifies, and the masks of its rows.

Cutting a chain at the first token the grammar rejects loses nothing (the target, masked, would reject
it); the tokens the grammar forces after it are a free draft (the target, masked, keeps them where
they are its only choice, and verification keeps the output exact where they are not).
"""

from __future__ import annotations

import torch

from specdec.tree import DraftTree


def constrain(constraint, draft: DraftTree, room: int) -> tuple[DraftTree, torch.Tensor]:
    """A draft under a grammar and the masks of its verify rows # [1 + len, vocab]: a tree kept whole,
    each node's row masked after its path; a chain cut at the first token the grammar rejects, then
    followed by the tokens the grammar forces after it (free), up to `room` tokens in all."""
    if not draft.is_chain:
        return draft, constraint.tree_masks(draft.tokens.tolist(), draft.parents.tolist())
    tokens = draft.tokens.tolist()
    masks = constraint.masks_along(tokens)  # [1 + m, vocab], m <= len(draft)
    m = masks.shape[0] - 1
    if m < len(draft):
        draft, tokens = draft.head(m), tokens[:m]
    tail = constraint.forced(room - m, tokens) if room > m else []
    if tail:
        draft = draft.extended(tail)
        masks = constraint.masks_along(tokens + tail)
        draft = draft.head(masks.shape[0] - 1)  # the whole of it: the grammar forced the tail
    return draft, masks
