"""A drafter's chain drafted on the device: no host sync between draft tokens, and on CUDA one graph.

DraftModelDrafter.propose drafts token by token: a forward, then the host reads the logits to pick the
token (argmax or a sample) and to apply p_min and the policy's confidence rule, then feeds it. On a GPU
each of those reads waits for the device, and a small model's step costs its kernel launches more than
its bytes. Here each token's argmax (or its sample, at a uniform drawn before the chain from the
request's generator) feeds the next forward on the device; the host reads the chain once: its tokens,
their q and each position's top probability. The stop rules then cut it: the rule before token i reads
only the top probability of q_i, which the tokens before i determine, so cutting afterwards equals
deciding as it goes. Tokens past the cut were fed to the draft cache; the drafter's next sync rolls the
cache back to the committed tokens, as after any rejection.

The committed tokens are fed by the model's own forward (under CUDA graphs, its graph of that length);
the chain's limit - 1 one-token forwards, each token's pick among them, are one graph per (cache, chain
length, sampling) under CUDA graphs (model.graphs), replayed with one launch. Elsewhere the same code
runs eagerly (what the CPU tests check against the token-by-token loop). An EAGLE head's chain is the
same loop over its own step (its entry on its own predicted feature: eagle.py).
"""

from __future__ import annotations

import weakref
from dataclasses import replace
from typing import NamedTuple

import torch

from specdec.config import SamplingParams
from specdec.drafters.base import GO_ON, LAST
from specdec.model.cuda_graphs import capture
from specdec.model.kv_cache import KVCache
from specdec.model.transformer import Ragged
from specdec.sampling.logits import align_vocab, probs_from_logits, sample_at
from specdec.sampling.verify import ragged_inputs


class Chain(NamedTuple):
    """Drafted chains before the stop rules, a row each: tokens # [B, limit], q # [B, limit, vocab] (None where
    every row is greedy; a greedy row's are zeros), top # [B, limit] (each position's top probability; None
    when no rule reads it)."""

    tokens: torch.Tensor
    q: torch.Tensor | None
    top: torch.Tensor | None

    def row(self, b: int, n: int, greedy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Row b's first n tokens # [n] and their q # [n, vocab] (None under greedy or for no token)."""
        return self.tokens[b, :n], None if greedy or self.q is None or n == 0 else self.q[b, :n]


def chain_samplings(samplings) -> tuple:
    """Each row's sampling as a chain graph depends on it: without its seed (the uniforms come from the
    request's generator), so requests of other seeds replay the same graph."""
    return tuple(replace(s, seed=None) for s in samplings)


def _pick(logits: torch.Tensor, u: torch.Tensor | None, samplings: tuple, tops: bool):
    """Each row's draft token from logits # [B, vocab]: argmax, or sampled from its processed q at its uniform
    u[b] # [B] float64. (tokens # [B], q # [B, vocab] or None, top # [B] or None)."""
    if all(s.greedy for s in samplings):
        return logits.argmax(-1), None, torch.softmax(logits, -1).amax(-1) if tops else None
    tokens, qs, top = [], [], []
    for b, s in enumerate(samplings):  # rows are few: one per sequence
        if s.greedy:
            tokens.append(logits[b].argmax().view(1))
            qs.append(torch.zeros_like(logits[b]))
            top.append(torch.softmax(logits[b], -1).max().view(1))
        else:
            qs.append(probs_from_logits(logits[b], s))  # [vocab]
            tokens.append(sample_at(qs[-1][None], u[b].view(1, 1)))
            top.append(qs[-1].max().view(1))
    return torch.cat(tokens), torch.stack(qs), torch.cat(top) if tops else None


def draft_chain(step, logits: torch.Tensor, start: torch.Tensor, uniforms: torch.Tensor | None, limit: int,
                samplings: tuple, tops: bool) -> Chain:
    """limit draft tokens a row after the positions whose logits # [B, vocab] are given, each fed to the next
    step but the last: step(tokens # [B], slots # [B]) -> the next logits # [B, vocab], the first at slots
    start # [B] (int64, on the device); samplings: each row's; uniforms # [B, limit] float64 for the sampled
    rows (None where every row is greedy). Only device operations, whatever the values, where step's are:
    CUDA-graph capturable."""
    slots = start
    tokens, qs, top = [], [], []
    for i in range(limit):
        token, q, t = _pick(logits, None if uniforms is None else uniforms[:, i], samplings, tops)
        tokens.append(token)
        qs.append(q)
        top.append(t)
        if i == limit - 1:
            break
        logits = step(token, slots)
        slots = slots + 1
    return Chain(torch.stack(tokens, 1), None if qs[0] is None else torch.stack(qs, 1),
                 torch.stack(top, 1) if tops else None)


def model_step(model, cache: KVCache, vocab: int):
    """A draft model's step for draft_chain on a cache of one row: a one-token forward at the slot, its
    logits over the target's vocabulary # [1, vocab]. The cache's length is not moved."""
    every = torch.arange(cache.capacity, device=cache.k.device)  # [capacity]

    def step(token: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        mask = every[None, :] <= slots[:, None]  # [1, capacity]
        out = model.static_forward(token.view(1, 1), cache, slots, slots[None, :], mask, last_only=True)
        return align_vocab(out[:, -1].float(), vocab)
    return step


def rows_step(model, cache: KVCache, rows: torch.Tensor, vocab: int):
    """A draft model's step for draft_chain on rows # [B] of a batched cache (a server's pool): a ragged
    one-token forward, each row at its own slot; logits # [B, vocab]."""
    every = torch.arange(cache.capacity, device=cache.k.device)  # [capacity]

    def step(tokens: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        at = slots[:, None]  # [B, 1]
        mask = (every[None, :] <= at)[:, None, None, :]  # [B, 1, 1, capacity]
        out = model.layers_forward(tokens[:, None], cache, Ragged(rows, at), at, mask, last_only=True)
        return align_vocab(out[:, -1].float(), vocab)
    return step


class _ChainGraph:
    """One captured chain: chain(*inputs) with static input buffers, filled before each replay; its output
    a NamedTuple of tensors (or None), cloned out after each."""

    def __init__(self, chain, cache: KVCache, inputs: tuple):
        device = cache.k.device
        self.cache_ref = weakref.ref(cache)
        self.inputs = tuple(None if t is None else t.clone() for t in inputs)
        # the warm-up runs on this call's own inputs: it writes what the call writes
        self.graph, self.out = capture(lambda: chain(*self.inputs), device)

    def replay(self, inputs: tuple) -> Chain:
        for buf, t in zip(self.inputs, inputs):
            if buf is not None:
                buf.copy_(t)
        self.graph.replay()
        return type(self.out)(*(None if t is None else t.clone() for t in self.out))


class DeviceChains:
    """Runs chains on the device for one drafter: each (cache, key) chain captured once as a CUDA graph where
    `graphed` (at most max_graphs kept, least recently used first out), eager otherwise."""

    def __init__(self, graphed: bool, max_graphs: int = 16):
        self.graphed, self.max_graphs = graphed, max_graphs
        self.graphs: dict[tuple, _ChainGraph] = {}
        self.captures = 0

    def run(self, cache: KVCache, key: tuple, chain, inputs: tuple):
        """chain(*inputs) -> a NamedTuple of tensors (a Chain, a head's tree levels): its graph for (cache,
        key) replayed on these inputs (tensors, or None for one that is always None under this key), or run
        eagerly."""
        if not self.graphed or torch.cuda.is_current_stream_capturing():
            return chain(*inputs)
        key = (id(cache), *key)
        graph = self.graphs.pop(key, None)
        if graph is None or graph.cache_ref() is not cache:  # a new cache may reuse a freed one's id
            graph = _ChainGraph(chain, cache, inputs)
            self.captures += 1
        self.graphs[key] = graph  # most recently used last
        while len(self.graphs) > self.max_graphs:
            del self.graphs[next(iter(self.graphs))]
        return graph.replay(inputs)

    def draft(self, model, cache: KVCache, feed: list[int], limit: int, sampling: SamplingParams,
              generator: torch.Generator | None, vocab: int, tops: bool) -> Chain:
        """A draft model's chain (a row) after `feed` at the cache's end; the cache then holds feed and the chain
        but its last. The feed goes through the model's own forward (a graph per length under CUDA graphs),
        the chain through one graph per (limit, sampling), so the feed's length does not multiply the graphs."""
        device = cache.k.device
        x = torch.tensor([feed], device=device)  # [1, T0]
        # a fill, not a copy: on a GPU a tensor copied from the host waits for the work queued before it
        start = torch.full((1,), cache.length + len(feed), dtype=torch.long, device=device)
        samplings = chain_samplings([sampling])
        uniforms = draw_uniforms([limit], samplings, [generator], limit, device)
        logits = align_vocab(model(x, cache, cache.length, last_only=True)[:, -1].float(), vocab)  # [1, vocab]
        cache.advance(len(feed))
        out = self.run(cache, (limit, samplings, tops), lambda lg, st, u: draft_chain(
            model_step(model, cache, vocab), lg, st, u, limit, samplings, tops), (logits, start, uniforms))
        cache.advance(limit - 1)
        return out

    def draft_rows(self, model, cache: KVCache, rows: list[int], feeds: list[list[int]], lengths: list[int],
                   limit: int, samplings: tuple, uniforms: torch.Tensor | None, vocab: int, tops: bool) -> Chain:
        """Chains of `limit` tokens for rows `rows` of a batched cache (a server's pool) together, row b's after
        its feeds[b] at slots lengths[b]..: the feeds in one ragged forward, then the chains in one graph per
        (rows, limit, samplings). Each row's slots then hold its feed and its chain but the last; the caller
        moves each row's length."""
        device = cache.k.device
        # the inputs before the feed: on a GPU a tensor copied from the host waits for the work queued before it
        tokens, slots, positions, mask = ragged_inputs(lengths, feeds, device)
        at = torch.tensor(rows, device=device)  # [B]
        last = torch.tensor([len(f) - 1 for f in feeds], device=device)  # each row's last fed position
        start = torch.tensor([n + len(f) for n, f in zip(lengths, feeds)], device=device)
        logits = model(tokens, cache, 0, positions=positions, mask=mask, slots=slots, rows=at)  # [B, T, vocab]
        logits = align_vocab(logits[torch.arange(len(rows), device=device), last].float(), vocab)  # [B, vocab]
        return self.run(cache, ("rows", len(rows), limit, samplings, tops), lambda lg, st, r, u: draft_chain(
            rows_step(model, cache, r, vocab), lg, st, u, limit, samplings, tops), (logits, start, at, uniforms))


def device_chains(graphed: bool, on_device: bool | None) -> DeviceChains | None:
    """A drafter's DeviceChains where it drafts on the device (on_device; None: where its model replays CUDA
    graphs, `graphed`), graphed where the model is; else None (the host loop)."""
    return DeviceChains(graphed) if (graphed if on_device is None else on_device) else None


def stop_cut(top: list[float], limit: int, decide) -> int:
    """How many tokens of a chain drafted to its end the stop rules keep (at most limit): decide(i, p), on
    token i's top probability p (END, LAST or GO_ON, as DraftState.stop), as the host loop asks it
    before drafting token i."""
    for i, p in enumerate(top[:limit]):
        decision = decide(i, p)
        if decision != GO_ON:
            return i + (decision == LAST)
    return limit


_pools: dict[int, tuple[weakref.ref, DeviceChains]] = {}


def pool_chains(cache: KVCache, graphed: bool) -> DeviceChains:
    """The DeviceChains of a batched cache whose rows draft together (a server's pool), one while the cache
    lives: whichever of its rows draft in a step, they replay the same graphs."""
    got = _pools.get(id(cache))
    if got is None or got[0]() is not cache:  # a new cache may reuse a freed one's id
        for key in [k for k, (ref, _) in _pools.items() if ref() is None]:
            del _pools[key]
        got = _pools[id(cache)] = (weakref.ref(cache), DeviceChains(graphed))
    return got[1]


def draw_uniforms(limits: list[int], samplings: tuple, generators: list, width: int, device) -> torch.Tensor | None:
    """Chains' uniforms # [B, width] float64: row b's first limits[b] drawn before its chain from its request's
    generator (what the host loop draws for as many tokens), the rest 0 (a greedy row's: all); None where
    every row is greedy."""
    if all(s.greedy for s in samplings):
        return None
    out = torch.zeros(len(samplings), width, device=device, dtype=torch.float64)
    for b, (n, s, g) in enumerate(zip(limits, samplings, generators)):
        if not s.greedy:
            out[b, :n] = torch.rand(n, generator=g, device=device, dtype=torch.float64)
    return out
