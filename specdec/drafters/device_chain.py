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
from typing import NamedTuple

import torch

from specdec.config import SamplingParams
from specdec.model.cuda_graphs import capture
from specdec.model.kv_cache import KVCache
from specdec.sampling.logits import align_vocab, probs_from_logits, sample_at


class Chain(NamedTuple):
    """A drafted chain before the stop rules: tokens # [limit], q # [limit, vocab] (None under greedy),
    top # [limit] (each position's top probability; None when no rule reads it)."""

    tokens: torch.Tensor
    q: torch.Tensor | None
    top: torch.Tensor | None


def _pick(logits: torch.Tensor, u: torch.Tensor | None, sampling: SamplingParams, tops: bool):
    """A draft token from logits # [vocab] (argmax, or sampled at the uniform u # [1, 1]): (token # [1], q # [vocab]
    or None, top # [1] or None)."""
    if sampling.greedy:
        return logits.argmax().view(1), None, torch.softmax(logits, -1).max().view(1) if tops else None
    q = probs_from_logits(logits, sampling)  # [vocab]
    return sample_at(q[None], u), q, q.max().view(1) if tops else None


def draft_chain(step, logits: torch.Tensor, start: torch.Tensor, uniforms: torch.Tensor | None, limit: int,
                sampling: SamplingParams, tops: bool) -> Chain:
    """limit draft tokens after the position whose logits # [vocab] are given, each fed to the next step but
    the last: step(token # [1], slot # [1]) -> the next logits # [vocab], the first at slot start (a 0-dim
    int64 tensor on the device); uniforms # [limit, 1] float64 for sampling (None under greedy). Only device
    operations, whatever the values, where step's are: CUDA-graph capturable."""
    slots = start.view(1)  # [1]
    tokens, qs, top = [], [], []
    for i in range(limit):
        token, q, t = _pick(logits, None if uniforms is None else uniforms[i:i + 1], sampling, tops)
        tokens.append(token)
        qs.append(q)
        top.append(t)
        if i == limit - 1:
            break
        logits = step(token, slots)
        slots = slots + 1
    return Chain(torch.cat(tokens), None if sampling.greedy else torch.stack(qs), torch.cat(top) if tops else None)


def model_step(model, cache: KVCache, vocab: int):
    """A draft model's step for draft_chain: one one-token forward at the slot, its logits over the target's
    vocabulary. The cache's length is not moved."""
    every = torch.arange(cache.capacity, device=cache.k.device)  # [capacity]

    def step(token: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        mask = every[None, :] <= slots[:, None]  # [1, capacity]
        out = model.static_forward(token.view(1, 1), cache, slots, slots[None, :], mask, last_only=True)
        return align_vocab(out[0, -1].float(), vocab)
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
        """A draft model's chain after `feed` at the cache's end; the cache then holds feed and the chain but
        its last. The feed goes through the model's own forward (a graph per length under CUDA graphs), the
        chain through one graph per (limit, sampling), so the feed's length does not multiply the graphs."""
        device = cache.k.device
        x = torch.tensor([feed], device=device)  # [1, T0]
        logits = align_vocab(model(x, cache, cache.length, last_only=True)[0, -1].float(), vocab)  # [vocab]
        cache.advance(len(feed))
        uniforms = draw_uniforms(limit, sampling, generator, device)
        step = model_step(model, cache, vocab)
        out = self.run(cache, (limit, sampling, tops), lambda lg, start, u: draft_chain(step, lg, start, u, limit,
                                                                                       sampling, tops),
                       (logits, torch.tensor(cache.length, device=device), uniforms))
        cache.advance(limit - 1)
        return out


def device_chains(graphed: bool, on_device: bool | None) -> DeviceChains | None:
    """A drafter's DeviceChains where it drafts on the device (on_device; None: where its model replays CUDA
    graphs, `graphed`), graphed where the model is; else None (the host loop)."""
    return DeviceChains(graphed) if (graphed if on_device is None else on_device) else None


def draw_uniforms(limit: int, sampling: SamplingParams, generator, device) -> torch.Tensor | None:
    """A chain's uniforms # [limit, 1] float64, drawn before it from the request's generator (None: greedy)."""
    if sampling.greedy:
        return None
    return torch.rand(limit, 1, generator=generator, device=device, dtype=torch.float64)
