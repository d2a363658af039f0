"""Fast CPU linear layers for small-M GEMMs (verify passes of k + 1 rows).

Through the default MKL path a 5-row fp32 GEMM costs about 2-3x a single row, which makes
verification expensive. oneDNN with a prepacked (blocked) weight costs about the same for 1 to 9
rows. A single row is still fastest through MKL's GEMV, so `PackedLinear` keeps both: the original
weight for one row and the packed copy for several. Measured in docs/results/perf.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class PackedLinear(nn.Module):
    """Same math as nn.Linear; rows > 1 go through oneDNN with a prepacked weight."""

    def __init__(self, linear: nn.Linear, pack_rows: int = 5):
        super().__init__()
        self.weight = linear.weight  # [out, in], shared (tied embeddings stay tied)
        self.bias = linear.bias  # [out] or None
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), pack_rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [batch, T, in]
        if x.shape[0] * x.shape[1] == 1:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def pack_linears(model: nn.Module) -> nn.Module:
    """Swap every nn.Linear of an fp32 CPU model for a PackedLinear, in place."""
    for name, child in model.named_children():
        if isinstance(child, nn.Linear) and child.weight.dtype == torch.float32:
            setattr(model, name, PackedLinear(child))
        else:
            pack_linears(child)
    return model
