"""Verification: one target forward over [last committed token] + a draft, then acceptance (pure).

Nothing here moves a KV cache. A verify writes keys/values at slots cache.length.. and reports
what it wrote (`Verified.written`); the step's commit (specdec.engine.step.commit_cache) then sets
the cache's length, or compacts a tree's accepted path into place.

Chains of many sequences are verified in one forward over ragged rows (`verify_chains`): each row's
[last token] + draft is written at its own slots and attends to its own prefix only; each row then
accepts its own prefix with its own generator.

Under a grammar (structured output) every verified row's logits are masked by what the grammar allows
after the tokens before it (`masks`, bool # [rows, vocab]): acceptance then runs on the target's
constrained distribution, and keeps the output exactly that distribution (greedy: constrained plain
decoding's tokens). A request's logit bias and penalties (sampling/penalties.py) shape each row by
the text before it in the same place, before the grammar's masks. The logits a Verified reports for
logprobs stay the raw ones.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from specdec.config import SamplingParams
from specdec.errors import SpecdecError
from specdec.model.transformer import Transformer
from specdec.sampling.logits import probs_from_logits
from specdec.sampling.penalties import Rules
from specdec.sampling.rejection import Acceptance, greedy_accept, rejection_accept
from specdec.sampling.tree_accept import TreeAcceptance, greedy_tree_accept, tree_rejection_accept
from specdec.tree import DraftTree


@dataclass(frozen=True)
class Verified:
    """One verified draft: emit tokens[path] + next_token."""

    path: list[int]  # accepted nodes (a chain: 0..accepted-1)
    next_token: int
    written: int  # slots written from the cache's length: 1 + nodes (+ extra inputs such as a window)
    chain: bool = True  # the path is a prefix of the proposal's slots: commit only sets the length
    confidence: tuple[float, ...] = ()  # the target's top probability per verified row, where asked
    features: torch.Tensor | None = None  # where asked: the target's features # [1 + accepted, hidden] of
    # the rows that stay ([last token] + the accepted path), for a drafter that reads them
    logits: torch.Tensor | None = None  # the verify's target logits # [1 + nodes, vocab] of [last token] +
    # draft (a reference, no copy): `emitted_rows` of them scored the emitted tokens

    @property
    def num_accepted(self) -> int:
        return len(self.path)

    @property
    def emitted_rows(self) -> list[int]:
        """The rows of `logits` that predicted the emitted tokens (tokens[path] + next_token): a chain's
        0..accepted, a tree's root and its accepted nodes."""
        return [0] + [1 + i for i in self.path]

    @staticmethod
    def of_chain(acc: Acceptance, tree: DraftTree, logits: torch.Tensor | None = None) -> "Verified":
        return Verified(list(range(acc.num_accepted)), acc.next_token, 1 + len(tree), True,
                        tuple(acc.confidence), logits=logits)

    @staticmethod
    def of_tree(acc: TreeAcceptance, written: int, logits: torch.Tensor | None = None) -> "Verified":
        return Verified(list(acc.path), acc.next_token, written, False, logits=logits)


def masked(logits: torch.Tensor, masks: torch.Tensor | Rules | None) -> torch.Tensor:
    """logits # [rows, vocab] with -inf where masks # [rows, vocab] (bool, the grammar's) is False;
    logits themselves where there is no grammar. A row the grammar allows nothing at (after a stop id,
    or a tree node on a path it rejects) is never one a kept token comes from: it stays as it is, so
    that no row of probabilities is NaN. Rules (a request's bias and penalties, sampling/penalties.py)
    penalise each row first, then mask it by the grammar's masks they carry."""
    if isinstance(masks, Rules):
        logits, masks = masks.penalties.apply(logits), masks.masks
    if masks is None:
        return logits
    masks = masks.to(logits.device)
    return logits.masked_fill(~masks & masks.any(-1, keepdim=True), float("-inf"))


def accept_chain(draft: DraftTree, logits: torch.Tensor, sampling: SamplingParams, generator,
                 confidence: bool = False, masks: torch.Tensor | Rules | None = None) -> Verified:
    """logits # [k + 1, vocab] of [last token] + draft -> the accepted prefix and the next token
    (masks # [k + 1, vocab]: the grammar's, row by row)."""
    tokens = draft.tokens.to(logits.device)
    scored = masked(logits, masks)  # [k + 1, vocab]
    if sampling.greedy:
        acc = greedy_accept(tokens, scored, confidence)
    else:
        acc = rejection_accept(tokens, probs_from_logits(scored, sampling), draft.q, generator, confidence)
    return Verified.of_chain(acc, draft, logits)


def verify(target: Transformer, cache, last_token: int, tree: DraftTree, sampling: SamplingParams,
           generator: torch.Generator | None, confidence: bool = False, features: bool = False,
           masks: torch.Tensor | Rules | None = None) -> Verified:
    """One target forward over [last committed token] + draft chain, at the cache's length
    (features: also the kept rows' features; masks # [k + 1, vocab]: the grammar's)."""
    device = cache.k.device
    # the last token by a fill (its value a kernel argument): a tensor copied from the host would wait for the
    # draft's queued work on a GPU
    last = torch.full((1,), last_token, dtype=torch.long, device=device)
    x = torch.cat([last, tree.tokens.to(device)]).unsqueeze(0)  # [1, k + 1]
    cache.require(cache.length + x.shape[1])
    if not features:
        return accept_chain(tree, target(x, cache, cache.length)[0], sampling, generator, confidence, masks)
    logits, h = target(x, cache, cache.length, hidden=True)  # [1, k + 1, vocab], [1, k + 1, hidden]
    v = accept_chain(tree, logits[0], sampling, generator, confidence, masks)
    return replace(v, features=h[0, :1 + v.num_accepted])


def ragged_inputs(lengths: list[int], rows: list[list[int]], device) -> tuple[torch.Tensor, ...]:
    """tokens, slots, positions # [B, T] and mask # [B, 1, T, S] for rows of different lengths.

    Row b's i-th token goes to slot lengths[b] + i at position lengths[b] + i and sees slots
    <= lengths[b] + i. Short rows are padded with their last token (written past their end,
    where nothing reads it before it is overwritten)."""
    width = max(len(r) for r in rows)
    tokens = torch.tensor([r + [r[-1]] * (width - len(r)) for r in rows], device=device)  # [B, T]
    base = torch.tensor(lengths, device=device)[:, None]  # [B, 1]
    slots = base + torch.arange(width, device=device)[None, :]  # [B, T]
    span = max(lengths) + width  # the last slot + 1, known on the host (no read back from the device)
    mask = torch.arange(span, device=device)[None, None, :] <= slots[:, :, None]  # [B, T, S]
    return tokens, slots, slots.clone(), mask.unsqueeze(1)


def verify_chains(target: Transformer, cache, rows: list[int], lengths: list[int], last_tokens: list[int],
                  drafts: list[DraftTree], samplings: list[SamplingParams], generators: list,
                  confidence: list[bool], features: bool = False,
                  masks: list[torch.Tensor | None] | None = None) -> list[Verified]:
    """One target forward over every row's [last token] + draft chain (rows: the rows of the batched
    `cache`, lengths: their committed slots); each row accepts its own prefix (under its grammar's
    masks # [k + 1, vocab], where it has one)."""
    device = cache.k.device
    inputs = [[t] + d.tokens.tolist() for t, d in zip(last_tokens, drafts)]
    width = max(len(r) for r in inputs)
    if max(lengths) + width > cache.capacity:
        raise SpecdecError(f"a batched step needs {max(lengths) + width} slots but the context holds {cache.capacity}")
    tokens, slots, positions, mask = ragged_inputs(lengths, inputs, device)
    out = target(tokens, cache, 0, positions=positions, mask=mask, slots=slots,
                 rows=torch.tensor(rows, device=device), hidden=features)  # [B, T, vocab] (, [B, T, hidden])
    logits, h = out if features else (out, None)
    masks = masks or [None] * len(drafts)
    verified = [accept_chain(d, logits[b, :len(d) + 1], s, g, c, m)
                for b, (d, s, g, c, m) in enumerate(zip(drafts, samplings, generators, confidence, masks))]
    if h is None:
        return verified
    return [replace(v, features=h[b, :1 + v.num_accepted]) for b, v in enumerate(verified)]


def tree_attention_mask(tree: DraftTree, start: int, device) -> torch.Tensor:
    """Bool mask # [n + 1, start + n + 1] for [root] + tree nodes written at slots start..start+n:
    every row sees the whole committed prefix, itself and its ancestors, never its siblings."""
    n = len(tree)
    mask = torch.ones(n + 1, start + n + 1, dtype=torch.bool, device=device)
    mask[:, start:] = tree.tree_mask().to(device)
    return mask


def accept_tree(tree: DraftTree, logits: torch.Tensor, sampling: SamplingParams, generator, q,
                masks: torch.Tensor | Rules | None = None) -> TreeAcceptance:
    """logits # [n + 1, vocab] of [root] + nodes -> the accepted path and the next token (masks
    # [n + 1, vocab]: the grammar's after each node's path)."""
    logits = masked(logits, masks)
    if sampling.greedy:
        return greedy_tree_accept(tree, logits)
    return tree_rejection_accept(tree, probs_from_logits(logits, sampling), q, generator, replacement=False)


def verify_tree(target: Transformer, cache, last_token: int, tree: DraftTree, sampling: SamplingParams,
                generator: torch.Generator | None, features: bool = False, masks: torch.Tensor | Rules | None = None) -> Verified:
    """One target forward over [last committed token] + every tree node, under the tree mask (and
    the grammar's masks # [n + 1, vocab])."""
    device = cache.k.device
    start = cache.length
    cache.require(start + len(tree) + 1)
    x = torch.cat([torch.tensor([last_token], device=device), tree.tokens.to(device)]).unsqueeze(0)  # [1, n + 1]
    positions = (start + tree.position_offsets().to(device)).unsqueeze(0)  # [1, n + 1]
    out = target(x, cache, start, positions=positions, mask=tree_attention_mask(tree, start, device), hidden=features)
    logits, h = (out[0][0], out[1][0]) if features else (out[0], None)
    v = Verified.of_tree(accept_tree(tree, logits, sampling, generator, tree.parent_q(), masks), len(tree) + 1, logits)
    if h is None:
        return v
    return replace(v, features=h[[0] + [1 + i for i in v.path]])
