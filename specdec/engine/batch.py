"""Batched speculative steps: one target forward verifies every sequence's draft (ragged).

The target's cache has one row per slot; each row has its own length. A step pads the rows'
[last token] + draft to a common width T, writes each row's tokens at its own slots
(length_b .. length_b + T - 1), and masks each query to its row's prefix and its own earlier
tokens. Each row then accepts its own prefix (greedy or rejection sampling with its own
generator) and commits its own length: ragged acceptance, and rollback per row is just the length.

`BatchEngine` adds and removes sequences at step boundaries (continuous batching); it is the
batched counterpart of `SpeculativeGenerator` and gives the same tokens under greedy decoding.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from specdec.config import GenerationConfig, SamplingParams
from specdec.drafters.base import Drafter, DraftState
from specdec.engine.generate import _Request, make_generator
from specdec.errors import SpecdecError
from specdec.metrics import GenerationStats
from specdec.model.transformer import Transformer
from specdec.sampling.logits import probs_from_logits, sample
from specdec.sampling.rejection import Acceptance, greedy_accept, rejection_accept
from specdec.tree import DraftTree


def ragged_inputs(lengths: list[int], rows: list[list[int]], device) -> tuple[torch.Tensor, ...]:
    """tokens, slots, positions # [B, T] and mask # [B, 1, T, S] for rows of different lengths.

    Row b's i-th token goes to slot lengths[b] + i at position lengths[b] + i and sees slots
    <= lengths[b] + i. Short rows are padded with their last token (written past their end,
    where nothing reads it before it is overwritten)."""
    width = max(len(r) for r in rows)
    tokens = torch.tensor([r + [r[-1]] * (width - len(r)) for r in rows], device=device)  # [B, T]
    base = torch.tensor(lengths, device=device)[:, None]  # [B, 1]
    slots = base + torch.arange(width, device=device)[None, :]  # [B, T]
    span = int(slots.max()) + 1
    mask = torch.arange(span, device=device)[None, None, :] <= slots[:, :, None]  # [B, T, S]
    return tokens, slots, slots.clone(), mask.unsqueeze(1)


def verify_batch(target: Transformer, cache, lengths: list[int], last_tokens: list[int], drafts: list[DraftTree],
                 samplings: list[SamplingParams], generators: list[torch.Generator],
                 rows: list[int] | None = None, confidence: list[bool] | None = None) -> list[Acceptance]:
    """One target forward over every row's [last token] + draft chain; each row accepts its own prefix.
    rows: the cache rows of the sequences (default 0..B-1); confidence: per row, also report the
    target's top probability per verified position (for that sequence's policy)."""
    device = cache.k.device
    inputs = [[t] + d.tokens.tolist() for t, d in zip(last_tokens, drafts)]
    width = max(len(r) for r in inputs)
    if max(lengths) + width > cache.capacity:
        raise SpecdecError(f"a batched step needs {max(lengths) + width} slots but the context holds {cache.capacity}")
    tokens, slots, positions, mask = ragged_inputs(lengths, inputs, device)
    cache_rows = None if rows is None else torch.tensor(rows, device=device)
    logits = target(tokens, cache, 0, positions=positions, mask=mask, slots=slots, rows=cache_rows)  # [B, T, vocab]
    out, confidence = [], confidence or [False] * len(drafts)
    for b, (draft, sampling, gen) in enumerate(zip(drafts, samplings, generators)):
        row = logits[b, :len(draft) + 1]  # [k_b + 1, vocab]
        if sampling.greedy:
            out.append(greedy_accept(draft.tokens, row, confidence[b]))
        else:
            out.append(rejection_accept(draft.tokens, probs_from_logits(row, sampling), draft.q, gen, confidence[b]))
    return out


@dataclass
class _Slot:
    request: _Request
    drafter: Drafter
    cache_length: int  # the row's committed slots in the target cache
    finish: str | None = None  # "stop" or "length" once done


class BatchEngine:
    """Continuous batching over `max_batch` cache rows; `k_for_batch(size) -> k` sets each step's draft length."""

    def __init__(self, target: Transformer, drafter_factory: Callable[[], Drafter], capacity: int, max_batch: int,
                 k_for_batch: Callable[[int], int] | None = None):
        self.target = target
        self.cache = target.new_cache(capacity, batch=max_batch)
        self.drafters = [drafter_factory() for _ in range(max_batch)]
        self.slots: dict[int, _Slot] = {}
        self.k_for_batch = k_for_batch

    @property
    def free_rows(self) -> list[int]:
        return [b for b in range(len(self.drafters)) if b not in self.slots]

    def add(self, prompt: list[int], cfg: GenerationConfig, eos_ids: set[int] = frozenset(),
            on_tokens: Callable[[list[int]], None] | None = None) -> int:
        """Prefill a new sequence into a free row; returns the row. Raises SpecdecError when full or too long."""
        if not self.free_rows:
            raise SpecdecError("no free batch slot")
        if not prompt:
            raise SpecdecError("the prompt is empty; give at least one token")
        need = len(prompt) + cfg.max_new_tokens + cfg.k + 1
        if need > self.cache.capacity:
            raise SpecdecError(f"prompt ({len(prompt)} tokens) + max_new_tokens ({cfg.max_new_tokens}) needs {need} "
                               f"slots with drafts; the context holds {self.cache.capacity}")
        b = self.free_rows[0]
        t0 = time.perf_counter()
        req = _Request(list(prompt), len(prompt), cfg, set(eos_ids),
                       make_generator(cfg.sampling.seed, self.cache.k.device), GenerationStats(), on_tokens)
        row = self.cache.row(b)
        logits = self.target(torch.tensor([prompt], device=self.cache.k.device), row, 0, last_only=True)[0, -1]
        first = int(logits.argmax()) if cfg.sampling.greedy else int(sample(probs_from_logits(logits, cfg.sampling),
                                                                            req.generator))
        req.stats.prefill_seconds = time.perf_counter() - t0
        req.stats.seconds = req.stats.prefill_seconds
        self.drafters[b].start(prompt)
        self.slots[b] = _Slot(req, self.drafters[b], len(prompt))
        self.slots[b].finish = req.emit([first])
        return b

    def remove(self, b: int) -> _Request:
        return self.slots.pop(b).request

    def step(self) -> dict[int, str]:
        """One speculative step for every unfinished row; returns {row: finish reason} for rows that finished."""
        live = {b: s for b, s in self.slots.items() if s.finish is None}
        if not live:
            return {}
        t0 = time.perf_counter()
        k_cap = self.k_for_batch(len(live)) if self.k_for_batch else None
        drafts = {}
        for b, s in live.items():
            req = s.request
            k = min(req.cfg.k if k_cap is None else k_cap, req.cfg.max_new_tokens - req.num_new - 1,
                    self.cache.capacity - s.cache_length - 1)
            req.stats.record_choice(max(k, 0))
            drafts[b] = DraftTree.empty() if k <= 0 else s.drafter.propose(
                DraftState(req.tokens, k, req.cfg.sampling, req.generator))
            if len(drafts[b]) > max(k, 0):
                drafts[b] = DraftTree.chain(drafts[b].tokens[:k], None if drafts[b].q is None else drafts[b].q[:k])
        t1 = time.perf_counter()
        order = list(live)
        accs = verify_batch(self.target, self.cache, [live[b].cache_length for b in order],
                            [live[b].request.tokens[-1] for b in order], [drafts[b] for b in order],
                            [live[b].request.cfg.sampling for b in order], [live[b].request.generator for b in order],
                            order)
        t2 = time.perf_counter()
        finished = {}
        for b, acc in zip(order, accs):
            s, draft = live[b], drafts[b]
            s.cache_length += 1 + acc.num_accepted
            st = s.request.stats
            st.draft_seconds += (t1 - t0) / len(order)  # the step's time, shared alike
            st.verify_seconds += (t2 - t1) / len(order)
            st.seconds += (t2 - t0) / len(order)
            st.record_step(len(draft), acc.num_accepted)
            s.drafter.observe(acc.num_accepted)
            s.finish = s.request.emit(draft.tokens[:acc.num_accepted].tolist() + [acc.next_token])
            if s.finish is not None:
                st.new_tokens = s.request.num_new
                finished[b] = s.finish
        return finished
