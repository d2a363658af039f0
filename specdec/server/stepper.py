"""Step-level continuous batching: a pool of slots stepped by the engine's one step function.

`StepwiseGenerator` keeps `max_batch` slots. Slot b is row b of one batched KV cache, with its own
drafter (from a factory) and its own policy (`LoadPolicy` over an adaptive policy or none), all
sharing the target's weights. A `Sequence` (specdec.engine.step) is one request in a slot.

`run_round()` does one unit of work for every active sequence:

- a sequence whose prompt is not yet in the cache: one prefill chunk (`prefill_chunk` tokens), so a
  long prompt holds the others up for one chunk at a time; after the last chunk, the first token
  and the drafter's start (the policy's admission at the round's load);
- every decoding sequence: one `step` together (specdec.engine.step.step): each proposes its own
  draft (draft-model chains for all rows in one draft forward), every chain is verified in ONE
  target forward over ragged rows, trees and drafters with a verify of their own alone, and each
  row accepts and commits its own tokens. So a sequence served here emits exactly the tokens
  `SpeculativeGenerator.generate` emits under greedy decoding.

Sequences join (`add`) and leave (`release`) between rounds, so a request never waits for another to
finish. With `batched=False` every sequence steps alone (the reference the batched path is tested
against).

Prefix caching: a free slot keeps the keys/values its last sequence left (prompt and answer), and
the tokens they belong to. A new request takes the free slot holding the longest prefix of its
prompt, and prefills only the rest (the next turn of a conversation, a shared system prompt); with
no such slot, the least recently used one, so the caches of recent conversations live longest. The
prefix cache is the slots' own rows: it takes no memory beyond them. Keys and values of a position
depend on the tokens up to it alone, so the reused ones are what a prefill would write, and greedy
output is the same with and without it. A slot's drafter reuses its own state the same way (a draft
model its cache, a head its features). A request that asks for its prompt's logprobs needs the logits
of every prompt position, so it prefills its whole prompt.

Speculation under load: before each round the owner sets `k_limit` (None = no limit, 0 = plain
steps). `LoadPolicy` caps each step's k at it and then asks the slot's adaptive policy, if any, at
the round's batch size (its cost model weighs B k c + v(B (k + 1)) against v(B), and turns drafting
off above the critical batch). Every row of the batched verify pads to the widest draft, so the
round asks the policy for one width W for all rows (`specdec.policy.round_width`: the most expected
tokens per predicted time, v(B W) plus draft costs) and caps each row's k at W - 1. Any k keeps the output exact.
"""

from __future__ import annotations

import time
from typing import Callable

from specdec.config import GenerationConfig
from specdec.drafters.base import Drafter
from specdec.engine.step import Sequence, check_fits, make_generator, prefill, prefill_from
from specdec.engine.step import step as speculative_step
from specdec.errors import SpecdecError
from specdec.model.transformer import Transformer
from specdec.policy import Action, Ask, Outcome, round_width
from specdec.tokens import common_prefix

__all__ = ["LoadPolicy", "Sequence", "StepwiseGenerator"]


class LoadPolicy:
    """A slot's policy: caps each step's k at the owner's current `k_limit`, then asks `inner` (an
    AdaptivePolicy, or None: the capped k) for a chain's k at the step's batch size. The server's
    steps pick k only: a tree drafter drafts its own tree, and there is no confidence rule."""

    def __init__(self, owner: "StepwiseGenerator", inner=None):
        self.owner = owner
        self.inner = inner

    @property
    def wants_target_confidence(self) -> bool:
        return self.inner is not None and self.inner.wants_target_confidence

    @property
    def last_admission(self) -> dict | None:
        return None if self.inner is None else self.inner.last_admission

    def plan(self, ask: Ask) -> Action:
        limit = self.owner.k_limit
        k_cap = ask.k_cap if limit is None else min(ask.k_cap, limit)
        return Action(k_cap if self.inner is None else self.inner.choose(batch=ask.batch, k_cap=k_cap))

    def observe(self, outcome: Outcome) -> None:
        if self.inner is not None:
            self.inner.observe(outcome)

    def reset(self) -> None:
        if self.inner is not None:
            self.inner.reset()

    def observe_prefill(self, prompt_len: int, seconds: float) -> None:
        if self.inner is not None:
            self.inner.observe_prefill(prompt_len, seconds)

    def start_now(self, prefill_len: int, generated: int, max_new_tokens: int, batch: int = 1) -> bool:
        """The inner policy's rental rule (start now, or run plain and ask again each round) at the load."""
        return self.inner is None or self.inner.start_now(prefill_len, generated, max_new_tokens, batch)


class StepwiseGenerator:
    """A pool of slots (cache row + drafter + policy each) stepped one round at a time."""

    def __init__(self, target: Transformer, drafter_factory: Callable[[], Drafter], capacity: int, max_batch: int,
                 policy_factory: Callable[[], object] | None = None, prefill_chunk: int = 256,
                 batched: bool = True, prefix_cache: bool = True):
        if max_batch < 1:
            raise SpecdecError(f"max_batch must be >= 1, got {max_batch}")
        if prefill_chunk < 1:
            raise SpecdecError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        self.target = target
        self.drafter_factory = drafter_factory
        self.prefill_chunk = prefill_chunk
        self.k_limit: int | None = None
        self.decode_batch = 1  # sequences verified together in the last round
        self.round_width = 1  # positions per row of the last round's batched verify
        self.batched = batched
        self.cache = target.new_cache(capacity, batch=max_batch)  # row b is slot b's cache
        self.rows = [self.cache.row(b) for b in range(max_batch)]
        self.drafters = [drafter_factory() for _ in range(max_batch)]
        for drafter, row in zip(self.drafters, self.rows):
            if drafter.caps.target_cache:  # it drafts into its slot's row (layer skip: layers 0..L-1)
                drafter.share_target_cache(row)
        self.policies = [LoadPolicy(self, policy_factory() if policy_factory else None) for _ in range(max_batch)]
        self.free: list[int] = list(range(max_batch))
        self.active: list[Sequence] = []
        self.prefix_cache = prefix_cache
        self.held: list[list[int]] = [[] for _ in range(max_batch)]  # tokens whose keys/values slot b holds
        self.used = [0] * max_batch  # when each slot was last taken (a counter), for least-recently-used
        self.clock = 0
        self.speculative = self.drafters[0].caps.drafts
        # Pooled drafters' caches (a draft model's, or a head's) become rows of one batched cache, so
        # that a round drafts for every sequence in one forward per position (propose_pooled).
        self.draft_cache = None
        if batched and all(d.caps.pooled for d in self.drafters):
            self.draft_cache = self.drafters[0].pool_model.new_pool_cache(max_batch)
            for b, d in enumerate(self.drafters):
                d.pool_model.cache = self.draft_cache.row(b)

    @property
    def capacity(self) -> int:
        """Context of every slot, in tokens (the cache capacity, capped by the model's positions)."""
        return self.cache.capacity

    @property
    def max_batch(self) -> int:
        return len(self.drafters)

    @property
    def tree_nodes(self) -> int:
        """Scratch slots a draft tree needs past the end of a sequence (0 for chains)."""
        return self.drafters[0].caps.tree_nodes

    def check_fits(self, prompt: list[int], max_new_tokens: int) -> None:
        """SpecdecError naming the numbers unless prompt + max_new_tokens (+ tree scratch) fit a slot."""
        check_fits(self.capacity, self.drafters[0], prompt, max_new_tokens)

    def add(self, prompt: list[int], cfg: GenerationConfig, eos_ids: set[int] = frozenset(), tag=None,
            constraint=None) -> Sequence:
        """Take a free slot for a new sequence; its prompt is prefilled by the next rounds (under its
        grammar, a fresh specdec.constraints.Constraint, where given)."""
        if not self.free:
            raise SpecdecError("no free slot")
        self.check_fits(prompt, cfg.max_new_tokens)
        slot, reuse = self._slot_for(prompt)
        if cfg.prompt_logprobs:  # every prompt position's logits are asked: the whole prompt is prefilled
            reuse = 0
        self.free.remove(slot)
        self.clock += 1
        self.used[slot] = self.clock
        cache = self.rows[slot]
        seq = Sequence(list(prompt), len(prompt), cfg, set(eos_ids), make_generator(cfg.sampling.seed, cache.k.device),
                       cache, self.drafters[slot], self.policies[slot], row=slot, tag=tag, constraint=constraint)
        prefill_from(seq, reuse)  # the cached prefix is in place: the prefill starts after it
        self.held[slot] = []
        self.active.append(seq)
        return seq

    def _slot_for(self, prompt: list[int]) -> tuple[int, int]:
        """(the free slot for this prompt, the prompt tokens whose keys/values it holds already): the
        longest cached prefix, else the least recently used slot. At least the prompt's last token is
        always prefilled (its logits give the first new token)."""
        if not self.prefix_cache:
            return self.free[0], 0
        best = max(self.free, key=lambda b: (min(common_prefix(self.held[b], prompt), len(prompt) - 1),
                                             -self.used[b]))
        return best, min(common_prefix(self.held[best], prompt), len(prompt) - 1)

    def release(self, seq: Sequence) -> None:
        """The sequence leaves its slot (finished, cancelled or failed); the slot is free at once."""
        if seq in self.active:
            self.active.remove(seq)
            self.free.append(seq.row)
            # what the slot's cache holds for a later prefix: the committed tokens' slots (a failed
            # step may have left them half written)
            self.held[seq.row] = [] if seq.finish_reason == "error" else seq.tokens[:min(seq.cache.length,
                                                                                           len(seq.tokens))]
            seq.stats.new_tokens = seq.num_new
            seq.stats.seconds = time.perf_counter() - seq.t_start

    def _load(self, starting: bool) -> int:
        """The batch a draft prefill would stall: the decoding sequences (plus this one at its start)."""
        if not self.batched:
            return 1
        return sum(1 for s in self.active if not s.prefilling) + (1 if starting else 0)

    def step(self, seq: Sequence) -> str | None:
        """One prefill chunk or one speculative step of one sequence; returns a finish reason or None."""
        if seq.finish_reason is not None:
            return seq.finish_reason
        if seq.prefilling:
            return prefill(self.target, seq, self.prefill_chunk, self._load(starting=True))
        report = speculative_step(self.target, self.cache, [seq], self._load(starting=False))
        if report.failed:
            raise report.failed[0][1]
        return seq.finish_reason

    def run_round(self, on_error: Callable[[Sequence, Exception], None] | None = None) -> list[Sequence]:
        """Step every active sequence once; returns those that finished this round (still in their slots).

        An exception in one sequence's step marks that sequence failed (on_error) and never stops the
        others; the failed sequence is returned with finish_reason 'error'."""
        done: list[Sequence] = []
        live = [s for s in self.active if s.finish_reason is None]
        prefilling = [s for s in live if s.prefilling]
        decoding = [s for s in live if not s.prefilling]  # a sequence whose prefill ends now decodes next round
        for seq in prefilling:
            self._guarded(seq, self.step, on_error, done)
        if not self.batched:
            for seq in decoding:
                self._guarded(seq, self.step, on_error, done)
            return done
        if not decoding:
            return done
        report = self.decode(decoding)
        for seq, e in report.failed:
            self._fail(seq, e, on_error, done)
        done += [s for s in decoding if s.finish_reason is not None and s not in done]
        return done

    def decode(self, seqs: list[Sequence]):
        """One step of the decoding sequences together (specdec.engine.step.step)."""
        report = speculative_step(self.target, self.cache, seqs, self._load(starting=False), self.draft_cache,
                      lambda chosen: round_width([(p.inner, k) for p, k in chosen]))
        self.decode_batch, self.round_width = report.batch, report.width
        return report

    @staticmethod
    def _guarded(seq: Sequence, fn, on_error, done: list[Sequence]) -> None:
        try:
            if fn(seq) is not None:
                done.append(seq)
        except Exception as e:  # noqa: BLE001 - one sequence's failure must not stop the others
            StepwiseGenerator._fail(seq, e, on_error, done)

    @staticmethod
    def _fail(seq: Sequence, e: Exception, on_error, done: list[Sequence]) -> None:
        seq.finish_reason = "error"
        if on_error is not None:
            on_error(seq, e)
        if seq not in done:
            done.append(seq)
