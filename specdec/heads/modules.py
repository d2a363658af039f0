"""Head modules. Parameter names are the published layouts' (EAGLE: fc, layers.0.*; EAGLE-3: fc,
midlayer.*, norm, lm_head; Medusa: medusa_head.{i}.{j}.linear), so a state dict saves and loads as is.

The target's embedding, final norm and LM head are not part of a head: they come in a TargetParts,
frozen, the LM head cut to the draft vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from specdec.model.transformer import MLP, Attention, DecoderLayer, ModelConfig, RMSNorm, apply_rope, rope_tables

KINDS = ("eagle", "eagle3", "medusa")


@dataclass(frozen=True)
class HeadConfig:
    kind: str               # one of KINDS
    hidden_size: int
    vocab_size: int         # the target's
    draft_vocab_size: int
    num_heads: int = 1
    num_kv_heads: int = 1
    head_dim: int = 1
    intermediate_size: int = 1
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    attention_bias: bool = False
    max_position_embeddings: int = 4096
    fc_bias: bool = True        # EAGLE-1's fc has a bias
    input_norm: bool = False    # EAGLE-1's layer 0 has no input norm
    final_norm: bool = True     # the target's final norm before the LM head (EAGLE-1 checkpoints: none)
    medusa_heads: int = 4
    medusa_layers: int = 1
    own_lm_head: bool = False   # Medusa checkpoints from elsewhere: a full LM head per head

    def layer_config(self) -> ModelConfig:
        return ModelConfig(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                           intermediate_size=self.intermediate_size, num_layers=1, num_heads=self.num_heads,
                           num_kv_heads=self.num_kv_heads, head_dim=self.head_dim, rms_norm_eps=self.rms_norm_eps,
                           rope_theta=self.rope_theta, max_position_embeddings=self.max_position_embeddings,
                           attention_bias=self.attention_bias)

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict) -> "HeadConfig":
        names = {f.name for f in fields(HeadConfig)}
        return HeadConfig(**{k: v for k, v in data.items() if k in names})


def eagle_config(target: ModelConfig, draft_vocab: int, intermediate_size: int | None = None,
                 max_positions: int = 4096) -> HeadConfig:
    """An EAGLE head of the target's layer shape; intermediate_size narrows its MLP."""
    return HeadConfig("eagle", target.hidden_size, target.vocab_size, draft_vocab, target.num_heads,
                      target.num_kv_heads, target.head_dim, intermediate_size or target.intermediate_size,
                      target.rms_norm_eps, target.rope_theta, target.attention_bias,
                      min(max_positions, target.max_position_embeddings))


def medusa_config(target: ModelConfig, draft_vocab: int, heads: int = 4, layers: int = 1) -> HeadConfig:
    return HeadConfig("medusa", target.hidden_size, target.vocab_size, draft_vocab, rms_norm_eps=target.rms_norm_eps,
                      medusa_heads=heads, medusa_layers=layers)


@dataclass
class TargetParts:
    """The target's frozen pieces a head drafts through."""

    embed: Callable          # the target's embedding as its first layer sees it (Transformer.embed): ids -> [..., hidden]
    norm_weight: torch.Tensor  # [hidden]
    norm_eps: float
    lm_weight: torch.Tensor  # [draft_vocab, hidden] fp32: the LM head's rows of the draft vocabulary

    def embeddings(self, tokens):  # [B, T] -> [B, T, hidden], never a gradient into the target
        with torch.no_grad():
            return self.embed(tokens).float()

    def norm(self, x):  # [..., hidden]
        xf = x.float()
        return self.norm_weight.float() * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.norm_eps))


LM_ROWS_CHUNK = 64


@torch.no_grad()
def lm_rows(module, ids: torch.Tensor) -> torch.Tensor:
    """The target's LM-head rows for ids # [n] -> [n, hidden] fp32, however its weights are held: the
    embedding's rows when tied, else the weight matrix, else the layer applied to the unit vectors."""
    if module.config.tie_word_embeddings:
        return module.model.embed_tokens(ids).float()
    head = module.lm_head
    if isinstance(head, nn.Linear):
        return head.weight[ids].float()
    eye = torch.eye(module.config.hidden_size, device=ids.device)
    cols = [head(eye[i:i + LM_ROWS_CHUNK])[:, ids] for i in range(0, eye.shape[0], LM_ROWS_CHUNK)]
    return torch.cat(cols).T.contiguous().float()


def target_parts(module, draft_ids: torch.Tensor) -> TargetParts:
    """The pieces of a loaded target, the LM head cut to draft_ids # [draft_vocab] (ascending target ids)."""
    norm = module.model.norm
    ids = draft_ids.to(norm.weight.device)
    return TargetParts(module.embed, norm.weight.detach(), norm.eps, lm_rows(module, ids))


def vocab_buffers(module: nn.Module, cfg: HeadConfig) -> None:
    module.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))  # [draft_vocab] offsets
    module.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))  # [vocab]


def attend(q, base_k, base_v, diag):
    """Attention of queries q # [B, heads, n, hd] over causal keys base_k/v # [B, kv, n, hd] and, for
    unrolled steps, each earlier step's own key at the same index: diag [(k, v) each [B, kv, n, hd]]."""
    rep = q.shape[1] // base_k.shape[1]
    if not diag:
        return F.scaled_dot_product_attention(q, base_k, base_v, is_causal=True, enable_gqa=rep != 1)
    scale = 1.0 / math.sqrt(q.shape[-1])
    kb, vb = base_k.repeat_interleave(rep, 1), base_v.repeat_interleave(rep, 1)
    n = q.shape[2]
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    scores = (q @ kb.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))  # [B, heads, n, n]
    extra = [(q * k.repeat_interleave(rep, 1)).sum(-1, keepdim=True) * scale for k, _ in diag]  # [B, heads, n, 1]
    weights = torch.softmax(torch.cat([scores, *extra], dim=-1), dim=-1)
    out = weights[..., :n] @ vb
    for i, (_, v) in enumerate(diag):
        out = out + weights[..., n + i:n + i + 1] * v.repeat_interleave(rep, 1)
    return out


def qkv(attn: Attention, x, cos, sin):
    """q [B, heads, n, hd], k and v [B, kv, n, hd] of x # [B, n, in], RoPE applied at cos/sin [n, hd]."""
    b, n, _ = x.shape
    q = attn.q_proj(x).view(b, n, attn.n_heads, attn.hd).transpose(1, 2)
    k = attn.k_proj(x).view(b, n, attn.n_kv, attn.hd).transpose(1, 2)
    v = attn.v_proj(x).view(b, n, attn.n_kv, attn.hd).transpose(1, 2)
    cos, sin = cos[None, None].to(x.dtype), sin[None, None].to(x.dtype)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


class EagleHead(nn.Module):
    """EAGLE-1: fc over [token embedding; feature] -> one decoder layer of the target's shape -> (the
    target's final norm) -> the target's LM head over the draft vocabulary."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.config = cfg
        self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=cfg.fc_bias)
        self.layers = nn.ModuleList([DecoderLayer(cfg.layer_config())])
        if not cfg.input_norm:
            self.layers[0].input_layernorm = nn.Identity()
        vocab_buffers(self, cfg)
        cos, sin = rope_tables(cfg.layer_config(), cfg.max_position_embeddings)
        self.register_buffer("rope_cos", cos, persistent=False)  # [max_pos, head_dim]
        self.register_buffer("rope_sin", sin, persistent=False)

    def step(self, feature, tokens, parts: TargetParts, first: int, base, diag):
        """One drafting step over n indices: feature [B, n, hidden], tokens [B, n] at positions
        first..first+n-1. base: step 1's (k, v) or None (this is step 1); diag: later steps' (k, v).
        Returns (predicted feature [B, n, hidden], logits [B, n, draft_vocab], this step's (k, v))."""
        layer = self.layers[0]
        x = self.fc(torch.cat([parts.embeddings(tokens).to(feature.dtype), feature], dim=-1))
        pos = slice(first, first + x.shape[1])
        q, k, v = qkv(layer.self_attn, layer.input_layernorm(x), self.rope_cos[pos], self.rope_sin[pos])
        base_k, base_v = base if base is not None else (k, v)
        out = attend(q, base_k, base_v, diag + [(k, v)] if base is not None else [])
        b, n, _ = x.shape
        x = x + layer.self_attn.o_proj(out.transpose(1, 2).reshape(b, n, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        pred = parts.norm(x).to(x.dtype) if self.config.final_norm else x
        return pred, F.linear(pred, parts.lm_weight.to(pred.dtype)), (k, v)

    def unroll(self, features, tokens, parts: TargetParts, steps: int):
        """Draft `steps` tokens ahead from every index at once, each step on the previous step's own
        predicted feature (EAGLE-3's training-time test). features [B, T, hidden], tokens [B, T].
        Returns per step j = 1..steps: (pred [B, n, hidden], logits [B, n, draft_vocab]) for indices
        0..n-1, n = T - steps; step j at index t predicts feature t + j and the token after it."""
        n = features.shape[1] - steps
        feature, base, diag, out = features[:, :n], None, [], []
        for j in range(1, steps + 1):
            pred, logits, kv = self.step(feature, tokens[:, j:j + n], parts, j - 1, base, diag)
            if base is None:
                base = kv
            else:
                diag.append(kv)
            out.append((pred, logits))
            feature = pred
        return out


class ResBlock(nn.Module):
    """Medusa's residual block: x + SiLU(linear(x)), zero-initialized to the identity."""

    def __init__(self, hidden: int):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x):  # [..., hidden]
        return x + F.silu(self.linear(x))


class MedusaHead(nn.Module):
    """K residual heads over the last feature; head i predicts the token i + 2 ahead, through the
    shared (truncated) LM head of the target, or its own full one (own_lm_head)."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.config = cfg
        lm = [nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)] if cfg.own_lm_head else []
        self.medusa_head = nn.ModuleList(
            nn.Sequential(*[ResBlock(cfg.hidden_size) for _ in range(cfg.medusa_layers)], *lm)
            for _ in range(cfg.medusa_heads))
        vocab_buffers(self, cfg)

    def forward(self, features, parts: TargetParts):  # features [B, T, hidden] -> [heads, B, T, draft_vocab]
        if self.config.own_lm_head:
            return torch.stack([head(features) for head in self.medusa_head])
        w = parts.lm_weight.to(features.dtype)
        return torch.stack([F.linear(head(features), w) for head in self.medusa_head])


class Eagle3Layer(nn.Module):
    """EAGLE-3's midlayer: attention reads [norm(embedding); norm(feature)] (2 x hidden wide)."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        lc = cfg.layer_config()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(lc)
        wide, bias = 2 * cfg.hidden_size, cfg.attention_bias
        self.self_attn.q_proj = nn.Linear(wide, cfg.num_heads * cfg.head_dim, bias=bias)
        self.self_attn.k_proj = nn.Linear(wide, cfg.num_kv_heads * cfg.head_dim, bias=bias)
        self.self_attn.v_proj = nn.Linear(wide, cfg.num_kv_heads * cfg.head_dim, bias=bias)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(lc)


class Eagle3Head(nn.Module):
    """EAGLE-3 (for checkpoints trained elsewhere): fc over three of the target's layer features,
    the midlayer, its own norm and LM head over the draft vocabulary."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.config = cfg
        self.fc = nn.Linear(3 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        vocab_buffers(self, cfg)
        cos, sin = rope_tables(cfg.layer_config(), cfg.max_position_embeddings)
        self.register_buffer("rope_cos", cos, persistent=False)  # [max_pos, head_dim]
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, features, tokens, parts: TargetParts):
        """features [B, T, 3 hidden] (low, middle, high layers) or [B, T, hidden] (a step's own output),
        tokens [B, T] the next tokens, causal over positions 0..T-1 -> (hidden [B, T, hidden],
        logits [B, T, draft_vocab])."""
        x = self.fc(features) if features.shape[-1] == 3 * self.config.hidden_size else features
        layer, n = self.midlayer, x.shape[1]
        inp = torch.cat([layer.input_layernorm(parts.embeddings(tokens).to(x.dtype)), layer.hidden_norm(x)], dim=-1)
        q, k, v = qkv(layer.self_attn, inp, self.rope_cos[:n], self.rope_sin[:n])
        out = attend(q, k, v, [])
        x = x + layer.self_attn.o_proj(out.transpose(1, 2).reshape(x.shape[0], n, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        return x, self.lm_head(self.norm(x))


def build_head(cfg: HeadConfig) -> nn.Module:
    return {"eagle": EagleHead, "eagle3": Eagle3Head, "medusa": MedusaHead}[cfg.kind](cfg)
