"""CUDA graphs for the decode and verify steps of fixed shapes.

A decode step of a small model on a GPU is bound by kernel launches, not by the GPU: dozens of
kernels per layer, each a few microseconds of work. A CUDA graph records one forward's kernels once
and replays them with a single launch. A graph fixes every shape and address, so the graphed step
is `Transformer.static_forward`: it writes K/V at slots given as a tensor and attends over the
whole cache under a [T, capacity] mask, instead of slicing the cache to the current length.

One graph is captured per (cache, batch, T, last_only, ragged) on first use, for T up to `max_tokens`
(the decode step T = 1, chain verification T = k + 1, a tree's T = nodes + 1). A ragged batch (each
row its own cache row and slots: the server's batched verify) is graphed where the model runs the
fused GPU loop (gpu_forward.py), under a [batch, 1, T, capacity] mask. Longer forwards (prefill), and
ragged ones on the torch path, run eagerly. Graphs hold their cache's address, so they are
keyed by the cache object and dropped with it; at most `max_graphs` are kept (least recently used
first out). Inputs are copied into each graph's static buffers before a replay, and the logits are
cloned out, so a caller may keep them across steps.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict

import torch

from specdec.errors import SpecdecError
from specdec.model.transformer import Ragged, Static


def capture(fn, device) -> tuple[torch.cuda.CUDAGraph, object]:
    """fn() recorded as a CUDA graph after two warm-up calls on a side stream (as torch.cuda.graphs asks;
    they execute, so fn's inputs must be the call's own): (the graph, fn's output, whose tensors each
    replay rewrites)."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


class _Graph:
    def __init__(self, model, cache, tokens, start, positions, mask, last_only: bool):
        (b, t), device, cap = tokens.shape, cache.k.device, cache.capacity
        self.cache_ref = weakref.ref(cache)
        self.tokens = torch.zeros(b, t, dtype=torch.long, device=device)
        self.positions = torch.zeros(b, t, dtype=torch.long, device=device)
        if isinstance(start, Ragged):  # each row its cache row and slots, a mask [B, 1, T, capacity]
            self.rows = torch.zeros(b, dtype=torch.long, device=device)
            self.slots = torch.zeros(b, t, dtype=torch.long, device=device)
            self.mask = torch.zeros(b, 1, t, cap, dtype=torch.bool, device=device)
            where = Ragged(self.rows, self.slots)
        else:  # every row at the same slots, a mask [T, capacity]
            self.slots = torch.zeros(t, dtype=torch.long, device=device)
            self.mask = torch.zeros(t, cap, dtype=torch.bool, device=device)
            where = Static(self.slots)
        # The warm-up runs execute, so they get this call's real inputs: they write exactly the
        # K/V the call itself writes, never over the valid prefix.
        self.fill(tokens, start, positions, mask)
        self.graph, self.logits = capture(
            lambda: model.layers_forward(self.tokens, cache, where, self.positions, self.mask, last_only), device)

    def fill(self, tokens, start, positions, mask) -> None:
        t = tokens.shape[1]
        self.tokens.copy_(tokens)
        self.positions.copy_(positions)
        self.mask.zero_()
        if isinstance(start, Ragged):  # mask [B, 1, T, S]
            self.rows.copy_(start.rows)
            self.slots.copy_(start.slots)
            self.mask[..., :mask.shape[-1]] = mask
            return
        self.slots.copy_(torch.arange(start, start + t, device=self.slots.device))
        if mask is None:  # T == 1: the one query sees every slot up to its own
            self.mask[:, :start + t] = True
        else:  # [T, start + T]
            self.mask[:, :start + t] = mask

    def replay(self, tokens, start, positions, mask) -> torch.Tensor:
        self.fill(tokens, start, positions, mask)
        self.graph.replay()
        return self.logits.clone()


class CudaGraphs:
    """Replays Transformer forwards of fixed shapes as CUDA graphs (see the module docstring)."""

    def __init__(self, model, max_tokens: int = 64, max_graphs: int = 32):
        device = model.device
        if model.config.num_experts:  # its routing picks experts on the host (moe.py), which a graph cannot replay
            raise SpecdecError("CUDA graphs cannot capture a mixture of experts' routing; drop --cuda-graphs")
        if device.type != "cuda":
            raise SpecdecError(f"CUDA graphs need the model on a CUDA device, not {device}; "
                               "use --device cuda or drop --cuda-graphs")
        self.model, self.max_tokens, self.max_graphs = model, max_tokens, max_graphs
        self.graphs: OrderedDict[tuple, _Graph] = OrderedDict()
        self.captures = 0

    def takes(self, tokens, start) -> bool:
        """Whether a forward of tokens [batch, T] writing where `start` says is graphed: T <= max_tokens, and
        a ragged batch only through the fused loop (gpu_forward.py), which reads each row's live keys only
        (the torch path would gather every row's whole cache under the capacity-wide mask)."""
        ragged = isinstance(start, Ragged)
        return (tokens.shape[1] <= self.max_tokens and not torch.cuda.is_current_stream_capturing()
                and (not ragged or self.model.layer_loop is not None))

    def run(self, tokens, cache, start, positions, mask, last_only: bool) -> torch.Tensor:
        """The forward's logits through its shape's graph (captured on first use); start: an int or Ragged."""
        b, t = tokens.shape
        if not self.takes(tokens, start):
            return self.model.layers_forward(tokens, cache, start, positions, mask, last_only)
        key = (id(cache), b, t, bool(last_only), isinstance(start, Ragged))
        graph = self.graphs.get(key)
        if graph is None or graph.cache_ref() is not cache:  # a new cache may reuse a freed one's id
            self._drop_dead()
            graph = _Graph(self.model, cache, tokens, start, positions, mask, last_only)
            self.captures += 1
            self.graphs[key] = graph
            while len(self.graphs) > self.max_graphs:
                self.graphs.popitem(last=False)
        self.graphs.move_to_end(key)
        return graph.replay(tokens, start, positions, mask)

    def _drop_dead(self) -> None:
        for key in [k for k, g in self.graphs.items() if g.cache_ref() is None]:
            del self.graphs[key]


def enable_cuda_graphs(model, max_tokens: int = 64) -> None:
    """Route the model's fixed-shape forwards (T <= max_tokens) through CUDA graphs."""
    model.graphs = CudaGraphs(model, max_tokens)
