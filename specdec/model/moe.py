"""The mixture-of-experts MLP (Qwen3-MoE's): a router scores E experts for each token, the top_k by softmax
probability are picked and their probabilities renormalised over the picked ones (norm_topk_prob, as
llama.cpp always does for qwen3moe); each picked expert's SiLU-gated MLP runs on the tokens routed to it,
and a token's output is its experts' outputs, weighted, summed in expert order.

Parameter names follow HF transformers: mlp.gate.weight # [E, hidden], mlp.experts.gate_up_proj # [E, 2 I,
hidden] (gate rows, then up rows), mlp.experts.down_proj # [E, hidden, I]. The CPU backend gives each expert
layers of its own on the GGUF file's blocks (Experts.blocks) and runs the whole MLP as one C call
(`fast`: cpu_forward.MoeRows, which routes each token by itself in C; the C layer loop calls the same code).

A token's routing does not depend on how many tokens share the call: in C for any count, and in the Python
path up to ROW_BY_ROW tokens (a decode step, a verify pass), where the router scores them one at a time;
the experts' layers on GGUF blocks give a row the same bits in any company. So a verify pass picks the
experts a one-token step would, and speculative output equals plain decoding's."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

ROW_BY_ROW = 16  # up to this many tokens a call, the router runs token by token (cpu_forward.MAX_T's verify passes)


class Experts(nn.Module):
    """E SiLU-gated MLPs, as HF's 3-D weights (the torch path) or as one module each (`blocks`)."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))  # [E, 2 I, hidden]
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))  # [E, hidden, I]
        self.blocks: nn.ModuleList | None = None  # the CPU backend: expert e's MLP on the file's blocks

    def run(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert e's output # [n, hidden] for its tokens x # [n, hidden]."""
        if self.blocks is not None:
            return self.blocks[e](x)
        gate, up = F.linear(x, self.gate_up_proj[e]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.down_proj[e])


class MoE(nn.Module):
    def __init__(self, num_experts: int, top_k: int, hidden: int, intermediate: int, norm_topk_prob: bool):
        super().__init__()
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob
        self.gate = nn.Linear(hidden, num_experts, bias=False)  # the router; the CPU backend's is the file's own
        self.experts = Experts(num_experts, hidden, intermediate)
        self.fast = None  # the CPU backend: x [..., hidden] -> the MLP's output in one C call (cpu_forward.MoeRows)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The picked experts' weights # [N, top_k] fp32 and ids # [N, top_k] int64 of tokens x # [N, hidden]."""
        if x.shape[0] <= ROW_BY_ROW:  # one token at a time: a row's scores free of the row count
            logits = torch.cat([self.gate(row) for row in x.split(1)])
        else:
            logits = self.gate(x)
        top, ids = torch.softmax(logits.float(), dim=-1).topk(self.top_k, dim=-1)
        if self.norm_topk_prob:
            top = top / top.sum(dim=-1, keepdim=True)
        return top, ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [batch, T, hidden]
        if self.fast is not None:
            return self.fast(x)
        flat = x.reshape(-1, x.shape[-1])
        weights, ids = self.route(flat)
        out = torch.zeros_like(flat)
        for e in ids.unique().tolist():  # ascending: every token sums its experts in one order
            rows, slot = (ids == e).nonzero(as_tuple=True)
            out.index_add_(0, rows, self.experts.run(e, flat[rows]) * weights[rows, slot, None].to(flat.dtype))
        return out.view_as(x)
