"""Pure tree verification: greedy matching and multi-candidate rejection sampling over a DraftTree.

Rows of the target's p / logits # [n + 1, vocab] follow the tree: row 0 is the root's prediction
(the next token after the committed text), row i + 1 is node i's prediction. Both verifiers walk
from the root: at the current node they try its children in sibling order (index order), move to
the first child they accept, and stop at a node none of whose children is accepted (or at a leaf),
where they emit one more token. They return the accepted path and that token, with one host sync.

Multi-candidate rejection sampling (SpecInfer's multi-step speculative sampling; the
without-replacement variant as in Recursive Speculative Decoding). At the current node let p_cur
be its target row and q_cur its draft row (the distribution its children were drawn from). For
each child x in order: accept with probability min(1, p_cur[x] / q_cur[x]); on rejection set
p_cur = norm(max(0, p_cur - q_cur)) and, without replacement, also q_cur[x] = 0 renormalised.
If every child is rejected, draw the token from p_cur; at an accepted leaf, draw the bonus token
from the leaf's own row.

Why it is lossless: one such step is ordinary speculative sampling with target p_cur and draft
q_cur, so P(accept x) + P(reject) * p_next(x) = min(p_cur, q_cur)(x) + max(0, p_cur - q_cur)(x)
= p_cur(x), provided that whatever happens after a rejection emits p_next. p_next does not depend
on the rejected token, so by induction over the remaining siblings the node emits p_cur as long as
each next candidate is distributed as the q_cur the verifier then uses. That is the contract:

* q given, replacement=True: a node's children are i.i.d. draws from its q row.
* q given, replacement=False: drawn sequentially without replacement: x_1 ~ q, x_j ~ q with
  x_1..x_{j-1} set to 0 and renormalised (what torch.multinomial(q, m, replacement=False) does).
* q = None (deterministic drafter, e.g. top-k candidates or n-gram lookups): the children are
  fixed tokens, q_cur is one-hot at each child's token, and `replacement` is ignored. The rule
  becomes: accept x with p_cur[x], where after rejecting x_1..x_{j-1} p_cur is p with those tokens
  removed and renormalised, i.e. accept x_j with p[x_j] / (1 - sum of p over the distinct earlier
  siblings); a repeated token has p_cur = 0 and is always rejected.

In every case a node's children must be drawn from its own row (the draft conditioned on the path
to it) with fresh randomness, and q rows must be the processed probabilities the drafter really
sampled from. Verifying i.i.d. children with replacement=False, or sequential without-replacement
children with replacement=True, is biased.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from specdec.sampling.logits import sample
from specdec.sampling.rejection import residual_probs
from specdec.tree import DraftTree


class TreeAcceptance(NamedTuple):
    """Outcome of verifying one tree: emit tokens[path] followed by next_token."""

    path: list[int]  # accepted node indices, root's child first, ascending; [] = none accepted
    next_token: int  # recovered token (all children of the last node rejected) or bonus (accepted leaf)

    @property
    def num_accepted(self) -> int:
        return len(self.path)


class _Layout(NamedTuple):
    """The tree's structure as index tensors on the device."""

    parent_rows: torch.Tensor  # [n] int64: parents + 1, the p row that predicts each node
    order: torch.Tensor  # [n] int64: nodes by (sibling rank, index)
    stage_sizes: list[int]  # how many nodes of order have sibling rank 0, 1, ... (one per parent at most)
    ancestors: torch.Tensor  # [n, n] bool: [i, j] when j is i or an ancestor of i
    earlier: torch.Tensor  # [n, n] bool: [i, j] when j is an earlier sibling of i or of an ancestor of i


def greedy_tree_accept(tree: DraftTree, target_logits: torch.Tensor) -> TreeAcceptance:
    """Accept the longest path whose every token is the argmax of its parent's row.

    target_logits: # [n + 1, vocab]; row 0 predicts the root's children, row i + 1 node i's.
    next_token is the argmax of the last accepted node's row (the root's row when none is).
    Among siblings with the same token the first is taken.
    """
    _check_rows(tree, target_logits, None)
    layout = _layout(tree, target_logits.device)
    best = target_logits.argmax(dim=-1)  # [n + 1]
    tokens = tree.tokens.to(best.device, non_blocking=True)  # [n]
    on_path, row = _walk(layout, tokens == best[layout.parent_rows])
    return _to_host(on_path, best.index_select(0, row.view(1)))


def tree_rejection_accept(tree: DraftTree, p: torch.Tensor, q: torch.Tensor | None,
                          generator: torch.Generator, replacement: bool) -> TreeAcceptance:
    """Multi-candidate rejection sampling over the tree (rules and contract in the module docstring).

    p:           # [n + 1, vocab] processed target probabilities, rows as in greedy_tree_accept
    q:           # [n + 1, vocab] per parent: row 0 = what the root's children were drawn from,
                 # row i + 1 = node i's children's (leaf rows unused; DraftTree.parent_q builds it);
                 # None = deterministic drafter (one-hot at each child's token)
    replacement: whether siblings were drawn i.i.d. (True) or without replacement (False)
    generator:   on p's device; draws n uniforms, then one token. One host sync.
    """
    _check_rows(tree, p, q)
    layout = _layout(tree, p.device)
    tokens = tree.tokens.to(p.device, non_blocking=True)  # [n]
    uniforms = torch.rand(len(tree), generator=generator, device=p.device)  # [n], one per node
    p_cur = p.clone()  # [n + 1, vocab]: each parent's target, updated as its children are rejected
    q_cur = None if q is None else q.clone()  # [n + 1, vocab]
    flags = []  # per stage # [m] bool
    stages = zip(*(t[layout.order].split(layout.stage_sizes) for t in (layout.parent_rows, tokens, uniforms)))
    for rows, x, u in stages:  # the j-th child of every parent at once: rows # [m] distinct, x # [m], u # [m]
        target = p_cur[rows]  # [m, vocab]
        x = x.unsqueeze(1)  # [m, 1]
        draft = torch.zeros_like(target).scatter_(1, x, 1.0) if q_cur is None else q_cur[rows]  # [m, vocab]
        flags.append((u * draft.gather(1, x).squeeze(1)) < target.gather(1, x).squeeze(1))
        p_cur[rows] = residual_probs(target, draft)
        if q_cur is not None and not replacement:
            q_cur[rows] = _remove(draft, x)
    accepted = torch.zeros(len(tree), dtype=torch.bool, device=p.device)  # [n]
    if flags:
        accepted[layout.order] = torch.cat(flags)
    on_path, row = _walk(layout, accepted)
    # The last node's children were all rejected (p_cur = its residual), or it is a leaf (p_cur = p).
    return _to_host(on_path, sample(p_cur.index_select(0, row.view(1)), generator))


def _layout(tree: DraftTree, device: torch.device) -> _Layout:
    """Build the structure on the host in Python; one non-blocking copy to the device."""
    tree.validate()
    parents = tree.parents.tolist()
    n = len(parents)
    path: list[list[int]] = []  # per node: its ancestors and itself
    before: list[list[int]] = []  # per node: earlier siblings of itself and of its ancestors
    rank: list[int] = []  # per node: its position among its parent's children
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(parents):
        siblings = children.setdefault(parent, [])
        path.append((path[parent] if parent >= 0 else []) + [i])
        before.append((before[parent] if parent >= 0 else []) + siblings)
        rank.append(len(siblings))
        siblings.append(i)
    order = sorted(range(n), key=lambda i: (rank[i], i))
    anc_idx = [i * n + j for i in range(n) for j in path[i]]
    ear_idx = [i * n + j for i in range(n) for j in before[i]]
    packed = torch.tensor([parent + 1 for parent in parents] + order + anc_idx + ear_idx, dtype=torch.long)
    parent_rows, order, anc_idx, ear_idx = packed.to(device, non_blocking=True).split(
        [n, n, len(anc_idx), len(ear_idx)])
    flags = torch.zeros(2, n * n, dtype=torch.bool, device=device)  # [2, n * n]
    flags[0].index_fill_(0, anc_idx, True)
    flags[1].index_fill_(0, ear_idx, True)
    stage_sizes = [rank.count(r) for r in range(max(rank, default=-1) + 1)]
    return _Layout(parent_rows, order, stage_sizes, flags[0].view(n, n), flags[1].view(n, n))


def _walk(layout: _Layout, accepted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """From per-node decisions # [n] bool to the path taken: (on_path # [n] bool, row # [] int64).

    A node is on the path when it and all its ancestors were accepted and no earlier sibling of
    any of them was. row is the p row of the last node on the path (0 = the root).
    """
    blocked = (layout.ancestors & ~accepted) | (layout.earlier & accepted)  # [n, n]
    on_path = ~blocked.any(dim=-1)  # [n]
    rows = torch.arange(1, on_path.numel() + 1, device=on_path.device) * on_path  # [n]
    return on_path, torch.cat([rows.new_zeros(1), rows]).max()


def _remove(draft: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """draft # [m, vocab] with token x # [m, 1] set to 0, renormalised (all zeros if nothing is left)."""
    rest = draft.scatter(1, x, 0.0)  # [m, vocab]
    return rest / rest.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(draft.dtype).tiny)


def _to_host(on_path: torch.Tensor, token: torch.Tensor) -> TreeAcceptance:
    """The single host sync: on_path # [n] bool and token # [1] -> TreeAcceptance of Python ints."""
    *flags, next_token = torch.cat([on_path.long(), token.view(1)]).tolist()
    return TreeAcceptance([i for i, flag in enumerate(flags) if flag], next_token)


def _check_rows(tree: DraftTree, rows: torch.Tensor, q: torch.Tensor | None) -> None:
    """rows (p or logits) # [n + 1, vocab]; q # [n + 1, vocab] or None. Raises ValueError."""
    n = len(tree)
    if rows.dim() != 2 or rows.shape[0] != n + 1:
        raise ValueError(f"need target rows [n + 1, vocab] for a tree of n = {n} nodes, got {tuple(rows.shape)}")
    if q is not None and q.shape != rows.shape:
        raise ValueError(f"need q per parent [n + 1, vocab] = {tuple(rows.shape)}, got {tuple(q.shape)} "
                         "(DraftTree.parent_q turns per-node q [n, vocab] into that)")
