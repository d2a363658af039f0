"""One compact decoder for the Llama family and its relatives: Llama (Llama 3's RoPE scaling too),
SmolLM2, SmolLM3, Qwen2/2.5, Qwen3, Qwen3-MoE, Mistral, Mixtral, Gemma 2, Gemma 3 and Phi-3/Phi-4-mini.

A family's differences are data in ModelConfig (q/k bias, per-head q/k norms, norms on the attention's
and the MLP's outputs, the gate's activation, scaled embeddings, the attention scale, sliding-window
layers with their own RoPE base, RoPE scaling: linear, Llama 3's, LongRoPE; RoPE on part of each head;
mixture-of-experts MLPs, moe.py),
filled from the GGUF metadata or the HF config.
Parameter names follow HF transformers (model.layers.N.self_attn.q_proj.weight, ...), so HF
checkpoints and a GGUF file's dequantized tensors (the torch reference) load with a plain load_state_dict;
the CPU backend swaps in layers on the file's own blocks (loading.load_gguf_blocks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from specdec.model import cpu_kernels
from specdec.model.kv_cache import KVCache
from specdec.model.moe import MoE

OLMO2_NORMS = {"sandwich_norms": True, "pre_norms": False, "qk_norm": True, "qk_norm_whole": True}
# HF model_type -> the switches its family sets in ModelConfig (the rest are Llama's)
FAMILIES = {
    "llama": {}, "mistral": {}, "qwen2": {"attention_bias": True}, "qwen3": {"qk_norm": True},
    "qwen3_moe": {"qk_norm": True},  # Qwen3's layer with a mixture-of-experts MLP (the experts are config data)
    "mixtral": {},  # Llama's layer with a mixture-of-experts MLP
    "smollm3": {},  # Llama's layer; every fourth without RoPE (nope_layers)
    "gemma2": {"sandwich_norms": True, "activation": "gelu_tanh", "norm_offset": 1.0, "scaled_embeddings": True},
    "gemma3": {"qk_norm": True, "sandwich_norms": True, "activation": "gelu_tanh", "norm_offset": 1.0,
               "scaled_embeddings": True},
    "phi3": {},  # Llama's layer; its fused tensors are the loader's, LongRoPE and partial RoPE are RoPE data
    "granite": {},  # Llama's layer; its four multipliers are config data (GRANITE_FAMILIES)
    "granitemoe": {},  # Granite's layer with a mixture-of-experts MLP
    # OLMo 2: no input norms, each branch's output normed; q and k normed over all their heads at once
    "olmo2": OLMO2_NORMS,
    "olmo3": OLMO2_NORMS,  # OLMo 2's layer, some in a sliding window
    "olmoe": {"qk_norm": True, "qk_norm_whole": True},  # Llama's layer, OLMo 2's q/k norms, a mixture of experts
}
GEMMA_FAMILIES = ("gemma2", "gemma3")  # their attention scale from query_pre_attn_scalar, embeddings tied by default
GRANITE_FAMILIES = ("granite", "granitemoe")  # their embeddings, branches, q.k and logits scaled by config
HF_FAMILY = {"gemma3_text": "gemma3"}  # HF model types that are another's family
GEMMA3_GLOBAL_EVERY = 6  # Gemma 3: every 6th layer attends globally, the others in a sliding window


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
    qk_norm: bool = False  # Qwen3, Gemma 3: an RMSNorm over each head of q and of k, before RoPE
    qk_norm_whole: bool = False  # OLMo 2: qk_norm's RMSNorms over all of q's heads at once, and all of k's
    sandwich_norms: bool = False  # Gemma 3: RMSNorms on the attention's and the MLP's outputs too
    pre_norms: bool = True  # False (OLMo 2): no norm on the attention's and the MLP's inputs (sandwich_norms' others)
    activation: str = "silu"  # the MLP gate's: "silu" or "gelu_tanh"
    scaled_embeddings: bool = False  # Gemma: embeddings times sqrt(hidden_size)
    embedding_multiplier: float = 1.0  # Granite: embeddings times this
    residual_multiplier: float = 1.0  # Granite: each branch's output times this before its residual add
    logits_scaling: float = 1.0  # Granite: logits divided by this
    attn_scale: float | None = None  # softmax scale of q.k; None: 1 / sqrt(head_dim)
    norm_offset: float = 0.0  # Gemma: HF's norm multiplies by (1 + w); ours hold 1 + w (as GGUF files do)
    sliding_window: int = 0  # > 0: the layers `sliding_layers` see only keys fewer than this many positions back
    sliding_layers: tuple[int, ...] = ()
    # layers whose attention takes no RoPE (SmolLM3's every fourth): they run as the sliding layers do, on the
    # local tables, here cos 1 and sin 0, and the full mask (a model has one kind of local layer or the other)
    nope_layers: tuple[int, ...] = ()
    attn_softcap: float = 0.0  # > 0 (Gemma 2): each scaled score s of q.k becomes cap tanh(s / cap) before the mask
    final_softcap: float = 0.0  # > 0 (Gemma 2): each logit z becomes cap tanh(z / cap)
    rope_local_theta: float | None = None  # the sliding layers' RoPE base (None: rope_theta)
    rope_linear_factor: float = 1.0  # linear RoPE scaling of the global layers: positions divided by it
    rope_freq_factors: tuple[float, ...] | None = None  # Llama 3, LongRoPE's short factors: each inverse
    # frequency divided by its factor
    rope_long_factors: tuple[float, ...] | None = None  # LongRoPE (Phi-3): these instead of rope_freq_factors
    # for a model run in a context longer than rope_original_context (llama.cpp's rule; Transformer.new_cache)
    rope_original_context: int = 0
    rope_attn_factor: float = 1.0  # LongRoPE: cos and sin of the rotated dimensions scaled by it
    rope_dim: int = 0  # RoPE on the first rope_dim dimensions of each head, the rest pass (Phi-4-mini); 0: all.
    # q's and k's rows then lie in rope_row_order's layout (the loaders reorder them; hf_state_dict undoes it)
    num_experts: int = 0  # > 0: every layer's MLP is a mixture of this many experts (moe.py)
    experts_per_token: int = 0  # the experts each token is routed to
    expert_intermediate_size: int = 0  # each expert's MLP width
    norm_topk_prob: bool = True  # the picked experts' weights renormalised to sum to 1

    @property
    def rotary_dim(self) -> int:
        return self.rope_dim or self.head_dim

    def long_rope(self, context: int) -> bool:
        """Whether a model run in a context of `context` positions takes LongRoPE's long factors."""
        return self.rope_long_factors is not None and context > self.rope_original_context

    @property
    def embed_scale(self) -> float:
        return math.sqrt(self.hidden_size) if self.scaled_embeddings else self.embedding_multiplier

    @property
    def softmax_scale(self) -> float:
        """The attention's scale, rounded to fp32 (1 / sqrt(head_dim) in fp32 arithmetic by default)."""
        if self.attn_scale is not None:
            return float(np.float32(self.attn_scale))
        return float(np.float32(1) / np.sqrt(np.float32(self.head_dim)))

    @staticmethod
    def from_hf(cfg: dict) -> "ModelConfig":
        heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        family = HF_FAMILY.get(cfg.get("model_type"), cfg.get("model_type"))
        switches = dict(FAMILIES.get(family, {}))
        windows, nope = _hf_windows(cfg, family), _hf_nope(cfg)
        if nope and (windows or cfg.get("use_sliding_window")):
            raise ValueError("layers without RoPE beside sliding-window layers are not supported")
        if "attention_bias" in cfg:
            switches["attention_bias"] = bool(cfg["attention_bias"])
        if family in GEMMA_FAMILIES:
            switches["attn_scale"] = float(cfg.get("query_pre_attn_scalar", head_dim)) ** -0.5
        if family in GRANITE_FAMILIES:
            switches.update(_hf_granite(cfg))
        return ModelConfig(
            vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"], num_layers=cfg["num_hidden_layers"],
            num_heads=heads, num_kv_heads=cfg.get("num_key_value_heads") or heads, head_dim=head_dim,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=cfg.get("tie_word_embeddings", family in GEMMA_FAMILIES),
            attn_softcap=float(cfg.get("attn_logit_softcapping") or 0.0),
            final_softcap=float(cfg.get("final_logit_softcapping") or 0.0),
            **switches, **windows, **_hf_rope(cfg, head_dim), **_hf_experts(cfg), **nope)

    @property
    def local_layers(self) -> tuple[int, ...]:
        """The layers that take LayerInputs' local tables and mask: the sliding-window ones, or those without RoPE."""
        return self.sliding_layers or self.nope_layers


def _hf_granite(cfg: dict) -> dict:
    """Granite's multipliers, from HF's names (1 where the config leaves one out, as GraniteConfig's defaults)."""
    return {"embedding_multiplier": float(cfg.get("embedding_multiplier", 1.0)),
            "residual_multiplier": float(cfg.get("residual_multiplier", 1.0)),
            "logits_scaling": float(cfg.get("logits_scaling", 1.0)),
            "attn_scale": float(cfg.get("attention_multiplier", 1.0))}


def _hf_experts(cfg: dict) -> dict:
    """The mixture-of-experts fields of an HF config (Qwen3-MoE's keys), or none for a dense model."""
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or 0  # transformers 5 writes the second
    if not experts:
        return {}
    if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
        raise ValueError("dense MLP layers among the mixture-of-experts ones (mlp_only_layers, decoder_sparse_step) "
                         "are not supported")
    top_k = int(cfg.get("num_experts_per_tok") or 0)
    if not 0 < top_k <= experts:
        raise ValueError(f"num_experts_per_tok {top_k} must be between 1 and num_experts {experts}")
    return {"num_experts": int(experts), "experts_per_token": top_k,
            "expert_intermediate_size": int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"]),
            # transformers' default: Mixtral's class always renormalises, Qwen3-MoE's only where the config says
            "norm_topk_prob": bool(cfg.get("norm_topk_prob", cfg.get("model_type") == "mixtral"))}


def _hf_nope(cfg: dict) -> dict:
    """nope_layers of an HF config: SmolLM3's no_rope_layers (0: the layer takes no RoPE), else every
    no_rope_layer_interval-th layer."""
    flags = cfg.get("no_rope_layers")
    every = cfg.get("no_rope_layer_interval") if cfg.get("model_type") == "smollm3" else None
    if flags is None and every:
        flags = [int((i + 1) % int(every) != 0) for i in range(cfg["num_hidden_layers"])]
    nope = tuple(i for i, f in enumerate(flags or ()) if not f)
    return {"nope_layers": nope} if nope else {}


def _hf_windows(cfg: dict, family: str) -> dict:
    """sliding_window and sliding_layers of an HF config (its layer_types, or Gemma 3's pattern)."""
    window = cfg.get("sliding_window") or 0
    types = cfg.get("layer_types")
    if types is None and family == "gemma2":  # every other layer slides, the first among them
        types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(cfg["num_hidden_layers"])]
    if types is None and family == "gemma3":
        every = cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or GEMMA3_GLOBAL_EVERY
        types = ["full_attention" if (i + 1) % every == 0 else "sliding_attention"
                 for i in range(cfg["num_hidden_layers"])]
    layers = tuple(i for i, t in enumerate(types or ()) if t == "sliding_attention")
    return {"sliding_window": int(window), "sliding_layers": layers} if window and layers else {}


def _hf_rope(cfg: dict, head_dim: int) -> dict:
    """The RoPE fields of an HF config: rope_parameters (transformers 5, per layer type where they differ)
    or rope_theta and rope_scaling."""
    params = cfg.get("rope_parameters") or {}
    full = params.get("full_attention", params)
    scaling = cfg.get("rope_scaling") or full
    theta = float(cfg.get("rope_theta") or full.get("rope_theta", 10000.0))
    out = {"rope_theta": theta}
    if "sliding_attention" in params:
        out["rope_local_theta"] = float(params["sliding_attention"].get("rope_theta", theta))
    elif cfg.get("rope_local_base_freq"):
        out["rope_local_theta"] = float(cfg["rope_local_base_freq"])
    kind = (scaling.get("rope_type") or scaling.get("type") or "default").lower()
    partial = full.get("partial_rotary_factor", scaling.get("partial_rotary_factor",
                                                            cfg.get("partial_rotary_factor", 1.0))) or 1.0
    rotary = int(round(head_dim * partial, 6))  # HF's int(head_dim * partial_rotary_factor), safe from float rounding
    if rotary != head_dim:
        if rotary <= 0 or rotary % 2 or (head_dim - rotary) % 2:
            raise ValueError(f"RoPE on {rotary} of each head's {head_dim} dimensions is not supported "
                             "(both counts must be even)")
        out["rope_dim"] = rotary
    if cfg.get("rope_freq_factors"):  # a GGUF file's rope_freqs tensor (gguf_config.gguf_hf_config)
        out["rope_freq_factors"] = tuple(float(f) for f in cfg["rope_freq_factors"])
    if kind == "linear":
        out["rope_linear_factor"] = float(scaling["factor"])
    elif kind == "llama3":
        out["rope_freq_factors"] = llama3_rope_factors(theta, head_dim, scaling)
    elif kind in ("longrope", "su"):
        out.update(longrope(cfg, scaling, rotary))
    elif kind != "default":
        raise ValueError(f"RoPE scaling {kind!r} is not supported (default, linear, llama3 and longrope are)")
    return out


def longrope(cfg: dict, scaling: dict, rotary: int) -> dict:
    """LongRoPE's ModelConfig fields (Phi-3) from an HF config and its rope scaling: the short and long
    factors, the original context, the attention factor (given, or transformers' default from the ratio
    of the context to the original one, as llama.cpp's converter writes it)."""
    original = scaling.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings")
    short, long = scaling.get("short_factor"), scaling.get("long_factor")
    if not original or short is None or long is None:
        raise ValueError("LongRoPE needs short_factor, long_factor and original_max_position_embeddings")
    if len(short) != rotary // 2 or len(long) != rotary // 2:
        raise ValueError(f"LongRoPE's factors must be {rotary // 2} each (one per rotated pair), "
                         f"not {len(short)} and {len(long)}")
    factor = scaling.get("factor") or cfg.get("max_position_embeddings", original) / original
    attn = scaling.get("attention_factor")
    if attn is None:
        attn = math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1.0 else 1.0
    return {"rope_freq_factors": tuple(float(f) for f in short), "rope_long_factors": tuple(float(f) for f in long),
            "rope_original_context": int(original), "rope_attn_factor": float(attn)}


def rope_row_order(head_dim: int, rotary_dim: int) -> list[int] | None:
    """Partial RoPE in the full-width rotate-half layout: the order of a head's q/k dimensions (new index ->
    HF's) that puts the rotated pairs (j, j + rotary_dim/2) at (j, j + head_dim/2) and pairs the passing
    dimensions among themselves (their cos 1, sin 0 in rope_tables). q.k is unchanged by one order applied
    to both; the loader reorders q's and k's rows so (None: every dimension rotates, HF's own order)."""
    if rotary_dim >= head_dim:
        return None
    r, p = rotary_dim // 2, (head_dim - rotary_dim) // 2
    return [*range(r), *range(2 * r, 2 * r + p), *range(r, 2 * r), *range(2 * r + p, head_dim)]


def llama3_rope_factors(theta: float, head_dim: int, scaling: dict) -> tuple[float, ...]:
    """Llama 3's per-frequency RoPE factors (inverse frequencies are divided by them), as llama.cpp's
    converter writes them into a GGUF file's rope_freqs tensor."""
    factor = scaling.get("factor", 8.0)
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    old = scaling.get("original_max_position_embeddings", 8192)
    out = []
    for freq in 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu") / head_dim)):
        wavelen = 2 * math.pi / float(freq)
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return tuple(float(np.float32(f)) for f in out)


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


def rope_tables(cfg: ModelConfig, length: int, local: bool = False, long: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables [length, head_dim] in HF's rotate-half layout: of the global layers, or (local)
    of the sliding-window layers (their own base, no scaling). long: LongRoPE's long factors. With
    partial RoPE the passing dimensions' cos is 1 and sin 0, in rope_row_order's layout."""
    # computed in fp32 exactly as HF transformers does, so logits match bit for bit in layout
    # on the CPU explicitly (under a meta-device context too: a table on meta costs a second of imports)
    theta = cfg.rope_local_theta if local and cfg.rope_local_theta is not None else cfg.rope_theta
    dim = cfg.rotary_dim
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device="cpu").float() / dim))
    factors = cfg.rope_long_factors if long and cfg.rope_long_factors is not None else cfg.rope_freq_factors
    if not local and factors is not None:
        inv_freq = inv_freq / torch.tensor(factors, dtype=torch.float32, device="cpu")
    if not local and cfg.rope_linear_factor != 1.0:
        inv_freq = inv_freq / cfg.rope_linear_factor
    freqs = torch.outer(torch.arange(length, device="cpu").float(), inv_freq)
    cos, sin = freqs.cos(), freqs.sin()
    if not local and cfg.rope_attn_factor != 1.0:
        cos, sin = cos * cfg.rope_attn_factor, sin * cfg.rope_attn_factor
    if dim < cfg.head_dim:
        passing = (length, (cfg.head_dim - dim) // 2)
        cos = torch.cat([cos, torch.ones(passing, device="cpu")], dim=-1)
        sin = torch.cat([sin, torch.zeros(passing, device="cpu")], dim=-1)
    return torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)


def apply_rope(x, cos, sin):  # x [batch, heads, T, head_dim]; cos, sin [batch, 1, T, head_dim]
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.scale = cfg.softmax_scale
        self.softcap = cfg.attn_softcap
        # RMSNorms of q and k before RoPE, per head (Qwen3, Gemma 3) or over all the heads (OLMo 2: a norm as
        # wide as them all), or None
        q_dim, k_dim = (self.n_heads * self.hd, self.n_kv * self.hd) if cfg.qk_norm_whole else (self.hd, self.hd)
        self.q_norm = RMSNorm(q_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(k_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
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
        if self.q_norm is not None:  # over each run of the norm's width: a head, or all of them
            q = self.q_norm(q.unflatten(-1, (-1, self.q_norm.weight.numel()))).flatten(-2)
            k = self.k_norm(k.unflatten(-1, (-1, self.k_norm.weight.numel()))).flatten(-2)
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
        if self.softcap:
            out = softcapped_attention(q, keys, values, mask, self.scale, self.softcap)
        else:
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=self.n_kv != self.n_heads,
                                                 scale=self.scale)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.n_heads * self.hd))

    def _cpu_forward(self, y, cos, sin, k_cache, v_cache, start, mask):
        """The rest of forward() on our fused CPU ops, from y = qkv_proj(x) # [batch, T, (heads + 2 kv_heads) * head_dim]."""
        b, t, _ = y.shape
        if self.q_norm is not None:  # q's runs of its norm's width (heads, or all of q), then k's, in place
            q_len, k_len = self.n_heads * self.hd, self.n_kv * self.hd
            qw, kw = self.q_norm.weight.numel(), self.k_norm.weight.numel()
            cpu_kernels.head_norm_(y, self.q_norm.weight, 0, q_len // qw, qw, self.q_norm.eps)
            cpu_kernels.head_norm_(y, self.k_norm.weight, q_len // kw, k_len // kw, kw, self.k_norm.eps)
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
        return self.o_proj(cpu_kernels.attend(y, k_cache, v_cache, slots, self.n_heads, rows, mask, self.scale,
                                              self.softcap))


def softcapped_attention(q, keys, values, mask, scale: float, cap: float):
    """SDPA's output with each scaled score s capped to cap tanh(s / cap) before the mask (Gemma 2; HF's eager
    order): q [batch, heads, T, hd], keys and values [batch, kv_heads, S, hd], mask bool (broadcast to
    [batch, heads, T, S]) or None."""
    group = q.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    scores = torch.tanh(q @ keys.transpose(-1, -2) * scale / cap) * cap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ values


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
        self.activation = cfg.activation  # of the gate: "silu" or "gelu_tanh"
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up_proj: nn.Module | None = None  # the CPU backend: gate and up as one GEMM
        self.cpu_ops = False  # the CPU backend: SiLU and the gate product on our op (cpu_kernels.silu_mul_rows)

    def forward(self, x):  # [batch, T, dim]
        if self.gate_up_proj is not None:
            gu = self.gate_up_proj(x)  # [batch, T, 2 * intermediate]: gate, then up
            if self.cpu_ops and not (torch.is_grad_enabled() and x.requires_grad):
                return self.down_proj(cpu_kernels.gated_rows(gu, self.activation))
            gate, up = gu.chunk(2, dim=-1)
            return self.down_proj(self.act(gate) * up)
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))

    def act(self, gate):
        return F.silu(gate) if self.activation == "silu" else F.gelu(gate, approximate="tanh")


class DecoderLayer(nn.Module):
    """x + attn(norm(x)), then x + mlp(norm(x)); with sandwich norms (Gemma 3) each branch's output is
    normed too, and without pre_norms (OLMo 2) only the outputs are. HF's names: post_attention_layernorm
    is the MLP's input norm in Llama's layout, the attention's output norm in Gemma's and OLMo 2's (Gemma's
    MLP input norm is pre_feedforward_layernorm)."""

    def __init__(self, cfg: ModelConfig, index: int = 0):
        super().__init__()
        self.local = index in cfg.local_layers  # a sliding-window or a NoPE layer (its own RoPE table and mask)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps) if cfg.pre_norms else None
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MoE(cfg.num_experts, cfg.experts_per_token, cfg.hidden_size, cfg.expert_intermediate_size,
                       cfg.norm_topk_prob) if cfg.num_experts else MLP(cfg)
        self.residual = cfg.residual_multiplier  # each branch's output times this (Granite's; 1 elsewhere)
        self.pre_feedforward_layernorm = self.post_feedforward_layernorm = None
        if cfg.sandwich_norms:
            self.pre_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps) if cfg.pre_norms else None
            self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def norms(self) -> tuple:
        """(attention input, attention output, MLP input, MLP output) norms, each or None."""
        if self.post_feedforward_layernorm is None:
            return self.input_layernorm, None, self.post_attention_layernorm, None
        return (self.input_layernorm, self.post_attention_layernorm, self.pre_feedforward_layernorm,
                self.post_feedforward_layernorm)

    def forward(self, x, cos, sin, k_cache, v_cache, start, mask):
        attn_in, attn_out, mlp_in, mlp_out = self.norms()
        h = self.self_attn(x if attn_in is None else attn_in(x), cos, sin, k_cache, v_cache, start, mask)
        x = x + self.scaled(h if attn_out is None else attn_out(h))
        h = self.mlp(x if mlp_in is None else mlp_in(x))
        return x + self.scaled(h if mlp_out is None else mlp_out(h))

    def scaled(self, h):
        return h if self.residual == 1.0 else h * self.residual


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        # weights uninitialized: a loader assigns them (a random init on the meta device costs a second)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                         _weight=torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Ragged(NamedTuple):
    """Where a ragged batch writes: cache rows # [batch] and slots # [batch, T] per row."""

    rows: torch.Tensor
    slots: torch.Tensor


class Static(NamedTuple):
    """Where a fixed-shape forward writes (CUDA graphs): slots # [T], the same for every row."""

    slots: torch.Tensor


class LayerInputs(NamedTuple):
    """What a decoder layer takes besides x and its cache, for the global layers and for the
    sliding-window ones: RoPE rows cos, sin # [batch, 1, T, head_dim] and the bool mask (or None)."""

    cos: torch.Tensor
    sin: torch.Tensor
    mask: torch.Tensor | None
    local_cos: torch.Tensor
    local_sin: torch.Tensor
    local_mask: torch.Tensor | None

    def of(self, layer: DecoderLayer) -> tuple:
        """(cos, sin, mask) of one layer."""
        return (self.local_cos, self.local_sin, self.local_mask) if layer.local else (self.cos, self.sin, self.mask)


def window_mask(mask, start, positions: torch.Tensor, window: int):
    """`mask` with each query restricted to keys fewer than `window` positions back (HF's and llama.cpp's
    sliding window: q_pos - k_pos < window). A cached key's position is its slot; the new tokens' are
    `positions` # [batch, T] at their slots. start: an int (mask [T, start + T] or None), Static or
    Ragged (mask [T or batch, ..., S]). With an int start and start + T <= window, `mask` itself."""
    b, t = positions.shape
    dev = positions.device
    if isinstance(start, int):
        if start + t <= window:
            return mask
        kpos = torch.cat([torch.arange(start, device=dev).expand(b, start), positions], dim=1)  # [batch, S]
    else:  # Static or Ragged: the slots of every cache position up to S, the new tokens' positions at theirs
        slots = start.slots.expand(b, t)
        kpos = torch.arange(mask.shape[-1], device=dev).expand(b, -1).clone().scatter_(1, slots, positions)
    near = (positions[:, :, None] - kpos[:, None, :]) < window  # [batch, T, S]
    if mask is None:
        return near[0] if b == 1 else near[:, None]
    if mask.dim() == 2 and b == 1:
        return mask & near[0]
    return (mask if mask.dim() == 4 else mask[None, None]) & near[:, None]


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
        self.rope_long = False  # LongRoPE: the long factors (set by new_cache for a context beyond the original)
        cos, sin = rope_tables(cfg, min(cfg.max_position_embeddings, ROPE_POSITIONS))
        self.register_buffer("rope_cos", cos, persistent=False)  # [positions, head_dim]; new_cache extends them
        self.register_buffer("rope_sin", sin, persistent=False)  # [positions, head_dim]
        self.rope_local = self._local_tables(cos.shape[0])  # the sliding layers' (cos, sin), or None: the same
        self.graphs = None  # a CudaGraphs replaying fixed-shape steps (specdec.model.cuda_graphs), or None
        # the layer loop fused where a call fits, or None: a cpu_forward.CpuForward (one C call on the CPU
        # backend) or a gpu_forward.GpuForward (Triton kernels between the GEMMs, --gpu-kernels)
        self.layer_loop = None
        self.weight_format = "torch"  # "gguf-q8": the CPU backend on a GGUF file's blocks (loading.load_gguf_blocks)

    @property
    def dtype(self) -> torch.dtype:
        """The activations' and the KV cache's dtype (the final norm's: linear layers may hold GGUF blocks)."""
        return self.model.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.norm.weight.device

    def _apply(self, fn, recurse=True):
        """nn.Module's, and the sliding layers' RoPE tables with the buffers (.to(device) moves them too)."""
        super()._apply(fn, recurse)
        if self.rope_local is not None:
            self.rope_local = tuple(fn(t) for t in self.rope_local)
        return self

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def set_rope_length(self, length: int) -> None:
        """RoPE tables for positions 0..length-1 (at most max_position_embeddings), on the model's device."""
        length = min(length, self.config.max_position_embeddings)
        self.rope_cos, self.rope_sin = (t.to(self.device) for t in rope_tables(self.config, length, long=self.rope_long))
        self.rope_local = self._local_tables(length)

    def _local_tables(self, length: int):
        cfg = self.config
        if cfg.nope_layers:  # RoPE as the identity
            return torch.ones(length, cfg.head_dim, device=self.rope_cos.device), \
                torch.zeros(length, cfg.head_dim, device=self.rope_cos.device)
        if not cfg.sliding_layers or (cfg.rope_local_theta in (None, cfg.rope_theta) and cfg.rope_linear_factor == 1.0
                                      and cfg.rope_freq_factors is None and cfg.rope_attn_factor == 1.0):
            return None
        return tuple(t.to(self.rope_cos.device) for t in rope_tables(cfg, length, local=True))

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The first layer's input [batch, T, hidden] for tokens [batch, T] (Gemma's scaled by sqrt(hidden),
        Granite's by its multiplier)."""
        x = self.model.embed_tokens(tokens)
        if self.config.embed_scale != 1.0:  # in fp32 as HF's Gemma does, then in the model's dtype
            x = (x.float() * self.config.embed_scale).to(x.dtype)
        return x

    def layer_inputs(self, positions, start, mask) -> LayerInputs:
        """The RoPE rows and masks of the global and the sliding-window layers for a forward writing
        where `start` says (see forward) at RoPE positions # [batch, T] under `mask`."""
        dtype = self.dtype
        cos = self.rope_cos[positions].unsqueeze(1).to(dtype)  # [batch, 1, T, head_dim]
        sin = self.rope_sin[positions].unsqueeze(1).to(dtype)
        if not self.config.local_layers:
            return LayerInputs(cos, sin, mask, cos, sin, mask)
        lcos, lsin = cos, sin
        if self.rope_local is not None:
            lcos, lsin = (t[positions].unsqueeze(1).to(dtype) for t in self.rope_local)
        if not self.config.sliding_layers:  # NoPE layers: the full mask
            return LayerInputs(cos, sin, mask, lcos, lsin, mask)
        return LayerInputs(cos, sin, mask, lcos, lsin, window_mask(mask, start, positions, self.config.sliding_window))

    def new_cache(self, capacity: int, batch: int = 1) -> KVCache:
        """A KV cache for `capacity` positions (at most max_position_embeddings). LongRoPE: the context a
        model runs in is the largest cache made for it, and beyond the original context the long factors
        hold from then on, for every cache (as llama.cpp picks them by its context size); make the
        largest cache first."""
        cfg = self.config
        capacity = min(capacity, cfg.max_position_embeddings)
        long = self.rope_long or cfg.long_rope(capacity)
        if capacity > self.rope_cos.shape[0] or long != self.rope_long:  # positions stay below the cache's capacity
            self.rope_long = long
            self.set_rope_length(max(capacity, self.rope_cos.shape[0]))
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
        with positions [batch, T] and mask [batch, 1, T, S] required (S above every slot); rows [batch] (default
        0..batch-1) are the cache rows the batch's rows live in.
        """
        b, t = tokens.shape
        if slots is not None:
            if positions is None or mask is None:
                raise ValueError("a forward with per-row slots needs positions and a mask")
            cache.require(mask.shape[-1])  # every slot lies below S (each query sees its own): no host read
            rows = torch.arange(b, device=tokens.device) if rows is None else rows
            start = Ragged(rows, slots)
        else:
            cache.require(start + t)
        if positions is None:
            positions = torch.arange(start, start + t, device=tokens.device).expand(b, t)
        if mask is None:
            mask = causal_mask(start, t, tokens.device)
        if self.graphs is not None and not hidden:  # graphs capture logits only
            return self.graphs.run(tokens, cache, start, positions, mask, last_only)
        return self.layers_forward(tokens, cache, start, positions, mask, last_only, hidden)

    @torch.inference_mode()
    def static_forward(self, tokens, cache: KVCache, slots, positions, mask, last_only=False):
        """forward() whose shapes depend only on tokens [batch, T] and the cache, with no host syncs,
        for CUDA graph capture: writes at slots [T] (int64), RoPE positions [batch, T], bool mask
        [T, capacity] over every cache slot. The caller checks that the slots fit."""
        return self.layers_forward(tokens, cache, Static(slots), positions, mask, last_only)

    def layers_forward(self, tokens, cache: KVCache, start, positions, mask, last_only, hidden=False):
        inputs = self.layer_inputs(positions, start, mask)
        x = self.embed(tokens)
        if self.layer_loop is not None and self.layer_loop.takes(tokens, cache, start, inputs):
            x = self.layer_loop.run(x, inputs, cache, start)  # the loop below, fused
        else:
            for i, layer in enumerate(self.model.layers):
                cos, sin, layer_mask = inputs.of(layer)
                x = layer(x, cos, sin, cache.k[i], cache.v[i], start, layer_mask)
        if last_only and not hidden:
            x = x[:, -1:]
        h = self.model.norm(x)  # [batch, T or 1, hidden_size]
        logits = self.logits(h[:, -1:] if last_only else h)
        return (logits, h) if hidden else logits

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """fp32 logits [..., vocab] of final-norm outputs h [..., hidden] (Gemma 2's soft-capped, Granite's
        divided by its scaling)."""
        logits = self.lm_head(h).float()
        if self.config.logits_scaling != 1.0:
            logits = logits / self.config.logits_scaling
        cap = self.config.final_softcap
        return torch.tanh(logits / cap) * cap if cap else logits
