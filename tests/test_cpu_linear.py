import pytest
import torch
from torch import nn

from specdec.config import GenerationConfig
from specdec.drafters.base import NoDrafter
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.engine.generate import SpeculativeGenerator
from specdec.model.cpu_linear import PackedLinear, onednn_available, pack_linears, unfused_state_dict
from tests.conftest import TINY_VOCAB, tiny_model

pytestmark = pytest.mark.skipif(not onednn_available(), reason="needs oneDNN (mkldnn) on CPU")


@pytest.mark.parametrize("rows", [1, 2, 5, 9, 33])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_linear(rows, bias):
    torch.manual_seed(0)
    lin = nn.Linear(96, 200, bias=bias)
    x = torch.randn(1, rows, 96)
    torch.testing.assert_close(PackedLinear(lin)(x), lin(x), atol=1e-5, rtol=1e-5)


def test_pack_linears_keeps_names_and_ties():
    model = pack_linears(tiny_model(4, tie_word_embeddings=True))
    assert isinstance(model.lm_head, PackedLinear)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    names = set(unfused_state_dict(model))  # the checkpoint's names, also where q/k/v and gate/up are fused
    assert names == set(tiny_model(4, tie_word_embeddings=True).state_dict())


def test_greedy_equivalence_with_packed_target():
    target = pack_linears(tiny_model(0))
    prompt = [1, 2, 3, 1, 2, 3, 1, 2, 9, 4]
    cfg = GenerationConfig(40, 5)
    plain = SpeculativeGenerator(target, NoDrafter(), 128).generate(prompt, cfg).tokens
    for drafter in (DraftModelDrafter(target, TINY_VOCAB, 128), NgramDrafter(3, 1)):
        assert SpeculativeGenerator(target, drafter, 128).generate(prompt, cfg).tokens == plain
