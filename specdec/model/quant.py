"""The CPU backend's layers on a GGUF file's own quantized blocks, read through its memory map.

`QuantLinear`: y = x W^T + b where W stays in the file's block formats (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
Q8_0, Q5_0, Q4_0, Q4_1, Q5_1, IQ4_NL, IQ4_XS, IQ3_S). Every GEMM quantizes its input rows to 8 bits per block and meets the blocks in
integer dot products (quant_q8.c, llama.cpp's arithmetic): a row's bits do not depend on how many
rows the call has, so a verify pass scores each position exactly as a one-token step would, and
speculative output equals plain decoding's.

`QuantEmbedding`: the token embedding, each looked-up row dequantized on demand (a step reads one
row of it, not the table).

Neither keeps an fp32 copy of its weight; the blocks are views into the map wherever the file's
layout allows (a fused q/k/v or gate/up GEMM over tensors that are not adjacent in the file takes a
copy of their blocks, a few percent of the file).
"""

from __future__ import annotations

import torch
from torch import nn

from specdec.model import cpu_kernels

Parts = list[tuple[int, torch.Tensor]]  # [(ggml type id, uint8 [rows_i, row bytes])], stacked along the output rows


class QuantLinear(nn.Module):
    """nn.Linear's math (fp32 in, fp32 out) on GGUF blocks; no gradients."""

    def __init__(self, parts: Parts, in_features: int, bias: torch.Tensor | None = None):
        super().__init__()
        self.parts = parts
        self.in_features = in_features
        self.out_features = sum(data.shape[0] for _, data in parts)
        for i, (_, data) in enumerate(parts):  # buffers: counted by module_bytes, listed by buffers()
            self.register_buffer(f"blocks{i}", data, persistent=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)  # [out] fp32

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., in] -> [..., out]
        return cpu_kernels.quant_linear(x, self.parts, self.bias)

    def rows(self, ids: torch.Tensor) -> "QuantLinear":
        """The layer restricted to the outputs `ids` # int64 [n], in that order (a copy of their blocks)."""
        out = []
        for qtype, data in self.parts:
            if qtype in cpu_kernels.REPACKED_TYPES.values():
                out.append((qtype, gather_repacked(qtype, data, self.in_features, ids)))
            else:
                out.append((qtype, data[ids].contiguous()))
            break
        if len(self.parts) != 1:
            raise ValueError("QuantLinear.rows takes a layer of one part")
        return QuantLinear(out, self.in_features, None if self.bias is None else self.bias[ids].clone())

    def first_rows(self, rows: int) -> "QuantLinear":
        """The layer restricted to its first `rows` outputs (views, no copy): a truncated LM head."""
        out, left = [], rows
        for qtype, data in self.parts:
            if left <= 0:
                break
            out.append((qtype, data[:left]))
            left -= data.shape[0]
        return QuantLinear(out, self.in_features, None if self.bias is None else self.bias[:rows])

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, types={[q for q, _ in self.parts]}"


class QuantEmbedding(nn.Module):
    """nn.Embedding over GGUF blocks: rows are dequantized when looked up."""

    def __init__(self, qtype: int, data: torch.Tensor, dim: int):
        super().__init__()
        self.qtype, self.embedding_dim, self.num_embeddings = qtype, dim, data.shape[0]
        self.register_buffer("blocks", data, persistent=False)  # uint8 [vocab, row bytes]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # ids [...] int64 -> [..., dim] fp32
        rows = self.blocks[ids.reshape(-1)]
        return cpu_kernels.quant_dequantize(self.qtype, rows, self.embedding_dim).view(*ids.shape, self.embedding_dim)


# each repacked layout's block of 16 rows as runs of (units, bytes a row per unit): a row's bytes of a
# unit lie at row * width within it (quant_rp.h)
REPACKED_UNITS = {102: [(4, 4), (1, 2)], 104: [(4, 4), (1, 2), (1, 2)], 106: [(5, 4), (1, 2)], 107: [(5, 4), (1, 2), (1, 2)], 108: [(8, 4), (1, 2)], 110: [(16, 4), (8, 2), (1, 2), (1, 2)], 111: [(24, 4), (16, 1), (1, 2)], 112: [(32, 4), (8, 1), (4, 2), (2, 2)],
                  113: [(32, 4), (8, 1), (4, 2), (2, 2), (8, 4)], 114: [(48, 4), (16, 1), (1, 2)],
                  120: [(4, 4), (1, 2)], 123: [(32, 4), (8, 1), (1, 2)]}


def gather_repacked(qtype: int, data: torch.Tensor, K: int, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` # int64 [n] of a repacked matrix data # uint8 [rows, row bytes] as a repacked matrix of
    their own: uint8 [n, row bytes], a view of the first n rows of storage in whole tiles of 16."""
    R = cpu_kernels.REPACK_ROWS
    rb, n = data.shape[1], ids.numel()
    nb = K // (256 if qtype in (110, 111, 112, 113, 114, 123) else 32)
    tile = rb * R // nb  # bytes of one block of 16 rows
    # every tile whole, though a view of first rows may end inside one (its storage holds the tile)
    src = torch.as_strided(data, ((data.shape[0] + R - 1) // R, nb, tile), (nb * tile, tile, 1))
    padded = torch.cat([ids, ids.new_zeros((-n) % R)])
    out = torch.empty(padded.numel() * rb, dtype=torch.uint8).view(-1, src.shape[1], tile)
    off = 0
    for units, width in REPACKED_UNITS[qtype]:
        span = units * R * width
        s = src[:, :, off:off + span].reshape(src.shape[0], src.shape[1], units, R, width)
        o = out[:, :, off:off + span].view(out.shape[0], out.shape[1], units, R, width)
        picked = s[padded // R, :, :, padded % R, :]  # [n', blocks, units, width]
        o.copy_(picked.view(-1, R, *picked.shape[1:]).permute(0, 2, 3, 1, 4))
        off += span
    return out.view(-1, rb)[:n]


def first_rows(linear: nn.Module, rows: int) -> nn.Module:
    """A linear layer (nn.Linear or QuantLinear) restricted to its first `rows` outputs, sharing its weights."""
    if isinstance(linear, QuantLinear):
        return linear.first_rows(rows)
    head = nn.Linear(linear.in_features, rows, bias=linear.bias is not None, device="meta")
    head.weight = nn.Parameter(linear.weight[:rows], requires_grad=False)  # [rows, in], a view
    if linear.bias is not None:
        head.bias = nn.Parameter(linear.bias[:rows], requires_grad=False)
    return head


def supported(qtype: int, K: int) -> bool:
    """Whether our kernels read format `qtype` with rows of K weights (GEMM with 8-bit activations)."""
    return cpu_kernels.available() and cpu_kernels.quant_row_bytes(qtype, K) > 0 \
        and cpu_kernels.quant_q8_supported(qtype, K)


Q5_0, Q8_0 = 6, 8  # ggml type ids


def reencode_q5_0_as_q8_0(data: torch.Tensor) -> torch.Tensor:
    """Q5_0 blocks # uint8 [rows, K / 32 * 22] as Q8_0 blocks # uint8 [rows, K / 32 * 34] holding the same
    weights: Q5_0's w = d (q - 16) with q in 0..31 is Q8_0's w = d q8 with q8 = q - 16 and the same fp16 d."""
    rows = data.shape[0]
    b = data.reshape(-1, 22)  # [blocks, 22]: d (fp16), qh (32 high bits), qs (16 bytes of nibble pairs)
    qh = b[:, 2:6].contiguous().view(torch.int32)  # [blocks, 1]
    qs = b[:, 6:22].to(torch.int16)  # [blocks, 16]
    low = torch.cat([qs & 0x0F, qs >> 4], dim=1)  # [blocks, 32]: weights 0..15, then 16..31
    bits = (qh >> torch.arange(32, dtype=torch.int32)) & 1  # [blocks, 32]
    q8 = (low | (bits.to(torch.int16) << 4)) - 16  # [blocks, 32] in -16..15
    out = torch.cat([b[:, :2], q8.to(torch.int8).view(torch.uint8)], dim=1)  # [blocks, 34]
    return out.reshape(rows, -1).contiguous()
