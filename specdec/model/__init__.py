"""Model: decoder, KV cache, loading, named-model registry, tokenizer."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.model.transformer import Transformer


@dataclass
class LoadedModel:
    """A decoder with the tokenizer that came with its weights."""

    name: str
    module: Transformer
    tokenizer: object
    eos_ids: set[int]

    @property
    def device(self) -> torch.device:
        return self.module.lm_head.weight.device


def model_flags(args) -> dict:
    """load_model's keyword arguments from the shared model flags (cli.add_model_flags); `pack` is
    each caller's (a draft model skips the oneDNN copy except in the server)."""
    return {"device": args.device, "dtype": args.dtype, "cuda_graphs": args.cuda_graphs, "kernel": not args.no_kernel,
            "weight_dtype": args.weight_dtype}


def load_model(spec: str, device: str | None = None, dtype: str | None = None, progress=print,
               pack: bool = False, cuda_graphs: bool = False, kernel: bool = True,
               weight_dtype: str | None = None) -> LoadedModel:
    """A registry name, .gguf path or HF directory -> LoadedModel on the chosen device/dtype.

    pack: on CPU in fp32, route multi-row GEMMs (verify passes) through oneDNN prepacked weights
    (see cpu_linear.py). It costs a second copy of the weights in memory. Ignored elsewhere.
    kernel: on CPU in fp32, route GEMMs of 1..8 rows (decode steps, verify passes) through our own
    kernel (cpu_kernels.py), where it builds; it reads the model's own weights (no copy).
    cuda_graphs: replay decode and verify forwards of fixed shapes as CUDA graphs (CUDA only; see
    engine/cuda_graphs.py).
    weight_dtype: on CPU in fp32, "bfloat16" keeps the linear layers' weights in bf16 (half the bytes
    a decode step reads; activations, the KV cache and accumulation stay fp32; no oneDNN copy is
    kept, so `pack` is moot). "gguf": decode and verify GEMMs (1..16 rows) read the GGUF file's own
    quantized blocks, dequantized in registers to exactly the fp32 weights (same output as
    "float32", 4-7x fewer bytes a step; cpu_linear.attach_gguf_weights). "gguf-q8": the same blocks
    against activations quantized to 8 bits per block, in integer dot products (llama.cpp's arithmetic;
    quant_q8.c): about twice as fast again, close to but not the fp32 output. None or "auto": "gguf-q8"
    where it can be had (a .gguf model on the CPU in fp32 with our kernel), else "float32".
    The module's `weight_format` says which one it got.
    """
    from specdec.errors import SpecdecError
    from specdec.model.loading import (gguf_blocks, load_hf_dir, model_directory, resolve_device, resolve_dtype,
                                       resolve_weight_dtype, use_gguf_blocks)
    from specdec.model.registry import resolve_model
    from specdec.model import cpu_kernels
    from specdec.model import cpu_forward
    from specdec.model.cpu_linear import attach_gguf_weights, onednn_available, pack_linears
    from specdec.model.tokenizer import eos_ids, load_tokenizer

    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dev, dtype)
    low = resolve_weight_dtype(dev, torch_dtype, weight_dtype)
    if cuda_graphs and dev.type != "cuda":
        raise SpecdecError(f"--cuda-graphs needs a CUDA device, not {dev}; use --device cuda or drop --cuda-graphs")
    source = resolve_model(spec)
    directory = model_directory(source, progress)
    tokenizer = load_tokenizer(directory)
    module = load_hf_dir(directory, dev, torch_dtype)
    module.weight_format = "bfloat16" if low is not None else str(torch_dtype).removeprefix("torch.")
    cpu_fp32 = dev.type == "cpu" and torch_dtype == torch.float32 and onednn_available()
    if cpu_fp32 and kernel and not cpu_kernels.available():
        progress(f"our CPU kernel is unavailable ({cpu_kernels.unavailable_reason()}); using torch's GEMMs")
        kernel = False
    blocks = use_gguf_blocks(dev, torch_dtype, weight_dtype, source, kernel and cpu_fp32)  # None, gguf, gguf-q8
    if cpu_fp32:
        act8 = blocks == "gguf-q8"
        if act8:  # its kernel takes every row count: a oneDNN copy would never be read
            pack = False
        if pack or kernel or low is not None:
            pack_linears(module, skinny=kernel, pack=pack, weight_dtype=low)
        if blocks and attach_gguf_weights(module, gguf_blocks(source, directory), act8=act8):
            module.weight_format = blocks
            cpu_forward.enable(module)  # decode and verify steps: the layer loop in one C call
    elif low is not None:
        raise SpecdecError("--weight-dtype bfloat16 needs oneDNN in this torch build (torch.backends.mkldnn)")
    if cuda_graphs:
        from specdec.engine.cuda_graphs import enable_cuda_graphs
        enable_cuda_graphs(module)
    return LoadedModel(spec, module, tokenizer, eos_ids(tokenizer))
