"""Decode steps and verify passes through every decoder layer in one C call (cpu_forward.c).

The Python layer loop calls about twenty small things a layer (RMSNorm, the GEMMs part by part,
RoPE, the cache write, attention, SiLU, the residual adds), each costing microseconds of Python,
ctypes and torch dispatch. On GGUF blocks the GEMMs are fast enough for that to show: a third of
the 0.5B draft model's step, an eighth of the 1.5B target's.
`forward_layers` runs the same C ops on the same data in the same order, so its output is the
loop's, bit for bit (tests/test_cpu_forward.py).

It serves one sequence (batch 1, or one row of a batched cache) writing at an int start, and a ragged
batch (the server's rows, each at its own slots under its own mask), up to 16 positions a row, for a
model whose every linear layer is a QuantLinear (loading.load_gguf_blocks) on our fused ops, its MLPs
dense or mixtures of experts (MoeRows: moe_rows, which moe.MoE calls for forwards of any length). A ragged
batch's GEMMs read each weight once for all its rows. `CpuForward.takes` says whether a call
qualifies, and the caller keeps the Python loop otherwise.
"""

from __future__ import annotations

import ctypes
import threading

import torch
from torch import nn

from specdec.model import cpu_kernels
from specdec.model.quant import QuantLinear
from specdec.model.transformer import Ragged, RMSNorm

MAX_T = 16  # cpu_forward.c's FW_MAX_T
MAX_PARTS = 4  # FW_MAX_PARTS


class _Part(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int32), ("data", ctypes.c_void_p), ("rows", ctypes.c_int64)]


class _Linear(ctypes.Structure):
    _fields_ = [("bias", ctypes.c_void_p), ("n_parts", ctypes.c_int64), ("N", ctypes.c_int64), ("K", ctypes.c_int64),
                ("parts", _Part * MAX_PARTS)]


class _Moe(ctypes.Structure):
    _fields_ = [("router", ctypes.c_void_p), ("E", ctypes.c_int64), ("k", ctypes.c_int64), ("norm", ctypes.c_int32),
                ("gate_up", ctypes.POINTER(_Linear)), ("down", ctypes.POINTER(_Linear))]


class _Layer(ctypes.Structure):
    _fields_ = [("ln1", ctypes.c_void_p), ("ln2", ctypes.c_void_p), ("attn_post", ctypes.c_void_p),
                ("mlp_post", ctypes.c_void_p), ("q_norm", ctypes.c_void_p), ("k_norm", ctypes.c_void_p),
                ("local", ctypes.c_int32), ("act", ctypes.c_int32), ("softcap", ctypes.c_float),
                ("residual", ctypes.c_float), ("qk_whole", ctypes.c_int32), ("qkv", _Linear), ("o", _Linear),
                ("gate_up", _Linear), ("down", _Linear), ("moe", ctypes.POINTER(_Moe))]


class MoeRows:
    """A mixture-of-experts MLP (moe.MoE on GGUF blocks) in one C call, cpu_forward.c's moe_rows: each token
    routed by itself in C, each expert's GEMMs over all its tokens. `of` builds one where the module qualifies:
    an fp32 router, every expert's gate/up and down a QuantLinear."""

    def __init__(self, table: _Moe, keep: list):
        self.table, self._keep = table, keep  # the pointers' owners

    @staticmethod
    def of(moe: nn.Module, activation: str) -> "MoeRows | None":
        router, blocks = moe.gate.weight if isinstance(moe.gate, nn.Linear) else None, moe.experts.blocks
        if router is None or router.dtype is not torch.float32 or not router.is_contiguous() or blocks is None \
                or activation != "silu":
            return None
        gate_up, down = [_linear(b.gate_up_proj) for b in blocks], [_linear(b.down_proj) for b in blocks]
        if any(x is None for x in gate_up + down):
            return None
        arrays = [(_Linear * len(blocks))(*gate_up), (_Linear * len(blocks))(*down)]
        table = _Moe(router=router.data_ptr(), E=len(blocks), k=moe.top_k, norm=int(moe.norm_topk_prob),
                     gate_up=arrays[0], down=arrays[1])
        return MoeRows(table, [router, *arrays, *(t for b in blocks for t in b.buffers())])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # x [..., D] fp32 -> [..., D]
        x = x.contiguous()
        out = torch.empty_like(x)
        D = x.shape[-1]
        if cpu_kernels._lib.moe_rows(ctypes.byref(self.table), x.data_ptr(), out.data_ptr(), x.numel() // D, D,
                                     cpu_kernels.ACTIVATIONS["silu"], torch.get_num_threads()):
            raise RuntimeError("moe_rows refused its rows (out of memory, or a GEMM that does not take its weights)")
        return out


def _linear(layer) -> _Linear | None:
    if not isinstance(layer, QuantLinear) or not 1 <= len(layer.parts) <= MAX_PARTS:
        return None
    if layer.bias is not None and not (layer.bias.dtype is torch.float32 and layer.bias.is_contiguous()):
        return None
    out = _Linear(bias=layer.bias.data_ptr() if layer.bias is not None else None, n_parts=len(layer.parts),
                  N=layer.out_features, K=layer.in_features)
    for i, (qtype, data) in enumerate(layer.parts):
        if not data.is_contiguous() or data.dtype is not torch.uint8 \
                or data.shape[1] != cpu_kernels.quant_row_bytes(qtype, out.K):
            return None
        out.parts[i] = _Part(type=qtype, data=data.data_ptr(), rows=data.shape[0])
    return out


class CpuForward:
    """The layer loop of one model in C; built by `enable` where the model qualifies."""

    def __init__(self, model: nn.Module, layers: list[_Layer]):
        cfg = model.config
        self.lib = cpu_kernels._lib
        self.layers = (_Layer * len(layers))(*layers)
        self.n_layers = len(layers)
        self.dims = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size)
        self.eps = float(cfg.rms_norm_eps)
        self.scale = float(model.model.layers[0].self_attn.scale)
        self._keep = [t for layer in model.model.layers for t in (*layer.parameters(), *layer.buffers())]  # the pointers' owners
        self._scratch = threading.local()  # per thread: two threads may step two sequences of one model
        self.row_floats = int(self.lib.forward_scratch_floats(1, *self.dims))  # scratch a row needs

    def takes(self, tokens: torch.Tensor, cache, start, inputs) -> bool:
        """Whether a forward of tokens [batch, T] at `start` (an int slot, or transformer.Ragged rows and
        slots) with inputs (transformer.LayerInputs) fits."""
        b, t = tokens.shape
        if not (1 <= t <= MAX_T and cache.k.dtype is torch.float32 and _rows_apart(cache.k)
                and cache.k.stride() == cache.v.stride()):
            return False
        masks = (inputs.mask, inputs.local_mask)
        if isinstance(start, int):
            return b == 1 and cache.k.shape[1] == 1 and all(
                m is None or (m.dtype is torch.bool and m.dim() == 2 and m.shape[0] == t and m.shape[1] >= start + t
                              and m.stride(1) == 1) for m in masks)
        return (isinstance(start, Ragged) and start.slots.dtype is torch.int64 and start.slots.shape == (b, t)
                and all(m is not None and m.dtype is torch.bool and m.dim() == 4 and m.shape[0] in (1, b)
                        and m.shape[2] == t and m.shape[3] == masks[0].shape[3] and m.stride(3) == 1 for m in masks))

    def run(self, x: torch.Tensor, inputs, cache, start) -> torch.Tensor:
        """x [batch, T, D] (embeddings; written in place) through every layer, writing at `start` (an int
        slot for one sequence, or Ragged rows and slots); inputs: the layers' RoPE rows [batch, 1, T, head_dim]
        and masks (transformer.LayerInputs: [T, S] for an int start, [batch, 1, T, S] for a ragged batch)."""
        D, H, KV, hd, inter = self.dims
        B, T = x.shape[:2]
        x = x.contiguous()
        cos, sin, lcos, lsin = (t.contiguous() for t in (inputs.cos, inputs.sin, inputs.local_cos, inputs.local_sin))
        (mask, smb, smt), (lmask, lsmb, lsmt) = _strides(inputs.mask), _strides(inputs.local_mask)
        if isinstance(start, int):
            rows = slots = None
            first, span = start, start + T
        else:
            rows, slots = start.rows.to(torch.int64).contiguous(), start.slots.contiguous()
            first, span = 0, inputs.mask.shape[3]
        rc = self.lib.forward_rows(self.layers, self.n_layers, x.data_ptr(), B, T, D, H, KV, hd, inter, self.eps,
                                   self.scale, cos.data_ptr(), sin.data_ptr(), lcos.data_ptr(), lsin.data_ptr(),
                                   cache.k.data_ptr(), cache.v.data_ptr(), cache.k.shape[3], cache.k.stride(0),
                                   cache.k.stride(1), cache.k.shape[1], _ptr(rows), _ptr(slots), first, span,
                                   _ptr(mask), smb, smt, _ptr(lmask), lsmb, lsmt, self._scratch_for(B * T).data_ptr(),
                                   torch.get_num_threads())
        if rc:
            where = f"slot {start}" if rows is None else f"slots {slots.tolist()}"
            raise RuntimeError(f"forward_rows refused {B} x {T} positions at {where} (capacity {cache.k.shape[3]})")
        return x

    def _scratch_for(self, n: int) -> torch.Tensor:
        """This thread's scratch, for n rows at least."""
        need = self.row_floats * max(n, MAX_T)
        scratch = getattr(self._scratch, "buf", None)
        if scratch is None or scratch.numel() < need:
            scratch = self._scratch.buf = torch.empty(need)
        return scratch


def _strides(mask: torch.Tensor | None) -> tuple[torch.Tensor | None, int, int]:
    """A bool mask [T, S] or [batch, 1, T, S] (contiguous slots), with its batch and query strides."""
    if mask is None:
        return None, 0, 0
    if mask.dim() == 2:
        return mask, 0, mask.stride(0)
    return mask, mask.stride(0) if mask.shape[0] > 1 else 0, mask.stride(2)


def _ptr(t: torch.Tensor | None):
    return t.data_ptr() if t is not None else None


def _rows_apart(t: torch.Tensor) -> bool:
    """A cache tensor [layers, batch, kv_heads, capacity, head_dim] whose layers and rows may lie apart (a
    row of a batched cache, or its rows) but each row's layer [kv_heads, capacity, head_dim] is contiguous."""
    _, batch, kv, cap, hd = t.shape
    layer = kv * cap * hd
    return t.stride()[2:] == (cap * hd, hd, 1) and (batch == 1 or t.stride(1) >= layer) and t.stride(0) >= batch * layer


def enable(model: nn.Module) -> bool:
    """Give a CPU fp32 model whose every decoder layer qualifies a CpuForward (model.layer_loop);
    returns whether it did."""
    model.layer_loop = None
    if not cpu_kernels.available():
        return False
    moe = model.config.num_experts > 0  # every layer's MLP a mixture of experts, in C where each has its MoeRows
    layers = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn_in, attn_out, mlp_in, mlp_out = layer.norms()
        norms = [n for n in (attn_in, attn_out, mlp_in, mlp_out, attn.q_norm, attn.k_norm) if n is not None]
        if not (attn.cpu_ops and attn.cpu_rows >= MAX_T and attn.qkv_proj is not None
                and (mlp.fast is not None if moe else mlp.gate_up_proj is not None)
                and all(isinstance(n, RMSNorm) and n.cpu_ops and n.weight.is_contiguous()
                        and n.weight.dtype is torch.float32 and n.eps == model.config.rms_norm_eps for n in norms)
                and (moe or mlp.activation in cpu_kernels.ACTIVATIONS)):
            return False
        parts = [_linear(m) for m in (attn.qkv_proj, attn.o_proj)]
        parts += [_Linear(), _Linear()] if moe else [_linear(m) for m in (mlp.gate_up_proj, mlp.down_proj)]
        if any(p is None for p in parts):
            return False
        ptr = lambda n: n.weight.data_ptr() if n is not None else None  # noqa: E731
        act = cpu_kernels.ACTIVATIONS["silu" if moe else mlp.activation]
        layers.append(_Layer(ptr(attn_in), ptr(mlp_in), ptr(attn_out), ptr(mlp_out), ptr(attn.q_norm),
                             ptr(attn.k_norm), int(layer.local), act, float(attn.softcap), float(layer.residual),
                             int(attn.q_norm is not None and attn.q_norm.weight.numel() != attn.hd), *parts, ctypes.pointer(mlp.fast.table) if moe else None))
    model.layer_loop = CpuForward(model, layers)
    return True
