"""The target's forward in parts: embed, a chosen list of decoder layers, the rest from a layer on,
and the final norm + LM head. Layer-skip drafting runs some layers to draft and verifies from layer L.

forward_layers(0..L-1) then forward_from_layer(L) is Transformer.forward. Keys/values are written
at the given slots; no function here changes a cache's length (the engine does).
"""

from __future__ import annotations

import torch

from specdec.errors import SpecdecError
from specdec.model.kv_cache import KVCache
from specdec.model.transformer import Transformer, causal_mask


def _defaults(x: torch.Tensor, start: int, positions, mask):
    b, t = x.shape[:2]
    if positions is None:
        positions = torch.arange(start, start + t, device=x.device).expand(b, t)
    if mask is None:
        mask = causal_mask(start, t, x.device)
    return positions, mask


@torch.inference_mode()
def forward_layers(target: Transformer, hidden: torch.Tensor, cache: KVCache, start: int, layers: list[int],
                   positions=None, mask=None, cache_layers: list[int] | None = None) -> torch.Tensor:
    """Run hidden # [batch, T, dim] through target layers `layers` in order; keys/values go to cache
    layers `cache_layers` (default: the same indices) at slots [start, start + T). Returns the output
    hidden states # [batch, T, dim]. The cache length is not changed."""
    cache.require(start + hidden.shape[1])
    positions, mask = _defaults(hidden, start, positions, mask)
    inputs = target.layer_inputs(positions, start, mask)  # each layer's RoPE rows and mask (sliding windows)
    for i, c in zip(layers, layers if cache_layers is None else cache_layers):
        layer = target.model.layers[i]
        hidden = layer(hidden, *inputs.of(layer)[:2], cache.k[c], cache.v[c], start, inputs.of(layer)[2])
    return hidden


@torch.inference_mode()
def head(target: Transformer, hidden: torch.Tensor) -> torch.Tensor:
    """The target's final norm + LM head: hidden # [batch, T, dim] -> fp32 logits # [batch, T, vocab]."""
    return target.logits(target.model.norm(hidden))


@torch.inference_mode()
def embed(target: Transformer, tokens: torch.Tensor) -> torch.Tensor:
    """tokens # [batch, T] -> hidden # [batch, T, dim] (the input of layer 0)."""
    return target.embed(tokens)


@torch.inference_mode()
def forward_from_layer(target: Transformer, hidden: torch.Tensor, cache: KVCache, start: int, first_layer: int,
                       positions=None, mask=None, last_only: bool = False) -> torch.Tensor:
    """The rest of the target's forward: hidden # [batch, T, dim] (the input of layer `first_layer`)
    through layers first_layer..n-1, norm and head -> fp32 logits # [batch, T or 1, vocab].

    Writes keys/values for layers first_layer.. only; layers below must already hold slots
    [0, start + T). forward_layers(0..L-1) then forward_from_layer(L) is Transformer.forward."""
    n = target.config.num_layers
    if not 0 <= first_layer <= n:
        raise SpecdecError(f"first_layer must be in 0..{n}, got {first_layer}")
    hidden = forward_layers(target, hidden, cache, start, list(range(first_layer, n)), positions, mask)
    if last_only:
        hidden = hidden[:, -1:]
    return head(target, hidden)
