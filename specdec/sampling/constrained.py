"""A draft under a grammar (structured output): what the step verifies, and the masks of its rows.

Cutting a chain at the first token the grammar rejects loses nothing (the target, masked, would reject
it); the tokens the grammar forces are a free draft (the target, masked, keeps them where they are
its only choice, and verification keeps the output exact where they are not).
"""

from __future__ import annotations

import torch

from specdec.tree import DraftTree


def constrain(constraint, draft: DraftTree, limit: int) -> tuple[DraftTree, torch.Tensor]:
    """A draft under a grammar and the masks of its verify rows # [1 + len, vocab]: a tree kept whole,
    each node's row masked after its path; a chain cut at the first token the grammar rejects, and
    where it is a prefix of the tokens the grammar forces next (nothing drafted, say), those tokens
    instead, up to limit (their q one-hot, as a lookup's)."""
    if not draft.is_chain:
        return draft, constraint.tree_masks(draft.tokens.tolist(), draft.parents.tolist())
    forced = constraint.forced(limit) if limit > len(draft) else []
    if len(forced) > len(draft) and forced[:len(draft)] == draft.tokens.tolist():
        draft = forced_chain(draft, forced)
    masks = constraint.masks_along(draft.tokens.tolist())  # [1 + m, vocab], m <= len(draft)
    m = masks.shape[0] - 1
    if m < len(draft):
        draft = DraftTree.chain(draft.tokens[:m], None if draft.q is None else draft.q[:m])
    return draft, masks


def forced_chain(draft: DraftTree, forced: list[int]) -> DraftTree:
    """The chain of the forced tokens, whose first len(draft) are the draft's (their q kept)."""
    tokens = torch.tensor(forced, dtype=torch.long, device=draft.tokens.device)  # [n]
    if draft.q is None:
        return DraftTree.chain(tokens)
    extra = torch.nn.functional.one_hot(tokens[len(draft):], draft.q.shape[-1]).to(draft.q.dtype)
    return DraftTree.chain(tokens, torch.cat([draft.q, extra]))
