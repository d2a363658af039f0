"""The layer loop on a GPU in ten launches a layer: cuBLAS for the four GEMMs, gpu_kernels.py for the rest.

    x += delta; h = norm(x)          add_rms_norm      (delta: the previous branch's output)
    qkv = qkv_proj(h)                one GEMM, q/k/v's weights concatenated at `enable`
    RoPE on q, k; k, v -> cache      rope_store
    attention                        attention (split over the keys, then a combine)
    delta = o_proj(.)
    x += delta; h = norm(x)          add_rms_norm
    delta = down_proj(silu_mul(gate_up_proj(h)))

against about 45 in the torch path (transformer.py). Every position, slot and length comes from device
tensors, so a CUDA graph captures the loop (cuda_graphs.py), and ragged batches run it too. It serves
the plain Llama layer (Llama, Qwen2/2.5, Qwen3 with its q/k norms, Mistral, SmolLM2; Phi-3's partial
RoPE lies in the tables): models with sandwich norms, sliding windows or a non-SiLU gate (Gemma 3) are
refused (`enable` says so); forwards longer than MAX_T (prefill) keep the torch path (SDPA's flash kernels).
"""

from __future__ import annotations

import torch
from torch import nn

from specdec.errors import SpecdecError
from specdec.model import gpu_kernels
from specdec.model.transformer import Ragged, Static

MAX_T = 64  # rows a forward may have (the longest verify; cuda_graphs.py's max_tokens)


def fuse_linears(parts: list[nn.Linear]) -> nn.Linear:
    """One Linear whose output is the parts' outputs concatenated (their weights and biases stacked)."""
    w = torch.cat([p.weight for p in parts])
    out = nn.Linear(w.shape[1], w.shape[0], bias=parts[0].bias is not None, device=w.device, dtype=w.dtype)
    with torch.no_grad():
        out.weight.copy_(w)
        if out.bias is not None:
            out.bias.copy_(torch.cat([p.bias for p in parts]))
    return out


class GpuForward:
    """The layer loop of one model through gpu_kernels (see the module docstring); built by `enable`."""

    def __init__(self, model: nn.Module):
        cfg = model.config
        self.layers = model.model.layers
        self.heads, self.kv_heads = cfg.num_heads, cfg.num_kv_heads
        self.eps = float(cfg.rms_norm_eps)
        self.scale = float(self.layers[0].self_attn.scale)

    def takes(self, tokens: torch.Tensor, cache, start, inputs) -> bool:
        """Whether a forward of tokens [batch, T] writing where `start` says fits (inputs: LayerInputs)."""
        t = tokens.shape[1]
        inner = cache.k.stride()[-2:] == (cache.k.shape[-1], 1) and cache.k.stride() == cache.v.stride()
        return 1 <= t <= MAX_T and inner and (inputs.mask is None or inputs.mask.dtype is torch.bool)

    def run(self, x: torch.Tensor, inputs, cache, start) -> torch.Tensor:
        """x [B, T, D] (embeddings; updated in place) through every layer, writing the cache where start
        (an int, Static or Ragged) says; inputs: the RoPE rows and mask (transformer.LayerInputs)."""
        b, t, _ = x.shape
        rows, slots, mask = where(start, b, t, x.device, inputs.mask)
        cos, sin = (c.reshape(c.shape[0], t, -1) for c in (inputs.cos, inputs.sin))  # [B or 1, T, head_dim]
        x = x.contiguous()
        delta = None
        for i, layer in enumerate(self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            h = gpu_kernels.add_rms_norm(x, delta, layer.input_layernorm.weight, self.eps)
            qkv = attn.qkv_proj(h)  # [B, T, (heads + 2 kv_heads) * head_dim]
            norms = None if attn.q_norm is None else (attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.eps)
            gpu_kernels.rope_store(qkv, cos, sin, cache.k[i], cache.v[i], rows, slots, self.heads, self.kv_heads, norms)
            delta = layer.scaled(attn.o_proj(gpu_kernels.attention(qkv, cache.k[i], cache.v[i], rows, slots, mask,
                                                                   self.heads, self.scale)))
            h = gpu_kernels.add_rms_norm(x, delta, layer.post_attention_layernorm.weight, self.eps)
            delta = layer.scaled(mlp.down_proj(gpu_kernels.silu_mul(mlp.gate_up_proj(h))))
        return x.add_(delta)


def where(start, b: int, t: int, device, mask):
    """(cache rows # [B], slots # [B, T] (batch stride 0 where shared), mask # [B or 1, T, S] or None) of a
    forward's `start`: an int (slots start..start+T-1), Static (its slots) or Ragged (its own)."""
    if isinstance(start, Ragged):
        return start.rows, start.slots, mask.flatten(1, 2)  # mask [B, 1, T, S]
    rows = torch.arange(b, device=device)
    if isinstance(start, Static):
        return rows, start.slots[None].expand(b, t), mask[None]
    slots = torch.arange(start, start + t, device=device)[None].expand(b, t)
    return rows, slots, None if mask is None else mask[None]


def unsupported(model: nn.Module) -> str | None:
    """Why the model's layers cannot run the fused loop, or None."""
    cfg = model.config
    if cfg.sandwich_norms or cfg.local_layers or cfg.activation != "silu" or cfg.attn_softcap:
        return ("its layers have sandwich norms, sliding windows, layers without RoPE, soft-capped attention or a "
                "gate other than SiLU")
    if cfg.num_experts:
        return "its MLPs are mixtures of experts"
    if cfg.head_dim < 16 or cfg.head_dim & (cfg.head_dim - 1):
        return f"its head_dim {cfg.head_dim} is not a power of two of at least 16 (the attention's tl.dot)"
    return gpu_kernels.available()


def enable(model: nn.Module) -> None:
    """Route the model's forwards of up to MAX_T rows through GpuForward (model.layer_loop): q/k/v and
    gate/up become one GEMM each (the torch path runs on them too). A clear error where it cannot."""
    reason = unsupported(model)
    if reason is not None:
        raise SpecdecError(f"--gpu-kernels cannot run this model: {reason}; drop --gpu-kernels")
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if attn.qkv_proj is None:
            attn.qkv_proj = fuse_linears([attn.q_proj, attn.k_proj, attn.v_proj])
            attn.q_proj = attn.k_proj = attn.v_proj = None
        if mlp.gate_up_proj is None:
            mlp.gate_up_proj = fuse_linears([mlp.gate_proj, mlp.up_proj])
            mlp.gate_proj = mlp.up_proj = None
    model.layer_loop = GpuForward(model)
