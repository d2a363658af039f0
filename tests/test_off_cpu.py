"""What a GPU runs, checked on a machine without one.

The meta device stands in for CUDA: its tensors hold shapes, not data, so whatever reads one back on the
host (.item(), .tolist(), bool(), a shape that depends on values: each of which breaks a CUDA graph's
capture or stalls the GPU) raises, and so does mixing it with a CPU tensor that is not a 0-dim scalar
(a table left behind by `.to(device)`). Every function a CUDA graph captures runs here on the meta device
through its real call site, the capture itself replaced by a plain call:
- the graphed step (cuda_graphs.py), on the torch path and on the fused Triton loop (gpu_forward.py, its
  kernels' launches recorded instead of run), for decode, verify, tree and ragged batches;
- the device chains (device_chain.py): a draft model's, an EAGLE head's, and the head's EAGLE-2 tree.
The recorded launches, taken from models in the benchmark's real shapes (free on the meta device), are
then compiled by Triton's NVIDIA backend for Hopper and Ampere (ptxas ships with Triton): what would fail
to compile on the GPU fails here."""

import dataclasses
import inspect
import json
import os
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from conftest import TINY_VOCAB, seat_in_pool, tiny_config
from specdec.bench.synthetic import SHAPES, TREE, random_eagle
from specdec.config import SamplingParams
from specdec.drafters.base import DraftState
from specdec.drafters import device_chain, draft_model, eagle
from specdec.drafters.device_chain import DeviceChains
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.eagle import EagleDrafter
from specdec.model import cuda_graphs, gpu_forward, gpu_kernels
from specdec.model.cuda_graphs import CudaGraphs
from specdec.model.transformer import ModelConfig, Transformer
from specdec.sampling.verify import tree_attention_mask
from specdec.tree import DraftTree

ROOT = Path(__file__).resolve().parent.parent
META = torch.device("meta")
REAL_KERNELS = gpu_kernels._kernels
CAP = 512
SAMPLINGS = [SamplingParams(), SamplingParams(temperature=0.8, top_k=20, top_p=0.9)]


def meta_model(cfg: ModelConfig, dtype=torch.bfloat16) -> Transformer:
    with META:
        model = Transformer(cfg)
    return model.to(META, dtype).eval()


def shape_config(shape: str, **overrides) -> ModelConfig:
    return ModelConfig(**{**SHAPES[shape], "rms_norm_eps": 1e-6, "rope_theta": 1e6, "max_position_embeddings": 4096,
                          "attention_bias": True, **overrides})


class _Replayed:
    def replay(self) -> None:  # the captured call already ran: nothing to do on the meta device
        pass


@pytest.fixture
def no_capture(monkeypatch):
    """cuda_graphs.capture as a plain call (what it records is what runs here; the stream reads as capturing
    meanwhile), and CudaGraphs for a meta model (its constructor asks for CUDA)."""
    capturing = [False]

    def capture(fn, device):
        capturing[0] = True
        try:
            return _Replayed(), fn()
        finally:
            capturing[0] = False
    monkeypatch.setattr(cuda_graphs, "capture", capture)
    monkeypatch.setattr(device_chain, "capture", capture)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])

    def graphs(model):
        g = object.__new__(CudaGraphs)
        g.model, g.max_tokens, g.max_graphs, g.graphs, g.captures = model, 64, 32, OrderedDict(), 0
        model.graphs = g
        return g
    return graphs


class Launches:
    """gpu_kernels' jitted kernels replaced by recorders: each launch's kernel, grid, arguments and
    compile-time constants, in order."""

    def __init__(self):
        self.calls = []

    def kernels(self):
        def launcher(name):
            return type("Grid", (), {"__getitem__": lambda _, grid: lambda *args, **consts: self.calls.append(
                (name, grid, args, consts))})()
        names = ("add_rms_norm", "rope_store", "attention_split", "attention_combine", "silu_mul")
        return {**{n: launcher(n) for n in names}, "next_power_of_2": lambda n: 1 << max(0, (n - 1).bit_length())}


@pytest.fixture
def launches(monkeypatch):
    rec = Launches()
    monkeypatch.setattr(gpu_kernels, "_kernels", rec.kernels)
    return rec


def decode_verify_tree(model: Transformer):
    """A decode step, a 5-row verify and a 4-node tree's verify through model.forward, at slots past a
    prompt; returns the logits of each."""
    cache = model.new_cache(CAP)
    cache.advance(37)  # a prompt's entries (prefill is not graphed: long forwards run eagerly)
    out = [model(torch.zeros(1, 1, dtype=torch.long, device=META), cache, 37)]
    out.append(model(torch.zeros(1, 5, dtype=torch.long, device=META), cache, 38))
    tree = DraftTree(torch.tensor([3, 4, 5, 6]), torch.tensor([-1, 0, 0, 1]))  # root, then depths 1, 2, 2, 3
    positions = torch.tensor([[43, 44, 45, 45, 46]], device=META)
    out.append(model(torch.zeros(1, 5, dtype=torch.long, device=META), cache, 43, positions=positions,
                     mask=tree_attention_mask(tree, 43, META)))
    return out


def ragged_verify(model: Transformer, batch: int = 3, t: int = 4):
    """The server's batched verify: each row at its own cache row and slots, under a [B, 1, T, capacity] mask."""
    cache = model.new_cache(CAP, batch)
    slots = torch.zeros(batch, t, dtype=torch.long, device=META)
    mask = torch.zeros(batch, 1, t, CAP, dtype=torch.bool, device=META)
    return model(torch.zeros(batch, t, dtype=torch.long, device=META), cache, 0, positions=slots, mask=mask,
                 slots=slots, rows=torch.arange(batch, device=META))


def test_the_meta_device_refuses_what_breaks_a_capture():
    """The stand-in is only as good as what it refuses: a host read, a value-dependent shape, a CPU table."""
    x = torch.zeros(4, device=META)
    for read in (lambda: x.sum().item(), lambda: x.tolist(), lambda: bool(x.any()), lambda: (x > 0).nonzero(),
                 lambda: x + torch.ones(4)):
        with pytest.raises((RuntimeError, NotImplementedError)):
            read()


@pytest.mark.parametrize("layout", ["qwen2", "qwen3", "gemma3"])
def test_the_graphed_step_runs_off_the_cpu_and_reads_nothing_back(no_capture, layout):
    overrides = {"qwen2": dict(attention_bias=True), "qwen3": dict(qk_norm=True),
                 "gemma3": dict(qk_norm=True, sandwich_norms=True, activation="gelu_tanh", scaled_embeddings=True,
                                sliding_window=8, sliding_layers=(0,), rope_local_theta=10000.0, rope_theta=1e6)}
    model = meta_model(tiny_config(**overrides[layout]))
    graphs = no_capture(model)
    for logits in decode_verify_tree(model):
        assert logits.device == META and logits.shape[-1] == TINY_VOCAB
    assert graphs.captures == 2  # through graphs: decode's, and the verify's (the tree's replays it)
    assert ragged_verify(model).shape == (3, 4, TINY_VOCAB)  # eager on the torch path


@pytest.mark.parametrize("layout", ["qwen2", "qwen3"])
def test_the_fused_loop_runs_off_the_cpu_and_reads_nothing_back(no_capture, launches, layout):
    model = meta_model(tiny_config(qk_norm=layout == "qwen3", attention_bias=layout == "qwen2"))
    gpu_forward.enable(model)
    graphs = no_capture(model)
    decode_verify_tree(model)
    assert ragged_verify(model).shape == (3, 4, TINY_VOCAB)
    assert graphs.captures == 3  # the ragged batch too, on the fused loop
    # six Triton kernels a layer (two norms, RoPE and the cache write, attention's split and combine, the gate)
    assert len(launches.calls) == graphs.captures * 6 * model.config.num_layers  # (a replay launches nothing here)
    assert [c[0] for c in launches.calls[:6]] == ["add_rms_norm", "rope_store", "attention_split",
                                                  "attention_combine", "add_rms_norm", "silu_mul"]


class Drafted(Exception):
    """Raised with a device chain's output, once it ran: the drafter would read it on the host next."""


class StopAfterChain(DeviceChains):
    def run(self, cache, key, chain, inputs):
        raise Drafted(super().run(cache, key, chain, inputs))


def drafted(drafter, tokens: list[int], k: int, sampling: SamplingParams, stop=None, tree: bool = False):
    """The output of the drafter's device chain (graphed, the capture a plain call) for one proposal."""
    drafter.chains = StopAfterChain(graphed=True)
    drafter.start(tokens)
    with pytest.raises(Drafted) as out:  # the meta device has no generator: sampled chains draw from torch's
        drafter.propose(DraftState(list(tokens), k, sampling, None, stop=stop, k_stop=k, tree=tree))
    assert drafter.chains.captures == 1
    return out.value.args[0]


def pooled_chain(monkeypatch, module, propose, drafters, cache, ends: tuple[int, int]):
    """propose(drafters, ...) for two pooled rows, texts 1..ends[b] - 1 (a greedy row under a stop rule
    drafting 4, a sampled one drafting 2), the pool's chains (module.pool_chains) stopped after their one
    capture: the chain drafted."""
    chains = StopAfterChain(graphed=True)
    monkeypatch.setattr(module, "pool_chains", lambda cache, graphed: chains)
    states = [DraftState(list(range(1, ends[0])), 4, SAMPLINGS[0], None, stop=lambda i, p: 0, k_stop=4),
              DraftState(list(range(1, ends[1])), 2, SAMPLINGS[1], None)]
    with pytest.raises(Drafted) as out:
        propose(drafters, states, cache, [0, 1])
    assert chains.captures == 1
    return out.value.args[0]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "sampled"])
def test_a_draft_models_device_chain_runs_off_the_cpu_and_reads_nothing_back(no_capture, sampling):
    draft = meta_model(tiny_config(num_layers=1))
    no_capture(draft)
    chain = drafted(DraftModelDrafter(draft, TINY_VOCAB, CAP), list(range(1, 9)), 4, sampling,
                    stop=lambda i, p: 0)
    assert chain.tokens.device == META and chain.tokens.shape == chain.top.shape == (1, 4)
    assert (chain.q is None) == sampling.greedy


@pytest.mark.parametrize("fused", [False, True], ids=["torch", "fused"])
def test_a_pools_rows_draft_together_off_the_cpu_and_read_nothing_back(no_capture, launches, monkeypatch, fused):
    """A server's slots draft together: one ragged feed, then every row's chain in one graph (a greedy row and
    a sampled one here)."""
    draft = meta_model(tiny_config(num_layers=1))
    if fused:
        gpu_forward.enable(draft)
    no_capture(draft)
    drafters, cache = seat_in_pool([DraftModelDrafter(draft, TINY_VOCAB, CAP) for _ in range(2)])
    for b, d in enumerate(drafters):
        d.start(list(range(1, 9 + b)))
    chain = pooled_chain(monkeypatch, draft_model, DraftModelDrafter.propose_pooled, drafters, cache, (10, 11))
    assert chain.tokens.shape == chain.top.shape == (2, 4)
    assert chain.q.shape == (2, 4, TINY_VOCAB)


def test_a_pools_head_chains_draft_together_off_the_cpu_and_read_nothing_back(no_capture, monkeypatch):
    target = meta_model(tiny_config(), torch.float32)
    no_capture(target)
    first = random_eagle(target, CAP, seed=0)
    drafters, cache = seat_in_pool([first, EagleDrafter(target, first.prepared, CAP)])
    for d in drafters:
        d.feed(0, torch.zeros(12, target.config.hidden_size, device=META))
    chain = pooled_chain(monkeypatch, eagle, EagleDrafter.propose_pooled, drafters, cache, (10, 12))
    assert chain.tokens.shape == chain.top.shape == (2, 4)


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "sampled"])
def test_a_heads_device_chain_and_tree_run_off_the_cpu_and_read_nothing_back(no_capture, sampling):
    target = meta_model(tiny_config(), torch.float32)
    no_capture(target)
    head = random_eagle(target, CAP, seed=0)
    assert head.features.device == META
    tokens = list(range(1, 9))
    head.feed(0, torch.zeros(len(tokens), target.config.hidden_size, device=META))
    chain = drafted(head, tokens, 4, sampling, stop=lambda i, p: 0)
    assert chain.tokens.shape == (1, 4) and (chain.q is None) == sampling.greedy
    treed = EagleDrafter(target, head.prepared, CAP, tree=TREE)
    treed.feed(0, torch.zeros(len(tokens), target.config.hidden_size, device=META))
    nodes = drafted(treed, tokens, 4, sampling, tree=True)
    k = TREE.topk
    assert nodes.tokens.shape == nodes.parents.shape == nodes.scores.shape == (k + (TREE.depth - 1) * k * k,)


# ---- the kernels compiled for NVIDIA GPUs, from the launches of models in the benchmark's shapes ----

POINTER = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.int64: "*i64",
           torch.int32: "*i32", torch.uint8: "*u8"}


def signature(kernel, args, consts) -> tuple[dict, dict]:
    """Triton's signature of a launch: a pointer type per tensor, i32/i64 per int, fp32 per float."""
    names = [n for n in inspect.signature(kernel.fn).parameters if n not in consts]
    sig = {}
    for name, a in zip(names, args, strict=True):
        if isinstance(a, torch.Tensor):
            sig[name] = POINTER[a.dtype]  # a torch.bool pointer would read bit-packed: the wrappers pass bytes
        elif isinstance(a, bool):
            sig[name] = "i1"
        elif isinstance(a, int):
            sig[name] = "i32" if -2 ** 31 <= a < 2 ** 31 else "i64"
        else:
            sig[name] = "fp32"
    return {**sig, **{n: "constexpr" for n in consts}}, consts


def benchmark_launches(rec: Launches, graphs) -> list:
    """The launches of decode, verify, tree and ragged forwards of the 1.5B and 0.5B shapes (bf16 and fp32)
    and a Qwen3-layout 1.5B (q/k norms), deduplicated by kernel, signature and constants."""
    models = [(shape_config(s), dt) for s in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
              for dt in (torch.bfloat16, torch.float32)]
    models.append((shape_config("qwen2.5-coder-1.5b", qk_norm=True, attention_bias=False), torch.bfloat16))
    for cfg, dtype in models:
        model = meta_model(dataclasses.replace(cfg, num_layers=1), dtype)
        gpu_forward.enable(model)
        graphs(model)
        decode_verify_tree(model)
        ragged_verify(model)
    kernels = REAL_KERNELS()
    seen = {}
    for name, _, args, consts in rec.calls:
        sig, consts = signature(kernels[name], args, consts)
        seen.setdefault((name, tuple(sig.items()), tuple(consts.items())), (name, sig, consts))
    return list(seen.values())


COMPILE = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from specdec.model import gpu_kernels
kernels = gpu_kernels._kernels()
for arch in map(int, sys.argv[2:]):
    for name, sig, consts in json.load(open(sys.argv[1])):
        compiled = triton.compile(ASTSource(kernels[name], sig, consts), target=GPUTarget("cuda", arch, 32))
        assert compiled.asm["cubin"], (arch, name, consts)
        assert compiled.metadata.shared <= 99 * 1024, (arch, name, consts, compiled.metadata.shared)
"""


def test_the_kernels_compile_for_nvidia_gpus(no_capture, launches, tmp_path):
    """For Hopper (sm_90) and Ampere (sm_80), in a process of its own: where Triton's interpreter ran (this
    suite's kernel tests), it leaves triton.language patched for itself."""
    pytest.importorskip("triton")
    variants = benchmark_launches(launches, no_capture)
    assert {v[0] for v in variants} == {"add_rms_norm", "rope_store", "attention_split", "attention_combine",
                                        "silu_mul"}
    path = tmp_path / "launches.json"
    path.write_text(json.dumps(variants))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    out = subprocess.run([sys.executable, "-c", COMPILE, str(path), "90", "80"], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
