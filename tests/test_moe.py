"""The mixture-of-experts MLP on the torch path (moe.py; the GGUF path and transformers' own class:
tests/test_families.py): a row's routing and output free of its company, and speculative greedy output
equal to plain decoding's."""

import torch

from specdec.config import GenerationConfig
from specdec.drafters.base import NoDrafter
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.engine.engine import Engine
from specdec.model.moe import ROW_BY_ROW
from tests.conftest import TINY_VOCAB, tiny_model

EXPERTS = dict(num_experts=6, experts_per_token=2, expert_intermediate_size=24)


def test_a_rows_experts_and_output_do_not_depend_on_its_company():
    moe = tiny_model(0, **EXPERTS).model.layers[0].mlp
    x = torch.randn(ROW_BY_ROW, moe.gate.in_features, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        weights, ids = moe.route(x)
        alone = [moe.route(x[i:i + 1]) for i in range(len(x))]
        assert all(torch.equal(weights[i], w[0]) and torch.equal(ids[i], e[0]) for i, (w, e) in enumerate(alone))
        assert torch.allclose(weights.sum(-1), torch.ones(len(x)))
        assert len(ids.unique()) > 2  # the tokens spread over the experts
        out = moe(x[None])[0]
        # the experts' GEMMs are torch's here, whose rounding may follow the row count: close, not equal
        assert all(torch.allclose(out[i], moe(x[None, i:i + 1])[0, 0], rtol=1e-5, atol=1e-5) for i in range(len(x)))


def test_speculative_greedy_equals_plain_on_a_mixture_of_experts():
    target = tiny_model(0, **EXPERTS)
    prompt = [5, 17, 3, 88, 41, 5, 17, 3, 88]
    cfg = GenerationConfig(32, 4)
    plain = Engine.single(target, NoDrafter(), 128).generate(prompt, cfg, set()).tokens
    for drafter in (DraftModelDrafter(target, TINY_VOCAB, 128), NgramDrafter(3, 1),
                    DraftModelDrafter(tiny_model(1), TINY_VOCAB, 128)):  # itself, lookup, a dense stranger
        assert Engine.single(target, drafter, 128).generate(prompt, cfg, set()).tokens == plain


def test_a_step_reads_k_of_the_e_experts():
    """The profile's roofline counts what a one-token step reads: each layer's k picked experts, not all E."""
    from specdec.bench.profile import weight_bytes
    dense, moe = tiny_model(0), tiny_model(0, **EXPERTS)
    experts = sum(p.numel() * 4 for n, p in moe.named_parameters() if ".mlp.experts." in n)
    others = sum(p.numel() * 4 for n, p in moe.named_parameters() if ".mlp.experts." not in n and "embed" not in n)
    assert weight_bytes(moe) == round(others + experts * 2 / 6) and weight_bytes(dense) > 0
