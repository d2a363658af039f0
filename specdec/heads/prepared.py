"""A trained head made ready to draft for one target (what the EAGLE and Medusa drafters run): on the
CPU backend its linear layers as 8-bit blocks (Q8_0) through the target's kernels, and its LM head
the target's own rows of the draft vocabulary. specdec.heads.find loads one by name."""

from __future__ import annotations

import copy

import torch
from torch import nn

from specdec.errors import SpecdecError
from specdec.heads.modules import lm_rows
from specdec.model.quant import QuantEmbedding, QuantLinear
from specdec.model.transformer import Transformer

Q8_0 = 8  # ggml type id


def quantize_q8_0(w: torch.Tensor) -> torch.Tensor:
    """fp32 weights # [rows, K] (K % 32 == 0) -> Q8_0 blocks # uint8 [rows, K / 32 * 34]: per block of 32
    an fp16 scale d = max|w| / 127 and 32 int8 q = round(w / d)."""
    rows, k = w.shape
    b = w.float().reshape(-1, 32)
    d = b.abs().amax(dim=1, keepdim=True) / 127.0  # [blocks, 1]
    d16 = d.to(torch.float16)
    inv = torch.where(d16.float() > 0, 1.0 / d16.float(), torch.zeros_like(d))
    q = torch.round(b * inv).clamp(-127, 127).to(torch.int8)
    out = torch.cat([d16.view(torch.uint8).reshape(-1, 2), q.view(torch.uint8)], dim=1)  # [blocks, 34]
    return out.reshape(rows, k // 32 * 34).contiguous()


def q8_linear(linear: nn.Linear) -> nn.Module:
    bias = None if linear.bias is None else linear.bias.detach().float().clone()
    return QuantLinear([(Q8_0, quantize_q8_0(linear.weight.detach()))], linear.in_features, bias)


def lm_head_rows(target: Transformer, ids: torch.Tensor) -> nn.Module:
    """The target's LM head for the rows `ids` only: its own blocks on the CPU backend, else fp32 rows."""
    head = target.lm_head
    if isinstance(head, QuantLinear) and len(head.parts) == 1:
        return head.rows(ids)
    embed = target.model.embed_tokens
    if target.config.tie_word_embeddings and isinstance(embed, QuantEmbedding):
        return QuantLinear([(embed.qtype, embed.blocks[ids].contiguous())], embed.embedding_dim)
    rows = lm_rows(target, ids.to(target.device))  # [n, hidden] fp32
    out = nn.Linear(rows.shape[1], rows.shape[0], bias=False, device=rows.device)
    out.weight = nn.Parameter(rows, requires_grad=False)
    return out


class PreparedHead:
    """An EAGLE head made ready to draft for one target, shared by every drafter of it: on the CPU
    backend its linear layers as Q8_0 blocks, its LM head the target's rows of the draft vocabulary."""

    def __init__(self, target: Transformer, head):
        cfg = head.config
        if cfg.kind != "eagle":
            raise SpecdecError(f"the EAGLE drafter needs an 'eagle' head, got {cfg.kind!r}")
        if cfg.hidden_size != target.config.hidden_size or cfg.vocab_size != target.config.vocab_size:
            raise SpecdecError(f"this head was made for a model of hidden size {cfg.hidden_size} and vocabulary "
                               f"{cfg.vocab_size}; the target has {target.config.hidden_size} and "
                               f"{target.config.vocab_size}")
        device = target.device
        self.config = cfg
        self.head = head.to(device).float().eval()
        self.layer = self.head.layers[0]
        self.ids = (self.head.d2t.long() + torch.arange(cfg.draft_vocab_size, device=device)).to(device)  # [draft_vocab]
        self.lm = lm_head_rows(target, self.ids)
        self.fc = self.head.fc
        if getattr(target, "weight_format", "torch") == "gguf-q8":  # 8-bit blocks, the target's kernels
            self.fc = q8_linear(self.head.fc)
            self.layer = copy.deepcopy(self.layer)
            attn, mlp = self.layer.self_attn, self.layer.mlp
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                setattr(attn, name, q8_linear(getattr(attn, name)))
            for name in ("gate_proj", "up_proj", "down_proj"):
                setattr(mlp, name, q8_linear(getattr(mlp, name)))
        norm = target.model.norm
        self.norm_weight, self.norm_eps = norm.weight.detach().float(), norm.eps
        self.rope_cos, self.rope_sin = self.head.rope_cos, self.head.rope_sin  # [positions, head_dim]

    def predict(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's output # [..., hidden] -> (predicted features, draft-vocabulary logits)."""
        xf = x.float()
        pred = self.norm_weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.norm_eps)) \
            if self.config.final_norm else xf
        return pred, self.lm(pred).float()


class PreparedMedusa:
    """A Medusa head made ready for one target: its residual blocks as Q8_0 blocks on the CPU backend,
    the target's LM head rows of the draft vocabulary shared by every head."""

    def __init__(self, target: Transformer, head):
        cfg = head.config
        if cfg.kind != "medusa" or cfg.own_lm_head:
            raise SpecdecError("the Medusa drafter needs a medusa head over the target's LM head (made by "
                               "`specdec train-head --kind medusa`)")
        if cfg.hidden_size != target.config.hidden_size:
            raise SpecdecError(f"this head was made for a model of hidden size {cfg.hidden_size}; the target has "
                               f"{target.config.hidden_size}")
        device = target.device
        self.config = cfg
        head = head.to(device).float().eval()
        self.ids = (head.d2t.long() + torch.arange(cfg.draft_vocab_size, device=device)).to(device)
        self.lm = lm_head_rows(target, self.ids)
        self.blocks = []  # per head: its residual blocks' linear layers
        for seq in head.medusa_head:
            layers = [block.linear for block in seq]
            if getattr(target, "weight_format", "torch") == "gguf-q8":
                layers = [q8_linear(layer) for layer in layers]
            self.blocks.append(layers)

    @torch.inference_mode()
    def logits(self, feature: torch.Tensor, heads: int) -> torch.Tensor:
        """Draft-vocabulary logits # [heads, draft_vocab] of the first `heads` heads at feature # [hidden]."""
        out = []
        for layers in self.blocks[:heads]:
            x = feature.view(1, -1).float()
            for linear in layers:
                x = x + torch.nn.functional.silu(linear(x))
            out.append(x)
        return self.lm(torch.cat(out)).float()
