"""Pure chain verification: greedy matching and modified rejection sampling.

Rejection sampling follows Leviathan et al. 2023 / Chen et al. 2023: accept draft token x_i with
probability min(1, p_i[x_i] / q_i[x_i]); at the first rejection n emit a recovered token from
norm(max(0, p_n - q_n)); if all k drafts are accepted emit a bonus token from p_k. The emitted
tokens are then distributed exactly as sampling from p one token at a time.

Both verifiers return an `Acceptance` (a plain tuple: num_accepted, next_token and, when asked,
the target's top probability per row) and synchronise with the host once.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from specdec.sampling.logits import sample


class Acceptance(NamedTuple):
    """Outcome of verifying one chain: emit draft[:num_accepted] followed by next_token."""

    num_accepted: int  # 0..k leading draft tokens the target kept
    next_token: int  # recovered token (after a rejection) or bonus token (all k accepted)
    confidence = ()  # not asked for (see ScoredAcceptance)


class ScoredAcceptance(Acceptance):
    """An Acceptance that also carries the target's top probability at each of the k + 1 rows, for
    the policy. It is not part of the tuple: it compares and unpacks as (num_accepted, next_token)."""

    def __new__(cls, num_accepted: int, next_token: int, confidence: tuple[float, ...]):
        self = super().__new__(cls, num_accepted, next_token)
        self.confidence = confidence
        return self


def greedy_accept(draft_tokens: torch.Tensor, target_logits: torch.Tensor, confidence: bool = False) -> Acceptance:
    """Accept the longest draft prefix that matches the target's argmax.

    draft_tokens:  # [k] int64, k may be 0
    target_logits: # [k + 1, vocab]; row i predicts draft token i, row k is the bonus position
    confidence: also return the target's top probability per row (softmax of the logits)
    """
    _check_shapes(draft_tokens, target_logits, None)
    best = target_logits.argmax(dim=-1)  # [k + 1]
    num = _leading_true(best[:-1] == draft_tokens.to(best.device))  # []
    top = top_probability(target_logits) if confidence else None
    return _to_host(num, best.index_select(0, num.view(1)), top)


def top_probability(logits: torch.Tensor) -> torch.Tensor:
    """The softmax's largest probability per row: logits # [rows, vocab] -> # [rows] fp32."""
    logits = logits.float()
    return (logits.amax(dim=-1) - torch.logsumexp(logits, dim=-1)).exp()


def rejection_accept(draft_tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor | None,
                     generator: torch.Generator, confidence: bool = False) -> Acceptance:
    """Modified rejection sampling over a chain of k draft tokens.

    draft_tokens: # [k] int64, k may be 0
    p:            # [k + 1, vocab] processed target probabilities
    q:            # [k, vocab] processed draft probabilities; None = deterministic drafter
                  # (q one-hot at the draft token, as for n-gram lookup)
    generator:    on p's device; draws k uniforms, then one token. One host sync.
    confidence:   also return p's top probability per row
    """
    _check_shapes(draft_tokens, p, q)
    draft_tokens = draft_tokens.to(p.device)
    uniforms = torch.rand(draft_tokens.numel(), generator=generator, device=p.device)  # [k]
    num = _leading_true(_accept_flags(draft_tokens, p, q, uniforms))  # []
    p_n = p.index_select(0, num.view(1))  # [1, vocab]
    if draft_tokens.numel() == 0:  # plain decoding: p_0 itself (the residual against no draft is p_0)
        token = sample(p_n, generator)  # [1]
    else:
        token = sample(residual_probs(p_n, _draft_row(draft_tokens, q, num, p.shape[-1])), generator)  # [1]
    return _to_host(num, token, p.amax(dim=-1) if confidence else None)


def residual_probs(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)), falling back to p where the residual has no mass (p == q).

    p, q: # [..., vocab] -> # [..., vocab]. With q = 0 this is p (the bonus distribution).
    """
    residual = (p - q).clamp_min(0.0)  # [..., vocab]
    mass = residual.sum(dim=-1, keepdim=True)  # [..., 1]
    normalised = residual / mass.clamp_min(torch.finfo(p.dtype).tiny)  # [..., vocab]
    return torch.where(mass > 0, normalised, p)


def _accept_flags(draft_tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor | None,
                  uniforms: torch.Tensor) -> torch.Tensor:
    """Per-position accept decisions # [k] bool: u_i < p_i[x_i] / q_i[x_i], written without division.

    draft_tokens: # [k]; p: # [k + 1, vocab]; q: # [k, vocab] or None; uniforms: # [k] in [0, 1)
    """
    rows = torch.arange(draft_tokens.numel(), device=p.device)  # [k]
    p_x = p[rows, draft_tokens]  # [k]
    if q is None:
        return uniforms < p_x
    return uniforms * q[rows, draft_tokens] < p_x


def _draft_row(draft_tokens: torch.Tensor, q: torch.Tensor | None, num: torch.Tensor,
               vocab: int) -> torch.Tensor:
    """q at position num as # [1, vocab]; all zeros at the bonus position num == k.

    draft_tokens: # [k]; q: # [k, vocab] or None (one-hot at the draft token); num: # [] int64
    """
    k = draft_tokens.numel()
    if q is None:
        padded = torch.cat([draft_tokens, draft_tokens.new_zeros(1)])  # [k + 1]
        one_hot = torch.nn.functional.one_hot(padded.index_select(0, num.view(1)), vocab)  # [1, vocab]
        return one_hot.float() * (num < k)
    padded = torch.cat([q, q.new_zeros(1, vocab)])  # [k + 1, vocab]
    return padded.index_select(0, num.view(1))


def _leading_true(flags: torch.Tensor) -> torch.Tensor:
    """Length # [] int64 of the all-True prefix of flags # [k] bool (0 when k == 0)."""
    return flags.long().cumprod(dim=0).sum()


def _to_host(num: torch.Tensor, token: torch.Tensor, top: torch.Tensor | None = None) -> Acceptance:
    """The single host sync: num # [], token # [1] (and top # [k + 1] probabilities) -> Acceptance
    of Python ints (and floats)."""
    if top is None:
        num_accepted, next_token = torch.stack([num.view(()), token.view(())]).tolist()
        return Acceptance(num_accepted, next_token)
    # float64 holds any token id exactly
    both = torch.cat([num.view(1).double(), token.view(1).double(), top.double()]).tolist()
    return ScoredAcceptance(int(both[0]), int(both[1]), tuple(both[2:]))


def _check_shapes(draft_tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor | None) -> None:
    """draft_tokens # [k]; p # [k + 1, vocab]; q # [k, vocab] or None. Raises ValueError."""
    k = draft_tokens.numel()
    if draft_tokens.dim() != 1 or p.dim() != 2 or p.shape[0] != k + 1:
        raise ValueError(f"need draft_tokens [k] and target rows [k + 1, vocab]; "
                         f"got {tuple(draft_tokens.shape)} and {tuple(p.shape)}")
    if q is not None and q.shape != (k, p.shape[1]):
        raise ValueError(f"need q [k, vocab] = {(k, p.shape[1])}, got {tuple(q.shape)}")
