"""An independent small draft model with the target's tokenizer, drafting a chain autoregressively."""

from __future__ import annotations

import copy

import torch
from torch import nn

from specdec.drafters.base import DraftState
from specdec.errors import SpecdecError
from specdec.model.transformer import Transformer
from specdec.sampling.logits import probs_from_logits, sample
from specdec.tree import DraftTree


def common_prefix(a: list[int], b: list[int], start: int = 0) -> int:
    n = min(len(a), len(b))
    i = start
    while i < n and a[i] == b[i]:
        i += 1
    return i


class DraftModelDrafter:
    """Keeps its own KV cache in step with the committed tokens; drafts k tokens per step.

    q is the draft's processed distribution (same temperature/top-k/top-p as the target's p),
    and draft tokens are sampled from that q, which rejection sampling needs to stay lossless.

    p_min > 0 stops a proposal early when the draft's top probability falls below it (llama.cpp's
    --draft-p-min, HF's assistant_confidence_threshold): a token it is unsure of is not drafted.
    """

    def __init__(self, model: Transformer, target_vocab: int, capacity: int, head_rows: int = 0,
                 p_min: float = 0.0):
        if not 0.0 <= p_min < 1.0:
            raise SpecdecError(f"draft p_min must be in [0, 1), got {p_min}")
        self.p_min = p_min
        self.model = truncated_head(model, head_rows) if 0 < head_rows < model.config.vocab_size else model
        self.target_vocab = target_vocab
        self.cache = model.new_cache(capacity)
        self.cached: list[int] = []  # tokens whose keys/values the cache holds
        self.committed = 0  # committed tokens at the last proposal (append-only, so still shared)

    def start(self, prompt: list[int]) -> None:
        self.cache.reset()
        self.cached = []
        self.committed = 0

    def propose(self, state: DraftState) -> DraftTree:
        if state.k < 1:
            return DraftTree.empty(self.cache.k.device)
        feed = self._sync(state.tokens)
        device = self.cache.k.device
        x = torch.tensor([feed], device=device)  # [1, T]
        drafted, qs, stopped = [], [], False
        for _ in range(state.k):
            logits = self._logits(x)  # [vocab]
            q = None if state.sampling.greedy else probs_from_logits(logits, state.sampling)
            if self.p_min > 0 and float((torch.softmax(logits, -1) if q is None else q).max()) < self.p_min:
                stopped = True  # every drafted token has been fed, so the cache holds them all
                break
            token = logits.argmax() if q is None else sample(q, state.generator)
            drafted.append(token.view(1))
            qs.append(q)
            x = token.view(1, 1)
        tokens = torch.cat(drafted) if drafted else torch.empty(0, dtype=torch.long, device=device)
        self.cached += tokens.tolist() if stopped else tokens.tolist()[:-1]
        return DraftTree.chain(tokens, None if state.sampling.greedy or not qs else torch.stack(qs))

    def observe(self, num_accepted: int) -> None:
        pass

    def _sync(self, tokens: list[int]) -> list[int]:
        """Roll the cache back to the prefix it shares with tokens; return the tokens to feed."""
        n = min(common_prefix(self.cached, tokens, min(self.committed, len(self.cached))), len(tokens) - 1)
        self.committed = len(tokens)
        self.cache.truncate(n)
        self.cached = self.cached[:n]
        feed = tokens[n:]
        self.cached += feed
        return feed

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        """Feed x # [1, T] at the cache end; return last-position logits # [target_vocab]."""
        start = self.cache.length
        logits = self.model(x, self.cache, start, last_only=True)[0, -1]  # [draft_vocab]
        self.cache.advance(x.shape[1])
        return align_vocab(logits, self.target_vocab)


def align_vocab(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """Cut or pad (with -inf) draft logits # [draft_vocab] to the target's vocab size."""
    if logits.shape[-1] >= vocab:
        return logits[..., :vocab]
    pad = logits.new_full((*logits.shape[:-1], vocab - logits.shape[-1]), float("-inf"))
    return torch.cat([logits, pad], dim=-1)


def truncated_head(model: Transformer, rows: int) -> Transformer:
    """A view of the model whose LM head scores only token ids < rows (no weights copied).

    BPE ids are roughly ordered by merge frequency, so the first ids cover most drafted text
    (the idea of FR-Spec's frequency-ranked draft vocabulary). The head is a large part of a small
    draft model's bytes per step. q is 0 beyond `rows`; rejection sampling stays exact for any q,
    and the target recovers such tokens itself.
    """
    view = copy.copy(model)
    view._modules = dict(model._modules)
    head = nn.Linear(model.config.hidden_size, rows, bias=False, device="meta")
    head.weight = nn.Parameter(model.lm_head.weight[:rows], requires_grad=False)  # [rows, hidden], a view
    view.lm_head = head
    return view
