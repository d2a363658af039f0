"""GGUF blocks dequantized (quant_dequant.c): each format to exactly gguf-py's fp32 values; bad
input is a clear error; on the real model the blocks are what a step reads."""

import numpy as np
import pytest
import torch

from specdec.model import cpu_kernels
from tests.conftest import KERNEL_FORMATS as FORMATS, random_blocks

kernel = pytest.mark.skipif(not cpu_kernels.available(), reason=f"kernel unavailable: {cpu_kernels.unavailable_reason()}")


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
def test_bad_quant_inputs_give_clear_errors():
    K, q4k = 256, cpu_kernels.QUANT_TYPES["Q4_K"]
    data = torch.from_numpy(random_blocks("Q4_K", 4, K))
    assert cpu_kernels.quant_row_bytes(q4k, 100) == 0  # K not a multiple of the block
    assert cpu_kernels.quant_row_bytes(99, K) == 0  # a type it does not read
    with pytest.raises(ValueError, match="rows of 144 bytes"):
        cpu_kernels.quant_dequantize(q4k, data[:, :100].contiguous(), K)
    with pytest.raises(ValueError, match="not supported"):
        cpu_kernels.quant_dequantize(99, data, K)
    with pytest.raises(ValueError, match="rows of 288 bytes"):  # rows of 512 weights need 288 bytes
        cpu_kernels.quant_linear(torch.randn(1, 2 * K), [(q4k, data)])
    with pytest.raises(ValueError, match="a bias of 3"):
        cpu_kernels.quant_linear(torch.randn(1, K), [(q4k, data)], torch.randn(3))


def test_unavailable_kernel_is_reported(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("SPECDEC_KERNEL_DIR", str(tmp_path / "kernels"))
    with pytest.raises((RuntimeError, OSError)):
        cpu_kernels.load()


@pytest.fixture(scope="module")
def smollm2_pair(smollm2_path):
    """The real model on its blocks (the default) and as the fp32 reference."""
    if not cpu_kernels.available():
        pytest.skip(f"kernel unavailable: {cpu_kernels.unavailable_reason()}")
    from specdec.model import load_model
    return (load_model(str(smollm2_path), device="cpu", progress=lambda *a: None),
            load_model(str(smollm2_path), device="cpu", weight_dtype="float32", progress=lambda *a: None))


@pytest.mark.real
def test_truncated_head_keeps_the_blocks(smollm2_pair):
    from specdec.drafters.draft_model import truncated_head
    from specdec.model.quant import QuantLinear
    quant, _ = smollm2_pair
    cut = truncated_head(quant.module, 4096)
    assert isinstance(cut.lm_head, QuantLinear) and cut.lm_head.out_features == 4096
    x = torch.randn(1, 3, quant.module.config.hidden_size)
    with torch.inference_mode():
        assert torch.equal(cut.lm_head(x), quant.module.lm_head(x)[..., :4096])


@pytest.mark.real
def test_weight_bytes_counts_the_blocks(smollm2_pair):
    from specdec.bench.profile import weight_bytes
    quant, fp32 = smollm2_pair
    assert weight_bytes(quant.module) < weight_bytes(fp32.module) / 3.5  # Q4_1 and Q8_0 against fp32
