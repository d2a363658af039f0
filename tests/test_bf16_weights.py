"""bf16 linear weights on the CPU (--weight-dtype bfloat16): our kernel's bf16 path gives the bits of
the fp32 path on the same values, for every row count it takes; the model keeps fp32 activations
and cache; greedy speculative decoding stays token-exact against plain decoding in that mode."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from specdec.config import GenerationConfig
from specdec.drafters.base import NoDrafter
from specdec.drafters.draft_model import DraftModelDrafter, truncated_head
from specdec.drafters.ngram import NgramDrafter
from specdec.engine.generate import SpeculativeGenerator
from specdec.errors import SpecdecError
from specdec.model import cpu_kernels
from specdec.model.cpu_linear import BF16_MAX_ROWS, PackedLinear, onednn_available, pack_linears, unfused_state_dict
from specdec.model.loading import resolve_weight_dtype
from tests.conftest import TINY_VOCAB, tiny_model

kernel = pytest.mark.skipif(not cpu_kernels.available(), reason=f"kernel unavailable: {cpu_kernels.unavailable_reason()}")
onednn = pytest.mark.skipif(not onednn_available(), reason="needs oneDNN (mkldnn) on CPU")


@kernel
@pytest.mark.parametrize("shape", [(37, 19), (203, 77), (64, 1536), (5, 16)])
def test_bf16_kernel_is_the_fp32_kernel_on_the_same_values(shape):
    torch.manual_seed(0)
    N, K = shape
    w16, b = torch.randn(N, K).bfloat16(), torch.randn(N)
    x = torch.randn(1, BF16_MAX_ROWS, K)
    full = cpu_kernels.skinny_linear(x, w16, b)
    assert full.dtype == torch.float32
    assert torch.equal(full, cpu_kernels.skinny_linear(x, w16.float(), b))  # widening bf16 is exact
    ref = F.linear(x.double(), w16.double(), b.double())
    torch.testing.assert_close(full, ref.float(), atol=1e-4, rtol=1e-4)
    for n in range(1, BF16_MAX_ROWS + 1):  # a row's bits do not depend on the row count
        assert torch.equal(cpu_kernels.skinny_linear(x[:, :n], w16, b), full[:, :n])
        assert torch.equal(cpu_kernels.skinny_linear(x[:, n - 1:n], w16, b), full[:, n - 1:n])


@kernel
def test_bf16_kernel_refuses_bf16_inputs():
    with pytest.raises(ValueError, match="float32 CPU"):
        cpu_kernels.skinny_linear(torch.randn(1, 1, 8).bfloat16(), torch.randn(4, 8).bfloat16())


@onednn
@pytest.mark.parametrize("rows", [1, 5, 9, 16, 17, 40])
@pytest.mark.parametrize("skinny", [True, False])
def test_packed_linear_in_bf16(rows, skinny, monkeypatch):
    torch.manual_seed(0)
    lin = nn.Linear(96, 200)
    layer = PackedLinear(lin, skinny=skinny, weight_dtype=torch.bfloat16)
    assert layer.weight.dtype == torch.bfloat16 and layer.packed is None  # one copy of the weight, in bf16
    assert lin.weight.dtype == torch.float32  # the source layer is not changed
    calls = []
    real = cpu_kernels.skinny_linear
    monkeypatch.setattr(cpu_kernels, "skinny_linear", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = torch.randn(1, rows, 96)
    with torch.no_grad():
        y = layer(x)
        ref = F.linear(x, lin.weight.bfloat16().float(), lin.bias)
    assert y.dtype == torch.float32 and y.shape == (1, rows, 200)
    kernel_rows = skinny and layer.skinny and rows <= BF16_MAX_ROWS
    assert bool(calls) == kernel_rows
    if kernel_rows:
        torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
    else:  # torch's bf16 GEMM rounds the inputs (and its output) to bf16
        torch.testing.assert_close(y, ref, atol=0.1, rtol=0.02)


@onednn
def test_model_keeps_fp32_activations_and_cache():
    model = pack_linears(tiny_model(0), skinny=True, pack=True, weight_dtype=torch.bfloat16)
    assert model.dtype == torch.float32
    assert model.new_cache(16).k.dtype == torch.float32
    linears = [m for m in model.modules() if isinstance(m, PackedLinear)]
    assert linears and all(m.weight.dtype == torch.bfloat16 and m.packed is None for m in linears)
    assert model.model.embed_tokens.weight.dtype == torch.float32
    state = unfused_state_dict(model)  # for HF's baseline: fp32 under the checkpoint's names
    assert all(t.dtype == torch.float32 for t in state.values())
    view = truncated_head(model, 40)
    assert view.lm_head.weight.dtype == torch.bfloat16 and view.lm_head.weight.shape[0] == 40


@onednn
@pytest.mark.parametrize("skinny", [True, False])
def test_greedy_equivalence_with_bf16_weights(skinny):
    target = pack_linears(tiny_model(0), skinny=skinny, pack=False, weight_dtype=torch.bfloat16)
    draft = pack_linears(tiny_model(3), skinny=skinny, pack=False, weight_dtype=torch.bfloat16)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2, 9, 4]
    cfg = GenerationConfig(40, 5)
    plain = SpeculativeGenerator(target, NoDrafter(), 128).generate(prompt, cfg).tokens
    assert len(plain) == 40
    for drafter in (DraftModelDrafter(target, TINY_VOCAB, 128), DraftModelDrafter(draft, TINY_VOCAB, 128, 40),
                    NgramDrafter(3, 1)):
        assert SpeculativeGenerator(target, drafter, 128).generate(prompt, cfg).tokens == plain
    if skinny and cpu_kernels.available():  # k = 8: a 9-row verify, its GEMMs still on the kernel (fp32 inputs)
        cfg8 = GenerationConfig(40, 8)
        assert SpeculativeGenerator(target, DraftModelDrafter(target, TINY_VOCAB, 128), 128).generate(
            prompt, cfg8).tokens == plain


@kernel
@onednn
def test_verify_logits_equal_one_token_steps_in_bf16():
    model = pack_linears(tiny_model(1), skinny=True, pack=False, weight_dtype=torch.bfloat16)
    tokens = torch.tensor([[5, 9, 2, 7, 7, 3, 1, 4, 8, 6, 2]])
    cache = model.new_cache(64)
    model(tokens[:, :3], cache, 0)  # a prefill
    whole = model(tokens[:, 3:], cache, 3)  # an 8-row verify (our fused ops take up to 8 positions)
    cache2 = model.new_cache(64)
    model(tokens[:, :3], cache2, 0)
    steps = torch.cat([model(tokens[:, i:i + 1], cache2, i) for i in range(3, tokens.shape[1])], dim=1)
    assert torch.equal(whole, steps)


def test_weight_dtype_is_checked():
    cpu = torch.device("cpu")
    assert resolve_weight_dtype(cpu, torch.float32, None) is None
    assert resolve_weight_dtype(cpu, torch.float32, "float32") is None
    assert resolve_weight_dtype(cpu, torch.float32, "bfloat16") is torch.bfloat16
    with pytest.raises(SpecdecError, match="unknown --weight-dtype"):
        resolve_weight_dtype(cpu, torch.float32, "int3")
    with pytest.raises(SpecdecError, match="CPU fp32 path"):
        resolve_weight_dtype(cpu, torch.bfloat16, "bfloat16")
    with pytest.raises(SpecdecError, match="CPU fp32 path"):
        resolve_weight_dtype(torch.device("cuda"), torch.bfloat16, "bfloat16")
