"""Model: decoder, KV cache, loading, named-model registry, tokenizer."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.errors import SpecdecError
from specdec.model import cpu_kernels, gpu_forward
from specdec.model.cuda_graphs import enable_cuda_graphs
from specdec.model.gguf_config import gguf_model_config
from specdec.model.loading import (blocks_all_readable, load_gguf_blocks, load_gguf_reference,
                                   load_hf_dir, open_gguf, resolve_device, resolve_dtype, use_gguf_blocks)
from specdec.model.registry import resolve_model
from specdec.model.tokenizer import eos_ids, load_tokenizer
from specdec.model.transformer import Transformer


class DeferredModule:
    """A CPU-backend draft model whose weights are read, re-encoded and repacked at its first use (a
    draft model that `generate` loads after the answer's first token, or never where the policy keeps
    the request plain). What is known from the file's header answers at once: its shape (`config`),
    weight format, device, fingerprint (the cost cache's key) and no CUDA graphs; anything else loads
    the module (`get`) and is the module's."""

    deferred = True

    def __init__(self, config, fingerprint_key: str, build):
        self.config, self.fingerprint_key, self._build, self._module = config, fingerprint_key, build, None
        self.weight_format, self.graphs, self.device = "gguf-q8", None, torch.device("cpu")

    @property
    def loaded(self) -> bool:
        return self._module is not None

    def get(self) -> Transformer:
        if self._module is None:
            self._module, self._build = self._build(), None
            self._module.fingerprint_key = self.fingerprint_key
        return self._module

    def __getattr__(self, name):  # only for what __init__ did not set: the loaded module's
        if name.startswith("__") or name in ("_module", "_build"):
            raise AttributeError(name)
        return getattr(self.get(), name)

    def __call__(self, *args, **kwargs):
        return self.get()(*args, **kwargs)


def loaded_module(module):
    """The Transformer behind `module`, loading a DeferredModule now."""
    return module.get() if getattr(module, "deferred", False) else module


@dataclass
class LoadedModel:
    """A decoder with the tokenizer that came with its weights."""

    name: str
    module: Transformer
    tokenizer: object
    eos_ids: set[int]
    tokenizer_key: str | None = None  # a GGUF file's tokenizer digest (load_model's `beside`), or None

    @property
    def device(self) -> torch.device:
        return self.module.device


def load_model(spec: str, device: str | None = None, dtype: str | None = None, progress=print,
               cuda_graphs: bool = False, gpu_kernels: bool = False, weight_dtype: str | None = None,
               draft: bool = False, draft_bits: int | None = None, beside: LoadedModel | None = None, head_rows: int = 0,
               defer: bool = False) -> LoadedModel:
    """A registry name, .gguf path or HF directory -> LoadedModel on the chosen device/dtype.

    The backend is chosen here, once. On the CPU a .gguf model runs on the file's own quantized
    blocks through its memory map, against 8-bit activations (loading.load_gguf_blocks; `weight_dtype`
    None or "auto"), where our kernels build. Otherwise, and with weight_dtype "float32", it is the
    torch reference: fp32 on the CPU, bf16 (or --dtype) on CUDA, the weights dequantized at load on
    the device. The module's `weight_format` says which: "gguf-q8" or "torch". On the CPU backend the
    blocks are repacked at load into the kernels' tiles; weight_dtype "gguf-q8-mapped" reads them
    through the map as they lie in the file instead (shared pages, slower multi-row GEMMs).
    draft: the model only drafts, so its numerics never reach the output: the CPU backend may re-encode
    its blocks into the format our kernels run fastest (loading.FASTER_FORMATS), and with draft_bits 4
    its 32-weight blocks (Q8_0, Q5_0, ...) and Q6_K into 4-bit Q4_0 tiles, with 3 the same but the MLP's
    gate and up as 3-bit Q3_0 (lossy: fewer bytes a draft step); None: the kernel build's best
    (cpu_kernels.best_draft_bits).
    cuda_graphs: replay decode and verify forwards of fixed shapes as CUDA graphs (CUDA only; see
    model/cuda_graphs.py). gpu_kernels: the layer loop of steps up to 64 positions through Triton kernels
    between the GEMMs (CUDA only; model/gpu_forward.py), inside the graphs where both are on.
    beside: a model loaded before (the target, for its draft): where this file's tokenizer metadata is
    the same as that model's but for the chat template (a draft reads the target's token ids and never
    renders a chat), that model's tokenizer is taken as it is instead of being built again.
    head_rows > 0 (a draft under --draft-vocab, on the CPU backend): its LM head holds only the first
    head_rows outputs, the ids the drafter scores; the rest is never converted or held.
    defer (a draft on the CPU backend that takes `beside`'s tokenizer, every block format of which the
    kernels read): the module is a DeferredModule, its weights loaded at its first use. A CPU-backend
    module carries `fingerprint_key`, from the file's tensors and how they are loaded, which the cost
    cache reads instead of the loaded blocks.
    """
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dev, dtype)
    if cuda_graphs and dev.type != "cuda":
        raise SpecdecError(f"--cuda-graphs needs a CUDA device, not {dev}; use --device cuda or drop --cuda-graphs")
    if gpu_kernels and dev.type != "cuda":
        raise SpecdecError(f"--gpu-kernels needs a CUDA device, not {dev}; use --device cuda or drop --gpu-kernels")
    source = resolve_model(spec)
    blocks = use_gguf_blocks(dev, weight_dtype, source)
    if source.suffix == ".gguf" and dev.type == "cpu" and weight_dtype in (None, "auto") and not blocks:
        progress(f"our CPU kernels are unavailable ({cpu_kernels.unavailable_reason()}); "
                 "using the fp32 torch reference (slower, and fp32 weights in memory)")
    key = None
    if source.is_dir():
        tokenizer, module = load_tokenizer(source), load_hf_dir(source, dev, torch_dtype)
    else:
        gguf = open_gguf(source)
        key = gguf.digest("tokenizer.", skip=("tokenizer.chat_template",))
        same = beside is not None and beside.tokenizer_key == key
        tokenizer = beside.tokenizer if same else load_tokenizer(source, gguf)
        gguf.forget_strings()
        if blocks:
            options = {"reencode": draft, "repack": weight_dtype != "gguf-q8-mapped",
                       "bits": (draft_bits or cpu_kernels.best_draft_bits()) if draft else 8, "head_rows": head_rows}
            weights = f"{gguf.weights_digest()}:{sorted(options.items())}"
            if defer and draft and same and blocks_all_readable(gguf):
                module = DeferredModule(gguf_model_config(gguf), weights, lambda: load_gguf_blocks(gguf, **options))
            else:
                module = load_gguf_blocks(gguf, **options)
                module.fingerprint_key = weights
        else:
            module = load_gguf_reference(gguf, dev, torch_dtype)
    if gpu_kernels:
        gpu_forward.enable(module)
    if cuda_graphs:
        enable_cuda_graphs(module)
    return LoadedModel(spec, module, tokenizer, eos_ids(tokenizer), key)
