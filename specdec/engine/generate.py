"""Single-sequence speculative generation: propose -> verify -> accept -> commit, streaming.

Plain decoding is the same loop with a drafter that proposes nothing (k = 0 per step).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from specdec.config import GenerationConfig, SamplingParams
from specdec.drafters.base import Drafter, DraftState, NoDrafter
from specdec.errors import SpecdecError
from specdec.metrics import GenerationStats
from specdec.model.transformer import Transformer
from specdec.policy import sync
from specdec.sampling.logits import probs_from_logits, sample
from specdec.sampling.rejection import Acceptance, greedy_accept, rejection_accept
from specdec.sampling.tree_accept import TreeAcceptance, greedy_tree_accept, tree_rejection_accept
from specdec.tree import DraftTree


@dataclass
class GenerationResult:
    tokens: list[int]  # new tokens only (an end-of-sequence token, if hit, is the last one)
    stats: GenerationStats
    finish_reason: str  # "stop" (end-of-sequence) or "length"


def make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


def verify(target: Transformer, cache, last_token: int, tree: DraftTree, sampling: SamplingParams,
           generator: torch.Generator, confidence: bool = False) -> Acceptance:
    """One target forward over [last committed token] + draft chain; accept a prefix + one token
    (confidence: and report the target's top probability per row, for the policy)."""
    device = cache.k.device
    draft = tree.tokens.to(device)  # [k]
    x = torch.cat([torch.tensor([last_token], device=device), draft]).unsqueeze(0)  # [1, k + 1]
    logits = target(x, cache, cache.length)[0]  # [k + 1, vocab]
    if sampling.greedy:
        return greedy_accept(draft, logits, confidence)
    return rejection_accept(draft, probs_from_logits(logits, sampling), tree.q, generator, confidence)


def tree_attention_mask(tree: DraftTree, start: int, device) -> torch.Tensor:
    """Bool mask # [n + 1, start + n + 1] for [root] + tree nodes written at slots start..start+n:
    every row sees the whole committed prefix, itself and its ancestors, never its siblings."""
    n = len(tree)
    mask = torch.ones(n + 1, start + n + 1, dtype=torch.bool, device=device)
    mask[:, start:] = tree.tree_mask().to(device)
    return mask


def verify_tree(target: Transformer, cache, last_token: int, tree: DraftTree, sampling: SamplingParams,
                generator: torch.Generator) -> TreeAcceptance:
    """One target forward over [last committed token] + every tree node, under the tree mask; then
    keep the accepted path's keys/values in place (cache.keep) and return the path + next token."""
    device = cache.k.device
    start = cache.length
    x = torch.cat([torch.tensor([last_token], device=device), tree.tokens.to(device)]).unsqueeze(0)  # [1, n + 1]
    positions = (start + tree.position_offsets().to(device)).unsqueeze(0)  # [1, n + 1]
    logits = target(x, cache, start, positions=positions, mask=tree_attention_mask(tree, start, device))[0]
    if sampling.greedy:
        acc = greedy_tree_accept(tree, logits)  # logits # [n + 1, vocab]
    else:
        acc = tree_rejection_accept(tree, probs_from_logits(logits, sampling), tree.parent_q(), generator,
                                    replacement=False)
    cache.advance(len(tree) + 1)
    cache.keep(list(range(start + 1)) + [start + 1 + i for i in acc.path])
    return acc


@dataclass
class _Request:
    """One sequence in flight: committed tokens, budget, stop ids and its own generator."""

    tokens: list[int]  # prompt + new tokens
    prompt_len: int
    cfg: GenerationConfig
    eos_ids: set[int]
    generator: torch.Generator
    stats: GenerationStats
    on_tokens: Callable[[list[int]], None] | None
    speculate: bool = True  # False: no drafting (the policy has not started the drafter: plain steps)
    pending: bool = False  # the drafter has not started: the policy is asked before each step

    @property
    def num_new(self) -> int:
        return len(self.tokens) - self.prompt_len

    def emit(self, new: list[int]) -> str | None:
        """Commit new tokens, cut at end-of-sequence or the budget; return a finish reason or None."""
        reason = None
        for i, tok in enumerate(new):
            if self.cfg.stop_at_eos and tok in self.eos_ids:
                new, reason = new[:i + 1], "stop"
                break
        room = self.cfg.max_new_tokens - self.num_new
        if len(new) >= room:
            new, reason = new[:room], reason or "length"
        self.tokens += new
        if self.on_tokens and new:
            self.on_tokens(new)
        return reason


class SpeculativeGenerator:
    """Generates with one target and one drafter; reuses the target's KV cache across requests.

    With a policy (specdec.policy.AdaptivePolicy), cfg.k is the largest draft length and the policy
    picks each step's k (0 = a plain step) from its cost model and the acceptance seen so far."""

    def __init__(self, target: Transformer, drafter: Drafter, capacity: int, policy=None, cache=None):
        """cache: share another generator's KV cache (generators used one at a time)."""
        self.target = target
        self.drafter = drafter
        self.cache = cache if cache is not None else target.new_cache(capacity)
        self.policy = policy

    def check_fits(self, prompt: list[int], max_new_tokens: int) -> None:
        if not prompt:
            raise SpecdecError("the prompt is empty; give at least one token")
        tree_nodes = getattr(self.drafter, "max_tree_nodes", 0)  # scratch slots a tree needs past the end
        if len(prompt) + max_new_tokens + tree_nodes > self.cache.capacity and tree_nodes:
            raise SpecdecError(f"a draft tree of {tree_nodes} nodes does not fit after prompt ({len(prompt)}) + "
                               f"max_new_tokens ({max_new_tokens}) in the context of {self.cache.capacity} tokens; "
                               "lower --tree-budget or --max-new-tokens, or raise --max-context")
        need = len(prompt) + max_new_tokens
        if need > self.cache.capacity:
            raise SpecdecError(f"prompt ({len(prompt)} tokens) + max_new_tokens ({max_new_tokens}) = {need} "
                               f"exceeds the context of {self.cache.capacity} tokens; shorten the prompt, "
                               "lower --max-new-tokens or raise --max-context")

    def generate(self, prompt: list[int], cfg: GenerationConfig, eos_ids: set[int] = frozenset(),
                 on_tokens: Callable[[list[int]], None] | None = None) -> GenerationResult:
        self.check_fits(prompt, cfg.max_new_tokens)
        t_start = time.perf_counter()
        req = _Request(list(prompt), len(prompt), cfg, set(eos_ids),
                       make_generator(cfg.sampling.seed, self.cache.k.device), GenerationStats(), on_tokens)
        first = self._prefill(prompt, cfg.sampling, req.generator)
        self.start_drafter(req)  # a draft model prefills here: part of the request's prefill time
        req.stats.prefill_seconds = time.perf_counter() - t_start
        reason = req.emit([first])
        while reason is None:
            reason = self._step(req)
        req.stats.new_tokens = req.num_new
        req.stats.seconds = time.perf_counter() - t_start
        return GenerationResult(req.tokens[req.prompt_len:], req.stats, reason)

    def start_drafter(self, req: _Request) -> None:
        """A new request: the policy starts afresh and decides whether the drafter's prefill of this
        prompt pays now. If not, the request runs plain (a hybrid drafts by lookup alone) and the
        policy is asked again before each step (`_step`, `_drafter_pays`): the drafter starts,
        prefilling the text so far, once the answer has run long enough to win its prefill back."""
        if self.policy is not None:
            self.policy.reset()
        pays = self._drafter_pays(req)
        admission = getattr(self.policy, "last_admission", None)
        req.stats.draft_admission = dict(admission) if admission else None
        if pays:
            self._start_now(req)
            return
        req.pending, req.stats.draft_started_at = True, None
        req.speculate = hasattr(self.drafter, "start_lookup_only")
        if req.speculate:
            self.drafter.start_lookup_only(req.tokens[:req.prompt_len])

    def _prefill_len(self, n: int) -> int:
        prefill_tokens = getattr(self.drafter, "prefill_tokens", None)  # a draft model's share of the text
        return prefill_tokens(n) if prefill_tokens is not None else n

    def _drafter_pays(self, req: _Request) -> bool:
        """The policy's word on starting the drafter now: start_now (may say yes mid-answer), or a
        policy that only admits (the server's LoadPolicy) at the request's start alone."""
        if self.policy is None or isinstance(self.drafter, NoDrafter):
            return True
        n = self._prefill_len(len(req.tokens))
        start_now = getattr(self.policy, "start_now", None)
        if start_now is not None:
            return start_now(n, req.num_new, req.cfg.max_new_tokens)
        admit = getattr(self.policy, "admit", None)
        return req.num_new == 0 and (admit is None or admit(n, req.cfg.max_new_tokens))

    def _start_now(self, req: _Request) -> None:
        """The drafter prefills the text so far (the prompt, or the prompt and the answer so far)."""
        t0 = time.perf_counter()
        self.drafter.start(list(req.tokens))
        sync(self.cache.k.device)
        seconds = time.perf_counter() - t0
        req.pending, req.speculate = False, True
        req.stats.draft_started_at = req.num_new
        if req.num_new:  # mid-answer: a prefill all the same (the request's own is over by now)
            req.stats.prefill_seconds += seconds
        observe_prefill = getattr(self.policy, "observe_prefill", None)
        if observe_prefill is not None:
            observe_prefill(self._prefill_len(len(req.tokens)), seconds)

    def _prefill(self, prompt: list[int], sampling: SamplingParams, generator) -> int:
        """Fill the cache with the prompt; return the first new token."""
        self.cache.reset()
        x = torch.tensor([prompt], device=self.cache.k.device)  # [1, T]
        logits = self.target(x, self.cache, 0, last_only=True)[0, -1]  # [vocab]
        self.cache.advance(len(prompt))
        if sampling.greedy:
            return int(logits.argmax())
        return int(sample(probs_from_logits(logits, sampling), generator))

    def _draft_length(self, req: _Request) -> int:
        """k, capped so drafts never pass the token budget or the context (0 for plain decoding)."""
        if isinstance(self.drafter, NoDrafter) or not req.speculate:
            return 0
        budget = req.cfg.max_new_tokens - req.num_new - 1
        room = self.cache.capacity - self.cache.length - 1
        return max(0, min(req.cfg.k, budget, room))

    def _propose(self, req: _Request, k: int, nodes: int | None = None, tree: bool = True,
                 stop=None, k_stop: int = 0) -> DraftTree:
        """k caps the depth (tokens a step can accept); a tree's nodes are capped by the context room
        and `nodes`; tree=False asks a tree drafter for a chain; stop, k_stop: the policy's confidence
        rule, which may let a chain grow to k_stop (see DraftState)."""
        if k == 0:
            return DraftTree.empty()
        room = self.cache.capacity - self.cache.length - 1
        cap = room if nodes is None else min(room, nodes)
        state = DraftState(req.tokens, k, req.cfg.sampling, req.generator, max_nodes=cap, tree=tree, stop=stop,
                           k_stop=k_stop)
        tree, k = self.drafter.propose(state), state.limit
        if tree.is_chain and len(tree) > k:
            tree = DraftTree.chain(tree.tokens[:k], None if tree.q is None else tree.q[:k])
        elif not tree.is_chain and len(tree) > room:
            raise SpecdecError(f"the drafter proposed a tree of {len(tree)} nodes but only {room} context slots are left")
        return tree

    def _step(self, req: _Request) -> str | None:
        """propose -> verify -> accept -> commit; returns a finish reason or None."""
        if req.pending and self._drafter_pays(req):
            self._start_now(req)
        t0 = time.perf_counter()
        k = k_cap = self._draft_length(req)
        nodes, stop = None, None
        choose_action = getattr(self.policy, "choose_action", None)
        tree_drafter = getattr(self.drafter, "max_tree_nodes", 0) > 0
        if choose_action is not None and tree_drafter:  # chain, tree size or plain
            k, nodes = choose_action(k_cap=k, nodes_cap=self.cache.capacity - self.cache.length - 1)
        elif self.policy is not None:
            k = self.policy.choose(k_cap=k)
        req.stats.record_choice(k)
        confident = getattr(self.policy, "confident_draft", None)
        if nodes is None and confident is not None and getattr(self.drafter, "knows_confidence", False):
            k_cap, stop = confident(k, k_cap)  # a chain the draft's confidence may lengthen or end
        tree = self._propose(req, k, nodes, tree=nodes is not None or choose_action is None, stop=stop,
                             k_stop=k_cap)
        t1 = time.perf_counter()
        # a drafter may bring its own verify forward: from the hidden states it already has (layer skip,
        # verify_chain) or with extra branches in the same pass (lookahead, verify_tree); a plain step
        # chosen by the policy (k = 0) is always a plain forward
        tree_hook = getattr(self.drafter, "verify_tree", None) if k > 0 else None
        if tree.is_chain and tree_hook is None:
            verify_chain = getattr(self.drafter, "verify_chain", None)
            if verify_chain is None:  # ours: it can also report the target's confidence per row
                acc = verify(self.target, self.cache, req.tokens[-1], tree, req.cfg.sampling, req.generator,
                             getattr(self.policy, "wants_target_confidence", False))
            else:
                acc = verify_chain(self.target, self.cache, req.tokens[-1], tree, req.cfg.sampling, req.generator)
            self.cache.advance(1 + acc.num_accepted)
            path, depth = list(range(acc.num_accepted)), len(tree)
        else:
            tacc = (tree_hook or verify_tree)(self.target, self.cache, req.tokens[-1], tree, req.cfg.sampling,
                                              req.generator)
            acc = Acceptance(len(tacc.path), tacc.next_token)
            path, depth = tacc.path, int(tree.depth.max()) if len(tree) else 0
        req.stats.draft_seconds += t1 - t0
        req.stats.verify_seconds += time.perf_counter() - t1
        req.stats.record_step(depth, acc.num_accepted, nodes=len(tree))
        self.drafter.observe(acc.num_accepted)
        if nodes is not None:
            self.policy.observe_tree(nodes, depth, acc.num_accepted)
            self.policy.observe_time(k, t1 - t0, time.perf_counter() - t1, nodes=nodes)
        elif self.policy is not None:
            if acc.confidence:  # before observe: it reads this step's confidence rule
                self.policy.observe_target(acc.confidence, depth, acc.num_accepted)
            self.policy.observe(depth, acc.num_accepted)
            observe_time = getattr(self.policy, "observe_time", None)
            if observe_time is not None:
                observe_time(depth, t1 - t0, time.perf_counter() - t1)  # what was drafted, not asked for
        return req.emit(tree.tokens[path].tolist() + [acc.next_token])
