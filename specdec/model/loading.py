"""Load a model from a GGUF file or an HF model directory.

A GGUF file is memory-mapped (gguf_file.py), never converted: on the CPU the linear layers read its
own quantized blocks through the map (quant.py), with no fp32 copy in memory or on disk. A torch
reference model (fp32 on the CPU with --weight-dtype float32, bf16/fp16 on CUDA) dequantizes the
tensors into memory at load, on the target device. HF directories load with safetensors.
"""

from __future__ import annotations

import json
import re
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from specdec.errors import SpecdecError
from specdec.model import cpu_forward, cpu_kernels
from specdec.model.gguf_config import (EXPERT_TENSORS, FUSED_TENSORS, GEMMA_LAYER_NAMES, GGUF_LAYER_NAMES,
                                       OUTPUT_NORM_ARCHS, PERMUTED_QK, family, fused_rows, gguf_hf_config, hf_name,
                                       part_rows)
from specdec.model.gguf_file import GGUFFile
from specdec.model.quant import Q5_0, Q8_0, QuantEmbedding, QuantLinear, reencode_q5_0_as_q8_0, supported
from specdec.model.transformer import MLP, ModelConfig, Transformer, rope_row_order

HF_MODEL_TYPES = {"llama", "qwen2", "qwen3", "qwen3_moe", "mistral", "mixtral", "gemma2", "gemma3_text", "phi3",
                  "smollm3", "granite", "olmo2", "olmo3", "olmoe"}

# a draft model's block formats re-encoded at load into ones our kernels run faster, holding the same weights
# (ggml type -> (new type, converter)); measured in docs/performance.md
FASTER_FORMATS = {Q5_0: (Q8_0, reencode_q5_0_as_q8_0)}
# an HF checkpoint's experts saved one by one (the 3-D parameters' layout on disk; Mixtral's under
# block_sparse_moe, w1 the gate, w3 up and w2 down), and its router
EXPERT_KEY = re.compile(r"(.*)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)\.weight$")
EXPERT_PARTS = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
ROUTER_KEY = re.compile(r"(.*)\.block_sparse_moe\.gate\.weight$")
# the weights gguf_config.FUSED_TENSORS stacks, as an HF checkpoint of the family holds them (HF module names)
HF_FUSED = {"phi3": {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                     "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}}


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved RoPE pairs -> HF rotate-half layout)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tensor(array: np.ndarray) -> torch.Tensor:
    """A torch view of a read-only numpy array (the map): torch warns that it cannot mark it read-only."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


def _rows(gguf: GGUFFile, name: str, cfg: dict) -> np.ndarray:
    """A tensor's stored rows in our row order (a copy where it is not the file's), else a view: llama's q/k
    rows un-permuted into HF's order; with partial RoPE, q's and k's dimensions in rope_row_order's."""
    data = gguf.tensor(name)
    if family(cfg) in PERMUTED_QK and name.endswith(("attn_q.weight", "attn_k.weight")):
        heads = cfg["num_attention_heads"] if "attn_q" in name else cfg["num_key_value_heads"]
        data = np.ascontiguousarray(unpermute_qk(data, heads))
    order = _partial_rope_rows(name, cfg)
    if order is not None:
        data = np.ascontiguousarray(data[order])
    return data


def _partial_rope_rows(name: str, cfg: dict) -> np.ndarray | None:
    """Where a model has partial RoPE: the rows of q/k/v tensor `name` (attn_q, attn_k or attn_qkv, a
    weight or a bias) in our order, each q and k head's in rope_row_order's (v's as they are); else None."""
    kind = name.rsplit(".", 2)[-2] if name.count(".") >= 2 else ""
    if kind not in ("attn_q", "attn_k", "attn_qkv") or cfg.get("partial_rotary_factor", 1.0) == 1.0:
        return None
    model = ModelConfig.from_hf(cfg)
    order = rope_row_order(model.head_dim, model.rotary_dim)
    if order is None:
        return None
    hd, q, kv = model.head_dim, model.num_heads, model.num_kv_heads
    heads = lambda n, at: (at + np.arange(n)[:, None] * hd + np.array(order)[None]).reshape(-1)  # noqa: E731
    if kind != "attn_qkv":
        return heads(q if kind == "attn_q" else kv, 0)
    return np.concatenate([heads(q, 0), heads(kv, q * hd), np.arange((q + kv) * hd, (q + 2 * kv) * hd)])


def _reordered(name: str, cfg: dict) -> bool:
    """Whether _rows gives tensor `name` in another order than the file's (a copy)."""
    return ((family(cfg) in PERMUTED_QK and name.endswith(("attn_q.weight", "attn_k.weight")))
            or _partial_rope_rows(name, cfg) is not None)


def dequantize(gguf: GGUFFile, name: str, cfg: dict) -> torch.Tensor:
    """A tensor's fp32 values [rows, K] (or [K] for a vector), in the HF row order."""
    info, data = gguf.tensors[name], _rows(gguf, name, cfg)
    if data.dtype == np.float32:
        return torch.from_numpy(np.array(data))
    K = info.dims[0]
    if cpu_kernels.available() and data.dtype == np.uint8 and cpu_kernels.quant_row_bytes(info.ggml_type, K):
        return cpu_kernels.quant_dequantize(info.ggml_type, _tensor(data), K)
    if info.ggml_type == 30:  # BF16, stored as raw uint16
        return _tensor(data).view(torch.bfloat16).float()
    from gguf.quants import dequantize as gguf_dequantize
    return torch.from_numpy(np.array(gguf_dequantize(data, info.ggml_type), dtype=np.float32).reshape(data.shape[0], K))


def gguf_state_dict(gguf: GGUFFile, cfg: dict, dtype: torch.dtype = torch.float32,
                    device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Every weight dequantized, under HF names, in `dtype` on `device` (one tensor at a time); norm
    weights as our model holds them (Gemma's with the 1 added, as the file has them: hf_state_dict
    gives HF's)."""
    out = {}
    arch = gguf.get("general.architecture")
    fused, model = FUSED_TENSORS.get(arch, {}), ModelConfig.from_hf(cfg)
    for name in gguf.tensors:
        parts = name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[2] in EXPERT_TENSORS:
            if parts[2] != "ffn_up_exps":  # up goes with gate
                key, value = _experts_state(gguf, int(parts[1]), parts[2], cfg, model)
                out[key] = value.to(device=device, dtype=dtype)
            continue
        if len(parts) == 4 and parts[0] == "blk" and parts[2] in fused:  # one of ours per part, row slices
            pieces = dequantize(gguf, name, cfg).split(fused_rows(arch, parts[2], model))
            for part, piece in zip(fused[parts[2]], pieces):
                out[hf_name(f"blk.{parts[1]}.{part}.{parts[3]}", arch)] = piece.to(device=device, dtype=dtype)
            continue
        hf = hf_name(name, arch)
        if hf is not None:
            out[hf] = dequantize(gguf, name, cfg).to(device=device, dtype=dtype)
    return out


def _experts_state(gguf: GGUFFile, layer: int, kind: str, cfg: dict, model: ModelConfig) -> tuple[str, torch.Tensor]:
    """HF's name and value of layer `layer`'s experts' weights that GGUF tensor `kind` holds: gate_up_proj
    # [E, 2 I, hidden] from ffn_gate_exps and ffn_up_exps, or down_proj # [E, hidden, I]."""
    E, I, H = model.num_experts, model.expert_intermediate_size, model.hidden_size
    deq = lambda k: dequantize(gguf, f"blk.{layer}.{k}.weight", cfg)  # noqa: E731  [E * rows, K]
    prefix = f"model.layers.{layer}.mlp.experts"
    if kind == "ffn_down_exps":
        return f"{prefix}.down_proj", deq(kind).view(E, H, I)
    return f"{prefix}.gate_up_proj", torch.cat([deq("ffn_gate_exps").view(E, I, H), deq("ffn_up_exps").view(E, I, H)], 1)


def _shift_norms(state: dict[str, torch.Tensor], offset: float) -> dict[str, torch.Tensor]:
    if not offset:
        return state
    return {k: v + offset if k.endswith("norm.weight") else v for k, v in state.items()}


def hf_state_dict(state: dict[str, torch.Tensor], cfg: dict) -> dict[str, torch.Tensor]:
    """Our model's weights (gguf_state_dict's, or a module's state_dict) as HF's class of the family
    takes them: Gemma's norm weights less the 1 its RMSNorm adds, partial RoPE's q/k rows in HF's order,
    Phi-3's fused weights stacked (new tensors); the rest the same tensors."""
    model = ModelConfig.from_hf(cfg)
    state = _shift_norms(state, -model.norm_offset)
    order = rope_row_order(model.head_dim, model.rotary_dim)
    if order is not None:
        state = _reorder_qk(state, np.argsort(order).tolist(), model.head_dim)
    for fused, parts in HF_FUSED.get(family(cfg), {}).items():
        for key in [k for k in state if k.rpartition(".")[0].endswith(f".{parts[0]}")]:
            prefix, kind = key.rpartition(".")[0][:-len(parts[0])], key.rpartition(".")[2]
            state[f"{prefix}{fused}.{kind}"] = torch.cat([state.pop(f"{prefix}{p}.{kind}") for p in parts])
    return state


def _stack_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Experts saved one by one (mlp.experts.E.gate_proj.weight, or Mixtral's block_sparse_moe.experts.E.w1.weight,
    ..., the layouts HF checkpoints are written in) as the 3-D parameters transformers' class and ours hold:
    gate_up_proj # [E, 2 I, hidden], down_proj; Mixtral's router as mlp.gate."""
    groups: dict[str, dict[str, dict[int, torch.Tensor]]] = {}
    for key in list(state):
        found, router = EXPERT_KEY.match(key), ROUTER_KEY.match(key)
        if found:
            kind = EXPERT_PARTS.get(found[3], found[3])
            groups.setdefault(found[1], {}).setdefault(kind, {})[int(found[2])] = state.pop(key)
        elif router:
            state[f"{router[1]}.mlp.gate.weight"] = state.pop(key)
    for layer, kinds in groups.items():
        stack = lambda kind: torch.stack([kinds[kind][e] for e in sorted(kinds[kind])])  # noqa: E731
        state[f"{layer}.mlp.experts.gate_up_proj"] = torch.cat([stack("gate_proj"), stack("up_proj")], dim=1)
        state[f"{layer}.mlp.experts.down_proj"] = stack("down_proj")
    return state


def _from_hf_state_dict(state: dict[str, torch.Tensor], cfg: dict) -> dict[str, torch.Tensor]:
    """An HF checkpoint's weights as our model takes them (hf_state_dict's inverse, less the norms)."""
    model = ModelConfig.from_hf(cfg)
    state = _stack_experts(state)
    for fused, parts in HF_FUSED.get(family(cfg), {}).items():
        for key in [k for k in state if k.rpartition(".")[0].endswith(f".{fused}")]:
            prefix, kind = key.rpartition(".")[0][:-len(fused)], key.rpartition(".")[2]
            pieces = state.pop(key).split([part_rows(p, model) for p in parts])
            state.update({f"{prefix}{p}.{kind}": piece for p, piece in zip(parts, pieces)})
    order = rope_row_order(model.head_dim, model.rotary_dim)
    return state if order is None else _reorder_qk(state, order, model.head_dim)


def _reorder_qk(state: dict[str, torch.Tensor], order: list[int], head_dim: int) -> dict[str, torch.Tensor]:
    """q's and k's rows (weights and biases) with each head's dimensions taken in `order` (new tensors)."""
    def one(t):
        return t.reshape(-1, head_dim, *t.shape[1:])[:, order].reshape(t.shape)
    qk = (".q_proj.weight", ".k_proj.weight", ".q_proj.bias", ".k_proj.bias")
    return {k: one(v) if k.endswith(qk) else v for k, v in state.items()}


def load_gguf_reference(gguf: GGUFFile, device: torch.device, dtype: torch.dtype) -> Transformer:
    """The torch reference model of a GGUF file: every weight dequantized to `dtype` on `device`."""
    cfg = gguf_hf_config(gguf)
    return _assemble(cfg, gguf_state_dict(gguf, cfg, dtype, device), device, str(gguf.path))


def _assemble(hf_cfg: dict, state: dict[str, torch.Tensor], device: torch.device, where: str) -> Transformer:
    with torch.device("meta"):
        model = Transformer(ModelConfig.from_hf(hf_cfg))
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [m for m in missing if not (m == "lm_head.weight" and model.config.tie_word_embeddings)]
    if missing or unexpected:
        raise SpecdecError(f"weights in {where} do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.tie_weights()
    model.set_rope_length(model.rope_cos.shape[0])  # the tables on the weights' device
    return model.eval()


def _vector(gguf: GGUFFile, name: str) -> nn.Parameter:
    return nn.Parameter(torch.from_numpy(np.array(gguf.tensor(name), dtype=np.float32)), requires_grad=False)


def _parts(gguf: GGUFFile, names: list[str], cfg: dict, reencode: bool = False):
    """Blocks of the weights `names` stacked in order, neighbours of one format merged into one part:
    one view where they lie side by side in the file, else a copy of their blocks. reencode: each in
    the faster format FASTER_FORMATS names for it, where there is one."""
    if reencode and any(gguf.tensors[n].ggml_type in FASTER_FORMATS for n in names):
        return _reencoded_parts(gguf, names, cfg)
    parts, group = [], []  # group: names of the current part
    def close():
        if not group:
            return
        copied = any(_reordered(n, cfg) for n in group)
        if len(group) > 1 and not copied and all(gguf.adjacent(a, b) for a, b in zip(group, group[1:])):
            data = gguf.span(group)
        elif len(group) > 1 or copied:
            data = np.concatenate([_rows(gguf, n, cfg) for n in group])
            for n in group:  # their pages in the map are not read again
                gguf.release(n)
        else:
            data = gguf.tensor(group[0])
        parts.append((gguf.tensors[group[0]].ggml_type, _tensor(data)))
    for name in names:
        if group and gguf.tensors[group[-1]].ggml_type != gguf.tensors[name].ggml_type:
            close()
            group = []
        group.append(name)
    close()
    return parts


REENCODE_ROWS = 256  # rows converted at a time: the conversion's temporaries stay a few MB


def _reencoded_parts(gguf: GGUFFile, names: list[str], cfg: dict):
    """The blocks of `names` stacked as _parts stacks them, each weight in the faster format
    FASTER_FORMATS names for it where there is one: neighbours of one (final) format fill one array,
    converted a few rows at a time; the weights' pages in the map are released."""
    final = lambda n: FASTER_FORMATS.get(gguf.tensors[n].ggml_type, (gguf.tensors[n].ggml_type,))[0]  # noqa: E731
    runs: list[tuple[int, list[str]]] = []
    for name in names:
        if runs and runs[-1][0] == final(name):
            runs[-1][1].append(name)
        else:
            runs.append((final(name), [name]))
    parts = []
    for qtype, run in runs:
        sources = [_rows(gguf, n, cfg) for n in run]
        width = cpu_kernels.quant_row_bytes(qtype, gguf.tensors[run[0]].dims[0])
        out = np.empty((sum(a.shape[0] for a in sources), width), dtype=np.uint8)
        at = 0
        for name, rows in zip(run, sources):
            convert = FASTER_FORMATS.get(gguf.tensors[name].ggml_type, (None, None))[1]
            for s in range(0, rows.shape[0], REENCODE_ROWS):
                piece = rows[s:s + REENCODE_ROWS]
                out[at + s:at + s + piece.shape[0]] = piece if convert is None else convert(_tensor(piece)).numpy()
            at += rows.shape[0]
            gguf.release(name)
        parts.append((qtype, _tensor(out)))
    return parts


LOW_BIT_SOURCES = {2, 3, 6, 7, 8, 14}  # Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q6_K: what a 4-bit (3-bit) draft re-encodes
# (Q4_K and Q5_K stay)


def _repacked(gguf: GGUFFile, names: list[str], parts, K: int, bits: int = 8):
    """Each part in the kernels' tiles of 16 output rows where its format has such a layout (quant_repack.c;
    in new private memory), the others as they are; the weights' pages in the map are released.
    bits 4 or 3 (a draft model): the 32-weight formats and Q6_K re-encoded as Q4_0 or Q3_0 (lossy; Q4_K
    stays: at 3 bits too, where its loss costs more acceptance than its bytes save, scripts/draft_bits_sim.py)."""

    def one(qtype, data):
        if data.shape[0] % cpu_kernels.REPACK_ROWS:
            return qtype, data
        if bits in cpu_kernels.DRAFT_BITS and qtype in LOW_BIT_SOURCES:
            return cpu_kernels.requant(qtype, data, K, bits)
        return cpu_kernels.repack(qtype, data, K) if cpu_kernels.repacked_type(qtype) else (qtype, data)
    out = [one(qtype, data) for qtype, data in parts]
    if all(o[1] is not p[1] for o, p in zip(out, parts)):
        for n in names:
            gguf.release(n)
    return out


def _linear(gguf: GGUFFile, bases: list[str], cfg: dict, reencode: bool = False, repack: bool = True,
            bits: int = 8, rows: int = 0) -> nn.Module:
    """One linear layer over the weights `bases` (GGUF names without ".weight") stacked along the outputs:
    a QuantLinear where our kernels read every part's format (repack: in their tiles, where the format
    has them), an fp32 nn.Linear where the weights are plain floats (F32, F16, BF16); a block format
    our kernels do not read is refused (SpecdecError naming it and the tensor). rows > 0: only the
    first `rows` outputs (a draft's LM head under --draft-vocab: the rest is never read or converted)."""
    names = [f"{b}.weight" for b in bases]
    K = gguf.tensors[names[0]].dims[0]
    biases = [f"{b}.bias" for b in bases]
    bias = None
    if any(n in gguf.tensors for n in biases):
        bias = torch.cat([dequantize(gguf, n, cfg) if n in gguf.tensors else torch.zeros(gguf.tensors[w].rows)
                          for n, w in zip(biases, names)])
    if all(supported(gguf.tensors[n].ggml_type, K) for n in names):
        parts = _parts(gguf, names, cfg, reencode)
        if rows > 0:
            parts = QuantLinear(parts, K).first_rows(rows).parts
            bias = bias[:rows] if bias is not None else None
        return QuantLinear(_repacked(gguf, names, parts, K, bits) if repack else parts, K, bias)
    for n in names:
        _refuse_blocks(gguf, n, supported(gguf.tensors[n].ggml_type, K))
    weight = torch.cat([dequantize(gguf, n, cfg) for n in names])
    layer = nn.Linear(K, weight.shape[0], bias=bias is not None, device="meta")
    layer.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        layer.bias = nn.Parameter(bias, requires_grad=False)
    return layer


def _experts(gguf: GGUFFile, p: str, model: ModelConfig, cfg: dict, repack: bool, bits: int, rest: int) -> nn.ModuleList:
    """Layer p's experts, one MLP each on its rows of the stacked expert tensors (gate and up as one GEMM);
    on the file's blocks where our kernels read them (repacked where the format has tiles), else fp32."""
    names = [f"{p}{k}.weight" for k in EXPERT_TENSORS]  # gate, up, down: [E * rows, K] each
    infos = [gguf.tensors[n] for n in names]
    E = model.num_experts
    blocks = all(supported(i.ggml_type, i.dims[0]) for i in infos)
    if not blocks:
        for n, i in zip(names, infos):
            _refuse_blocks(gguf, n, supported(i.ggml_type, i.dims[0]))
    data = [_tensor(gguf.tensor(n)) if blocks else dequantize(gguf, n, cfg) for n in names]

    def linear(at: list[int], e: int, width: int) -> nn.Module:
        """Expert e's rows of the tensors `at` (indices into names), stacked along the outputs."""
        K = infos[at[0]].dims[0]
        rows = [data[i][e * (infos[i].rows // E):(e + 1) * (infos[i].rows // E)] for i in at]
        if blocks:
            parts = [(infos[i].ggml_type, r) for i, r in zip(at, rows)]
            return QuantLinear(_repacked(gguf, [], parts, K, width) if repack else parts, K)
        layer = nn.Linear(K, sum(r.shape[0] for r in rows), bias=False, device="meta")
        layer.weight = nn.Parameter(torch.cat(rows), requires_grad=False)
        return layer
    shape = replace(model, intermediate_size=model.expert_intermediate_size)
    experts = nn.ModuleList()
    for e in range(E):
        with torch.device("meta"):
            mlp = MLP(shape)
        mlp.gate_up_proj, mlp.down_proj = linear([0, 1], e, bits), linear([2], e, rest)
        mlp.gate_proj = mlp.up_proj = None
        mlp.cpu_ops = True
        experts.append(mlp)
    if blocks and repack:
        for n in names:  # every expert's blocks were copied into tiles
            gguf.release(n)
    return experts


FLOAT_TYPES = {0: "F32", 1: "F16", 30: "BF16"}  # ggml type ids of plain float tensors


def _refuse_blocks(gguf: GGUFFile, name: str, readable: bool) -> None:
    """SpecdecError for tensor `name` in a block format our kernels do not read (`readable` False)."""
    qtype = gguf.tensors[name].ggml_type
    if readable or qtype in FLOAT_TYPES:
        return
    from gguf import GGMLQuantizationType
    try:
        fmt = GGMLQuantizationType(qtype).name
    except ValueError:
        fmt = f"ggml type {qtype}"
    raise SpecdecError(f"{gguf.path}: tensor {name} is in the block format {fmt}, which our CPU kernels do not run "
                       f"(they run {', '.join(cpu_kernels.QUANT_TYPES)}); use a file in one of those, or "
                       "--weight-dtype float32 (the torch reference, every weight dequantized to fp32 in memory)")


def _embedding(gguf: GGUFFile, cfg: dict) -> nn.Module:
    info = gguf.tensors["token_embd.weight"]
    if gguf.tensor(info.name).dtype == np.uint8 and cpu_kernels.quant_row_bytes(info.ggml_type, info.dims[0]):
        return QuantEmbedding(info.ggml_type, _tensor(gguf.tensor(info.name)), info.dims[0])
    _refuse_blocks(gguf, info.name, False)
    return nn.Embedding.from_pretrained(dequantize(gguf, info.name, cfg), freeze=True)


def blocks_all_readable(gguf: GGUFFile) -> bool:
    """Every tensor of the file is plain floats or a block format our kernels read: loading it on the CPU
    backend cannot be refused (a deferred load then cannot fail on a format later, mid-answer)."""
    return all(t.ggml_type in FLOAT_TYPES or supported(t.ggml_type, t.dims[0]) for t in gguf.tensors.values())



def load_gguf_blocks(gguf: GGUFFile, reencode: bool = False, repack: bool = True, bits: int = 8,
                     head_rows: int = 0) -> Transformer:
    """The CPU backend's model of a GGUF file: linear layers on the file's own blocks (q/k/v and
    gate/up fused into one GEMM each), the embedding dequantized row by row, norms and biases read
    as they are, our fused ops for RMSNorm, RoPE, attention and SiLU, and the layer loop in C
    (cpu_forward.py) where every layer qualifies. reencode: the linear layers' blocks in the faster
    format FASTER_FORMATS names for them, where there is one (for a draft model). repack: the linear
    layers' blocks (all but IQ3_S) rewritten at load into the kernels' tiles of 16 output rows
    (quant_rp.h: prefill and verification run several times faster; private memory instead of the
    file's shared pages), else read through the map as they lie in the file. bits 4 (with repack, for a
    draft model): the 32-weight formats (Q8_0, Q5_0, Q4_0, Q4_1, Q5_1) and Q6_K re-encoded as Q4_0, lossy; bits 3:
    the MLP's gate and up projections as Q3_0, the rest as at 4.
    head_rows > 0 (a draft under --draft-vocab): the LM head holds only its first head_rows outputs
    (logits for ids below it; the drafter scores no others), so the rest is never converted or held."""
    if not cpu_kernels.available():
        raise SpecdecError(f"the CPU backend needs our kernels, which cannot be built here "
                           f"({cpu_kernels.unavailable_reason()}); use --weight-dtype float32")
    reencode = reencode and not (repack and bits in cpu_kernels.DRAFT_BITS)  # every 32-weight format in one pass
    # 3 bits: the MLP's gate and up alone (two thirds of a layer's bytes); the rest, the LM head and the
    # down projection lose more acceptance at 3 bits than their bytes save (scripts/draft_bits_sim.py)
    rest = 4 if bits == 3 else bits
    cfg = gguf_hf_config(gguf)
    with torch.device("meta"):
        model = Transformer(ModelConfig.from_hf(cfg))
    backbone = model.model
    backbone.embed_tokens = _embedding(gguf, cfg)
    backbone.norm.weight = _vector(gguf, "output_norm.weight")
    arch = gguf.get("general.architecture")
    names = GEMMA_LAYER_NAMES if arch in OUTPUT_NORM_ARCHS else GGUF_LAYER_NAMES

    def stacked(p: str, parts: tuple[str, ...]) -> list[str]:
        """The tensors holding layer p's weights `parts` stacked along the rows: the architecture's fused one
        where the file has it (our fused GEMM as it is), else the parts."""
        for fused, held in FUSED_TENSORS.get(arch, {}).items():
            if held == parts and f"{p}{fused}.weight" in gguf.tensors:
                return [p + fused]
        return [p + n for n in parts]
    for i, layer in enumerate(backbone.layers):
        p = f"blk.{i}."
        for gguf_name, module in names.items():  # the norms: our RMSNorm modules under their HF names
            if gguf_name.endswith("norm") and f"{p}{gguf_name}.weight" in gguf.tensors:
                norm = layer.get_submodule(module)
                norm.weight, norm.cpu_ops = _vector(gguf, f"{p}{gguf_name}.weight"), True
        attn, mlp = layer.self_attn, layer.mlp
        attn.qkv_proj = _linear(gguf, stacked(p, ("attn_q", "attn_k", "attn_v")), cfg, reencode, repack, rest)
        attn.q_proj = attn.k_proj = attn.v_proj = None
        attn.o_proj = _linear(gguf, [p + "attn_output"], cfg, reencode, repack, rest)
        if model.config.num_experts:
            mlp.gate = _linear(gguf, [p + "ffn_gate_inp"], cfg, reencode, repack, rest)
            mlp.experts.blocks = _experts(gguf, p, model.config, cfg, repack, bits, rest)
            mlp.experts.gate_up_proj = mlp.experts.down_proj = None
            mlp.fast = cpu_forward.MoeRows.of(mlp, model.config.activation)
        else:
            mlp.gate_up_proj = _linear(gguf, stacked(p, ("ffn_gate", "ffn_up")), cfg, reencode, repack, bits)
            mlp.gate_proj = mlp.up_proj = None
            mlp.down_proj = _linear(gguf, [p + "ffn_down"], cfg, reencode, repack, rest)
            mlp.cpu_ops = True
        attn.cpu_ops, attn.cpu_rows = True, sys.maxsize
    backbone.norm.cpu_ops = True
    model.lm_head = _linear(gguf, ["output" if "output.weight" in gguf.tensors else "token_embd"], cfg, reencode, repack,
                            rest, head_rows)
    model.weight_format = "gguf-q8"
    cpu_forward.enable(model)
    return model.eval()


def resolve_dtype(device: torch.device, dtype: str | None) -> torch.dtype:
    """fp32 on CPU by default, bf16 on CUDA; refuse a dtype the device cannot run well."""
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in names:
        raise SpecdecError(f"unknown dtype {dtype!r}; choose one of float32, bfloat16, float16")
    if device.type == "cpu" and names[dtype] != torch.float32:
        raise SpecdecError(f"{dtype} is not supported on the CPU, whose paths are the GGUF blocks (8-bit activations) "
                           "and the fp32 reference; use --dtype float32 or leave it out")
    return names[dtype]


WEIGHT_DTYPES = ("auto", "gguf-q8", "gguf-q8-mapped", "float32")


def use_gguf_blocks(device: torch.device, weight_dtype: str | None, source: Path) -> bool:
    """Whether the model runs on its GGUF file's own blocks (the CPU backend): "auto" (or None) takes
    them for a .gguf model on the CPU where our kernels build, "gguf-q8" asks for them (an error where
    they cannot be had), "float32" asks for the torch reference."""
    if weight_dtype not in (None, *WEIGHT_DTYPES):
        raise SpecdecError(f"unknown --weight-dtype {weight_dtype!r}; choose one of {', '.join(WEIGHT_DTYPES)}")
    if weight_dtype == "float32":
        return False
    possible = device.type == "cpu" and source.suffix == ".gguf" and cpu_kernels.available()
    if weight_dtype in ("gguf-q8", "gguf-q8-mapped") and not possible:
        if source.suffix != ".gguf":
            raise SpecdecError(f"--weight-dtype gguf-q8 reads a GGUF file's quantized blocks; {source} is not a .gguf file")
        if device.type != "cpu":
            raise SpecdecError(f"--weight-dtype gguf-q8 is the CPU backend, not {device}; leave it out on {device}")
        raise SpecdecError(f"--weight-dtype gguf-q8 needs our CPU kernels, which cannot be built here "
                           f"({cpu_kernels.unavailable_reason()}); use --weight-dtype float32")
    return possible


def resolve_device(device: str | None) -> torch.device:
    name = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise SpecdecError(f"unknown device {name!r}; use cpu or cuda[:N]") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SpecdecError("CUDA was asked for but no CUDA device is available; use --device cpu")
    if dev.type not in ("cpu", "cuda"):
        raise SpecdecError(f"unsupported device {name!r}; use cpu or cuda[:N]")
    return dev


def load_hf_dir(directory: Path, device: torch.device, dtype: torch.dtype) -> Transformer:
    from safetensors import safe_open
    cfg_path = directory / "config.json"
    files = sorted(directory.glob("*.safetensors"))
    if not cfg_path.is_file() or not files:
        raise SpecdecError(f"{directory} is not an HF model directory (needs config.json and *.safetensors)")
    hf_cfg = json.loads(cfg_path.read_text())
    if hf_cfg.get("model_type") not in HF_MODEL_TYPES:
        raise SpecdecError(f"unsupported model_type {hf_cfg.get('model_type')!r} in {cfg_path}; "
                           f"supported: {', '.join(sorted(HF_MODEL_TYPES))}")
    try:
        offset = ModelConfig.from_hf(hf_cfg).norm_offset
    except ValueError as e:
        raise SpecdecError(f"{cfg_path}: {e}") from None
    state = {}
    for f in files:
        with safe_open(str(f), framework="pt", device=str(device)) as sf:
            state.update({k: sf.get_tensor(k).float() for k in sf.keys() if not k.endswith("rotary_emb.inv_freq")})
    state = _from_hf_state_dict(state, hf_cfg)
    state = {k: v.to(dtype) for k, v in _shift_norms(state, offset).items()}  # Gemma's +1 in fp32, as llama.cpp's
    return _assemble(hf_cfg, state, device, str(directory))


def open_gguf(path: Path) -> GGUFFile:
    if path.suffix != ".gguf" and not path.is_dir():
        raise SpecdecError(f"{path} is neither a .gguf file nor a model directory")
    return GGUFFile(path)
