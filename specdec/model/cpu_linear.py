"""Fast CPU linear layers for small-M GEMMs (decode steps and verify passes of k + 1 rows).

Through the default MKL path a 5-row fp32 GEMM costs about 2-3x a single row, which makes
verification expensive. oneDNN with a prepacked (blocked) weight costs about the same for 1 to 9
rows. Our own kernel (`skinny_gemm.c`, built on first use by cpu_kernels.py) streams each weight row
once for up to 8 input rows, and gives the same bits for a row whatever the row count.
`PackedLinear` routes 1..8 rows through our kernel where it builds, more rows (prefill, large
batches) through the oneDNN-packed copy, and a single row through MKL's GEMV where our kernel is
off. Measured in docs/results/perf.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specdec.model import cpu_kernels


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class PackedLinear(nn.Module):
    """Same math as nn.Linear. 1..8 rows (MAX_ROWS): our skinny kernel (when `skinny`); otherwise one row
    through MKL's GEMV and several through oneDNN with a prepacked weight."""

    def __init__(self, linear: nn.Linear, pack_rows: int = 5, skinny: bool = False, pack: bool = True):
        super().__init__()
        self.weight = linear.weight  # [out, in], shared (tied embeddings stay tied)
        self.bias = linear.bias  # [out] or None
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), pack_rows) if pack else None
        self.skinny = skinny and self.weight.is_contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [batch, T, in]
        rows = x.numel() // x.shape[-1]
        if (self.skinny and rows <= cpu_kernels.MAX_ROWS
                and not (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad))):
            return cpu_kernels.skinny_linear(x, self.weight, self.bias)
        if rows == 1 or self.packed is None:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def pack_linears(model: nn.Module, skinny: bool = True, pack: bool = True) -> nn.Module:
    """Swap every nn.Linear of an fp32 CPU model for a PackedLinear, in place. skinny: route 1..8
    rows through our kernel, if it builds on this machine (cpu_kernels.available()). pack: keep a
    oneDNN-prepacked copy of each weight for multi-row GEMMs our kernel does not take."""
    skinny = skinny and cpu_kernels.available()
    for name, child in model.named_children():
        if isinstance(child, nn.Linear) and child.weight.dtype == torch.float32:
            setattr(model, name, PackedLinear(child, skinny=skinny, pack=pack))
        else:
            pack_linears(child, skinny, pack)
    return model
