"""Each model family against transformers' own class: a tiny random checkpoint built with transformers'
config and model classes, converted to GGUF by llama.cpp's own convert_hf_to_gguf.py (f32 and q8_0),
loaded by our loader. The torch reference matches transformers' logits to fp32 rounding; the quantized
CPU path (the repacked kernels, 8-bit activations) within a stated bound; its fused C layer loop gives
the Python loop's bits; and speculative greedy output equals plain greedy output."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdec.config import GenerationConfig
from specdec.drafters.base import NoDrafter
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.engine.engine import Engine
from specdec.model import cpu_kernels, load_model
from specdec.model.loading import load_gguf_blocks, load_gguf_reference, open_gguf
from scripts.family_speed import GEMMA2_BPE
from tests.conftest import ragged_step

LLAMA_CPP = Path(os.environ.get("SPECDEC_HOME", Path.home() / ".cache" / "specdec")) / "llama.cpp" / "src"
CONVERTER = LLAMA_CPP / "convert_hf_to_gguf.py"
GEMMA = Path(os.environ.get("SPECDEC_HOME", Path.home() / ".cache" / "specdec")) / "models" / "gemma3-270m.gguf"
kernel = pytest.mark.skipif(not cpu_kernels.available(), reason=f"kernel unavailable: {cpu_kernels.unavailable_reason()}")

FAMILIES = ["qwen3", "llama3", "gemma3", "phi3", "phi3-longrope", "qwen3moe", "mixtral", "smollm3", "gemma2", "granite",
            "granitemoe", "olmo2", "olmo3", "olmoe"]
MIXTURES = {"qwen3moe", "mixtral", "granitemoe", "olmoe"}
CONVERSIONS_AT_ONCE = 8
WINDOW = 5  # gemma3's tiny sliding window: the prompts below are several times longer
TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=256)
# phi3-longrope (Phi-4-mini's shape): LongRoPE with an original context of 16, so that a 23-token prompt is
# beyond it (the long factors) and a 12-token one in a 16-position cache within it (the short ones); RoPE on
# 12 of each head's 16 dimensions; tied embeddings
PHI_ORIGINAL = 16
# Granite's four multipliers, each far from 1 (and the attention's from 1 / sqrt(16)), so that one misread shows
GRANITE = dict(embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.1, logits_scaling=4.0)
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
            "short_factor": [1.0 + 0.2 * i for i in range(6)], "long_factor": [1.0 + 1.5 * i for i in range(6)]}
# Phi-3's chat format, carried into the GGUF file by the converter
PHI3_CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
                      "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}")


def family_model(name: str, vocab: int):
    """A transformers model of family `name` with random weights (norms too), in fp32."""
    import transformers as tf
    if name == "qwen3":  # head_dim 32, not hidden / heads = 16
        cfg = tf.Qwen3Config(vocab_size=vocab, num_hidden_layers=2, head_dim=32, tie_word_embeddings=True, **TINY)
        cls = tf.Qwen3ForCausalLM
    elif name == "llama3":  # Llama 3's RoPE scaling, with a short original context so that its three regimes show
        cfg = tf.LlamaConfig(vocab_size=vocab, num_hidden_layers=2, tie_word_embeddings=False, **TINY,
                             rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                              "original_max_position_embeddings": 64})
        cls = tf.LlamaForCausalLM
    elif name == "phi3":  # Phi-3-mini's shape: fused q/k/v and gate/up, no RoPE scaling
        cfg = tf.Phi3Config(vocab_size=vocab, num_hidden_layers=2, tie_word_embeddings=False, sliding_window=None,
                            original_max_position_embeddings=256, **TINY)
        cls = tf.Phi3ForCausalLM
    elif name == "qwen3moe":  # 8 experts, 2 a token, Qwen3-30B-A3B's renormalised weights
        cfg = tf.Qwen3MoeConfig(vocab_size=vocab, num_hidden_layers=2, head_dim=32, tie_word_embeddings=True,
                                num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
                                **TINY)
        cls = tf.Qwen3MoeForCausalLM
    elif name == "mixtral":  # Llama's layer, 8 experts of 32, 2 a token (llama.cpp's llama architecture)
        cfg = tf.MixtralConfig(vocab_size=vocab, num_hidden_layers=2, num_local_experts=8, num_experts_per_tok=2,
                               tie_word_embeddings=False, **(TINY | {"intermediate_size": 32}))
        cls = tf.MixtralForCausalLM
    elif name == "smollm3":  # 4 layers: the fourth takes no RoPE
        cfg = tf.SmolLM3Config(vocab_size=vocab, num_hidden_layers=4, tie_word_embeddings=True, pad_token_id=None,
                               bos_token_id=None, eos_token_id=None, **TINY)
        cls = tf.SmolLM3ForCausalLM
    elif name == "gemma2":  # 4 layers, 0 and 2 sliding; both soft-caps low enough to bite on these logits
        cfg = tf.Gemma2Config(vocab_size=vocab, num_hidden_layers=4, head_dim=32, query_pre_attn_scalar=32,
                              sliding_window=WINDOW, attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
                              pad_token_id=None, bos_token_id=None, eos_token_id=None, **TINY)
        cls = tf.Gemma2ForCausalLM
    elif name == "granite":  # Granite 3's dense layer: Llama's, with the multipliers
        cfg = tf.GraniteConfig(vocab_size=vocab, num_hidden_layers=2, tie_word_embeddings=True, **GRANITE, **TINY)
        cls = tf.GraniteForCausalLM
    elif name == "granitemoe":  # Granite 3's mixture: 8 experts of 32, 2 a token
        cfg = tf.GraniteMoeConfig(vocab_size=vocab, num_hidden_layers=2, tie_word_embeddings=True, num_local_experts=8,
                                  num_experts_per_tok=2, **GRANITE, **(TINY | {"intermediate_size": 32}))
        cls = tf.GraniteMoeForCausalLM
    elif name == "olmo2":  # no input norms, q/k norms over all the heads
        cfg = tf.Olmo2Config(vocab_size=vocab, num_hidden_layers=2, tie_word_embeddings=False, pad_token_id=None,
                             bos_token_id=None, eos_token_id=None, **TINY)
        cls = tf.Olmo2ForCausalLM
    elif name == "olmo3":  # OLMo 2's layer; 4 layers, the first three in a sliding window
        cfg = tf.Olmo3Config(vocab_size=vocab, num_hidden_layers=4, tie_word_embeddings=False, sliding_window=WINDOW,
                             pad_token_id=None, bos_token_id=None, eos_token_id=None, **TINY)
        cls = tf.Olmo3ForCausalLM
    elif name == "olmoe":  # Llama's layer with OLMo 2's q/k norms (llama.cpp's: k as wide as q, no GQA); 8 experts
        # of 32, 2 a token, their weights not renormalised
        cfg = tf.OlmoeConfig(vocab_size=vocab, num_hidden_layers=2, tie_word_embeddings=False, num_experts=8,
                             num_experts_per_tok=2, norm_topk_prob=False, pad_token_id=None, bos_token_id=None,
                             eos_token_id=None, **(TINY | {"intermediate_size": 32, "num_key_value_heads": 4}))
        cls = tf.OlmoeForCausalLM
    elif name == "phi3-longrope":
        cfg = tf.Phi3Config(vocab_size=vocab, num_hidden_layers=2, tie_word_embeddings=True, sliding_window=None,
                            original_max_position_embeddings=PHI_ORIGINAL, rope_parameters=dict(LONGROPE), **TINY)
        cls = tf.Phi3ForCausalLM
    else:  # gemma3: 7 layers, so layers 0-4 and 6 slide and layer 5 is global
        cfg = tf.Gemma3TextConfig(vocab_size=vocab, num_hidden_layers=7, head_dim=32, query_pre_attn_scalar=32,
                                  sliding_window=WINDOW, **TINY)
        cls = tf.Gemma3ForCausalLM
    cfg._attn_implementation = "eager"
    torch.manual_seed(sum(map(ord, name)))
    model = cls(cfg)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):  # Gemma's norms multiply by (1 + w), the others' by w
                p.copy_(torch.randn_like(p) * 0.1 + (0.0 if name.startswith("gemma") else 1.0))
            elif pname.endswith(("mlp.gate.weight", "router.layer.weight")):  # a router's picks weighted apart
                p.normal_(0.0, 0.5)
            else:
                p.normal_(0.0, 0.15)
    return model.eval()


def byte_level_tokenizer(request):
    """A byte-level BPE the converter knows, as a transformers tokenizer: SmolLM2's, from its GGUF file, or
    the directory $SPECDEC_TEST_TOKENIZER names (where the model cannot be pulled: a GPU machine)."""
    from transformers import PreTrainedTokenizerFast
    if os.environ.get("SPECDEC_TEST_TOKENIZER"):
        return PreTrainedTokenizerFast.from_pretrained(os.environ["SPECDEC_TEST_TOKENIZER"])
    from specdec.model.gguf_file import GGUFFile
    from specdec.model.tokenizer import gguf_tokenizer
    tok = gguf_tokenizer(GGUFFile(request.getfixturevalue("smollm2_path")))
    return PreTrainedTokenizerFast(tokenizer_object=tok.backend, bos_token=tok.bos_token, eos_token=tok.eos_token)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, request):
    """{family: (transformers model, {outtype: GGUF path, "hf": its HF directory})}: the conversions run
    CONVERSIONS_AT_ONCE at a time (each converter process holds about 350 MB)."""
    if not CONVERTER.is_file():
        pytest.skip(f"llama.cpp's converter is absent ({CONVERTER}); run scripts/llama_cpp.sh source")
    tok = byte_level_tokenizer(request)
    out, running = {}, []
    for name in FAMILIES:
        d = tmp_path_factory.mktemp(name)
        tok.save_pretrained(d)
        if name.startswith("phi3"):  # the converter takes a Phi-3 vocabulary as byte-level BPE by this class name
            config = json.loads((d / "tokenizer_config.json").read_text())
            config.update(tokenizer_class="GPT2Tokenizer", chat_template=PHI3_CHAT_TEMPLATE)
            (d / "tokenizer_config.json").write_text(json.dumps(config))
        model = family_model(name, len(tok))
        model.save_pretrained(d)
        out[name] = (model, {t: d / f"{name}-{t}.gguf" for t in ("f32", "q8_0")} | {"hf": d})
        for t in ("f32", "q8_0"):
            path = out[name][1][t]
            # the converter reads a Gemma 2 vocabulary as SentencePiece only; this byte-level BPE goes as GPT-2's
            run = ["-c", GEMMA2_BPE] if name == "gemma2" else [str(CONVERTER)]
            paths = os.pathsep.join([str(LLAMA_CPP / "gguf-py"), str(LLAMA_CPP)])
            if len(running) == CONVERSIONS_AT_ONCE:
                converted(running.pop(0))
            running.append(subprocess.Popen([sys.executable, *run, str(d), "--outtype", t, "--outfile",
                                             str(path)], env={**os.environ, "PYTHONPATH": paths},
                                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    for p in running:
        converted(p)
    return out


def converted(p: subprocess.Popen) -> None:
    """Wait for a converter process; its error's tail where it failed."""
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-2000:]


def prompt_ids(vocab: int, n: int = 23) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, vocab, (1, n), generator=g)


def hf_logits(model, ids) -> torch.Tensor:
    with torch.inference_mode():
        return model(ids).logits[0].float()  # [T, vocab]


def our_logits(module, ids) -> torch.Tensor:
    cache = module.new_cache(64)
    return module(ids, cache, 0)[0]  # [T, vocab]


TORCH_ATOL = 5e-5  # fp32 rounding over a few layers, logits up to ~6 (measured: 4e-6 to 6e-6)
# Q8_0 weights and 8-bit activations on these random nets: max |error| / max |logit| (measured 0.040 qwen3,
# 0.053 llama3, 0.048 gemma3, 0.058 phi3, 0.078 phi3-longrope, whose attention factor sqrt(2) scales q.k by 2;
# the weights' rounding alone, on the torch path, is 0.03 to 0.045)
QUANT_REL = 0.1
CUDA_ATOL = 2e-4  # fp32 on a GPU: the same arithmetic in another summation order (not yet measured on one)


@pytest.mark.parametrize("name", FAMILIES)
def test_torch_path_matches_transformers(checkpoints, name):
    model, paths = checkpoints[name]
    ids = prompt_ids(model.config.vocab_size)
    expected = hf_logits(model, ids)
    ours = load_model(str(paths["f32"]), device="cpu", weight_dtype="float32", progress=lambda *a: None).module
    err = (our_logits(ours, ids) - expected).abs().max().item()
    assert err < TORCH_ATOL, f"{name}: max |logit error| {err:.2e}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", FAMILIES)
def test_torch_path_on_cuda_matches_transformers(checkpoints, name):
    """The same file on CUDA in fp32 (TF32 off): the torch reference's code on another device, summed in
    another order."""
    torch.backends.cuda.matmul.allow_tf32 = False
    model, paths = checkpoints[name]
    ids = prompt_ids(model.config.vocab_size)
    expected = hf_logits(model, ids)
    ours = load_model(str(paths["f32"]), device="cuda", dtype="float32", weight_dtype="float32",
                      progress=lambda *a: None).module
    err = (our_logits(ours, ids.cuda()).cpu() - expected).abs().max().item()
    assert err < CUDA_ATOL, f"{name}: max |logit error| {err:.2e}"


@kernel
@pytest.mark.parametrize("name", FAMILIES)
def test_quantized_path_matches_transformers(checkpoints, name):
    model, paths = checkpoints[name]
    ids = prompt_ids(model.config.vocab_size)
    expected = hf_logits(model, ids)
    loaded = load_model(str(paths["q8_0"]), device="cpu", progress=lambda *a: None).module
    assert loaded.weight_format == "gguf-q8" and loaded.layer_loop is not None  # the kernels and the C loop
    rel = (our_logits(loaded, ids) - expected).abs().max(-1).values / expected.abs().max()  # [T]
    # a mixture's rounding may swap a near tie's pick at a few positions (measured: 1 of 23 at 0.11-0.15);
    # a wrong expert, weight or matrix would move every position
    allowed = len(rel) // 10 if name in MIXTURES else 0
    assert (rel >= QUANT_REL).sum() <= allowed and rel.max() < 2 * QUANT_REL, \
        f"{name}: max |logit error| / max |logit| by position {[round(x, 3) for x in rel.tolist()]}"


def both_loops(module, fn):
    """fn(module) with the C layer loop, then with the Python loop."""
    fast = module.layer_loop
    try:
        a = fn(module)
        module.layer_loop = None
        b = fn(module)
    finally:
        module.layer_loop = fast
    return a, b


def steps_and_passes(m, prompt, steps):
    """Logits of 8 decode steps after a 20-token prompt, verify passes of 2, 5 and 16 rows from the same
    point, and a tree with its own mask; and the keys cached."""
    with torch.inference_mode():
        c = m.new_cache(64)
        m(prompt, c, 0)
        out = [m(steps[:, i:i + 1], c, 20 + i) for i in range(8)]
        out += [m(steps[:, :n], c, 20) for n in (2, 5, 16)]
        mask = torch.zeros(4, 24, dtype=torch.bool)
        mask[:, :20] = True
        for i, anc in enumerate([[0], [1], [0, 2], [1, 3]]):
            mask[i, [20 + a for a in anc]] = True
        out.append(m(steps[:, :4], c, 20, positions=torch.tensor([[20, 20, 21, 21]]), mask=mask))
        return out, c.k.clone()


@kernel
@pytest.mark.parametrize("name", FAMILIES)
def test_c_loop_gives_the_python_loops_bits(checkpoints, name):
    """Decode steps and verify passes past the sliding window, a tree with its own mask, and a ragged batch."""
    model, paths = checkpoints[name]
    loaded = load_model(str(paths["q8_0"]), device="cpu", progress=lambda *a: None).module
    prompt, steps = prompt_ids(model.config.vocab_size, 20), prompt_ids(model.config.vocab_size, 16)
    (a, ka), (b, kb) = both_loops(loaded, lambda m: steps_and_passes(m, prompt, steps))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert torch.equal(ka, kb)
    assert torch.equal(a[8], torch.cat(a[:2], 1))  # a verify row is a one-token step
    # a ragged batch (the server's) past the window: rows at 20 and 9 slots, 5 and 2 new positions
    feeds = [steps[0, :5].tolist(), steps[0, 5:7].tolist()]
    (a, ka, takes, alone), (b, kb, _, _) = both_loops(loaded, lambda m: ragged_step(m, prompt, [20, 9], feeds, [2, 0]))
    assert takes and torch.equal(a, b) and torch.equal(ka, kb)
    assert all(torch.equal(a[row, :len(f)], own[0]) for row, (f, own) in enumerate(zip(feeds, alone)))


@kernel
@pytest.mark.parametrize("path", ["C", "Python"])
def test_moe_rows_take_the_experts_of_one_token_steps(checkpoints, path):
    """Mixture-of-experts layers, routed in C (moe_rows: the C layer loop and the Python loop's MoE.fast) or
    in Python (a model whose experts moe_rows does not take): a verify pass gives each row a one-token
    step's bits, experts and all, and so does a ragged batch; the experts a token is routed to change its
    output."""
    model, paths = checkpoints["qwen3moe"]
    loaded = load_model(str(paths["q8_0"]), device="cpu", progress=lambda *a: None).module
    if path == "Python":
        loaded.layer_loop = None
        for layer in loaded.model.layers:
            layer.mlp.fast = None
    prompt, steps = prompt_ids(model.config.vocab_size, 20), prompt_ids(model.config.vocab_size, 16)
    out, _ = steps_and_passes(loaded, prompt, steps)
    assert torch.equal(out[8], torch.cat(out[:2], 1)) and torch.equal(out[9], torch.cat(out[:5], 1))
    assert torch.equal(out[10][:, :8], torch.cat(out[:8], 1))
    feeds = [steps[0, :5].tolist(), steps[0, 5:7].tolist()]
    a, _, _, alone = ragged_step(loaded, prompt, [20, 9], feeds, [2, 0])
    assert all(torch.equal(a[row, :len(f)], own[0]) for row, (f, own) in enumerate(zip(feeds, alone)))
    moe = loaded.model.layers[0].mlp
    x = torch.randn(3, model.config.hidden_size)
    weights, ids = moe.route(x)
    assert ids.shape == (3, 2) and torch.allclose(weights.sum(-1), torch.ones(3))
    others = (ids + 1) % 8  # the same weights on the next experts along
    with torch.inference_mode():
        picked = sum(moe.experts.run(int(e), x[:1]) * w for e, w in zip(ids[0], weights[0]))
        moved = sum(moe.experts.run(int(e), x[:1]) * w for e, w in zip(others[0], weights[0]))
        assert torch.allclose(moe(x[None])[0, :1], picked, atol=1e-5) and not torch.allclose(picked, moved, atol=1e-3)


def _llama_server():
    from specdec.bench.llama_server import find_binary
    from specdec.errors import SpecdecError
    try:
        return find_binary()
    except SpecdecError:
        return None


@kernel
@pytest.mark.skipif(_llama_server() is None, reason="no llama-server build (scripts/llama_cpp.sh build)")
@pytest.mark.parametrize("name", sorted(MIXTURES) + ["smollm3", "gemma2", "granite", "olmo2", "olmo3"])
def test_next_token_logprobs_match_llama_server(checkpoints, tmp_path, name):
    """The same Q8_0 file through llama.cpp's own server: its log-probabilities of its top tokens after each
    of 6 prompts equal ours within the two engines' rounding, a mixture's swapped pick at a prompt included
    (llama.cpp renormalises the picked experts' weights for qwen3moe, granitemoe and for llama with experts,
    Mixtral, as we do; it leaves RoPE out of smollm3's every fourth layer, as we do; it reads Granite's
    multipliers and OLMo 3's window pattern from the file's keys, as we do)."""
    from specdec.bench.llama_server import LlamaServer
    model, paths = checkpoints[name]
    ours = load_model(str(paths["q8_0"]), device="cpu", progress=lambda *a: None).module
    server, worst = LlamaServer(_llama_server(), paths["q8_0"], None, 256, 2, tmp_path / "llama.log"), []
    try:
        for seed in range(6):
            ids = prompt_ids(model.config.vocab_size, 12 + seed).tolist()[0]
            with torch.inference_mode():
                mine = torch.log_softmax(ours(torch.tensor([ids]), ours.new_cache(64), 0)[0, -1], -1)
            top = server.complete({"prompt": ids, "n_predict": 1, "temperature": 0, "n_probs": 8,
                                   "cache_prompt": False})["completion_probabilities"][0]["top_logprobs"]
            worst.append(max(abs(t["logprob"] - float(mine[t["id"]])) for t in top))
    finally:
        server.close()
    # measured, a prompt's largest difference: qwen3moe 0.02-0.05; mixtral 0.02-0.05 and one prompt at 0.12 (the
    # rounding's swap of a near tie); smollm3, 4 layers, 0.03-0.13 (mean 0.08), and 0.14-0.47 (mean 0.25) with
    # RoPE in every layer; granite and granitemoe 0.000-0.003; olmo2 0.01-0.03, olmo3 0.03-0.09, olmoe 0.02-0.09
    assert sum(worst) / len(worst) < 0.1 and max(worst) < 0.25, worst


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("weights", ["default", "float32"])
def test_speculative_greedy_equals_plain(checkpoints, name, weights):
    model, paths = checkpoints[name]
    path = paths["q8_0" if weights == "default" else "f32"]
    loaded = load_model(str(path), device="cpu", weight_dtype=None if weights == "default" else "float32",
                        progress=lambda *a: None)
    module, vocab = loaded.module, model.config.vocab_size
    ids = prompt_ids(vocab, 12).tolist()[0] * 2  # a repeat: the n-gram drafter has something to propose
    plain = Engine.single(module, NoDrafter(), 128).generate(ids, GenerationConfig(40, 1), set()).tokens
    for drafter, k in [(NgramDrafter(3, 1), 4), (DraftModelDrafter(module, vocab, 128), 3)]:
        result = Engine.single(module, drafter, 128).generate(ids, GenerationConfig(40, k), set())
        assert result.tokens == plain, f"{name} {weights}: {type(drafter).__name__} differs from plain decoding"


def test_gemma3_window_matters(checkpoints):
    """The sliding window changes the logits of a prompt longer than it: the test above would see a
    loader that ignored it."""
    model, paths = checkpoints["gemma3"]
    ours = load_model(str(paths["f32"]), device="cpu", weight_dtype="float32", progress=lambda *a: None).module
    assert ours.config.sliding_window == WINDOW and ours.config.sliding_layers == (0, 1, 2, 3, 4, 6)
    ids = prompt_ids(model.config.vocab_size)
    windowed = our_logits(ours, ids)
    ours.config = dataclasses.replace(ours.config, sliding_window=10 ** 6)  # the same RoPE tables, no window
    assert (our_logits(ours, ids) - windowed)[WINDOW:].abs().max() > 1e-2


def test_gemma2_soft_caps_matter(checkpoints):
    """Both soft-caps reach the model from the file and change its logits: the tests above would see a
    loader that dropped either."""
    model, paths = checkpoints["gemma2"]
    ours = load_model(str(paths["f32"]), device="cpu", weight_dtype="float32", progress=lambda *a: None).module
    assert (ours.config.attn_softcap, ours.config.final_softcap) == (2.0, 3.0)
    assert ours.config.sliding_window == WINDOW and ours.config.sliding_layers == (0, 2)
    ids = prompt_ids(model.config.vocab_size)
    capped = our_logits(ours, ids)
    assert capped.abs().max() < 3.0
    for layer in ours.model.layers:
        layer.self_attn.softcap = 0.0
    assert (our_logits(ours, ids) - capped).abs().max() > 1e-2
    ours.config = dataclasses.replace(ours.config, final_softcap=0.0)
    assert our_logits(ours, ids).abs().max() > 3.0


def test_granite_multipliers_matter(checkpoints):
    """Each of Granite's four multipliers reaches the model from the file and changes its logits: the tests above
    would see a loader that dropped any one."""
    model, paths = checkpoints["granite"]
    ours = load_model(str(paths["f32"]), device="cpu", weight_dtype="float32", progress=lambda *a: None).module
    cfg = ours.config
    assert (cfg.embedding_multiplier, cfg.residual_multiplier, cfg.logits_scaling) == pytest.approx((12.0, 0.22, 4.0))
    assert ours.model.layers[0].self_attn.scale == pytest.approx(0.1)
    ids = prompt_ids(model.config.vocab_size)
    scaled = our_logits(ours, ids)
    for change in [dict(embedding_multiplier=1.0), dict(logits_scaling=1.0)]:
        ours.config = dataclasses.replace(cfg, **change)
        assert (our_logits(ours, ids) - scaled).abs().max() > 1e-2, change
    ours.config = cfg
    for layer in ours.model.layers:
        layer.residual = 1.0
    assert (our_logits(ours, ids) - scaled).abs().max() > 1e-2
    for layer in ours.model.layers:
        layer.residual, layer.self_attn.scale = cfg.residual_multiplier, 0.25
    assert (our_logits(ours, ids) - scaled).abs().max() > 1e-2


def test_a_granite_file_without_its_multipliers_takes_llama_cpps_defaults(checkpoints):
    """A multiplier the file leaves out is 1, as llama.cpp takes it; the attention's scale is then
    1 / sqrt(head_dim)."""
    from specdec.model.gguf_config import gguf_hf_config
    gguf = open_gguf(checkpoints["granite"][1]["q8_0"])
    for key in ("embedding_scale", "residual_scale", "attention.scale", "logit_scale"):
        del gguf.metadata[f"granite.{key}"]
    cfg = gguf_hf_config(gguf)
    assert [cfg[k] for k in ("embedding_multiplier", "residual_multiplier", "logits_scaling")] == [1.0, 1.0, 1.0]
    assert cfg["attention_multiplier"] == 16 ** -0.5


def test_a_granite_mixture_with_a_shared_expert_is_named(checkpoints):
    from specdec.errors import SpecdecError
    from specdec.model.gguf_config import gguf_hf_config
    gguf = open_gguf(checkpoints["granitemoe"][1]["q8_0"])
    gguf.metadata["granitemoe.expert_shared_feed_forward_length"] = 64
    with pytest.raises(SpecdecError, match="a Granite mixture with a shared expert .* is not supported"):
        gguf_hf_config(gguf)


@pytest.mark.skipif(not GEMMA.is_file(), reason=f"gemma3-270m is not installed ({GEMMA})")
def test_a_gemma3_file_naming_a_final_soft_cap_takes_it():
    """The final soft-cap is the model's, whatever Gemma's generation: a gemma3 file that names one gets it."""
    from specdec.model.gguf_config import gguf_model_config
    gguf = open_gguf(GEMMA)
    assert gguf_model_config(gguf).final_softcap == 0.0
    gguf.metadata["gemma3.final_logit_softcapping"] = 30.0
    assert gguf_model_config(gguf).final_softcap == 30.0


def test_smollm3_leaves_rope_out_of_every_fourth_layer(checkpoints):
    """The fourth layer takes no RoPE (the file says nothing of it: llama.cpp's rule for the architecture),
    which changes the logits: the tests above would see a loader that rotated every layer."""
    model, paths = checkpoints["smollm3"]
    ours = load_model(str(paths["f32"]), device="cpu", weight_dtype="float32", progress=lambda *a: None).module
    assert ours.config.nope_layers == (3,) and [layer.local for layer in ours.model.layers] == [False] * 3 + [True]
    ids = prompt_ids(model.config.vocab_size)
    nope = our_logits(ours, ids)
    ours.model.layers[3].local = False  # the global tables: RoPE in every layer
    assert (our_logits(ours, ids) - nope)[1:].abs().max() > 1e-2


def test_layers_without_rope_beside_sliding_ones_are_refused():
    from specdec.model.transformer import ModelConfig
    cfg = dict(model_type="smollm3", vocab_size=64, num_hidden_layers=4, no_rope_layers=[1, 1, 1, 0],
               **TINY)
    assert ModelConfig.from_hf(cfg).nope_layers == (3,)
    assert ModelConfig.from_hf(cfg | {"no_rope_layers": None, "no_rope_layer_interval": 2}).nope_layers == (1, 3)
    with pytest.raises(ValueError, match="layers without RoPE beside sliding-window layers"):
        ModelConfig.from_hf(cfg | {"sliding_window": 8, "layer_types": ["sliding_attention"] * 4})


def test_phi3_reads_longrope_and_partial_rope(checkpoints):
    """The file's LongRoPE factors, attention factor and partial RoPE reach the model; the short factors
    serve a cache within the original context (transformers: a sequence within it), the long ones a
    larger one, and each matches transformers' logits; so does a loader that ignored them not."""
    model, paths = checkpoints["phi3-longrope"]
    ours = load_model(str(paths["f32"]), device="cpu", weight_dtype="float32", progress=lambda *a: None).module
    cfg = ours.config
    assert cfg.rope_dim == 12 and cfg.head_dim == 16 and cfg.rope_original_context == PHI_ORIGINAL
    assert cfg.rope_freq_factors == pytest.approx(LONGROPE["short_factor"])
    assert cfg.rope_long_factors == pytest.approx(LONGROPE["long_factor"])
    assert cfg.rope_attn_factor == pytest.approx(math.sqrt(1 + math.log(256 / PHI_ORIGINAL) / math.log(PHI_ORIGINAL)))
    short_ids = prompt_ids(model.config.vocab_size, 12)
    with torch.inference_mode():
        short = ours(short_ids, ours.new_cache(PHI_ORIGINAL), 0)[0]
    assert not ours.rope_long
    assert (short - hf_logits(model, short_ids)).abs().max().item() < TORCH_ATOL
    long_ids = prompt_ids(model.config.vocab_size)
    long = our_logits(ours, long_ids)  # a 64-position cache: beyond the original context
    assert ours.rope_long
    assert (long - hf_logits(model, long_ids)).abs().max().item() < TORCH_ATOL
    assert (our_logits(ours, short_ids) - short).abs().max().item() > 1e-3  # the long factors differ


@pytest.mark.parametrize("name", ["phi3", "phi3-longrope", "qwen3moe", "mixtral", "smollm3", "gemma2", "granite",
                                  "olmo2", "olmo3", "olmoe"])
def test_through_transformers_and_the_hf_directory(checkpoints, name):
    """Our weights handed back to transformers' class (bench's HF peer: q/k/v and gate/up fused again, the
    partial RoPE's rows in HF's order, the experts' gate and up in one parameter) and the HF directory itself
    through our loader give transformers' logits."""
    from specdec.bench.baselines import hf_model
    model, paths = checkpoints[name]
    ids = prompt_ids(model.config.vocab_size)
    expected = hf_logits(model, ids)
    ours = load_model(str(paths["f32"]), device="cpu", weight_dtype="float32", progress=lambda *a: None).module
    assert (hf_logits(hf_model(paths["f32"], share=ours), ids) - expected).abs().max().item() < TORCH_ATOL
    assert (hf_logits(hf_model(paths["f32"]), ids) - expected).abs().max().item() < TORCH_ATOL
    from_dir = load_model(str(paths["hf"]), device="cpu", progress=lambda *a: None).module
    assert (our_logits(from_dir, ids) - expected).abs().max().item() < TORCH_ATOL


@kernel
def test_phi3_runs_its_fused_tensors_as_they_are(checkpoints):
    """The quantized path's q/k/v and gate/up GEMMs are the file's fused tensors (rows of q and k reordered
    for the partial RoPE: a copy), one part each."""
    from specdec.model.quant import QuantLinear
    _, paths = checkpoints["phi3-longrope"]
    layer = load_model(str(paths["q8_0"]), device="cpu", progress=lambda *a: None).module.model.layers[0]
    for linear in (layer.self_attn.qkv_proj, layer.mlp.gate_up_proj):
        assert isinstance(linear, QuantLinear) and len(linear.parts) == 1
    assert layer.self_attn.qkv_proj.out_features == (4 + 2 * 2) * 16 and layer.mlp.gate_up_proj.out_features == 256


@pytest.mark.parametrize("weights", ["gguf-q8", "float32"])
def test_phi3_generates_with_its_chat_template(checkpoints, capsys, weights):
    """`specdec generate --chat` on a phi3 file: the chat template is the file's (Phi-3's turns)."""
    from specdec.cli import main
    from specdec.model.gguf_file import GGUFFile
    from specdec.model.tokenizer import encode_prompt, gguf_tokenizer
    _, paths = checkpoints["phi3"]
    tok = gguf_tokenizer(GGUFFile(paths["q8_0"]))
    assert tok.decode(encode_prompt(tok, "hi", chat=True)).endswith("<|user|>\nhi<|end|>\n<|assistant|>\n")
    code = main(["generate", "--model", str(paths["q8_0"]), "--weight-dtype", weights, "--chat", "--ngram", "--policy", "fixed",
                 "--max-new-tokens", "8", "--json", "hi"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert json.loads(captured.out.strip().splitlines()[-1])["stats"]["new_tokens"] >= 1


TIE = 0.25  # logits this close count as a tie the quantized arithmetic (max error ~1.4 on logits ~20) may break


@pytest.mark.real
@pytest.mark.skipif(not GEMMA.is_file(), reason=f"gemma3-270m is not installed ({GEMMA}); specdec pull gemma3-270m")
def test_gemma3_270m_greedy_matches_transformers():
    """Our torch path's greedy tokens are transformers' on the same dequantized weights; the quantized
    path's (8-bit activations) are too, up to a position where transformers' top two are a near-tie."""
    from specdec.bench.baselines import hf_model
    from specdec.model.tokenizer import encode_prompt
    ref = load_model(str(GEMMA), device="cpu", weight_dtype="float32", progress=lambda *a: None)
    quant = load_model(str(GEMMA), device="cpu", progress=lambda *a: None)
    hf = hf_model(GEMMA, share=ref.module)
    for text in ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village by the sea,"]:
        ids = encode_prompt(ref.tokenizer, text, chat=False)
        x = torch.tensor([ids])
        with torch.inference_mode():
            expected = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=24, do_sample=False)
        expected = expected[0, len(ids):].tolist()
        plain = lambda m: Engine.single(m, NoDrafter(), 256).generate(ids, GenerationConfig(24, 1), set()).tokens  # noqa: E731
        assert plain(ref.module) == expected, text
        got = plain(quant.module)
        first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), None)
        if first is not None:
            with torch.inference_mode():
                logits = hf(torch.tensor([ids + expected[:first]])).logits[0, -1]
            gap = (logits[expected[first]] - logits[got[first]]).item()
            assert gap < TIE, f"{text!r}: the quantized path leaves transformers at token {first} by {gap:.3f}"


@pytest.mark.real
@pytest.mark.skipif(not GEMMA.is_file(), reason=f"gemma3-270m is not installed ({GEMMA})")
def test_gemma3_270m_chat_uses_gemmas_turns():
    """The file carries no chat template: Gemma's turn format is used, its turn markers as single tokens."""
    from specdec.model.gguf_file import GGUFFile
    from specdec.model.tokenizer import encode_prompt, gguf_tokenizer
    tok = gguf_tokenizer(GGUFFile(GEMMA))
    ids = encode_prompt(tok, "hi", chat=True)
    assert [tok.decode([i]) for i in ids] == ["<bos>", "<start_of_turn>", "user", "\n", "hi", "<end_of_turn>", "\n",
                                              "<start_of_turn>", "model", "\n"]


def tiny_gguf(tmp_path, arch: str, fmt: str = "Q8_0", **overrides) -> Path:
    from tests.conftest import tiny_model, write_tiny_gguf
    model = tiny_model(0, hidden_size=256, intermediate_size=256, head_dim=64, **overrides)
    return write_tiny_gguf(tmp_path / f"{arch}-{fmt}.gguf", model, arch, fmt)


def test_an_architecture_we_do_not_run_names_itself_and_the_supported_ones(tmp_path):
    from specdec.errors import SpecdecError
    from specdec.model.gguf_config import SUPPORTED_ARCHS, gguf_hf_config
    gguf = open_gguf(tiny_gguf(tmp_path, "phi2"))
    with pytest.raises(SpecdecError, match="unsupported GGUF architecture 'phi2'") as e:
        gguf_hf_config(gguf)
    assert all(a in str(e.value) for a in SUPPORTED_ARCHS)


def test_a_missing_tensor_is_named(tmp_path):
    """A qwen3 file without its q/k norms (a Llama-shaped file under qwen3's name)."""
    from specdec.errors import SpecdecError
    with pytest.raises(SpecdecError, match=r"lacks the tensor blk\.0\.attn_q_norm\.weight, which a qwen3 model needs"):
        load_gguf_blocks(open_gguf(tiny_gguf(tmp_path, "qwen3")))


def test_a_dense_file_under_the_moe_architecture_is_named(tmp_path):
    from specdec.errors import SpecdecError
    with pytest.raises(SpecdecError, match=r"lacks the tensor blk\.0\.ffn_gate_inp\.weight, which a qwen3moe model needs"):
        load_gguf_blocks(open_gguf(tiny_gguf(tmp_path, "qwen3moe")))


def test_an_olmo2_file_without_its_own_norms_is_named(tmp_path):
    """A Llama-shaped file under olmo2's name: its whole-width q/k norms are missing."""
    from specdec.errors import SpecdecError
    with pytest.raises(SpecdecError, match=r"lacks the tensor blk\.0\.attn_q_norm\.weight, which a olmo2 model needs"):
        load_gguf_blocks(open_gguf(tiny_gguf(tmp_path, "olmo2")))


def test_an_olmo3_file_with_yarn_is_refused(checkpoints):
    """OLMo 3's long-context files scale RoPE by YaRN, which we do not run: a clear error, not wrong logits."""
    from specdec.errors import SpecdecError
    from specdec.model.gguf_config import gguf_hf_config
    gguf = open_gguf(checkpoints["olmo3"][1]["q8_0"])
    gguf.metadata["olmo2.rope.scaling.type"] = "yarn"
    with pytest.raises(SpecdecError, match="RoPE scaling 'yarn' is not supported"):
        gguf_hf_config(gguf)


def test_a_mixture_without_its_expert_count_is_named(checkpoints):
    from specdec.errors import SpecdecError
    from specdec.model.gguf_config import gguf_hf_config
    gguf = open_gguf(checkpoints["qwen3moe"][1]["q8_0"])
    del gguf.metadata["qwen3moe.expert_count"]
    with pytest.raises(SpecdecError, match=r"lacks qwen3moe\.expert_count, which a qwen3moe model needs"):
        gguf_hf_config(gguf)


@pytest.mark.parametrize("change, message", [
    ({"num_experts_per_tok": 9}, "num_experts_per_tok 9 must be between 1 and num_experts 8"),
    ({"num_experts_per_tok": 0}, "num_experts_per_tok 0 must be between 1 and num_experts 8"),
    ({"mlp_only_layers": [1]}, "dense MLP layers among the mixture-of-experts ones"),
    ({"decoder_sparse_step": 2}, "dense MLP layers among the mixture-of-experts ones")])
def test_an_moe_config_we_do_not_run_is_refused(checkpoints, tmp_path, change, message):
    """An HF directory whose experts we cannot route as it says: a clear error naming the key, no crash."""
    import shutil

    from specdec.errors import SpecdecError
    d = shutil.copytree(checkpoints["qwen3moe"][1]["hf"], tmp_path / "moe")
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(config | change))
    with pytest.raises(SpecdecError, match=message):
        load_model(str(d), device="cpu", progress=lambda *a: None)


def test_a_phi3_file_of_another_layout_is_named(tmp_path):
    """phi3 under a Llama-shaped file: separate q/k/v are fine (llama.cpp reads them too), but its ffn_up
    must hold the gate and up; and LongRoPE needs both factor tensors."""
    from types import SimpleNamespace

    from specdec.errors import SpecdecError
    with pytest.raises(SpecdecError, match=r"tensor blk\.0\.ffn_up\.weight has .* a phi3 model of these sizes "
                                           r"stacks ffn_gate, ffn_up in 512"):
        load_gguf_blocks(open_gguf(tiny_gguf(tmp_path, "phi3")))
    from specdec.model.gguf_config import _gguf_rope
    half = SimpleNamespace(path="half.gguf", tensors={"rope_factors_long.weight": None}, get=lambda key, default=None: default)
    with pytest.raises(SpecdecError, match=r"half\.gguf lacks the tensor rope_factors_short\.weight, which LongRoPE needs"):
        _gguf_rope(half, "phi3", {"max_position_embeddings": 256})


@kernel
@pytest.mark.parametrize("fmt", ["IQ2_XXS"])
def test_a_block_format_our_kernels_do_not_run_is_refused(tmp_path, fmt):
    """Refused by name on the quantized path (no silent fp32 copy); the torch reference dequantizes it."""
    from specdec.errors import SpecdecError
    path = tiny_gguf(tmp_path, "llama", fmt)
    with pytest.raises(SpecdecError, match=rf"tensor \S+ is in the block format {fmt}, which our CPU kernels"):
        load_gguf_blocks(open_gguf(path))
    from specdec.model.loading import blocks_all_readable  # so a draft of it is never deferred (loaded at start)
    assert not blocks_all_readable(open_gguf(path)) and blocks_all_readable(open_gguf(tiny_gguf(tmp_path, "qwen2")))
    ref = load_gguf_reference(open_gguf(path), torch.device("cpu"), torch.float32)
    assert ref.weight_format == "torch" and ref.model.layers[0].self_attn.q_proj.weight.dtype == torch.float32


@kernel
@pytest.mark.parametrize("fmt", ["Q4_0", "Q8_0", "Q5_K", "Q3_K", "Q2_K", "IQ4_XS", "IQ4_NL", "IQ3_S"])
def test_a_file_in_a_format_our_kernels_read_runs_on_them(tmp_path, fmt):
    from specdec.model.quant import QuantLinear
    module = load_gguf_blocks(open_gguf(tiny_gguf(tmp_path, "llama", fmt)))
    layer = module.model.layers[0]
    assert isinstance(layer.self_attn.qkv_proj, QuantLinear) and isinstance(layer.mlp.down_proj, QuantLinear)
    assert module.layer_loop is not None
