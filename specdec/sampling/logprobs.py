"""Log-probabilities of tokens under the target's raw distribution (pure).

A token's logprob is log_softmax of the target's logits at the row that predicted it, before
temperature, top-k and top-p: the model's own distribution, whatever the request samples with.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

MAX_TOP_LOGPROBS = 20


class TokenLogprob(NamedTuple):
    """One scored token: its id, its logprob and the `n` most likely (id, logprob) at its row."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(logits: torch.Tensor, tokens: list[int], n: int) -> list[TokenLogprob]:
    """logits # [rows, vocab] (row i predicted tokens[i]), tokens # rows ids, n: top alternatives
    per row (0..vocab) -> one TokenLogprob per row, fp32 arithmetic, one host copy."""
    if len(tokens) != logits.shape[0]:
        raise ValueError(f"{len(tokens)} tokens for {logits.shape[0]} rows of logits")
    if not tokens:
        return []
    lp = torch.log_softmax(logits.float(), dim=-1)  # [rows, vocab]
    ids = torch.tensor(tokens, device=lp.device).unsqueeze(1)  # [rows, 1]
    chosen = lp.gather(1, ids).squeeze(1).tolist()  # rows floats
    if n <= 0:
        return [TokenLogprob(t, c) for t, c in zip(tokens, chosen)]
    top = lp.topk(min(n, lp.shape[-1]), dim=-1)  # values, indices # [rows, n]
    pairs = zip(top.indices.tolist(), top.values.tolist())
    return [TokenLogprob(t, c, tuple(zip(i, v))) for t, c, (i, v) in zip(tokens, chosen, pairs)]
