"""Our skinny GEMM kernel (specdec/model/skinny_gemm.c): exact against a float64 reference, the
same bits for a row whatever the row count, and a greedy-exact engine on top of it."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from specdec.config import GenerationConfig
from specdec.drafters.base import NoDrafter
from specdec.drafters.draft_model import DraftModelDrafter, truncated_head
from specdec.drafters.ngram import NgramDrafter
from specdec.engine.generate import SpeculativeGenerator
from specdec.model import cpu_kernels
from specdec.model.cpu_linear import PackedLinear, onednn_available, pack_linears
from tests.conftest import TINY_VOCAB, tiny_model

pytestmark = pytest.mark.skipif(not cpu_kernels.available(),
                                reason=f"kernel unavailable: {cpu_kernels.unavailable_reason()}")


@pytest.mark.parametrize("shape", [(37, 19), (256, 64), (1001, 130), (8, 16), (3, 5)])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_float64_reference(shape, bias):
    torch.manual_seed(0)
    N, K = shape
    w = torch.randn(N, K)
    b = torch.randn(N) if bias else None
    for n in range(1, cpu_kernels.MAX_ROWS + 1):
        x = torch.randn(2, n, K)[1:]  # a leading batch dim, and a row stride of its own
        ref = F.linear(x.double(), w.double(), b.double() if bias else None)
        torch.testing.assert_close(cpu_kernels.skinny_linear(x, w, b), ref.float(), atol=1e-4, rtol=1e-4)


def test_same_bits_for_a_row_whatever_the_row_count():
    torch.manual_seed(1)
    w, b = torch.randn(203, 77), torch.randn(203)
    x = torch.randn(1, cpu_kernels.MAX_ROWS, 77)
    full = cpu_kernels.skinny_linear(x, w, b)
    for n in range(1, cpu_kernels.MAX_ROWS + 1):
        part = cpu_kernels.skinny_linear(x[:, :n], w, b)
        assert torch.equal(part, full[:, :n])
        assert torch.equal(cpu_kernels.skinny_linear(x[:, n - 1:n], w, b), full[:, n - 1:n])


def test_bad_shapes_are_clear_errors():
    with pytest.raises(ValueError, match="shape mismatch"):
        cpu_kernels.skinny_linear(torch.randn(1, 1, 8), torch.randn(4, 9))
    with pytest.raises(ValueError, match="contiguous"):
        cpu_kernels.skinny_linear(torch.randn(1, 1, 8), torch.randn(8, 4).t())
    with pytest.raises(ValueError, match="float32 CPU"):
        cpu_kernels.skinny_linear(torch.randn(1, 1, 8, dtype=torch.bfloat16), torch.randn(4, 8))
    with pytest.raises(ValueError, match="bias is torch.float64"):
        cpu_kernels.skinny_linear(torch.randn(1, 1, 8), torch.randn(4, 8), torch.randn(4, dtype=torch.float64))


@pytest.mark.skipif(not onednn_available(), reason="needs oneDNN (mkldnn) on CPU")
@pytest.mark.parametrize("rows", [1, 2, 5, 16, 17, 40])
def test_packed_linear_routes_rows(rows, monkeypatch):
    torch.manual_seed(0)
    lin = nn.Linear(96, 200)
    layer = PackedLinear(lin, skinny=True)
    calls = []
    real = cpu_kernels.skinny_linear
    monkeypatch.setattr(cpu_kernels, "skinny_linear", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = torch.randn(1, rows, 96)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), lin(x), atol=1e-5, rtol=1e-5)
    assert bool(calls) == (rows <= cpu_kernels.MAX_ROWS)


def test_gradients_fall_back_to_torch():
    lin = nn.Linear(16, 8)
    layer = PackedLinear(lin, skinny=True, pack=False)
    x = torch.randn(1, 1, 16, requires_grad=True)
    layer(x).sum().backward()  # our kernel has no backward; torch's path must take it
    assert x.grad is not None and lin.weight.grad is not None


def test_greedy_equivalence_with_kernel_target_and_draft():
    target = pack_linears(tiny_model(0), skinny=True, pack=False)
    draft = pack_linears(tiny_model(3), skinny=True, pack=False)
    assert target.lm_head.skinny and target.lm_head.packed is None
    prompt = [1, 2, 3, 1, 2, 3, 1, 2, 9, 4]
    cfg = GenerationConfig(40, 5)
    plain = SpeculativeGenerator(target, NoDrafter(), 128).generate(prompt, cfg).tokens
    reference = SpeculativeGenerator(tiny_model(0), NoDrafter(), 128).generate(prompt, cfg).tokens
    assert plain == reference  # same model through torch's GEMMs
    for drafter in (DraftModelDrafter(target, TINY_VOCAB, 128), DraftModelDrafter(draft, TINY_VOCAB, 128, 40),
                    NgramDrafter(3, 1)):
        assert SpeculativeGenerator(target, drafter, 128).generate(prompt, cfg).tokens == plain


def test_truncated_head_keeps_the_kernel():
    model = pack_linears(tiny_model(0), skinny=True, pack=False)
    view = truncated_head(model, 40)
    assert isinstance(view.lm_head, PackedLinear) and view.lm_head.skinny
    assert view.lm_head.weight.data_ptr() == model.lm_head.weight.data_ptr()  # a view, no copy


def test_unavailable_kernel_is_reported(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("SPECDEC_KERNEL_DIR", str(tmp_path / "kernels"))
    with pytest.raises((RuntimeError, OSError)):
        cpu_kernels.load()
