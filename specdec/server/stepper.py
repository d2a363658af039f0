"""Step-level continuous batching over the single-sequence engine.

`StepwiseGenerator` keeps a pool of `max_batch` slots. Each slot is a `SpeculativeGenerator` with
its own preallocated KV cache (capacity = the context), its own drafter (from a factory) and its own
policy, all sharing the target's weights. A `Sequence` is one request in a slot. `step(seq)` does one
unit of work for it:

- while its prompt is not yet in the cache: one prefill chunk (`prefill_chunk` tokens), so a long
  prompt holds the other sequences up for one chunk at a time, not for the whole prompt;
- after the last chunk: the first token, from the chunk's last logits (exactly as the engine's
  `_prefill`), then `engine.start_drafter` (the policy's reset and admission, the drafter's start;
  a draft prefill that does not pay yet is rented: the sequence decodes plain and the policy is
  asked again each round, at the round's load, whether to start the drafter mid-answer);
- afterwards: one speculative step through the engine's own `_step` (propose -> verify -> accept ->
  commit), so a sequence served here emits exactly the tokens `SpeculativeGenerator.generate` emits.

`run_round()` steps every active sequence once, in admission order (round robin). Sequences join
(`add`) and leave (`release`) between rounds, so a request never waits for another to finish.

Batched verification: the slots' caches are rows of one batched KV cache (`KVCache.row`).
`_decode_round` lets each decoding sequence propose its own draft (its own drafter, policy and k),
then verifies every chain in ONE target forward over the ragged [last token + draft] rows
(specdec.engine.batch.verify_batch), and accepts, rolls back and commits per row. Sequences whose
drafter proposes a tree or brings its own verify pass (layer skip, lookahead) take the engine's
single-sequence `_step` instead. Prefill chunks stay per sequence. With `batched=False` every
sequence takes `_step` (the reference the batched path is tested against).

Speculation under load: before each round the owner sets `k_limit` (None = no limit, 0 = plain
steps). Each slot's engine consults it through `LoadPolicy`, which caps the step's k and then asks
the slot's adaptive policy, if any, with the round's batch size (its cost model then weighs
B k c + v(B (k + 1)) against v(B), and turns drafting off above the critical batch). Every row
of the batched verify pads to the widest draft, so the round then picks one width W for all rows
(`round_width`: the most expected tokens per predicted time, v(B W) plus draft costs) and caps each
row's k at W - 1: one sequence's probe no longer makes all B rows pay for its width. Any k keeps
the output exact (greedy: plain decoding's tokens).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from specdec.config import GenerationConfig
from specdec.drafters.base import Drafter, DraftState, NoDrafter
from specdec.drafters.draft_model import DraftModelDrafter, propose_chains
from specdec.engine.batch import verify_batch
from specdec.engine.generate import SpeculativeGenerator, _Request, make_generator
from specdec.errors import SpecdecError
from specdec.metrics import GenerationStats
from specdec.model.transformer import Transformer
from specdec.sampling.logits import probs_from_logits, sample
from specdec.tree import DraftTree


def round_width(chosen: list[tuple[object, int]]) -> int:
    """Positions per row for one batched verify: every row pads to the widest, so a single row
    drafting k makes all B rows cost k + 1. chosen: (the row's adaptive policy or None, its k).

    With adaptive policies on every row, the width W is chosen for the whole round: the one with
    the most expected tokens, sum_b E_b(min(k_b, W - 1)), per predicted time, v(B W) plus the rows'
    draft costs; each row then drafts at most W - 1. A lone probe in a large batch no longer makes
    every row pay for it. Otherwise (fixed k, a schedule) the widest choice stands."""
    if not chosen:
        return 1
    widest = max(k for _, k in chosen) + 1
    policies = [p for p, _ in chosen]
    if len(chosen) < 2 or any(p is None or not hasattr(p, "beta") or p.cfg.schedule for p in policies):
        return widest
    from specdec.policy import expected_tokens
    costs, n = policies[0].costs, len(chosen)
    rho_v = sum(p.rho_v for p in policies) / n
    rho_spec = sum(p.rho_spec for p in policies) / n  # drafted (multi-position) steps' calibration
    best, best_rate = 1, 0.0
    for w in sorted({k + 1 for _, k in chosen} | {1}):
        tokens = sum(expected_tokens(p.beta, min(k, w - 1)) for p, k in chosen)
        seconds = (rho_spec if w > 1 else rho_v) * costs.v(n * w) + sum(min(k, w - 1) * p.draft_cost
                                                                        for p, k in chosen)
        if tokens / seconds > best_rate * (1 + 1e-9):
            best, best_rate = w, tokens / seconds
    return best


class LoadPolicy:
    """A slot's policy: caps each step's k at the owner's current `k_limit`, then defers to `inner`
    (an AdaptivePolicy or None). Without a limit and without `inner` it returns the engine's cap,
    which makes the engine's step identical to a step without a policy."""

    def __init__(self, owner: "StepwiseGenerator", inner=None):
        self.owner = owner
        self.inner = inner

    def choose(self, batch: int = 1, k_cap: int | None = None) -> int:
        limit = self.owner.k_limit
        if limit is not None:
            k_cap = limit if k_cap is None else min(k_cap, limit)
        if self.inner is not None:
            # the batch this step is verified in: every decoding sequence of the round (batched path)
            return self.inner.choose(batch=self.owner.decode_batch, k_cap=k_cap)
        return k_cap if k_cap is not None else 0

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        if self.inner is not None:
            self.inner.observe(num_drafted, num_accepted)

    @property
    def wants_target_confidence(self) -> bool:
        return getattr(self.inner, "wants_target_confidence", False)

    def observe_target(self, confidence, num_drafted: int, num_accepted: int) -> None:
        if self.inner is not None and hasattr(self.inner, "observe_target"):
            self.inner.observe_target(confidence, num_drafted, num_accepted)

    def observe_time(self, k: int, draft_seconds: float | None, verify_seconds: float) -> None:
        if self.inner is not None and hasattr(self.inner, "observe_time"):
            batch = self.owner.decode_batch
            width = max(self.owner.round_width, k + 1) if batch > 1 else None  # the padded rows it shared
            self.inner.observe_time(k, draft_seconds, verify_seconds, batch, width)

    def reset(self) -> None:
        if self.inner is not None:
            self.inner.reset()

    def observe_prefill(self, prompt_len: int, seconds: float) -> None:
        if self.inner is not None and hasattr(self.inner, "observe_prefill"):
            self.inner.observe_prefill(prompt_len, seconds)

    def admit(self, prompt_len: int, max_new_tokens: int) -> bool:
        """Admission at the current load: the sequences already decoding plus this one."""
        if self.inner is None or not hasattr(self.inner, "admit"):
            return True
        return self.inner.admit(prompt_len, max_new_tokens, self._load(starting=True))

    def start_now(self, prefill_len: int, generated: int, max_new_tokens: int) -> bool:
        """The inner policy's rental rule (start now, or run plain and ask again each round) at the
        current load; an inner policy without one decides once, at the start (admit)."""
        if self.inner is None:
            return True
        if not hasattr(self.inner, "start_now"):
            return generated == 0 and self.admit(prefill_len, max_new_tokens)
        return self.inner.start_now(prefill_len, generated, max_new_tokens, self._load(starting=generated == 0))

    def _load(self, starting: bool) -> int:
        """The batch a draft prefill would stall: the decoding sequences (plus this one at its start)."""
        if not self.owner.batched:
            return 1
        return sum(1 for s in self.owner.active if not s.prefilling) + (1 if starting else 0)


@dataclass(eq=False)
class Sequence:
    """One request in a slot: the engine's _Request, how much of the prompt is in the cache, and
    whether it is done. `tag` is the owner's (the scheduler keeps its request handle there)."""

    req: _Request
    slot: int
    engine: SpeculativeGenerator
    prefilled: int = 0
    finish_reason: str | None = None
    t_start: float = field(default_factory=time.perf_counter)
    tag: object = None

    @property
    def prefilling(self) -> bool:
        return self.req.num_new == 0

    @property
    def new_tokens(self) -> list[int]:
        return self.req.tokens[self.req.prompt_len:]


class StepwiseGenerator:
    """A pool of slots (cache + drafter + policy each) stepped one sequence-step at a time."""

    def __init__(self, target: Transformer, drafter_factory: Callable[[], Drafter], capacity: int, max_batch: int,
                 policy_factory: Callable[[], object] | None = None, prefill_chunk: int = 256,
                 batched: bool = True):
        if max_batch < 1:
            raise SpecdecError(f"max_batch must be >= 1, got {max_batch}")
        if prefill_chunk < 1:
            raise SpecdecError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        self.target = target
        self.drafter_factory = drafter_factory
        self.prefill_chunk = prefill_chunk
        self.k_limit: int | None = None
        self.decode_batch = 1  # sequences verified together this round (the policy's batch size)
        self.round_width = 1  # positions per row of this round's batched verify (every row pads to it)
        self.batched = batched
        self.cache = target.new_cache(capacity, batch=max_batch)  # row b is slot b's cache
        self.slots = [SpeculativeGenerator(target, drafter_factory(), capacity,
                                           LoadPolicy(self, policy_factory() if policy_factory else None),
                                           cache=self.cache.row(b))
                      for b in range(max_batch)]
        self.free: list[int] = list(range(max_batch))
        self.active: list[Sequence] = []
        self.speculative = not isinstance(self.slots[0].drafter, NoDrafter)
        # A draft model's slot caches become rows of one batched cache, so that a round drafts for
        # every sequence in one forward per position (propose_chains).
        self.draft_cache = None
        models = [self._model_drafter(s.drafter) for s in self.slots]
        if batched and all(m is not None for m in models):
            first = models[0]
            self.draft_cache = first.model.new_cache(first.cache.capacity, batch=max_batch)
            for b, m in enumerate(models):
                m.cache = self.draft_cache.row(b)

    @property
    def capacity(self) -> int:
        """Context of every slot, in tokens (the cache capacity, capped by the model's positions)."""
        return self.slots[0].cache.capacity

    @property
    def max_batch(self) -> int:
        return len(self.slots)

    @property
    def tree_nodes(self) -> int:
        """Scratch slots a draft tree needs past the end of a sequence (0 for chains)."""
        return getattr(self.slots[0].drafter, "max_tree_nodes", 0)

    def check_fits(self, prompt: list[int], max_new_tokens: int) -> None:
        """SpecdecError naming the numbers unless prompt + max_new_tokens (+ tree scratch) fit a slot."""
        self.slots[0].check_fits(prompt, max_new_tokens)

    def add(self, prompt: list[int], cfg: GenerationConfig, eos_ids: set[int] = frozenset(), tag=None) -> Sequence:
        """Take a free slot for a new sequence; its prompt is prefilled by the next steps."""
        if not self.free:
            raise SpecdecError("no free slot")
        self.check_fits(prompt, cfg.max_new_tokens)
        slot = self.free.pop(0)
        engine = self.slots[slot]
        engine.cache.reset()
        req = _Request(list(prompt), len(prompt), cfg, set(eos_ids),
                       make_generator(cfg.sampling.seed, engine.cache.k.device), GenerationStats(), None)
        seq = Sequence(req, slot, engine, tag=tag)
        self.active.append(seq)
        return seq

    def release(self, seq: Sequence) -> None:
        """The sequence leaves its slot (finished, cancelled or failed); the slot is free at once."""
        if seq in self.active:
            self.active.remove(seq)
            self.free.append(seq.slot)
            seq.req.stats.new_tokens = seq.req.num_new
            seq.req.stats.seconds = time.perf_counter() - seq.t_start

    def step(self, seq: Sequence) -> str | None:
        """One prefill chunk or one speculative step; returns a finish reason ('stop', 'length') or None."""
        if seq.finish_reason is not None:
            return seq.finish_reason
        if seq.prefilling:
            reason = self._prefill_chunk(seq)
        else:
            reason = seq.engine._step(seq.req)
        seq.finish_reason = reason
        return reason

    def run_round(self, on_error: Callable[[Sequence, Exception], None] | None = None) -> list[Sequence]:
        """Step every active sequence once; returns those that finished this round (still in their slots).

        An exception in one sequence's step marks that sequence failed (on_error) and never stops the
        others; the failed sequence is returned with finish_reason 'error'."""
        done: list[Sequence] = []
        prefilling = [s for s in self.active if s.finish_reason is None and s.prefilling]
        decoding = [s for s in self.active if s.finish_reason is None and not s.prefilling]
        for seq in prefilling:
            self._guarded(seq, self.step, on_error, done)
        self._decode_round(decoding, on_error, done)
        return done

    def _decode_round(self, decoding: list[Sequence], on_error, done: list[Sequence]) -> None:
        """One speculative step per decoding sequence: chains verified together in one forward."""
        batch: list[tuple[Sequence, int, DraftTree, float]] = []  # (sequence, k, draft, draft seconds)
        self.decode_batch = sum(1 for s in decoding if not self._own_verify(s.engine.drafter)) if self.batched else 1
        self.decode_batch = max(self.decode_batch, 1)
        chosen: list[tuple[Sequence, int, float]] = []  # (sequence, k, seconds spent choosing)
        for seq in decoding:
            engine = seq.engine
            if not self.batched or self._own_verify(engine.drafter):
                self._guarded(seq, self.step, on_error, done)
                continue
            try:
                t0 = time.perf_counter()
                if seq.req.pending and engine._drafter_pays(seq.req):  # rented plain steps: buy now
                    engine._start_now(seq.req)
                k = self._choose_for(seq)
            except Exception as e:  # noqa: BLE001 - one sequence's failure must not stop the others
                self._fail(seq, e, on_error, done)
                continue
            chosen.append((seq, k, time.perf_counter() - t0))
        chains = [(s.engine.policy.inner, k) for s, k, _ in chosen if not self._tree(s.engine.drafter)]
        self.round_width = round_width(chains)
        capped = [(seq, k if self._tree(seq.engine.drafter) else min(k, self.round_width - 1), t)
                  for seq, k, t in chosen]  # trees are verified on their own, at their own width
        for seq, k, draft, seconds in self._propose_round(capped):
            if isinstance(draft, Exception):
                self._fail(seq, draft, on_error, done)
                continue
            if not draft.is_chain:  # a tree: verified on its own (its mask is not ragged-batched)
                self._guarded(seq, lambda s, k=k, d=draft: self._step_with(s, k, d), on_error, done)
                continue
            batch.append((seq, k, draft, seconds))
        if not batch:
            return
        t1 = time.perf_counter()
        try:
            accs = verify_batch(self.target, self.cache, [s.engine.cache.length for s, *_ in batch],
                                [s.req.tokens[-1] for s, *_ in batch], [d for _, _, d, _ in batch],
                                [s.req.cfg.sampling for s, *_ in batch], [s.req.generator for s, *_ in batch],
                                [s.slot for s, *_ in batch],
                                [getattr(s.engine.policy, "wants_target_confidence", False) for s, *_ in batch])
        except Exception as e:  # noqa: BLE001 - the batch failed as a whole: each sequence reports it
            for seq, *_ in batch:
                self._fail(seq, e, on_error, done)
            return
        verify_seconds = (time.perf_counter() - t1) / len(batch)  # the shared forward, split alike
        for (seq, k, draft, draft_seconds), acc in zip(batch, accs):
            self._guarded(seq, lambda s, k=k, d=draft, a=acc, ds=draft_seconds:
                          self._commit(s, k, d, a, ds, verify_seconds), on_error, done)

    def _propose_round(self, chosen: list[tuple[Sequence, int, float]]):
        """Every sequence's draft for this round: (sequence, k, draft or the exception it raised,
        seconds spent choosing and drafting). Chains of the draft model are drafted for all rows
        together (propose_chains: one draft forward per position); other drafters propose alone."""
        out, pooled = [], []  # pooled: (index into out, model drafter, state)
        for seq, k, seconds in chosen:
            t0 = time.perf_counter()
            try:
                model = self._model_drafter(seq.engine.drafter) if k > 0 and self.draft_cache is not None else None
                state = DraftState(seq.req.tokens, k, seq.req.cfg.sampling, seq.req.generator)
                lookup = seq.engine.drafter.lookup(state) if model is not None and model is not seq.engine.drafter \
                    else None  # a hybrid step copies by lookup or asks the model
                if model is not None and lookup is None:
                    pooled.append((len(out), model, state))
                    draft = None
                else:
                    draft = lookup if lookup is not None else seq.engine._propose(seq.req, k)
            except Exception as e:  # noqa: BLE001 - one sequence's failure must not stop the others
                draft = e
            out.append([seq, k, draft, seconds + time.perf_counter() - t0])
        if pooled:
            t0 = time.perf_counter()
            try:
                drafts = propose_chains([m for _, m, _ in pooled], [st for *_, st in pooled], self.draft_cache,
                                        [out[i][0].slot for i, *_ in pooled])
            except Exception as e:  # noqa: BLE001 - the pooled drafting failed as a whole: each sequence reports it
                drafts = [e] * len(pooled)
            share = (time.perf_counter() - t0) / len(pooled)
            for (i, *_), draft in zip(pooled, drafts):
                out[i][2] = draft
                out[i][3] += share
        return [tuple(o) for o in out]

    @staticmethod
    def _model_drafter(drafter) -> DraftModelDrafter | None:
        """The draft-model drafter behind a slot's drafter (itself, or a hybrid's), for chains only."""
        model = drafter if isinstance(drafter, DraftModelDrafter) else getattr(drafter, "model", None)
        if isinstance(model, DraftModelDrafter) and model.tree is None and (model is drafter or hasattr(drafter, "lookup")):
            return model
        return None

    @staticmethod
    def _choose_for(seq: Sequence) -> int:
        """This step's k for a sequence: its slot's load limit and policy (the round may cap it)."""
        return seq.engine.policy.choose(k_cap=seq.engine._draft_length(seq.req))

    @staticmethod
    def _tree(drafter) -> bool:
        return getattr(drafter, "max_tree_nodes", 0) > 0

    @staticmethod
    def _own_verify(drafter) -> bool:
        return hasattr(drafter, "verify_chain") or hasattr(drafter, "verify_tree")

    def _step_with(self, seq: Sequence, k: int, tree: DraftTree) -> str | None:
        """The engine's step for a draft already proposed (trees): verify alone, then commit."""
        from specdec.engine.generate import verify_tree
        t1 = time.perf_counter()
        tacc = verify_tree(self.target, seq.engine.cache, seq.req.tokens[-1], tree, seq.req.cfg.sampling,
                           seq.req.generator)
        seq.req.stats.verify_seconds += time.perf_counter() - t1
        return self._finish_step(seq, k, tree, tacc.path, tacc.next_token, int(tree.depth.max()),
                                 None, time.perf_counter() - t1)

    def _commit(self, seq: Sequence, k: int, draft: DraftTree, acc, draft_seconds: float,
                verify_seconds: float) -> str | None:
        seq.engine.cache.advance(1 + acc.num_accepted)  # this row's rollback: its length
        seq.req.stats.draft_seconds += draft_seconds
        seq.req.stats.verify_seconds += verify_seconds
        return self._finish_step(seq, k, draft, list(range(acc.num_accepted)), acc.next_token, len(draft),
                                 draft_seconds, verify_seconds, acc.confidence)

    @staticmethod
    def _finish_step(seq: Sequence, k: int, draft: DraftTree, path: list[int], next_token: int,
                     depth: int, draft_seconds: float | None, verify_seconds: float,
                     confidence: tuple[float, ...] = ()) -> str | None:
        """What the engine's _step does after verifying: stats, drafter and policy feedback (the
        target's confidence per verified row, where reported), emit."""
        stats = seq.req.stats
        stats.record_choice(k)
        stats.record_step(depth, len(path), nodes=len(draft))
        seq.engine.drafter.observe(len(path))
        if confidence:  # before observe: it reads this step's confidence rule
            seq.engine.policy.observe_target(confidence, depth, len(path))
        seq.engine.policy.observe(depth, len(path))
        seq.engine.policy.observe_time(depth, draft_seconds, verify_seconds)  # what was drafted
        reason = seq.req.emit(draft.tokens[path].tolist() + [next_token])
        seq.finish_reason = reason
        return reason

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
        done.append(seq)

    def _prefill_chunk(self, seq: Sequence) -> str | None:
        """Feed the next chunk of the prompt; after the last one, emit the first token as the engine does."""
        t0 = time.perf_counter()
        req, cache = seq.req, seq.engine.cache
        end = min(seq.prefilled + self.prefill_chunk, req.prompt_len)
        x = torch.tensor([req.tokens[seq.prefilled:end]], device=cache.k.device)  # [1, chunk]
        logits = self.target(x, cache, seq.prefilled, last_only=True)[0, -1]  # [vocab]
        cache.advance(end - seq.prefilled)
        seq.prefilled = end
        if end < req.prompt_len:
            req.stats.prefill_seconds += time.perf_counter() - t0
            return None
        sampling = req.cfg.sampling
        first = int(logits.argmax()) if sampling.greedy else int(sample(probs_from_logits(logits, sampling),
                                                                        req.generator))
        seq.engine.start_drafter(req)
        req.stats.prefill_seconds += time.perf_counter() - t0
        return req.emit([first])
