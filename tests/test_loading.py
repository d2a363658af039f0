"""Loading: HF dirs and GGUF files give the same logits as HF transformers; names, permutations, devices."""

from __future__ import annotations

import functools
import numpy as np
import pytest
import torch

from specdec.errors import SpecdecError
from specdec.model import load_model
from specdec.model.gguf_config import hf_name
from specdec.model.loading import resolve_device, resolve_dtype, unpermute_qk
from tests.conftest import llama_cpp_permute

PROMPT = ("Speculative decoding lets a small draft model propose several tokens, and the large target "
          "model checks them all in a single forward pass, so the output is unchanged.")


def our_logits(module, tokens: torch.Tensor) -> torch.Tensor:  # tokens [1, T] -> [1, T, vocab]
    return module(tokens, module.new_cache(tokens.shape[1]), 0)


def hf_logits(hf_model, tokens: torch.Tensor) -> torch.Tensor:  # tokens [1, T] -> [1, T, vocab]
    with torch.no_grad():
        return hf_model(tokens).logits.float()


@pytest.mark.parametrize("fixture", ["tiny_llama_dir", "tiny_qwen_dir"])
def test_tiny_hf_dir_matches_transformers(fixture, request):
    """llama (tied embeddings) and qwen2 (q/k/v bias) load to the same logits as HF's own code."""
    from transformers import AutoModelForCausalLM
    directory = request.getfixturevalue(fixture)
    ours = load_model(str(directory), device="cpu", progress=lambda m: None)
    ref = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
    tokens = torch.randint(0, ours.module.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(0))
    a, b = our_logits(ours.module, tokens), hf_logits(ref, tokens)
    assert a.shape == b.shape == (1, 24, ours.module.config.vocab_size)
    assert (a - b).abs().max().item() < 1e-4


def test_tiny_dirs_exercise_both_variants(tiny_llama_dir, tiny_qwen_dir):
    llama = load_model(str(tiny_llama_dir), device="cpu", progress=lambda m: None).module
    qwen = load_model(str(tiny_qwen_dir), device="cpu", progress=lambda m: None).module
    assert llama.lm_head.weight is llama.model.embed_tokens.weight
    assert "model.layers.0.self_attn.q_proj.bias" in qwen.state_dict()
    assert qwen.lm_head.weight is not qwen.model.embed_tokens.weight


@pytest.fixture(scope="module")
def smollm2_tokens(smollm2) -> torch.Tensor:
    ids = smollm2.tokenizer.encode(PROMPT)
    assert 25 <= len(ids) <= 45
    return torch.tensor([ids])  # [1, T]


@pytest.mark.real
def test_smollm2_gguf_matches_transformers(smollm2_path, smollm2, smollm2_tokens, monkeypatch):
    """Our GGUF conversion (dequantize, q/k unpermute, tied head) vs HF transformers reading the same file:
    with fp32 weights the logits agree to 1e-3; the default (the blocks against 8-bit activations,
    llama.cpp's arithmetic) stays close: the same top token at almost every position."""
    import gguf
    from transformers import AutoModelForCausalLM
    # speed only: transformers rebuilds this pure name table once per submodule (~400 times, ~8 s)
    monkeypatch.setattr(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map))
    ref = AutoModelForCausalLM.from_pretrained(str(smollm2_path.parent), gguf_file=smollm2_path.name,
                                               dtype=torch.float32).eval()
    fp32 = load_model(str(smollm2_path), device="cpu", weight_dtype="float32", progress=lambda m: None)
    a, b = our_logits(fp32.module, smollm2_tokens), hf_logits(ref, smollm2_tokens)
    assert a.shape == b.shape
    assert (a - b).abs().max().item() < 1e-3
    assert torch.equal(a[0].argmax(-1), b[0].argmax(-1))
    q8 = our_logits(smollm2.module, smollm2_tokens)
    assert smollm2.module.weight_format in ("gguf-q8", "torch")  # torch where our kernels cannot build
    assert (q8[0].argmax(-1) == b[0].argmax(-1)).float().mean().item() >= 0.9
    p, r = q8[0].softmax(-1), b[0].softmax(-1)
    assert 0.5 * (p - r).abs().sum(-1).max().item() < 0.1  # total variation per position


@pytest.mark.real
def test_smollm2_chunked_prefill_matches_one_shot(smollm2, smollm2_tokens):
    module, t = smollm2.module, smollm2_tokens.shape[1]
    one_shot = our_logits(module, smollm2_tokens)
    cache, split = module.new_cache(t + 8), t // 3
    first = module(smollm2_tokens[:, :split], cache, 0)
    second = module(smollm2_tokens[:, split:], cache, split)
    chunked = torch.cat([first, second], dim=1)  # [1, T, vocab]
    assert (chunked - one_shot).abs().max().item() < 1e-3
    if module.weight_format == "gguf-q8":  # the default: every row count runs the same per-row code
        assert torch.equal(chunked, one_shot)


@pytest.mark.parametrize("gguf, hf", [
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
    ("blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight"),
    ("blk.0.ffn_norm.weight", "model.layers.0.post_attention_layernorm.weight"),
    ("blk.3.attn_q.weight", "model.layers.3.self_attn.q_proj.weight"),
    ("blk.3.attn_q.bias", "model.layers.3.self_attn.q_proj.bias"),
    ("blk.12.attn_k.weight", "model.layers.12.self_attn.k_proj.weight"),
    ("blk.12.attn_v.bias", "model.layers.12.self_attn.v_proj.bias"),
    ("blk.7.attn_output.weight", "model.layers.7.self_attn.o_proj.weight"),
    ("blk.29.ffn_gate.weight", "model.layers.29.mlp.gate_proj.weight"),
    ("blk.29.ffn_up.weight", "model.layers.29.mlp.up_proj.weight"),
    ("blk.29.ffn_down.weight", "model.layers.29.mlp.down_proj.weight"),
    ("rope_freqs.weight", None),
    ("blk.0.attn_q_norm.weight", "model.layers.0.self_attn.q_norm.weight"),
    ("blk.0.unknown.weight", None),
    ("blk.attn_q.weight", None),
])
def test_hf_name(gguf, hf):
    assert hf_name(gguf) == hf


@pytest.mark.parametrize("n_head, head_dim, rest", [(4, 16, (24,)), (2, 8, (5,)), (3, 4, ())])
def test_unpermute_qk_inverts_llama_cpp(n_head, head_dim, rest):
    w = np.random.default_rng(0).standard_normal((n_head * head_dim, *rest)).astype(np.float32)
    permuted = llama_cpp_permute(w, n_head)
    assert not np.array_equal(permuted, w)
    np.testing.assert_array_equal(unpermute_qk(permuted, n_head), w)
    np.testing.assert_array_equal(llama_cpp_permute(unpermute_qk(w, n_head), n_head), w)


def test_resolve_device_cuda_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SpecdecError, match="CUDA"):
        resolve_device("cuda")
    with pytest.raises(SpecdecError, match="CUDA"):
        resolve_device("cuda:1")
    assert resolve_device(None) == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("name", ["gpu", "tpu:0", "meta", "not a device"])
def test_resolve_device_unknown(name):
    with pytest.raises(SpecdecError, match="device"):
        resolve_device(name)


def test_resolve_dtype():
    cpu = torch.device("cpu")
    assert resolve_dtype(cpu, None) == torch.float32
    assert resolve_dtype(cpu, "fp32") == torch.float32
    assert resolve_dtype(torch.device("cuda"), None) == torch.bfloat16
    assert resolve_dtype(torch.device("cuda"), "fp16") == torch.float16
    with pytest.raises(SpecdecError, match="unknown dtype"):
        resolve_dtype(cpu, "int8")
    for name in ("float16", "fp16", "bfloat16"):  # the CPU runs fp32 activations: blocks or the reference
        with pytest.raises(SpecdecError, match="not supported on the CPU"):
            resolve_dtype(cpu, name)


def test_load_model_rejects_fp16_on_cpu(tiny_llama_dir):
    with pytest.raises(SpecdecError, match="float16"):
        load_model(str(tiny_llama_dir), device="cpu", dtype="float16", progress=lambda m: None)
