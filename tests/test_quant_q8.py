"""GGUF blocks against 8-bit activations (the CPU backend, quant_q8.c): the activations are
quantized exactly as the reference below says, the GEMM is that arithmetic (integer dot products,
scales in fp32), a row's bits do not depend on the row count, the VNNI and AVX2 builds agree bit for
bit, and on the real model speculative decoding still gives plain decoding's tokens."""

import numpy as np
import pytest
import torch

from specdec.model import cpu_kernels
from tests.conftest import KERNEL_FORMATS as FORMATS, SUPER_BLOCK_FORMATS, random_blocks
from tests.test_dequant import gguf_py_dequantize

kernel = pytest.mark.skipif(not cpu_kernels.available(), reason=f"kernel unavailable: {cpu_kernels.unavailable_reason()}")

# The other x86 builds, which must give the default build's bits: AVX2 alone (maddubs/madd for the dot
# products, int16 sums in the tiles), AVX-VNNI at 256 bits (int32 sums), and AVX-VNNI with int16 sums.
# Each with the CPU features it needs: a host that has them must build and load it (a compile error fails).
OTHER_BUILDS = {"x86-64-v3": ("x86-64-v3", [], "avx2 fma f16c bmi2"),
                "x86-64-v3+avxvnni": ("x86-64-v3+avxvnni", [], "avx2 fma f16c bmi2 avx_vnni"),
                "avxvnni-int16-sums": ("x86-64-v3+avxvnni", ["-DR_SUB16=1"], "avx2 fma f16c bmi2 avx_vnni")}


@pytest.fixture(params=sorted(OTHER_BUILDS))
def other_build(request):
    target, flags, needs = OTHER_BUILDS[request.param]
    missing = cpu_kernels.missing_features(needs, cpu_kernels._cpu_flags())
    if missing:
        pytest.skip(f"no {request.param} build here: this CPU lacks {', '.join(missing)}")
    return cpu_kernels.load(flags, target=target)


def act_block(fmt: str) -> int:
    return 256 if fmt in SUPER_BLOCK_FORMATS else 32


def reference_activations(x: np.ndarray, B: int):
    """One row in blocks of B: d = max|x| / 127 and q = round-half-even(x * (127 / max|x|)), in fp32."""
    x = x.astype(np.float32).reshape(-1, B)
    amax = np.abs(x).max(1)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore", over="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    inv[~np.isfinite(inv)] = 0  # a block below 127 / FLT_MAX reads as zeros
    q = np.rint(x * inv[:, None]).astype(np.int8)
    return q.reshape(-1), d.astype(np.float32)


def kernel_activations(x: np.ndarray, B: int):
    K = x.size
    q, d = np.zeros(K, np.int8), np.zeros(K // B, np.float32)
    s, sa = np.zeros(K // 16, np.int16), np.zeros(K // 32, np.float32)
    x = np.ascontiguousarray(x, dtype=np.float32)
    cpu_kernels._lib.quant_q8_activations(x.ctypes.data, K, B, q.ctypes.data, d.ctypes.data, s.ctypes.data,
                                          sa.ctypes.data)
    return q, d, s, sa


@kernel
@pytest.mark.parametrize("B", [32, 256])
def test_activations_are_quantized_as_the_reference(B):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(1024) * np.repeat(rng.uniform(0.01, 30, 1024 // 32), 32)).astype(np.float32)
    x[:B] = 0.0  # an all-zero block: scale 0, q 0
    x[B + 5] = np.float32(2.5) * np.abs(x[B:2 * B]).max() / 127  # ties round to even somewhere
    x[2 * B:3 * B] = np.float32(1e-38) * np.sign(x[2 * B:3 * B])  # 127 / max|x| overflows: zeros, not -128
    q, d, s, sa = kernel_activations(x, B)
    rq, rd = reference_activations(x, B)
    assert np.array_equal(q, rq) and np.array_equal(d, rd)
    assert np.array_equal(s, rq.reshape(-1, 16).astype(np.int64).sum(1))  # the sums of each 16
    if B == 32:
        assert np.array_equal(sa, rd * rq.reshape(-1, 32).astype(np.int64).sum(1).astype(np.float32))


@kernel
@pytest.mark.parametrize("fmt,K", [(f, 768) for f in sorted(FORMATS)]
                         + [(f, 32 * 27) for f in sorted(FORMATS) if f not in SUPER_BLOCK_FORMATS])
def test_q8_gemm_is_the_quantized_arithmetic_and_row_count_free(fmt, K):
    """K = 32 * 27: the 32-weight formats' blocks in eights and three left over (the 0.5B's K = 896 has 4)."""
    torch.manual_seed(0)
    N = 203
    qtype = cpu_kernels.QUANT_TYPES[fmt]
    assert cpu_kernels.quant_q8_supported(qtype, K)
    data = torch.from_numpy(random_blocks(fmt, N, K, seed=1))
    w = gguf_py_dequantize(fmt, data.numpy(), K).double()
    bias = torch.randn(N)
    x = torch.randn(1, 16, K)
    full = cpu_kernels.quant_linear(x, [(qtype, data)], bias)
    # the exact value of the arithmetic: dequantized weights times dequantized 8-bit activations
    xq = torch.from_numpy(np.stack([(lambda q, d: q.reshape(-1, act_block(fmt)).astype(np.float64) * d[:, None])(
        *reference_activations(r, act_block(fmt))).reshape(-1) for r in x[0].numpy()]))
    ref = xq @ w.T + bias.double()
    scale = (xq.abs() @ w.abs().T).max().item()
    assert (full[0].double() - ref).abs().max().item() < 1e-6 * scale  # only fp32 rounding of the scales and sums
    exact = x[0].double() @ w.T + bias.double()
    assert (full[0].double() - exact).abs().max().item() < 0.03 * exact.abs().max().item()  # 8-bit activations: close
    for n in range(1, 16 + 1):
        assert torch.equal(cpu_kernels.quant_linear(x[:, :n], [(qtype, data)], bias), full[:, :n])
        assert torch.equal(cpu_kernels.quant_linear(x[:, n - 1:n], [(qtype, data)], bias), full[:, n - 1:n])
    # a prefill of any length: 16 rows at a time, each row the same bits
    long = torch.cat([x, x[:, :7] * 2, x[:, :14] - 1], dim=1)  # 37 rows
    y = cpu_kernels.quant_linear(long, [(qtype, data)], bias)
    assert torch.equal(y[:, :16], full)
    assert torch.equal(y[:, 16:23], cpu_kernels.quant_linear(x[:, :7] * 2, [(qtype, data)], bias))
    assert torch.equal(y[:, 23:], cpu_kernels.quant_linear(x[:, :14] - 1, [(qtype, data)], bias))


@kernel
def test_q8_parts_in_several_formats_stack_along_the_outputs():
    torch.manual_seed(0)
    K = 512
    parts = [(cpu_kernels.QUANT_TYPES[f], torch.from_numpy(random_blocks(f, rows, K, seed=i)))
             for i, (f, rows) in enumerate([("Q4_K", 40), ("Q5_0", 8), ("Q6_K", 16), ("Q8_0", 8)])]
    x = torch.randn(2, 3, K)
    y = cpu_kernels.quant_linear(x, parts, None)
    assert y.shape == (2, 3, 72)
    off = 0
    for qtype, data in parts:
        rows = data.shape[0]
        assert torch.equal(y[..., off:off + rows], cpu_kernels.quant_linear(x, [(qtype, data)]))
        off += rows


@kernel
def test_q8_bad_inputs_give_clear_errors():
    q4k, q8_0 = cpu_kernels.QUANT_TYPES["Q4_K"], cpu_kernels.QUANT_TYPES["Q8_0"]
    assert not cpu_kernels.quant_q8_supported(99, 256)
    assert not cpu_kernels.quant_q8_supported(q4k, 100)
    assert not cpu_kernels.quant_q8_supported(q8_0, 32 * 4096)  # longer rows than its buffers take
    data = torch.from_numpy(random_blocks("Q4_K", 4, 256))
    with pytest.raises(ValueError, match="at least 1 row"):
        cpu_kernels.quant_linear(torch.randn(0, 256), [(q4k, data)])
    with pytest.raises(ValueError, match="rows of 144 bytes"):
        cpu_kernels.quant_linear(torch.randn(1, 256), [(q4k, data[:, :100].contiguous())])
    big = torch.zeros(2, cpu_kernels.quant_row_bytes(q8_0, 32 * 4096), dtype=torch.uint8)
    with pytest.raises(ValueError, match="not supported"):
        cpu_kernels.quant_linear(torch.randn(1, 32 * 4096), [(q8_0, big)])


@kernel
def test_the_other_x86_builds_give_the_same_bits(other_build):
    """Without VNNI the integer dot products go through maddubs/madd; no pair can saturate, so the
    integers, and with them every output bit, are the VNNI build's."""
    avx2 = other_build
    torch.manual_seed(0)
    for fmt in sorted(FORMATS):
        qtype, K = cpu_kernels.QUANT_TYPES[fmt], 512
        data = torch.from_numpy(random_blocks(fmt, 64, K, seed=3))
        data.view(-1)[2::7] = 0x80  # extreme bytes (Q8_0: -128, the largest |w|); an fp16 scale stays finite
        x = torch.randn(5, K) * 10
        assert torch.equal(cpu_kernels.quant_linear(x, [(qtype, data)]),
                           cpu_kernels.quant_linear(x, [(qtype, data)], lib=avx2)), fmt


@pytest.mark.real
def test_the_default_for_a_gguf_model_is_gguf_q8(smollm2_path):
    if not cpu_kernels.available():
        pytest.skip("kernel unavailable")
    from specdec.model import load_model
    assert load_model(str(smollm2_path), device="cpu", progress=lambda *a: None).module.weight_format == "gguf-q8"


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
def smollm2_q8(smollm2_path):
    """On its blocks against 8-bit activations (--weight-dtype gguf-q8) and as the fp32 reference."""
    if not cpu_kernels.available():
        pytest.skip(f"kernel unavailable: {cpu_kernels.unavailable_reason()}")
    from specdec.model import load_model
    return (load_model(str(smollm2_path), device="cpu", weight_dtype="gguf-q8", progress=lambda *a: None),
            load_model(str(smollm2_path), device="cpu", weight_dtype="float32", progress=lambda *a: None))


@pytest.mark.real
def test_real_model_q8_verify_rows_are_one_token_steps(smollm2_q8):
    from specdec.model.quant import QuantLinear
    q8, fp32 = smollm2_q8
    assert q8.module.weight_format == "gguf-q8"
    assert not any(isinstance(m, torch.nn.Linear) for m in q8.module.modules())
    assert sum(isinstance(m, QuantLinear) for m in q8.module.modules()) == 4 * q8.module.config.num_layers + 1
    one, ref, verify = steps_against_fp32(q8, fp32)
    for n in (2, 5, 8, 9, 16):  # a verify pass of n positions: the one-token steps' bits
        assert torch.equal(verify(n), torch.cat(one[:n], dim=1))
    # close to the fp32 model: the same top token on most steps, probabilities near
    a, b = torch.cat(one, 1).softmax(-1), torch.cat(ref, 1).softmax(-1)
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.8
    assert 0.5 * (a - b).abs().sum(-1).max() < 0.2  # total variation distance per step


@pytest.mark.real
def test_real_model_q8_speculation_gives_plain_tokens(smollm2_q8):
    from specdec.config import GenerationConfig
    from specdec.drafters.base import NoDrafter
    from specdec.drafters.draft_model import DraftModelDrafter
    from specdec.engine.engine import Engine
    from specdec.model.tokenizer import encode_prompt
    q8, _ = smollm2_q8
    ids = encode_prompt(q8.tokenizer, "Write a Python function that checks whether a number is prime.", chat=True)
    plain = Engine.single(q8.module, NoDrafter(), 512).generate(ids, GenerationConfig(40, 1), q8.eos_ids)
    drafter = DraftModelDrafter(q8.module, q8.module.config.vocab_size, 512, head_rows=8192)
    for k in (3, 8):
        out = Engine.single(q8.module, drafter, 512).generate(ids, GenerationConfig(40, k), q8.eos_ids)
        assert out.tokens == plain.tokens


REPACKABLE = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "IQ4_XS"]


@kernel
@pytest.mark.parametrize("fmt,K", [("Q2_K", 768), ("Q3_K", 768), ("Q4_K", 768), ("Q5_K", 768), ("Q6_K", 768), ("Q8_0", 768), ("Q8_0", 32 * 27),
                                     ("IQ4_NL", 32 * 27), ("IQ4_XS", 768), ("Q4_0", 32 * 27), ("Q4_1", 32 * 27),
                                     ("Q5_0", 32 * 27), ("Q5_1", 768)])
def test_repacked_gemm_is_the_quantized_arithmetic_and_row_count_free(fmt, K):
    """The weights repacked into tiles of 16 rows (quant_rp.h) give the same arithmetic's value, each row
    the same bits at any row count (N = 200: a last tile of 8 valid rows) and in a prefill of any length."""
    torch.manual_seed(0)
    N = 200
    qtype = cpu_kernels.QUANT_TYPES[fmt]
    data = torch.from_numpy(random_blocks(fmt, 208, K, seed=1))
    rtype, packed = cpu_kernels.repack(qtype, data, K)
    packed, data = packed[:N], data[:N]
    assert rtype == cpu_kernels.REPACKED_TYPES[fmt + "_R16"] and cpu_kernels.quant_q8_supported(rtype, K)
    w = gguf_py_dequantize(fmt, data.numpy(), K).double()
    bias = torch.randn(N)
    x = torch.randn(1, 16, K)
    full = cpu_kernels.quant_linear(x, [(rtype, packed)], bias)
    xq = torch.from_numpy(np.stack([(lambda q, d: q.reshape(-1, act_block(fmt)).astype(np.float64) * d[:, None])(
        *reference_activations(r, act_block(fmt))).reshape(-1) for r in x[0].numpy()]))
    ref = xq @ w.T + bias.double()
    scale = (xq.abs() @ w.abs().T).max().item()
    assert (full[0].double() - ref).abs().max().item() < 1e-6 * scale
    for n in range(1, 16 + 1):
        assert torch.equal(cpu_kernels.quant_linear(x[:, :n], [(rtype, packed)], bias), full[:, :n])
        assert torch.equal(cpu_kernels.quant_linear(x[:, n - 1:n], [(rtype, packed)], bias), full[:, n - 1:n])
    long = torch.cat([x, x[:, :7] * 2, x[:, :14] - 1], dim=1)  # 37 rows: chunks of 8 and a rest
    y = cpu_kernels.quant_linear(long, [(rtype, packed)], bias)
    assert torch.equal(y[:, :16], full)
    assert torch.equal(y[:, 16:23], cpu_kernels.quant_linear(x[:, :7] * 2, [(rtype, packed)], bias))
    assert torch.equal(y[:, 23:], cpu_kernels.quant_linear(x[:, :14] - 1, [(rtype, packed)], bias))


@kernel
def test_repacked_rows_gather_and_cut_as_the_matrix():
    from specdec.model.quant import QuantLinear
    K = 512
    for fmt in REPACKABLE:
        layer = QuantLinear([cpu_kernels.repack(cpu_kernels.QUANT_TYPES[fmt],
                                                torch.from_numpy(random_blocks(fmt, 64, K, seed=2)), K)], K)
        x = torch.randn(3, K)
        y = layer(x)
        ids = torch.tensor([5, 63, 0, 17, 17, 40, 2])
        assert torch.equal(layer.rows(ids)(x), y[:, ids]), fmt
        assert torch.equal(layer.first_rows(21)(x), y[:, :21]), fmt
        assert torch.equal(layer.first_rows(21).rows(torch.tensor([20, 3]))(x), y[:, [20, 3]]), fmt


@kernel
def test_repacking_refuses_what_it_cannot_take():
    data = torch.from_numpy(random_blocks("Q4_K", 20, 256))
    with pytest.raises(ValueError, match="rows in 16s"):
        cpu_kernels.repack(cpu_kernels.QUANT_TYPES["Q4_K"], data, 256)
    rtype, packed = cpu_kernels.repack(cpu_kernels.QUANT_TYPES["Q4_K"], data[:16].contiguous(), 256)
    with pytest.raises(ValueError, match="not repackable"):  # tiles are not repacked again
        cpu_kernels.repack(rtype, packed, 256)
    with pytest.raises(ValueError, match="repacked layout"):
        cpu_kernels.quant_dequantize(rtype, packed, 256)


@kernel
def test_the_other_x86_builds_give_the_repacked_kernels_same_bits(other_build):
    """The 256-bit builds run each tile as two 8-lane halves (int16 sub-block sums, and without VNNI
    Q8_0 as |w| . sign(a, w)): the same integers and float steps per row as the AVX-512 build's 16 lanes."""
    avx2 = other_build
    torch.manual_seed(0)
    for fmt in REPACKABLE:
        qtype, K = cpu_kernels.QUANT_TYPES[fmt], 512
        data = torch.from_numpy(random_blocks(fmt, 64, K, seed=3))
        data.view(-1)[2::7] = 0x80  # extreme bytes (Q8_0: -128); an fp16 scale stays finite
        packed = cpu_kernels.repack(qtype, data, K)
        again = cpu_kernels.repack(qtype, data, K, lib=avx2)
        assert torch.equal(packed[1], again[1]), fmt  # one layout for both builds
        for n in (1, 3, 8, 13):
            x = torch.randn(n, K) * 10
            assert torch.equal(cpu_kernels.quant_linear(x, [packed]), cpu_kernels.quant_linear(x, [packed], lib=avx2)), fmt


def reference_sym(w: np.ndarray, bits: int = 4) -> np.ndarray:
    """A draft's symmetric re-encoding of fp32 weights [rows, K], dequantized (bits 4: llama.cpp's Q4_0;
    3: the same rule at 3 bits): per 32, with L = 2^(bits - 1), d = (the largest-magnitude weight) / -L in
    fp16, q = min(2L - 1, trunc(w / d + L + 0.5)), weight = d (q - L)."""
    L = 1 << (bits - 1)
    b = w.reshape(-1, 32).astype(np.float32)
    mx = b[np.arange(b.shape[0]), np.abs(b).argmax(1)]
    mx = np.where(mx != 0, mx, np.float32(0))  # an all-zero block: +0 (llama.cpp's max starts there), d = -0
    d = (mx / np.float32(-L)).astype(np.float16).astype(np.float32)
    d32 = (mx / np.float32(-L)).astype(np.float32)  # the scale the rounding uses (before fp16)
    with np.errstate(divide="ignore"):
        inv = np.where(d32 != 0, np.float32(1) / d32, np.float32(0)).astype(np.float32)
    q = np.clip((b * inv[:, None] + np.float32(L + 0.5)).astype(np.int32), 0, 2 * L - 1)
    return (d[:, None] * (q - L)).reshape(w.shape)


DRAFT_TILES = {"Q4_0_R16": 4, "Q3_0_R16": 3}  # a draft's re-encodings and their bits


def extreme_blocks(fmt: str, rows: int, K: int, q4_0: bool = False) -> np.ndarray:
    """Blocks whose integers are all at their largest (Q4_0, Q4_1: q 15; Q5_0, Q5_1: q 31; Q2_K: q 3, scales 15, mins 15 or 0; Q3_K: q 7 or 0, scales 31
    or -32; Q4_K, Q5_K: q 15 or 31
    and 6-bit scales and mins 63;
    Q6_K: q 63, scales -128 and 127 in turn; Q8_0: -128), with small finite fp16 scales: the sums a 256-bit
    build keeps in int16 are as large as they can be."""
    data = random_blocks(fmt, rows, K, seed=5)
    blocks = data.reshape(-1, {"Q2_K": 84, "Q3_K": 110, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210, "Q8_0": 34, "IQ4_NL": 18,
                               "IQ4_XS": 136, "Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24}[fmt])
    if fmt in ("Q4_K", "Q5_K"):
        blocks[:, 4:] = 0xFF
    elif fmt in ("IQ4_NL", "IQ4_XS"):  # every index 0 (-127); IQ4_XS's scales -32
        blocks[:, 2:] = 0
    elif fmt in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):  # every q 15 (31): all bits after d (and m) set
        blocks[:, 4 if fmt in ("Q4_1", "Q5_1") else 2:] = 0xFF
    elif fmt == "Q2_K":  # q 3 and scales 15; mins 15 in the first half of the rows, 0 in the rest
        blocks[:, :80] = 0xFF
        blocks[len(blocks) // 2:, :16] = 0x0F
    elif fmt == "Q3_K":  # q 7 and scales 31 in the first half of the rows; q 0 (-4) and scales -32 in the rest
        blocks[:, :108] = 0xFF
        blocks[len(blocks) // 2:, :108] = 0
    elif fmt == "Q6_K":
        blocks[:, :192] = 0xFF
        blocks[:, 192:208] = np.array([0x80, 0x7F] * 8, np.uint8)
    else:
        blocks[:, 2:34] = 0x80
        if q4_0:  # one -128 a block, the rest 127: re-encoded as Q4_0, nibbles 0 and 15 (127 / 16 + 8.5, clipped)
            blocks[:, 3:34] = 0x7F
    return data


@kernel
@pytest.mark.parametrize("fmt", REPACKABLE + list(DRAFT_TILES))
def test_the_largest_integers_give_every_build_the_arithmetic(fmt, other_build):
    """Weights and activations at their extremes (every activation +-127): the tiles' int16 sums in a
    256-bit build must not saturate. Each build gives the quantized arithmetic's value and the same bits."""
    K, N = 512, 32
    bits = DRAFT_TILES.get(fmt)
    src = "Q8_0" if bits else fmt
    data = torch.from_numpy(extreme_blocks(src, N, K, q4_0=bits is not None))
    qtype = cpu_kernels.QUANT_TYPES[src]
    packed = cpu_kernels.requant(qtype, data, K, bits) if bits else cpu_kernels.repack(qtype, data, K)
    x = torch.ones(6, K)
    x[1] = -1
    x[2, ::2] = -1
    x[3] = torch.linspace(-3, 3, K)
    x[4:] = torch.randn(2, K) * 10
    y = cpu_kernels.quant_linear(x, [packed])
    assert torch.equal(cpu_kernels.quant_linear(x, [packed], lib=other_build), y)
    if bits:
        w = torch.from_numpy(reference_sym(gguf_py_dequantize(src, data.numpy(), K).numpy(), bits)).double()
    else:
        w = gguf_py_dequantize(fmt, data.numpy(), K).double()
    B = act_block(src) if not bits else 32
    xq = torch.from_numpy(np.stack([(lambda q, d: q.reshape(-1, B).astype(np.float64) * d[:, None])(
        *reference_activations(r, B)).reshape(-1) for r in x.numpy()]))
    scale = (xq.abs() @ w.abs().T).max().item()
    assert (y.double() - xq @ w.T).abs().max().item() < 1e-6 * scale


@kernel
@pytest.mark.parametrize("bits", [4, 3])
@pytest.mark.parametrize("fmt", ["Q8_0", "Q5_0", "Q5_1", "Q6_K"])
def test_a_draft_re_encoding_is_the_symmetric_rounding_of_its_weights(fmt, bits):
    """requant: the weights re-encoded with llama.cpp's Q4_0 rounding (at 3 bits the same rule), in
    Q4_0_R16 / Q3_0_R16 tiles; the GEMM is the quantized arithmetic on those weights and row-count free
    (the other builds' bits: above)."""
    K, N = 512, 48
    qtype = cpu_kernels.QUANT_TYPES[fmt]
    data = torch.from_numpy(random_blocks(fmt, N, K, seed=4))
    rtype, packed = cpu_kernels.requant(qtype, data, K, bits)
    assert rtype == cpu_kernels.REPACKED_TYPES[f"Q{bits}_0_R16"] and packed.numel() == N * K // 32 * (2 + 4 * bits)
    w = torch.from_numpy(reference_sym(gguf_py_dequantize(fmt, data.numpy(), K).numpy(), bits)).double()
    x = torch.randn(9, K)
    y = cpu_kernels.quant_linear(x, [(rtype, packed)])
    xq = torch.from_numpy(np.stack([(lambda q, d: q.reshape(-1, 32).astype(np.float64) * d[:, None])(
        *reference_activations(r, 32)).reshape(-1) for r in x.numpy()]))
    scale = (xq.abs() @ w.abs().T).max().item()
    assert (y.double() - xq @ w.T).abs().max().item() < 1e-6 * scale
    assert torch.equal(cpu_kernels.quant_linear(x[3:4], [(rtype, packed)]), y[3:4])


def decode_q4_0_r16(packed: np.ndarray, rows: int, K: int) -> np.ndarray:
    """Q4_0_R16 tiles (quant_repack.c) back to fp32 weights [rows, K]: a tile a block of 32 weights of
    16 rows, row i's nibbles in four 4-byte groups 64 bytes apart (low nibbles weights 0-15, high
    16-31), its fp16 scale at 256 + 2 i; weight = d (q - 8)."""
    tiles = packed.reshape(rows // 16, K // 32, 288)
    nib = tiles[:, :, :256].reshape(rows // 16, K // 32, 4, 16, 4).transpose(0, 3, 1, 2, 4)  # tile, row, block, g, e
    nib = nib.reshape(rows // 16, 16, K // 32, 16)
    q = np.concatenate([nib & 15, nib >> 4], axis=-1).astype(np.float32) - 8
    d = tiles[:, :, 256:].copy().view(np.float16).astype(np.float32).transpose(0, 2, 1)  # tile, row, block
    return (q * d[..., None]).reshape(rows, K)


def decode_q3_0_r16(packed: np.ndarray, rows: int, K: int) -> np.ndarray:
    """Q3_0_R16 tiles (quant_rp.h's layout) back to fp32 weights [rows, K]: per tile and block, row i's
    4 bytes at 64c + 4i (c = 0..2): byte b holds weight 8c + b at bits 0-2, weight 8c + 4 + b at bits
    4-6, and bit c of weights 24 + b and 28 + b at bits 3 and 7; its fp16 scale at 192 + 2i;
    weight = d (q - 4)."""
    tiles = packed.reshape(rows // 16, K // 32, 224)
    ch = tiles[:, :, :192].reshape(rows // 16, K // 32, 3, 16, 4).astype(np.int32)  # tile, block, chunk, row, byte b
    q = np.zeros((rows // 16, K // 32, 16, 32), np.int32)  # tile, block, row, weight
    for c in range(3):
        for b in range(4):
            byte = ch[:, :, c, :, b]
            q[:, :, :, 8 * c + b] = byte & 7
            q[:, :, :, 8 * c + 4 + b] = byte >> 4 & 7
            q[:, :, :, 24 + b] |= (byte >> 3 & 1) << c
            q[:, :, :, 28 + b] |= (byte >> 7 & 1) << c
    d = tiles[:, :, 192:].copy().view(np.float16).astype(np.float32)  # tile, block, row
    w = (q.astype(np.float32) - 4) * d[..., None]
    return w.transpose(0, 2, 1, 3).reshape(rows, K)


@kernel
@pytest.mark.parametrize("bits", [4, 3])
def test_a_draft_encoding_is_its_rounding_bit_for_bit(other_build, bits):
    """requant's tiles, decoded, are reference_sym of the weights exactly, in this build and the others:
    random blocks, a block whose largest magnitude comes twice with opposite signs (the first one sets
    the scale), and all-zero blocks."""
    K, N = 256, 32
    data = random_blocks("Q8_0", N, K, seed=9)
    blocks = data.reshape(N, K // 32, 34)
    blocks[0, 0, 2:] = 3
    blocks[0, 0, 2 + 5], blocks[0, 0, 2 + 20] = 0x9C, 100  # -100 at weight 5, +100 at 20: the scale is -100's
    blocks[1, 1, 2:] = 3
    blocks[1, 1, 2 + 4], blocks[1, 1, 2 + 30] = 100, 0x9C  # +100 first
    blocks[2, :, 2:] = 0  # all zeros
    blocks[3, 2, 2:] = 0x80  # -128 everywhere: ties throughout
    w = gguf_py_dequantize("Q8_0", data, K).numpy()
    want = reference_sym(w, bits)
    decode = decode_q4_0_r16 if bits == 4 else decode_q3_0_r16
    for lib in (None, other_build):
        rtype, packed = cpu_kernels.requant(cpu_kernels.QUANT_TYPES["Q8_0"], torch.from_numpy(data), K, bits, lib=lib)
        got = decode(packed.numpy(), N, K)
        assert np.array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32))


@kernel
def test_a_draft_re_encoding_refuses_other_widths_and_shapes():
    data = torch.from_numpy(random_blocks("Q8_0", 32, 64, seed=1))
    with pytest.raises(ValueError, match="at \\[3, 4\\] bits, not 5"):
        cpu_kernels.requant(cpu_kernels.QUANT_TYPES["Q8_0"], data, 64, 5)
    with pytest.raises(ValueError, match="rows in 16s"):
        cpu_kernels.requant(cpu_kernels.QUANT_TYPES["Q8_0"], data[:20], 64, 3)


def test_a_bad_or_foreign_target_is_a_clear_error(monkeypatch):
    """SPECDEC_CPU_TARGET names what the kernels build for: a malformed name, and a build this CPU cannot
    run, are refused with the reason (the loader then keeps the fp32 reference), never an illegal instruction."""
    with pytest.raises(RuntimeError, match="SPECDEC_CPU_TARGET='x86-64-v3\\+': name a target"):
        cpu_kernels.target_flags("x86-64-v3+")
    monkeypatch.setenv(cpu_kernels.TARGET_ENV, "+avx2")
    with pytest.raises(RuntimeError, match="name a target"):
        cpu_kernels.target_flags()
    if "avx2" not in cpu_kernels._cpu_flags().split():
        pytest.skip("the foreign-build case needs an x86 host that builds x86-64-v3")
    monkeypatch.delenv(cpu_kernels.TARGET_ENV)
    monkeypatch.setattr(cpu_kernels, "_cpu_flags", lambda: "flags : fpu sse sse2")  # a CPU without AVX2
    with pytest.raises(RuntimeError, match="this CPU lacks avx2, fma"):
        cpu_kernels.load(target="x86-64-v3")


@kernel
def test_amx_rows_keep_their_bits_when_onednn_uses_the_tiles_between_calls():
    """Q4_K on AMX tiles (quant_rp_amx.h; AMX hosts only): 9-16 rows give each row its one-row bits, also
    after torch's bf16 GEMM (oneDNN, on AMX where the CPU has it) used and released the tiles on the same
    threads between two calls (the kernels configure the tiles afresh each call)."""
    if not cpu_kernels._lib.quant_amx_enable(1):
        pytest.skip("no AMX here (or the kernel refused the tile state)")
    K, N = 768, 64
    rtype, packed = cpu_kernels.repack(cpu_kernels.QUANT_TYPES["Q4_K"],
                                       torch.from_numpy(random_blocks("Q4_K", N, K, seed=1)), K)
    x = torch.randn(1, 16, K, generator=torch.Generator().manual_seed(0))
    one = torch.cat([cpu_kernels.quant_linear(x[:, i:i + 1], [(rtype, packed)]) for i in range(16)], 1)
    a = torch.randn(512, 512, dtype=torch.bfloat16)
    for n in (16, 16, 12, 12, 9, 9):  # the same row count again: a configuration the thread thinks it holds
        (a @ a).sum()
        assert torch.equal(cpu_kernels.quant_linear(x[:, :n], [(rtype, packed)]), one[:, :n]), n
