"""One compact decoder for the Llama family (Llama, SmolLM2, Qwen2/2.5, Mistral).

Parameter names follow HF transformers (model.layers.N.self_attn.q_proj.weight, ...), so HF
checkpoints and a GGUF file's dequantized tensors (the torch reference) load with a plain load_state_dict;
the CPU backend swaps in layers on the file's own blocks (loading.load_gguf_blocks).
"""

from __future__ import annotations

from dataclasses import dataclass

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from specdec.model import cpu_kernels
from specdec.model.kv_cache import KVCache


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 has q/k/v biases

    @staticmethod
    def from_hf(cfg: dict) -> "ModelConfig":
        heads = cfg["num_attention_heads"]
        rope = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        return ModelConfig(
            vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"], num_layers=cfg["num_hidden_layers"],
            num_heads=heads, num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6), rope_theta=float(rope),
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            attention_bias=cfg.get("attention_bias", cfg.get("model_type") == "qwen2"))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.cpu_ops = False  # the CPU backend: our fused op (cpu_kernels.rms_norm); set by loading.load_gguf_blocks

    def forward(self, x):  # [batch, T, dim]
        if self.cpu_ops:
            return cpu_kernels.rms_norm(x, self.weight, self.eps)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


ROPE_POSITIONS = 4096  # RoPE tables made with the model; a larger cache extends them (Transformer.new_cache)


def rope_tables(cfg: ModelConfig, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables [length, head_dim] in HF's rotate-half layout."""
    # computed in fp32 exactly as HF transformers does, so logits match bit for bit in layout
    # on the CPU explicitly (under a meta-device context too: a table on meta costs a second of imports)
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, device="cpu").float() / cfg.head_dim))
    freqs = torch.outer(torch.arange(length, device="cpu").float(), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):  # x [batch, heads, T, head_dim]; cos, sin [batch, 1, T, head_dim]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.hd, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.hd, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.hd, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.hd, cfg.hidden_size, bias=False)
        # the CPU backend (loading.load_gguf_blocks): q/k/v as one GEMM, in place of the three above (set to
        # None), and our fused RoPE and attention for up to cpu_rows positions
        self.qkv_proj: nn.Module | None = None
        self.qkv_sizes = [self.n_heads * self.hd, self.n_kv * self.hd, self.n_kv * self.hd]  # q, k, v in qkv_proj's output
        self.cpu_ops = False
        self.cpu_rows = 0

    def forward(self, x, cos, sin, k_cache, v_cache, start, mask):
        # x [batch, T, dim]; k_cache, v_cache [batch, kv_heads, capacity, head_dim].
        # start: int (all rows write slots start..start+T-1; mask [T, start + T] or None), or
        # slots # [batch, T] int64 (row b writes its tokens at slots[b]; mask [batch, 1, T, S] attends to slots < S)
        b, t, _ = x.shape
        if self.qkv_proj is not None:
            y = self.qkv_proj(x)  # [batch, T, (heads + 2 kv_heads) * head_dim]
            if self.cpu_ops and t <= self.cpu_rows and (mask is None or mask.dtype == torch.bool):
                return self._cpu_forward(y, cos, sin, k_cache, v_cache, start, mask)
            q, k, v = y.split(self.qkv_sizes, dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(b, t, self.n_heads, self.hd).transpose(1, 2)
        k = k.view(b, t, self.n_kv, self.hd).transpose(1, 2)
        v = v.view(b, t, self.n_kv, self.hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        store(k, v, k_cache, v_cache, start)
        if isinstance(start, int):
            keys, values = k_cache[:, :, :start + t], v_cache[:, :, :start + t]
        elif isinstance(start, Static):  # fixed shapes: attend over the whole cache under the mask
            keys, values = k_cache, v_cache
        else:  # Ragged: a gather of the live rows
            keys, values = k_cache[start.rows, :, :mask.shape[-1]], v_cache[start.rows, :, :mask.shape[-1]]
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=self.n_kv != self.n_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.n_heads * self.hd))

    def _cpu_forward(self, y, cos, sin, k_cache, v_cache, start, mask):
        """The rest of forward() on our fused CPU ops, from y = qkv_proj(x) # [batch, T, (heads + 2 kv_heads) * head_dim]."""
        b, t, _ = y.shape
        cpu_kernels.rope_(y, cos, sin, self.n_heads + self.n_kv, self.hd)  # q and k, in place
        _, k, v = y.split(self.qkv_sizes, dim=-1)
        k = k.view(b, t, self.n_kv, self.hd).transpose(1, 2)
        v = v.view(b, t, self.n_kv, self.hd).transpose(1, 2)
        store(k, v, k_cache, v_cache, start)
        rows, slots = None, (start + t if isinstance(start, int) else mask.shape[-1])
        if isinstance(start, Ragged):
            rows = start.rows
        if mask is not None and mask.stride(-1) != 1:
            mask = mask.contiguous()
        return self.o_proj(cpu_kernels.attend(y, k_cache, v_cache, slots, self.n_heads, rows, mask))


def store(k, v, k_cache, v_cache, start) -> None:
    """Write k, v # [batch, kv_heads, T, head_dim] into one layer's cache where `start` says
    (an int slot for every row, Static slots, or Ragged rows and slots)."""
    if isinstance(start, int):
        k_cache[:, :, start:start + k.shape[2]] = k
        v_cache[:, :, start:start + k.shape[2]] = v
    elif isinstance(start, Static):  # fixed shapes: write at slots
        k_cache.index_copy_(2, start.slots, k)
        v_cache.index_copy_(2, start.slots, v)
    else:  # Ragged: row i of the batch is cache row start.rows[i] and writes at start.slots[i]
        k_cache[start.rows[:, None], :, start.slots] = k.transpose(1, 2)  # [batch, T, kv_heads, head_dim]
        v_cache[start.rows[:, None], :, start.slots] = v.transpose(1, 2)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up_proj: nn.Module | None = None  # the CPU backend: gate and up as one GEMM
        self.cpu_ops = False  # the CPU backend: SiLU and the gate product on our op (cpu_kernels.silu_mul_rows)

    def forward(self, x):  # [batch, T, dim]
        if self.gate_up_proj is not None:
            gu = self.gate_up_proj(x)  # [batch, T, 2 * intermediate]: gate, then up
            if self.cpu_ops and not (torch.is_grad_enabled() and x.requires_grad):
                return self.down_proj(cpu_kernels.silu_mul_rows(gu))
            gate, up = gu.chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, k_cache, v_cache, start, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, k_cache, v_cache, start, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        # weights uninitialized: a loader assigns them (a random init on the meta device costs a second)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                         _weight=torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Ragged(NamedTuple):
    """Where a ragged batch writes: cache rows # [batch] and slots # [batch, T] per row."""

    rows: torch.Tensor
    slots: torch.Tensor


class Static(NamedTuple):
    """Where a fixed-shape forward writes (CUDA graphs): slots # [T], the same for every row."""

    slots: torch.Tensor


def causal_mask(start: int, t: int, device) -> torch.Tensor | None:
    """Bool mask [t, start + t]: query i (slot start + i) sees slots <= start + i. None when t == 1."""
    if t == 1:
        return None
    rows = torch.arange(start, start + t, device=device)[:, None]
    return torch.arange(start + t, device=device)[None, :] <= rows


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg, min(cfg.max_position_embeddings, ROPE_POSITIONS))
        self.register_buffer("rope_cos", cos, persistent=False)  # [positions, head_dim]; new_cache extends them
        self.register_buffer("rope_sin", sin, persistent=False)  # [positions, head_dim]
        self.graphs = None  # a CudaGraphs replaying fixed-shape steps (specdec.engine.cuda_graphs), or None
        self.cpu_forward = None  # a cpu_forward.CpuForward running the layer loop in C where a call fits, or None
        self.weight_format = "torch"  # "gguf-q8": the CPU backend on a GGUF file's blocks (loading.load_gguf_blocks)

    @property
    def dtype(self) -> torch.dtype:
        """The activations' and the KV cache's dtype (the final norm's: linear layers may hold GGUF blocks)."""
        return self.model.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.norm.weight.device

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def set_rope_length(self, length: int) -> None:
        """RoPE tables for positions 0..length-1 (at most max_position_embeddings), on the model's device."""
        length = min(length, self.config.max_position_embeddings)
        self.rope_cos, self.rope_sin = (t.to(self.device) for t in rope_tables(self.config, length))

    def new_cache(self, capacity: int, batch: int = 1) -> KVCache:
        cfg = self.config
        capacity = min(capacity, cfg.max_position_embeddings)
        if capacity > self.rope_cos.shape[0]:  # positions stay below the cache's capacity
            self.set_rope_length(capacity)
        return KVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, capacity, batch, self.dtype, self.device)

    @torch.inference_mode()
    def forward(self, tokens, cache: KVCache, start: int, positions=None, mask=None, last_only=False, slots=None,
                rows=None, hidden=False):
        """Logits [batch, T or 1, vocab] for tokens [batch, T] written at cache slots [start, start+T).
        hidden=True: (logits, h) with h [batch, T, hidden_size] the final norm's output for every row
        (last_only then cuts the logits only), the feature a self-drafting head reads.

        positions [batch, T] are the RoPE positions (default start..start+T-1); mask [T, start+T]
        is a bool attention mask over the slots (default causal). The cache length is not changed.
        Ragged batches: slots [batch, T] gives each row's own cache slots (start is then ignored),
        with positions [batch, T] and mask [batch, 1, T, S] required; rows [batch] (default
        0..batch-1) are the cache rows the batch's rows live in.
        """
        b, t = tokens.shape
        if slots is not None:
            if positions is None or mask is None:
                raise ValueError("a forward with per-row slots needs positions and a mask")
            cache.require(int(slots.max()) + 1)
            cache.require(mask.shape[-1])
            rows = torch.arange(b, device=tokens.device) if rows is None else rows
            start = Ragged(rows, slots)
        else:
            cache.require(start + t)
        if positions is None:
            positions = torch.arange(start, start + t, device=tokens.device).expand(b, t)
        if mask is None:
            mask = causal_mask(start, t, tokens.device)
        if self.graphs is not None and isinstance(start, int) and not hidden:  # graphs capture logits only
            return self.graphs.run(tokens, cache, start, positions, mask, last_only)
        return self.layers_forward(tokens, cache, start, positions, mask, last_only, hidden)

    @torch.inference_mode()
    def static_forward(self, tokens, cache: KVCache, slots, positions, mask, last_only=False):
        """forward() whose shapes depend only on tokens [batch, T] and the cache, with no host syncs,
        for CUDA graph capture: writes at slots [T] (int64), RoPE positions [batch, T], bool mask
        [T, capacity] over every cache slot. The caller checks that the slots fit."""
        return self.layers_forward(tokens, cache, Static(slots), positions, mask, last_only)

    def layers_forward(self, tokens, cache: KVCache, start, positions, mask, last_only, hidden=False):
        dtype = self.dtype
        cos = self.rope_cos[positions].unsqueeze(1).to(dtype)  # [batch, 1, T, head_dim]
        sin = self.rope_sin[positions].unsqueeze(1).to(dtype)
        x = self.model.embed_tokens(tokens)
        if self.cpu_forward is not None and self.cpu_forward.takes(tokens, cache, start, mask):
            x = self.cpu_forward.run(x, cos, sin, cache, start, mask)  # the loop below, in one C call
        else:
            for i, layer in enumerate(self.model.layers):
                x = layer(x, cos, sin, cache.k[i], cache.v[i], start, mask)
        if last_only and not hidden:
            x = x[:, -1:]
        h = self.model.norm(x)  # [batch, T or 1, hidden_size]
        logits = self.lm_head(h[:, -1:] if last_only else h).float()
        return (logits, h) if hidden else logits
