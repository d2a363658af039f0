"""Fast CPU linear layers for small-M GEMMs (decode steps and verify passes of k + 1 rows).

Through the default MKL path a 5-row fp32 GEMM costs about 2-3x a single row, which makes
verification expensive. oneDNN with a prepacked (blocked) weight costs about the same for 1 to 9
rows. Our own kernel (`skinny_gemm.c`, built on first use by cpu_kernels.py) streams each weight row
once for up to 8 input rows, and gives the same bits for a row whatever the row count.
`PackedLinear` routes 1..8 rows through our kernel where it builds, more rows (prefill, large
batches) through the oneDNN-packed copy, and a single row through MKL's GEMV where our kernel is
off. Measured in docs/results/perf.md.

bf16 weights (`--weight-dtype bfloat16`): each weight is stored once, in bf16, and no oneDNN copy
is kept. Up to 16 rows go through our kernel with fp32 inputs and accumulation (the arithmetic of
fp32 weights holding the bf16 values, at half the bytes a step streams); more rows (prefill, big
batches) through torch's bf16 GEMM (oneDNN), whose inputs are rounded to bf16.

GGUF blocks (`--weight-dtype gguf`): each linear layer also keeps
the checkpoint's own quantized rows (Q4_K, Q6_K, Q8_0, ...; `attach_gguf_weights`), and 1..16 rows
go through quant_gemm.c, which streams those (4-7x fewer bytes than fp32) and dequantizes them in
registers to exactly the fp32 weights: the same bits as our fp32 kernel, for every row count.
Prefill keeps the fp32 path.

`--weight-dtype gguf-q8` (the default for a .gguf model): the same blocks, but each input row is
first quantized to 8 bits per block and meets them in integer dot products (quant_q8.c, llama.cpp's
arithmetic): about twice as fast again, not the fp32 bits, and still the same bits for a row
whatever the row count. It takes every row count (prefill too), so no oneDNN copy is kept.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn

from specdec.model import cpu_kernels


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


BF16_MAX_ROWS = 16  # bf16 weights: our kernel up to this many rows (a k = 8 verify's GEMMs keep fp32 inputs)


class PackedLinear(nn.Module):
    """Same math as nn.Linear (fp32 in, fp32 out). 1..8 rows (MAX_ROWS): our skinny kernel (when `skinny`);
    otherwise one row through MKL's GEMV and several through oneDNN with a prepacked weight.
    weight_dtype=torch.bfloat16 (or a bf16 weight): the weight is kept in bf16 only; our kernel takes
    up to BF16_MAX_ROWS rows, torch's bf16 GEMM the rest."""

    def __init__(self, linear: nn.Linear, pack_rows: int = 5, skinny: bool = False, pack: bool = True,
                 weight_dtype: torch.dtype | None = None):
        super().__init__()
        weight = linear.weight  # [out, in], shared (tied embeddings stay tied, in fp32)
        if weight_dtype is not None and weight.dtype != weight_dtype:
            weight = nn.Parameter(weight.detach().to(weight_dtype), requires_grad=False)
        self.weight = weight
        self.bias = linear.bias  # [out] or None (fp32)
        self.bf16 = weight.dtype is torch.bfloat16
        self.packed = (torch.ops.mkldnn._reorder_linear_weight(weight.detach(), pack_rows)
                       if pack and not self.bf16 else None)
        self.skinny = skinny and self.weight.is_contiguous()
        self.max_rows = BF16_MAX_ROWS if self.bf16 else cpu_kernels.MAX_ROWS
        # GGUF blocks of the weight (attach_gguf_weights): [(ggml type id, uint8 [rows, row bytes]), ...]
        # stacked along the output rows; 1..QUANT_MAX_ROWS rows then go through quant_gemm
        self.quant: list[tuple[int, torch.Tensor]] | None = None
        self.quant_act8 = False  # all GEMMs (any row count) quantize their inputs to 8 bits (quant_q8.c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [batch, T, in]
        rows = x.numel() // x.shape[-1]
        if (self.quant is not None and (rows <= cpu_kernels.QUANT_MAX_ROWS or self.quant_act8)
                and not (torch.is_grad_enabled() and x.requires_grad)):
            return cpu_kernels.quant_linear(x, self.quant, self.bias, act8=self.quant_act8)
        if (self.skinny and rows <= self.max_rows
                and not (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad))):
            return cpu_kernels.skinny_linear(x, self.weight, self.bias)
        if self.bf16:
            y = F.linear(x.to(torch.bfloat16), self.weight).float()
            return y if self.bias is None else y + self.bias
        if rows == 1 or self.packed is None:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def concat_linears(linears: list[nn.Linear]) -> nn.Linear:
    """One nn.Linear whose output is the outputs of `linears` side by side (a bias of zeros where one has none)."""
    w = torch.cat([lin.weight.detach() for lin in linears])
    out = nn.Linear(w.shape[1], w.shape[0], bias=any(lin.bias is not None for lin in linears),
                    device=w.device, dtype=w.dtype)
    out.weight = nn.Parameter(w, requires_grad=False)
    if out.bias is not None:
        out.bias = nn.Parameter(torch.cat([lin.bias.detach() if lin.bias is not None else w.new_zeros(lin.out_features)
                                           for lin in linears]), requires_grad=False)
    return out


def fuse_for_cpu(model: nn.Module) -> nn.Module:
    """In place: q/k/v and gate/up as one GEMM each (qkv_proj, gate_up_proj; the separate modules
    become None), and RMSNorm, RoPE and attention of up to cpu_kernels.MAX_ROWS positions on our
    fused ops. Fewer, longer weight streams and about a dozen fewer small ops per layer (perf.md,
    session 10). Needs cpu_kernels.available()."""
    from specdec.model.transformer import MLP, Attention, RMSNorm

    for module in model.modules():
        if isinstance(module, Attention) and module.qkv_proj is None:
            module.qkv_proj = concat_linears([module.q_proj, module.k_proj, module.v_proj])
            module.q_proj = module.k_proj = module.v_proj = None
            module.cpu_ops = True
        elif isinstance(module, MLP) and module.gate_up_proj is None:
            module.gate_up_proj = concat_linears([module.gate_proj, module.up_proj])
            module.gate_proj = module.up_proj = None
            module.cpu_ops = True
        elif isinstance(module, RMSNorm):
            module.cpu_ops = True
    return model


def unfused_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """model.state_dict() under the checkpoint's names: a fused qkv_proj / gate_up_proj is given back
    as q/k/v_proj and gate/up_proj (views of the fused tensors, no copies; bf16 weights are given
    back in fp32, copies)."""
    from specdec.model.transformer import MLP, Attention

    state = model.state_dict()
    for name, m in model.named_modules():
        prefix = f"{name}." if name else ""
        if isinstance(m, Attention) and m.qkv_proj is not None:
            fused, parts = "qkv_proj", dict(zip(("q_proj", "k_proj", "v_proj"), m.qkv_sizes))
        elif isinstance(m, MLP) and m.gate_up_proj is not None:
            half = m.gate_up_proj.weight.shape[0] // 2
            fused, parts = "gate_up_proj", {"gate_proj": half, "up_proj": half}
        else:
            continue
        for kind in ("weight", "bias"):
            t = state.pop(f"{prefix}{fused}.{kind}", None)
            if t is not None:
                for part, piece in zip(parts, t.split(list(parts.values()))):
                    state[f"{prefix}{part}.{kind}"] = piece
    return {name: t.float() if t.dtype is torch.bfloat16 else t for name, t in state.items()}


def pack_linears(model: nn.Module, skinny: bool = True, pack: bool = True,
                 weight_dtype: torch.dtype | None = None) -> nn.Module:
    """Swap every nn.Linear of an fp32 CPU model for a PackedLinear, in place. skinny: route 1..8
    rows through our kernel, if it builds on this machine (cpu_kernels.available()), after fusing
    projections and switching to our fused ops (fuse_for_cpu). pack: keep a oneDNN-prepacked copy of
    each weight for multi-row GEMMs our kernel does not take. weight_dtype=torch.bfloat16: keep the
    linear weights in bf16 instead (activations, norms, embeddings and the KV cache stay fp32)."""
    skinny = skinny and cpu_kernels.available()
    if skinny:
        fuse_for_cpu(model)
    _swap_linears(model, skinny, pack, weight_dtype)
    return model


def _swap_linears(model: nn.Module, skinny: bool, pack: bool, weight_dtype: torch.dtype | None) -> None:
    for name, child in model.named_children():
        if isinstance(child, nn.Linear) and child.weight.dtype == torch.float32:
            setattr(model, name, PackedLinear(child, skinny=skinny, pack=pack, weight_dtype=weight_dtype))
        else:
            _swap_linears(child, skinny, pack, weight_dtype)


def _gguf_linear_sources(model: nn.Module) -> dict[str, list[str]]:
    """Each PackedLinear's module name -> the checkpoint weights (HF names, without ".weight") stacked
    in it, in order."""
    from specdec.model.transformer import MLP, Attention

    out = {}
    for name, m in model.named_modules():
        prefix = f"{name}." if name else ""
        if isinstance(m, Attention) and m.qkv_proj is not None:
            out[f"{prefix}qkv_proj"] = [f"{prefix}{p}" for p in ("q_proj", "k_proj", "v_proj")]
        elif isinstance(m, MLP) and m.gate_up_proj is not None:
            out[f"{prefix}gate_up_proj"] = [f"{prefix}gate_proj", f"{prefix}up_proj"]
        elif isinstance(m, PackedLinear) and name not in out:
            out.setdefault(name, [name])
    tie = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    if tie and "lm_head" in out:
        out["lm_head"] = ["model.embed_tokens"]
    return out


def attach_gguf_weights(model: nn.Module, blocks: dict[str, tuple[int, torch.Tensor]], act8: bool = False) -> int:
    """Give each PackedLinear of a packed fp32 CPU model (pack_linears with skinny) the checkpoint's
    quantized rows, from blocks: HF weight name (without ".weight") -> (ggml type id, uint8 [rows,
    row bytes]). A layer any of whose parts is missing or in a format quant_gemm does not read keeps
    the fp32 path. Each part's first rows are dequantized and checked bit for bit against the layer's
    fp32 weight (a wrong mapping fails loudly, not silently). act8: those layers' GEMMs quantize their
    inputs to 8 bits (quant_q8.c). Returns the number of layers given blocks."""
    from specdec.errors import SpecdecError
    from specdec.model.transformer import Attention

    modules = dict(model.named_modules())
    done = 0
    for name, sources in _gguf_linear_sources(model).items():
        layer = modules.get(name)
        if not isinstance(layer, PackedLinear) or layer.bf16 or any(s not in blocks for s in sources):
            continue
        K = layer.weight.shape[1]
        if any(not 0 < cpu_kernels.quant_row_bytes(blocks[s][0], K) == blocks[s][1].shape[1] for s in sources):
            continue
        if act8 and not all(cpu_kernels.quant_q8_supported(blocks[s][0], K) for s in sources):
            continue
        parts, row = [], 0
        for s in sources:
            qtype, data = blocks[s]
            check = min(8, data.shape[0])
            if not torch.equal(cpu_kernels.quant_dequantize(qtype, data[:check], K), layer.weight[row:row + check]):
                raise SpecdecError(f"the GGUF blocks of {s} do not dequantize to the model's weights; "
                                   "the converted cache may be stale: delete SPECDEC_HOME/converted and load again")
            row += data.shape[0]
            if parts and parts[-1][0] == qtype:  # one call for neighbours in the same format
                parts[-1] = (qtype, torch.cat([parts[-1][1], data]))
            else:
                parts.append((qtype, data))
        if row != layer.weight.shape[0]:
            raise SpecdecError(f"the GGUF blocks of {name} hold {row} rows, the layer {layer.weight.shape[0]}")
        layer.quant = parts
        layer.quant_act8 = act8
        done += 1
    if done:  # verify passes of 9..16 positions then stay on our ops too: a row's bits match a one-token step.
        # act8: every row count (prefill, big trees): the whole forward then gives a row the same bits
        # whatever the row count (a chunked prefill equals a one-shot one), which 8-bit rounding needs:
        # it would turn SDPA's last-bit differences into different logits
        for m in model.modules():
            if isinstance(m, Attention) and m.cpu_ops:
                m.cpu_rows = sys.maxsize if act8 else cpu_kernels.QUANT_MAX_ROWS
    return done


def truncated_quant(parts: list[tuple[int, torch.Tensor]] | None, rows: int) -> list[tuple[int, torch.Tensor]] | None:
    """The first `rows` output rows of a layer's quantized parts (views)."""
    if parts is None:
        return None
    out, left = [], rows
    for qtype, data in parts:
        if left <= 0:
            break
        out.append((qtype, data[:left]))
        left -= data.shape[0]
    return out
