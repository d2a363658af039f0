"""The step: propose -> verify -> accept -> commit, for B >= 1 sequences at once.

`generate` (one sequence), the bench and the server's slot pool all run this one function. A step,
for every sequence given:

1. plan: a drafter whose prefill was put off is started if the policy now says it pays; then the
   policy's `plan(Ask)` picks the action (plain, a chain of k, a tree), capped by the budget and
   the context, and by the step's common width where chains of many rows are verified together
   (a drafter drafting by lookup while its model waits: the policy's waiting one plans and learns,
   and the policy itself reads the step's tokens, `observe_waiting`);
2. propose: each drafter drafts (the chains of pooled drafters, a draft model or a head: all rows
   in one forward per draft position);
3. verify: the chains of every row in ONE target forward over ragged rows; a tree, or a drafter
   with a verify forward of its own (layer skip, lookahead), alone;
4. commit: the only place a target cache moves after its prefill (`commit_cache`); then the stats,
   the drafter's and the policy's feedback (`observe(Outcome)`) and the tokens, cut at
   end-of-sequence or the budget.

Before its steps a sequence's target cache moves in its prefill alone (`prefill`); a prefix cache's
hit is a prefill that starts late (`prefill_from`).

A failure in one sequence's step fails that sequence alone (`StepReport.failed`); the others go on.
Greedy decoding gives plain decoding's tokens whatever the drafter, the policy or the batch.

A sequence under a grammar (`Sequence.constraint`, structured output) draws every token from the
target's distribution masked by the grammar: its first token, and each verified row after the draft
tokens before it. Its drafts are cut at the first token the grammar rejects (the target would reject
it); the tokens the grammar forces after it (a key, punctuation) follow it for free, up to
FORCED_MOST in all, and the policy learns from the drafter's own tokens alone; the grammar moves with
the emitted tokens.
"""

from __future__ import annotations

import time
from functools import partial
from dataclasses import dataclass, field
from typing import Callable

import torch

from specdec.config import GenerationConfig
from specdec.drafters.base import Drafter, DraftState
from specdec.errors import SpecdecError
from specdec.metrics import GenerationStats
from specdec.model.transformer import Transformer
from specdec.policy import Action, Ask, Outcome, StepPolicy, sync
from specdec.sampling.logits import probs_from_logits, sample
from specdec.sampling.logprobs import TokenLogprob, token_logprobs
from specdec.sampling.penalties import Penalties, Rules, paths_of
from specdec.tree import DraftTree
from specdec.sampling.constrained import constrain
from specdec.sampling.verify import Verified, masked, verify, verify_chains, verify_tree


def make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


@dataclass(eq=False)
class Sequence:
    """One sequence in flight: its tokens, budget and stop ids, its generator, its target cache (a
    row of a batched cache: `row`), its drafter and policy. `tag` is the owner's."""

    tokens: list[int]  # prompt + new tokens
    prompt_len: int
    cfg: GenerationConfig
    eos_ids: set[int]
    generator: torch.Generator
    cache: object = None  # KVCache: this sequence's keys/values (row `row` of the step's batched cache)
    drafter: Drafter | None = None  # (cache, drafter, policy: its slot's, from when it is seated)
    policy: StepPolicy | None = None
    row: int = 0
    on_tokens: Callable[[list[int]], None] | None = None
    tag: object = None
    stats: GenerationStats = field(default_factory=GenerationStats)
    prefilled: int = 0  # prompt tokens in the cache
    speculate: bool = True  # False: no drafting (the drafter has not started: plain steps)
    pending: bool = False  # the drafter's start was put off: the policy is asked before each step
    finish_reason: str | None = None  # "stop", "length" (or the owner's "error")
    t_start: float = field(default_factory=time.perf_counter)
    logprobs: list[TokenLogprob] | None = None  # one per new token, where cfg.logprobs asks
    prompt_logprobs: list[TokenLogprob | None] | None = None  # one per prompt token (the first: None), where asked
    constraint: object | None = None  # a specdec.constraints.Constraint (structured output), or None
    penalties: Penalties | None = None  # the request's logit bias and penalties on the target's rows, or None
    error: Exception | None = None  # what failed it (finish_reason 'error')

    def __post_init__(self):
        if self.cfg.logprobs is not None:
            self.logprobs = []
        if self.cfg.prompt_logprobs:
            self.prompt_logprobs = [None]

    @property
    def num_new(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def new_tokens(self) -> list[int]:
        return self.tokens[self.prompt_len:]

    @property
    def prefilling(self) -> bool:
        return self.num_new == 0

    def emit(self, new: list[int], scores: list[TokenLogprob] | None = None) -> str | None:
        """Commit new tokens, cut at end-of-sequence or the budget; return a finish reason or None.
        scores: the new tokens' logprobs (where cfg.logprobs asks), cut alike."""
        reason = None
        for i, tok in enumerate(new):
            if self.cfg.stop_at_eos and tok in self.eos_ids:
                new, reason = new[:i + 1], "stop"
                break
        room = self.cfg.max_new_tokens - self.num_new
        if len(new) >= room:
            new, reason = new[:room], reason or "length"
        if self.constraint is not None:  # the grammar moves with each token; where it ends, the answer does
            for i, tok in enumerate(new):
                self.constraint.advance([tok])
                if self.constraint.finished:
                    new, reason = new[:i + 1], "stop"
                    break
        self.tokens += new
        if self.logprobs is not None:
            if scores is None or len(scores) < len(new):
                raise SpecdecError("logprobs were asked but the step did not score its tokens")
            self.logprobs += scores[:len(new)]
        if self.on_tokens and new:
            self.on_tokens(new)
        self.finish_reason = reason
        return reason


def check_fits(capacity: int, drafter: Drafter, prompt: list[int], max_new_tokens: int) -> None:
    """SpecdecError naming the numbers unless prompt + max_new_tokens (+ a tree's scratch) fit."""
    if not prompt:
        raise SpecdecError("the prompt is empty; give at least one token")
    tree_nodes = drafter.caps.tree_nodes  # scratch slots a tree needs past the end
    if tree_nodes and len(prompt) + max_new_tokens + tree_nodes > capacity:
        raise SpecdecError(f"a draft tree of {tree_nodes} nodes does not fit after prompt ({len(prompt)}) + "
                           f"max_new_tokens ({max_new_tokens}) in the context of {capacity} tokens; "
                           "lower the tree budget (--tree-budget) or the new tokens (max_tokens, --max-new-tokens), "
                           "or raise the context (--max-context)")
    need = len(prompt) + max_new_tokens
    if need > capacity:
        raise SpecdecError(f"prompt ({len(prompt)} tokens) + max_new_tokens ({max_new_tokens}) = {need} "
                           f"exceeds the context of {capacity} tokens; shorten the prompt, ask for fewer new tokens "
                           "(max_tokens, --max-new-tokens) or raise the context (--max-context)")


# ---- prefill and the drafter's start ----

def prefill(target: Transformer, seq: Sequence, chunk: int | None = None, load: int = 1) -> str | None:
    """The prompt's next `chunk` tokens (None: all of it) into the sequence's cache. After the last:
    the policy's word on the drafter's start (`admit_drafter`, at `load` sequences), the first token
    emitted (streamed), then the drafter's prefill of the prompt where it starts now, unless the
    answer ended at that token."""
    t0 = time.perf_counter()
    cache = seq.cache
    if seq.prefilled == 0:
        cache.reset()
    end = seq.prompt_len if chunk is None else min(seq.prefilled + chunk, seq.prompt_len)
    x = torch.tensor([seq.tokens[seq.prefilled:end]], device=cache.k.device)  # [1, chunk]
    every = seq.prompt_logprobs is not None  # the prompt's logprobs: every position's logits
    if seq.drafter.caps.features:  # a head drafts from the prompt's features
        logits, h = target(x, cache, seq.prefilled, last_only=not every, hidden=True)
        seq.drafter.feed(seq.prefilled, h[0])
    else:
        logits = target(x, cache, seq.prefilled, last_only=not every)  # [1, chunk or 1, vocab]
    if every:  # rows but the last scored the prompt's next tokens
        seq.prompt_logprobs += token_logprobs(logits[0, :-1], seq.tokens[seq.prefilled + 1:end], seq.cfg.logprobs)
    logits = logits[0, -1]  # [vocab]
    if every and end < seq.prompt_len:
        seq.prompt_logprobs += token_logprobs(logits[None], [seq.tokens[end]], seq.cfg.logprobs)
    cache.advance(end - seq.prefilled)
    seq.prefilled = end
    if end < seq.prompt_len:
        seq.stats.prefill_seconds += time.perf_counter() - t0
        return None
    if seq.cfg.max_new_tokens == 0:  # the prompt alone is scored
        seq.stats.prefill_seconds += time.perf_counter() - t0
        seq.finish_reason = "length"
        return seq.finish_reason
    sampling = seq.cfg.sampling
    allowed = None if seq.constraint is None else seq.constraint.allowed()[None]
    if seq.penalties is not None:
        allowed = Rules(seq.penalties.rows([], [[]]), allowed)
    scored = masked(logits[None], allowed)[0]
    first = int(scored.argmax()) if sampling.greedy else int(sample(probs_from_logits(scored, sampling),
                                                                    seq.generator))
    pays = admit_drafter(seq, load)  # decided at the request's start, before anything is generated
    reason = seq.emit([first], _scores(seq, logits[None], [first]))  # streamed before the drafter's prefill
    # a draft model prefills the prompt: part of the request's prefill (its load, where deferred, is not)
    loaded = _start_now(seq, seq.prompt_len) if pays and reason is None else 0.0
    seq.stats.prefill_seconds += time.perf_counter() - t0 - loaded
    return reason


def prefill_from(seq: Sequence, cached: int) -> None:
    """A prefill that starts late: the sequence's cache holds its prompt's first `cached` tokens'
    keys/values already (a prefix cache's hit) and keeps them; the prefill goes on from there."""
    seq.cache.truncate(cached)
    seq.prefilled = seq.stats.cached_tokens = cached


def _scores(seq: Sequence, rows: torch.Tensor, tokens: list[int]) -> list[TokenLogprob] | None:
    """The tokens' logprobs from the target's logits rows # [len(tokens), vocab] that predicted them,
    where the sequence asks for them (else nothing is computed)."""
    if seq.logprobs is None:
        return None
    return token_logprobs(rows, tokens, seq.cfg.logprobs)


def admit_drafter(seq: Sequence, load: int = 1) -> bool:
    """A new request: the policy starts afresh and decides whether the drafter's prefill of this
    prompt pays now (at `load` sequences, which a draft prefill stalls); True: the caller starts it
    (`_start_now`). If not, the request runs plain (a drafter that can draft by lookup alone does so)
    and the policy is asked again before each step: the drafter starts, prefilling the text so far,
    once the answer has run long enough to win its prefill back. A request of k 0 runs plain, its
    drafter never started."""
    seq.policy.reset()
    if seq.cfg.k == 0:  # the request asked for plain decoding: the drafter never starts, nor looks up
        seq.pending = seq.speculate = False
        seq.stats.draft_admission = seq.stats.draft_started_at = None
        return False
    pays = _drafter_pays(seq, load)
    admission = seq.policy.last_admission
    seq.stats.draft_admission = dict(admission) if admission else None
    if pays:
        return True
    seq.pending, seq.stats.draft_started_at = True, None
    seq.speculate = seq.drafter.caps.lookup_only
    if seq.speculate:
        seq.drafter.start_lookup_only(seq.tokens[:seq.prompt_len])
    return False


def _drafter_pays(seq: Sequence, load: int) -> bool:
    if not seq.drafter.caps.drafts:
        return True
    return seq.policy.start_now(_to_prefill(seq, seq.tokens), seq.num_new, seq.cfg.max_new_tokens, load)


def _to_prefill(seq: Sequence, tokens: list[int]) -> int:
    """The tokens the drafter's prefill of `tokens` computes: those it feeds, less what its cache holds."""
    return seq.drafter.prefill_tokens(len(tokens)) - seq.drafter.held(tokens)


def _start_now(seq: Sequence, upto: int | None = None) -> float:
    """The drafter prefills the text so far (upto: its first `upto` tokens, the prompt at the
    request's start; None: the prompt and the answer so far, mid-answer). A draft model deferred until
    now loads first, outside the prefill's timing (the policy prices the prefill alone) and outside the
    request's seconds (as the target's load is), in stats.load_seconds; returns those seconds."""
    loaded = seq.drafter.load()
    seq.stats.load_seconds += loaded
    tokens = seq.tokens[:upto] if upto is not None else list(seq.tokens)
    fed = _to_prefill(seq, tokens)
    t0 = time.perf_counter()
    seq.drafter.start(tokens)
    sync(seq.cache.k.device)
    seconds = time.perf_counter() - t0
    seq.pending, seq.speculate = False, True
    seq.stats.draft_started_at = len(tokens) - seq.prompt_len
    if upto is None and seq.num_new:  # mid-answer: a prefill all the same (the request's own is over by now)
        seq.stats.prefill_seconds += seconds
    seq.policy.observe_prefill(fed, seconds)
    return loaded


# ---- the step ----

@dataclass
class StepReport:
    failed: list[tuple[Sequence, Exception]]  # sequences whose step raised (the others went on)
    batch: int  # sequences whose chains the step verified together (at least 1)
    width: int  # positions per row of that verify (every row pads to the widest)


@dataclass
class _Row:
    """One sequence's step in the making."""

    seq: Sequence
    policy: StepPolicy  # the one that planned the step (_planner)
    action: Action
    seconds: float  # choosing and drafting
    draft: DraftTree | None = None
    state: DraftState | None = None
    masks: torch.Tensor | Rules | None = None  # the grammar's, bool # [1 + len(draft), vocab], where it has one;
    # Rules where the request has a bias or penalties (they carry the grammar's masks)
    pooled: int = 1  # rows whose chains were drafted together with this one's (a pool's), itself included


FORCED_MOST = 32  # the most tokens a chain may hold with the grammar's forced tokens (its verify rows)


def _space(seq: Sequence) -> int:
    """Tokens a step may draft past the last committed one: the token budget and the context left."""
    budget = seq.cfg.max_new_tokens - seq.num_new - 1
    room = seq.cache.capacity - seq.cache.length - 1
    return max(0, min(budget, room))


def draft_length(seq: Sequence) -> int:
    """The most draft tokens a step may verify: k, capped by the token budget and the context."""
    return min(seq.cfg.k, _space(seq)) if seq.drafter.caps.drafts and seq.speculate else 0


def chain_room(seq: Sequence) -> int:
    """The most tokens a chain may hold under a grammar, its forced tokens included (they are free, so
    a plain step verifies them too): the budget and the context, at most FORCED_MOST; none in plain
    decoding (a drafter that drafts nothing)."""
    return min(FORCED_MOST, _space(seq)) if seq.drafter.caps.drafts else 0


def _planner(seq: Sequence) -> StepPolicy:
    """The policy that plans this step and learns its outcome: while the drafter drafts by prompt lookup
    waiting for its model to start, the policy's waiting one (where it has one), else its own."""
    waiting = seq.policy.waiting
    return waiting if waiting is not None and seq.pending and seq.speculate else seq.policy


def _plan(seq: Sequence, policy: StepPolicy, batch: int, k_limit: int | None) -> Action:
    k_cap = draft_length(seq) if k_limit is None else min(draft_length(seq), k_limit)
    caps = seq.drafter.caps
    room = seq.cache.capacity - seq.cache.length - 1
    return policy.plan(Ask(k_cap, batch, room if caps.tree_nodes else None, caps.knows_confidence))


def _state(seq: Sequence, action: Action) -> DraftState:
    room = seq.cache.capacity - seq.cache.length - 1
    cap = room if action.nodes is None else min(room, action.nodes)
    mask = None if seq.constraint is None else seq.constraint.mask_after
    forced = None if seq.constraint is None else seq.constraint.forced
    penalize = None if seq.penalties is None else partial(seq.penalties.after, seq.new_tokens)
    return DraftState(seq.tokens, action.k, seq.cfg.sampling, seq.generator, max_nodes=cap, tree=action.tree,
                      stop=action.stop, k_stop=action.k_stop, mask=mask, forced=forced, room=chain_room(seq),
                      penalize=penalize)


def _clip(seq: Sequence, tree: DraftTree, state: DraftState) -> DraftTree:
    """A chain past its limit is cut; a tree must fit the context."""
    if tree.is_chain and len(tree) > state.most:
        return tree.head(state.most)
    room = seq.cache.capacity - seq.cache.length - 1
    if not tree.is_chain and len(tree) > room:
        raise SpecdecError(f"the drafter proposed a tree of {len(tree)} nodes but only {room} context slots are left")
    return tree


def _propose(rows: list[_Row], pool, failed: list) -> list[_Row]:
    """Every row's draft; the chains of pooled drafters (a draft model, a head) for all such rows in one
    forward per position."""
    out, pooled = [], []
    for r in rows:
        t0 = time.perf_counter()
        try:
            r.state = _state(r.seq, r.action)
            if r.action.k == 0:
                r.draft = DraftTree.empty()
            elif pool is not None and r.seq.drafter.caps.pooled:
                r.draft = r.seq.drafter.lookup(r.state)  # None: the model drafts, with the pool
            else:
                r.draft = r.seq.drafter.propose(r.state)
        except Exception as e:  # noqa: BLE001 - one sequence's failure must not stop the others
            failed.append((r.seq, e))
            continue
        r.seconds += time.perf_counter() - t0
        (out if r.draft is not None else pooled).append(r)
    if pooled:
        t0 = time.perf_counter()
        try:
            models = [r.seq.drafter.pool_model for r in pooled]
            drafts = models[0].propose_pooled(models, [r.state for r in pooled], pool, [r.seq.row for r in pooled])
        except Exception as e:  # noqa: BLE001 - the pooled drafting failed as a whole: each sequence reports it
            failed.extend((r.seq, e) for r in pooled)
            return out
        share = (time.perf_counter() - t0) / len(pooled)
        for r, d in zip(pooled, drafts):
            r.draft, r.seconds, r.pooled = d, r.seconds + share, len(pooled)
            out.append(r)
    kept = []
    for r in out:
        try:
            r.draft = _clip(r.seq, r.draft, r.state)
            if r.seq.constraint is not None:
                r.draft, r.masks = constrain(r.seq.constraint, r.draft, r.state.most)
            if r.seq.penalties is not None:
                r.masks = Rules(r.seq.penalties.rows(r.seq.new_tokens, paths_of(r.draft)), r.masks)
            kept.append(r)
        except Exception as e:  # noqa: BLE001
            failed.append((r.seq, e))
    return kept


def _alone(r: _Row) -> bool:
    """Verified by itself: a drafter's own verify forward (a drafting step), or a tree."""
    return (r.action.k > 0 and r.seq.drafter.caps.own_verify) or not r.draft.is_chain


def _verify_alone(target: Transformer, r: _Row) -> Verified:
    seq = r.seq
    last, sampling = seq.tokens[-1], seq.cfg.sampling
    if r.action.k > 0 and seq.drafter.caps.own_verify:
        return seq.drafter.verify(target, seq.cache, last, r.draft, sampling, seq.generator, r.masks)
    return verify_tree(target, seq.cache, last, r.draft, sampling, seq.generator, seq.drafter.caps.features,
                       r.masks)


def _verify_together(target: Transformer, cache, rows: list[_Row]) -> list[Verified]:
    if len(rows) == 1:
        s = rows[0].seq
        return [verify(target, s.cache, s.tokens[-1], rows[0].draft, s.cfg.sampling, s.generator,
                       s.policy.wants_target_confidence, s.drafter.caps.features, rows[0].masks)]
    seqs = [r.seq for r in rows]
    return verify_chains(target, cache, [s.row for s in seqs], [s.cache.length for s in seqs],
                         [s.tokens[-1] for s in seqs], [r.draft for r in rows], [s.cfg.sampling for s in seqs],
                         [s.generator for s in seqs], [s.policy.wants_target_confidence for s in seqs],
                         any(s.drafter.caps.features for s in seqs), [r.masks for r in rows])


def step(target: Transformer, cache, seqs: list[Sequence], load: int = 1, pool=None,
         width_rule: Callable[[list[tuple[StepPolicy, int]]], int] | None = None,
         k_limit: int | None = None) -> StepReport:
    """One speculative step for every sequence in `seqs` (decoding, unfinished).

    cache: the batched target cache whose row `seq.row` is each sequence's cache; load: sequences a
    drafter's prefill started now would stall; pool: a batched draft cache whose rows are the pooled
    draft models' caches (their chains are drafted together); width_rule: picks the common width of
    the chains verified together from each row's (policy, k) (default: the widest); k_limit: every
    row's draft length at most this (None: no cap)."""
    failed: list[tuple[Sequence, Exception]] = []
    batch = max(1, sum(1 for s in seqs if not s.drafter.caps.own_verify))
    rows = []
    for seq in seqs:
        try:
            if seq.pending and _drafter_pays(seq, load):  # a put-off prefill: buy it now
                _start_now(seq)
            t0 = time.perf_counter()
            planner = _planner(seq)
            rows.append(_Row(seq, planner, _plan(seq, planner, batch, k_limit), 0.0))
        except Exception as e:  # noqa: BLE001 - one sequence's failure must not stop the others
            failed.append((seq, e))
            continue
        rows[-1].seconds = time.perf_counter() - t0
    chains = [r for r in rows if not r.seq.drafter.caps.tree_nodes and not r.seq.drafter.caps.own_verify]
    if width_rule is not None and len(chains) > 1:
        w = width_rule([(r.policy, r.action.k) for r in chains])
        for r in chains:  # trees and own verifies run alone, at their own width
            a = r.action
            r.action = Action(min(a.k, w - 1), a.nodes, a.tree, a.stop, min(a.k_stop, w - 1))
    rows = _propose(rows, pool, failed)
    together = [r for r in rows if not _alone(r)]
    width = max((len(r.draft) + 1 for r in together), default=1)
    for r in rows:
        if not _alone(r):
            continue
        t1 = time.perf_counter()
        try:
            verified = _verify_alone(target, r)
            _commit(r, verified, time.perf_counter() - t1, 1, None)
        except Exception as e:  # noqa: BLE001
            failed.append((r.seq, e))
    if together:
        t1 = time.perf_counter()
        try:
            results = _verify_together(target, cache, together)
        except Exception as e:  # noqa: BLE001 - the shared forward failed: each of its sequences reports it
            failed.extend((r.seq, e) for r in together)
            results = []
        seconds = (time.perf_counter() - t1) / len(together)  # the shared forward, split alike
        for r, verified in zip(together, results):
            try:
                _commit(r, verified, seconds, len(together), width if len(together) > 1 else None)
            except Exception as e:  # noqa: BLE001
                failed.append((r.seq, e))
    return StepReport(failed, len(together) or 1, width)


def _commit(r: _Row, verified: Verified, verify_seconds: float, batch: int, width: int | None) -> str | None:
    """The accepted tokens' keys/values stay, the stats count the step, the drafter and the policy
    learn its outcome, the tokens are emitted."""
    seq, draft, action = r.seq, r.draft, r.action
    if seq.drafter.caps.features:  # the kept rows' features, at the positions they now hold
        seq.drafter.feed(seq.cache.length, verified.features)
    commit_cache(seq.cache, verified)
    accepted = verified.num_accepted
    depth = len(draft) if draft.is_chain else (int(draft.depth.max()) if len(draft) else 0)
    stats = seq.stats
    stats.draft_seconds += r.seconds
    stats.verify_seconds += verify_seconds
    stats.record_choice(action.k)
    stats.record_step(depth, accepted, nodes=len(draft))
    seq.drafter.observe(accepted)
    tree = action.nodes is not None
    outcome = (_outcome(r, verified, verify_seconds, batch, width) if draft.free else
               Outcome(depth, accepted, action.nodes if tree else None, list(verified.confidence) or None,
                       r.seconds, verify_seconds, batch, width, action.k if tree else None, pooled=r.pooled))
    r.policy.observe(outcome)
    if r.policy is not seq.policy:  # a waiting lookup's step: the drafter's own policy sees its tokens
        seq.policy.observe_waiting(outcome)
        stats.lookup_drafted += depth
        stats.lookup_accepted += accepted
    tokens = draft.tokens[verified.path].tolist() + [verified.next_token]
    if seq.logprobs is None:
        return seq.emit(tokens)
    if verified.logits is None:
        raise SpecdecError("logprobs are not available with this drafter: its verify does not report the "
                           "target's logits")
    return seq.emit(tokens, _scores(seq, verified.logits[verified.emitted_rows], tokens))


def _outcome(r: _Row, verified: Verified, verify_seconds: float, batch: int, width: int | None) -> Outcome:
    """A chain with the grammar's forced tokens in it, as the policy learns from it: the drafter's own
    tokens and their confidence rows alone (a forced token passes wherever its prefix does), the
    verify pass at its real width."""
    free, accepted = r.draft.free, verified.num_accepted
    mine = [i for i, f in enumerate(free) if not f]
    rows = [c for j, c in enumerate(verified.confidence) if j >= len(free) or not free[j]]
    passed = sum(1 for i in mine if i < accepted)
    return Outcome(len(mine), passed, None, rows or None, r.seconds, verify_seconds, batch, width or len(free) + 1,
                   free_accepted=accepted - passed, pooled=r.pooled)


def commit_cache(cache, verified: Verified) -> None:
    """The accepted tokens' keys/values become the cache's: its length, or a tree's path moved into place."""
    start = cache.length
    if verified.chain:
        cache.advance(1 + verified.num_accepted)
        return
    cache.advance(verified.written)
    cache.keep(list(range(start + 1)) + [start + 1 + i for i in verified.path])
