"""GGUF blocks as the weights of decode and verify GEMMs (--weight-dtype gguf, the default for a
.gguf model): our quantized kernel dequantizes each format to exactly gguf-py's fp32 values, gives
the fp32 kernel's bits for every row count up to 16, and the real model decodes the fp32 model's
tokens."""

import numpy as np
import pytest
import torch

from specdec.errors import SpecdecError
from specdec.model import cpu_kernels
from specdec.model.loading import use_gguf_blocks

kernel = pytest.mark.skipif(not cpu_kernels.available(), reason=f"kernel unavailable: {cpu_kernels.unavailable_reason()}")

# per format: block bytes, weights per block, byte offsets of its fp16 scales
FORMATS = {"Q4_K": (144, 256, [0, 2]), "Q6_K": (210, 256, [208]), "Q8_0": (34, 32, [0]), "Q5_0": (22, 32, [0]),
           "Q4_0": (18, 32, [0]), "Q4_1": (20, 32, [0, 2])}


def random_blocks(fmt: str, rows: int, K: int, seed: int = 0) -> np.ndarray:
    """Random rows of `fmt` blocks: random bits (every bit pattern is a valid block) with finite fp16 scales."""
    size, qk, scales = FORMATS[fmt]
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (rows, K // qk, size), dtype=np.uint8)
    for off in scales:
        d = (rng.standard_normal((rows, K // qk)) * 0.02).astype(np.float16)
        d[0, 0] = np.float16(6e-8)  # a subnormal scale widens exactly too
        data[:, :, off:off + 2] = d.view(np.uint8).reshape(rows, K // qk, 2)
    return data.reshape(rows, -1)


def gguf_py_dequantize(fmt: str, data: np.ndarray, K: int) -> torch.Tensor:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize
    return torch.from_numpy(np.array(dequantize(data, GGMLQuantizationType[fmt]), dtype=np.float32).reshape(-1, K))


@kernel
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_dequantize_matches_gguf_py_bit_for_bit(fmt):
    K = 512
    data = random_blocks(fmt, 37, K)
    qtype = cpu_kernels.QUANT_TYPES[fmt]
    assert cpu_kernels.quant_row_bytes(qtype, K) == data.shape[1]
    ours = cpu_kernels.quant_dequantize(qtype, torch.from_numpy(data), K)
    assert torch.equal(ours.view(torch.int32), gguf_py_dequantize(fmt, data, K).view(torch.int32))


@kernel
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_quant_gemm_is_the_fp32_kernel_on_the_dequantized_weights(fmt):
    torch.manual_seed(0)
    N, K = 203, 768  # N: not a multiple of any block of rows the kernel takes
    qtype = cpu_kernels.QUANT_TYPES[fmt]
    data = torch.from_numpy(random_blocks(fmt, N, K, seed=1))
    w = cpu_kernels.quant_dequantize(qtype, data, K)
    bias = torch.randn(N)
    x = torch.randn(1, cpu_kernels.QUANT_MAX_ROWS, K)
    full = cpu_kernels.quant_linear(x, [(qtype, data)], bias)
    scale = (x.abs() @ w.abs().T).max().item()  # fp32 rounding grows with the sum of |terms|
    torch.testing.assert_close(full, torch.nn.functional.linear(x.double(), w.double(), bias.double()).float(),
                               atol=1e-6 * scale, rtol=1e-5)
    for n in range(1, cpu_kernels.QUANT_MAX_ROWS + 1):
        # a row's bits do not depend on the row count, and are the fp32 kernel's
        assert torch.equal(cpu_kernels.quant_linear(x[:, :n], [(qtype, data)], bias), full[:, :n])
        assert torch.equal(cpu_kernels.quant_linear(x[:, n - 1:n], [(qtype, data)], bias), full[:, n - 1:n])
    for n in range(1, cpu_kernels.MAX_ROWS + 1):
        assert torch.equal(cpu_kernels.skinny_linear(x[:, :n], w, bias), full[:, :n])


@kernel
def test_parts_in_several_formats_stack_along_the_outputs():
    torch.manual_seed(0)
    K = 256
    parts = [(cpu_kernels.QUANT_TYPES[f], torch.from_numpy(random_blocks(f, rows, K, seed=i)))
             for i, (f, rows) in enumerate([("Q4_K", 40), ("Q6_K", 8), ("Q8_0", 8)])]
    bias = torch.randn(56)
    x = torch.randn(2, 3, K)
    y = cpu_kernels.quant_linear(x, parts, bias)
    assert y.shape == (2, 3, 56)
    off = 0
    for qtype, data in parts:
        rows = data.shape[0]
        assert torch.equal(y[..., off:off + rows], cpu_kernels.quant_linear(x, [(qtype, data)], bias[off:off + rows]))
        off += rows


@kernel
def test_bad_quant_inputs_give_clear_errors():
    K, q4k = 256, cpu_kernels.QUANT_TYPES["Q4_K"]
    data = torch.from_numpy(random_blocks("Q4_K", 4, K))
    assert cpu_kernels.quant_row_bytes(q4k, 100) == 0  # K not a multiple of the block
    assert cpu_kernels.quant_row_bytes(99, K) == 0  # a type it does not read
    with pytest.raises(ValueError, match="1 to 16 rows"):
        cpu_kernels.quant_linear(torch.randn(17, K), [(q4k, data)])
    with pytest.raises(ValueError, match="not supported"):
        cpu_kernels.quant_linear(torch.randn(1, K), [(99, data)])
    with pytest.raises(ValueError, match="rows of 144 bytes"):
        cpu_kernels.quant_dequantize(q4k, data[:, :100].contiguous(), K)
    with pytest.raises(ValueError, match="rows of 144 bytes"):  # checked before the kernel could read past them
        cpu_kernels.quant_linear(torch.randn(1, K), [(q4k, data[:, :100].contiguous())])
    with pytest.raises(ValueError, match="rows of 288 bytes"):  # rows of 512 weights need 288 bytes
        cpu_kernels.quant_linear(torch.randn(1, 2 * K), [(q4k, data)])
    with pytest.raises(ValueError, match="a bias of 3"):
        cpu_kernels.quant_linear(torch.randn(1, K), [(q4k, data)], torch.randn(3))


@pytest.mark.parametrize("mode", ["gguf", "gguf-q8"])
def test_weight_dtype_choice(tmp_path, mode):
    cpu, gguf, hf = torch.device("cpu"), tmp_path / "m.gguf", tmp_path / "hf"
    assert use_gguf_blocks(cpu, torch.float32, mode, gguf, kernel=True) == mode
    assert use_gguf_blocks(cpu, torch.float32, None, gguf, kernel=True) == "gguf-q8"
    assert use_gguf_blocks(cpu, torch.float32, "auto", gguf, kernel=True) == "gguf-q8"
    assert not use_gguf_blocks(cpu, torch.float32, "float32", gguf, kernel=True)
    assert not use_gguf_blocks(cpu, torch.float32, "bfloat16", gguf, kernel=True)
    assert not use_gguf_blocks(cpu, torch.float32, None, hf, kernel=True)  # auto: fp32 where it cannot be had
    assert not use_gguf_blocks(cpu, torch.float32, None, gguf, kernel=False)
    with pytest.raises(SpecdecError, match=f"--weight-dtype {mode} reads a GGUF file.*not a .gguf file"):
        use_gguf_blocks(cpu, torch.float32, mode, hf, kernel=True)
    with pytest.raises(SpecdecError, match="CPU fp32 path"):
        use_gguf_blocks(torch.device("cuda"), torch.bfloat16, mode, gguf, kernel=True)
    with pytest.raises(SpecdecError, match="needs our CPU kernel"):
        use_gguf_blocks(cpu, torch.float32, mode, gguf, kernel=False)


def load_with_fp32(path, weight_dtype: str):
    """The real model twice: in `weight_dtype` and with fp32 weights."""
    if not cpu_kernels.available():
        pytest.skip(f"kernel unavailable: {cpu_kernels.unavailable_reason()}")
    from specdec.model import load_model
    return (load_model(str(path), device="cpu", weight_dtype=weight_dtype, progress=lambda *a: None),
            load_model(str(path), device="cpu", weight_dtype="float32", progress=lambda *a: None))


def steps_against_fp32(quant, fp32):
    """Both models prefill the same 30 random tokens, then take 16 one-token steps each: (quant's
    step logits, fp32's, verify) where verify(n) is quant's logits of one pass over the first n steps."""
    torch.manual_seed(0)
    prompt, steps = torch.randint(0, 1000, (1, 30)), torch.randint(0, 1000, (1, 16))
    with torch.inference_mode():
        caches = [m.module.new_cache(64) for m in (quant, fp32)]
        for m, c in zip((quant, fp32), caches):
            m.module(prompt, c, 0)
            c.advance(30)
        one = [quant.module(steps[:, i:i + 1], caches[0], 30 + i) for i in range(16)]
        ref = [fp32.module(steps[:, i:i + 1], caches[1], 30 + i) for i in range(16)]

    def verify(n: int) -> torch.Tensor:
        with torch.inference_mode():
            return quant.module(steps[:, :n], caches[0], 30)
    return one, ref, verify


@pytest.fixture(scope="module")
def smollm2_pair(smollm2_path):
    """With GGUF blocks read exactly (--weight-dtype gguf) and with fp32 weights."""
    return load_with_fp32(smollm2_path, "gguf")


@pytest.mark.real
def test_real_model_with_blocks_gives_the_fp32_models_logits(smollm2_pair):
    from specdec.model.cpu_linear import PackedLinear
    quant, fp32 = smollm2_pair
    assert quant.module.weight_format == "gguf" and fp32.module.weight_format == "float32"
    linears = [m for m in quant.module.modules() if isinstance(m, PackedLinear)]
    assert linears and all(m.quant is not None for m in linears)  # SmolLM2: Q4_1 layers, a Q8_0 (tied) head
    one, ref, verify = steps_against_fp32(quant, fp32)
    assert all(torch.equal(a, b) for a, b in zip(one, ref))  # one-token steps: the fp32 model's bits
    for n in (2, 5, 8, 9, 16):  # a verify pass of n positions: the one-token steps' bits
        assert torch.equal(verify(n), torch.cat(one[:n], dim=1))


@pytest.mark.real
def test_real_model_with_blocks_decodes_the_fp32_tokens(smollm2_pair):
    from specdec.config import GenerationConfig
    from specdec.drafters.base import NoDrafter
    from specdec.drafters.draft_model import DraftModelDrafter
    from specdec.engine.generate import SpeculativeGenerator
    from specdec.model.tokenizer import encode_prompt
    quant, fp32 = smollm2_pair
    ids = encode_prompt(quant.tokenizer, "Write a Python function that checks whether a number is prime.", chat=True)
    plain = SpeculativeGenerator(fp32.module, NoDrafter(), 512).generate(ids, GenerationConfig(40, 1), fp32.eos_ids)
    for drafter, k in [(NoDrafter(), 1), (DraftModelDrafter(quant.module, quant.module.config.vocab_size, 512,
                                                            head_rows=8192), 8)]:
        out = SpeculativeGenerator(quant.module, drafter, 512).generate(ids, GenerationConfig(40, k), quant.eos_ids)
        assert out.tokens == plain.tokens


@pytest.mark.real
def test_truncated_head_keeps_the_blocks(smollm2_pair):
    from specdec.drafters.draft_model import truncated_head
    quant, _ = smollm2_pair
    cut = truncated_head(quant.module, 4096)
    assert cut.lm_head.quant is not None and sum(d.shape[0] for _, d in cut.lm_head.quant) == 4096
    x = torch.randn(1, 3, quant.module.config.hidden_size)
    with torch.inference_mode():
        assert torch.equal(cut.lm_head(x), quant.module.lm_head(x)[..., :4096])


@pytest.mark.real
def test_weight_bytes_counts_the_blocks(smollm2_pair):
    from specdec.bench.profile import weight_bytes
    quant, fp32 = smollm2_pair
    assert weight_bytes(quant.module) < weight_bytes(fp32.module) / 3.5  # Q4_1 and Q8_0 against fp32


@pytest.mark.real
def test_an_unreadable_block_cache_is_built_again(smollm2_path, tmp_path):
    from specdec.model.loading import BLOCKS_FILE, gguf_blocks
    fresh = gguf_blocks(smollm2_path, tmp_path)  # parsed from the GGUF file, then cached
    assert (tmp_path / BLOCKS_FILE).is_file()
    (tmp_path / BLOCKS_FILE).write_bytes(b"not a safetensors file")
    again = gguf_blocks(smollm2_path, tmp_path)
    assert again.keys() == fresh.keys()
    assert all(again[k][0] == fresh[k][0] and torch.equal(again[k][1], fresh[k][1]) for k in fresh)


@pytest.mark.real
def test_blocks_that_do_not_match_the_weights_fail_loudly(smollm2_path):
    if not cpu_kernels.available():
        pytest.skip(f"kernel unavailable: {cpu_kernels.unavailable_reason()}")
    from specdec.model import load_model
    from specdec.model.cpu_linear import attach_gguf_weights
    from specdec.model.loading import gguf_blocks
    model = load_model(str(smollm2_path), device="cpu", weight_dtype="float32", progress=lambda *a: None).module
    blocks = gguf_blocks(smollm2_path)
    q, o = "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.o_proj"  # both 576 x 576, Q4_1
    blocks[q], blocks[o] = blocks[o], blocks[q]
    with pytest.raises(SpecdecError, match="do not dequantize to the model's weights"):
        attach_gguf_weights(model, blocks)
