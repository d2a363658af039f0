"""The engine: `add_request(prompt, cfg) -> Sequence`, `step() -> finished`, `abort(seq)`.

`generate` is one request through it, the bench runs its requests through it, and the server's
scheduler calls the same `step()` and only admits, streams and cancels. Behind it: the slots
(`pool.SlotPool`: cache rows, drafters, policies, prefix caching, the pooled draft cache) and THE
step (`step.step`).

A request's fit in the context is checked once, at `add_request`; it then waits for a free slot.
Each `step()`:

1. seats waiting requests in free slots (first come, first seated; one whose prompt a running
   sequence is prefilling waits for it, then copies those keys/values: `shares_a_prefill`);
2. a sequence whose prompt is not yet in the cache prefills: all of it, or one chunk of
   `prefill_chunk` tokens while other sequences decode (a long prompt holds them up for one chunk at
   a time); after its last chunk, the first token (streamed at once) and then the drafter's start;
3. every decoding sequence: one speculative step together (`step.step`): each proposes its own
   draft (pooled drafters for all rows in one forward per position), every chain is verified in ONE
   target forward over ragged rows, trees and drafters with a verify of their own alone. Every row
   of the batched verify pads to the widest draft, so with adaptive policies the step asks for one
   width for all rows (`specdec.policy.round_width`);
4. sequences that finished (or failed: `Sequence.error`) leave their slots and are returned.

`k_limit` (None: none; 0: plain steps) caps every step's draft length: the server sets it from
its load. With `batched=False` every sequence steps alone (the reference the batched path is tested
against). Greedy output is the same whatever the batch, the chunking or the prefix cache.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from typing import Callable

from specdec.config import GenerationConfig
from specdec.drafters.base import Drafter
from specdec.engine.pool import SlotPool
from specdec.engine.step import Sequence, check_fits, make_generator, prefill, step
from specdec.errors import SpecdecError
from specdec.metrics import GenerationStats
from specdec.model.transformer import Transformer
from specdec.policy import round_width
from specdec.sampling.penalties import Penalties
from specdec.tokens import common_prefix

__all__ = ["Engine", "GenerationResult", "Sequence"]

SHARED_PREFILL = 32  # prompt tokens worth waiting for another sequence's prefill to copy (Engine.shares_a_prefill)


@dataclass
class GenerationResult:
    tokens: list[int]  # new tokens only (an end-of-sequence token, if hit, is the last one)
    stats: GenerationStats
    finish_reason: str  # "stop" (end-of-sequence) or "length"
    logprobs: list | None = None  # TokenLogprob per new token, where cfg.logprobs asks
    prompt_logprobs: list | None = None  # per prompt token (the first: None), where cfg.prompt_logprobs asks


class Engine:
    """One target and `max_batch` slots (a drafter and a policy each) over one batched KV cache."""

    def __init__(self, target: Transformer, drafter_factory: Callable[[], Drafter], capacity: int,
                 max_batch: int = 1, policy_factory: Callable[[], object] | None = None,
                 prefill_chunk: int = 256, batched: bool = True, prefix_cache: bool = True, cache=None):
        """policy_factory: each slot's AdaptivePolicy (None: every step drafts as far as allowed);
        cache: a one-row target cache to use (one slot), shared with a drafter built over it."""
        if prefill_chunk < 1:
            raise SpecdecError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        self.target = target
        self.pool = SlotPool(target, drafter_factory, capacity, max_batch, policy_factory, batched, prefix_cache,
                             cache)
        self.prefill_chunk = prefill_chunk
        self.batched = batched
        self.k_limit: int | None = None
        self.decode_batch = 1  # sequences verified together in the last step
        self.round_width = 1  # positions per row of the last step's batched verify
        self.lock = threading.Lock()  # add_request may come from another thread than step()
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []

    @staticmethod
    def single(target: Transformer, drafter: Drafter, capacity: int, policy=None, cache=None) -> "Engine":
        """One slot with this drafter and policy (None: none), no prefix cache (each request prefills
        its whole prompt, as a benchmark wants); cache: the target cache to use."""
        return Engine(target, lambda: drafter, capacity, 1, (lambda: policy) if policy is not None else None,
                      prefix_cache=False, cache=cache)

    @property
    def capacity(self) -> int:
        return self.pool.capacity

    @property
    def max_batch(self) -> int:
        return self.pool.max_batch

    @property
    def tree_nodes(self) -> int:
        return self.pool.tree_nodes

    @property
    def speculative(self) -> bool:
        """Whether the drafter drafts at all (False: plain decoding)."""
        return self.pool.drafters[0].caps.drafts

    @property
    def cache(self):
        return self.pool.cache

    @property
    def drafter(self) -> Drafter:
        """The first slot's drafter (a one-slot engine's only one)."""
        return self.pool.drafters[0]

    @property
    def policy(self):
        """The first slot's policy."""
        return self.pool.policies[0]

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def check_fits(self, prompt: list[int], max_new_tokens: int) -> None:
        """SpecdecError naming the numbers unless prompt + max_new_tokens (+ tree scratch) fit a slot."""
        check_fits(self.capacity, self.pool.drafters[0], prompt, max_new_tokens)

    def add_request(self, prompt: list[int], cfg: GenerationConfig, eos_ids: set[int] = frozenset(), *,
                    constraint=None, tag=None, on_tokens: Callable[[list[int]], None] | None = None) -> Sequence:
        """A new request: checked to fit, then waiting for a slot (the next step seats it). constraint: its
        grammar (a fresh specdec.constraints.Constraint) or None; tag: the caller's; on_tokens: hears
        each step's new tokens."""
        self.check_fits(prompt, cfg.max_new_tokens)
        penalties = (Penalties(cfg.sampling, prompt, self.target.config.vocab_size) if cfg.sampling.penalized
                     else None)
        seq = Sequence(list(prompt), len(prompt), cfg, set(eos_ids), make_generator(cfg.sampling.seed,
                                                                                      self.cache.k.device),
                       tag=tag, on_tokens=on_tokens, constraint=constraint, penalties=penalties)
        with self.lock:
            self.waiting.append(seq)
        return seq

    def abort(self, seq: Sequence) -> None:
        """The request ends now (waiting or running); its slot is free. A finished one is left as is."""
        with self.lock:
            if seq in self.waiting:
                self.waiting.remove(seq)
        if seq in self.running:
            self._leave(seq)

    def _leave(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.pool.release(seq)
        seq.stats.new_tokens = seq.num_new
        seq.stats.seconds = time.perf_counter() - seq.t_start - seq.stats.load_seconds

    def step(self) -> list[Sequence]:
        """One step of every request in a slot (seating waiting ones first); returns those that finished
        or failed in it (`finish_reason` 'error', `error` the exception), already out of their slots."""
        self._seat()
        done = self._run()
        for seq in done:
            self._leave(seq)
        return done

    def _seat(self) -> None:
        with self.lock:
            held: list[Sequence] = []
            while self.waiting and self.pool.free:
                seq = self.waiting.popleft()
                if self.shares_a_prefill(seq):  # it waits for the prompt's keys/values to copy
                    held.append(seq)
                    continue
                self.pool.seat(seq, self.running)
                self.running.append(seq)
            self.waiting.extendleft(reversed(held))

    def shares_a_prefill(self, seq: Sequence) -> bool:
        """Whether a running sequence is prefilling a prompt that covers most of this one's (at least
        SHARED_PREFILL tokens and half of it): then this one is seated once that prefill is done, and
        copies those keys/values instead of computing them again (several samples of one prompt)."""
        if not self.pool.prefix_cache or seq.cfg.prompt_logprobs or len(seq.tokens) <= SHARED_PREFILL:
            return False
        need = max(SHARED_PREFILL, len(seq.tokens) // 2)
        return any(s.prefilled < s.prompt_len and s.finish_reason is None
                   and common_prefix(s.tokens[:s.prompt_len], seq.tokens) >= need for s in self.running)

    def _load(self, starting: bool) -> int:
        """The batch a draft prefill would stall: the decoding sequences (plus this one at its start)."""
        if not self.batched:
            return 1
        return sum(1 for s in self.running if not s.prefilling) + (1 if starting else 0)

    def _run(self) -> list[Sequence]:
        done: list[Sequence] = []
        live = [s for s in self.running if s.finish_reason is None]
        decoding = [s for s in live if not s.prefilling]  # a sequence whose prefill ends now decodes next step
        chunk = self.prefill_chunk if decoding else None  # nobody waits on a prefill: all of it at once
        for seq in (s for s in live if s.prefilling):
            self._guarded(seq, lambda s: prefill(self.target, s, chunk, self._load(starting=True)), done)
        groups = [[s] for s in decoding] if not self.batched else [decoding] if decoding else []
        for group in groups:
            width_rule = round_width if self.pool.adaptive else None
            pool = self.pool.draft_cache if len(group) > 1 else None  # one row drafts as generate does
            report = step(self.target, self.cache, group, self._load(starting=False), pool, width_rule, self.k_limit)
            self.decode_batch, self.round_width = report.batch, report.width
            for seq, e in report.failed:
                self._fail(seq, e, done)
            done += [s for s in group if s.finish_reason is not None and s not in done]
        return done

    def _guarded(self, seq: Sequence, fn, done: list[Sequence]) -> None:
        try:
            if fn(seq) is not None:
                done.append(seq)
        except Exception as e:  # noqa: BLE001 - one sequence's failure must not stop the others
            self._fail(seq, e, done)

    @staticmethod
    def _fail(seq: Sequence, e: Exception, done: list[Sequence]) -> None:
        seq.finish_reason, seq.error = "error", e
        if seq not in done:
            done.append(seq)

    def generate(self, prompt: list[int], cfg: GenerationConfig, eos_ids: set[int] = frozenset(),
                 on_tokens: Callable[[list[int]], None] | None = None, constraint=None) -> GenerationResult:
        """One request, stepped until it ends (with whatever else is in flight); its error is raised."""
        seq = self.add_request(prompt, cfg, eos_ids, constraint=constraint, on_tokens=on_tokens)
        while seq.finish_reason is None:
            self.step()
        if seq.error is not None:
            raise seq.error
        return GenerationResult(seq.new_tokens, seq.stats, seq.finish_reason, seq.logprobs, seq.prompt_logprobs)
