"""Greedy equivalence on the real SmolLM2-135M: every drafter reproduces plain decoding exactly."""

import pytest

from specdec.config import GenerationConfig
from specdec.drafters.base import NoDrafter
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.engine.engine import Engine
from specdec.model.tokenizer import encode_prompt
from tests.conftest import tiny_model

pytestmark = pytest.mark.real
PROMPTS = ["Write a Python function that returns the factorial of n.",
           "List three facts about the moon, then repeat the list in reverse order."]


@pytest.fixture(scope="module", params=["default", "float32"])
def smollm2_variant(request, smollm2_path):
    """The real model on its backend by default (the GGUF blocks against 8-bit activations where our
    kernels build) and as the fp32 torch reference."""
    from specdec.model import load_model
    return load_model(str(smollm2_path), device="cpu", weight_dtype=None if request.param == "default" else "float32")


@pytest.fixture(scope="module")
def prompts_and_plain(smollm2_variant):
    smollm2 = smollm2_variant
    ids = [encode_prompt(smollm2.tokenizer, p, chat=True) for p in PROMPTS]
    engine = Engine.single(smollm2.module, NoDrafter(), 512)
    return ids, [engine.generate(p, GenerationConfig(48, 1), smollm2.eos_ids).tokens for p in ids]


@pytest.mark.parametrize("which, k", [("self", 4), ("random", 3), ("ngram", 4), ("ngram", 1)])
def test_smollm2_greedy_equivalence(smollm2_variant, prompts_and_plain, which, k):
    smollm2 = smollm2_variant
    vocab = smollm2.module.config.vocab_size
    drafter = {"self": lambda: DraftModelDrafter(smollm2.module, vocab, 512),
               "random": lambda: DraftModelDrafter(tiny_model(5, vocab_size=vocab), vocab, 512),
               "ngram": lambda: NgramDrafter(3, 1)}[which]()
    engine = Engine.single(smollm2.module, drafter, 512)
    ids, plain = prompts_and_plain
    for prompt, expected in zip(ids, plain):
        result = engine.generate(prompt, GenerationConfig(48, k), smollm2.eos_ids)
        assert result.tokens == expected, f"{which} k={k}: first difference at " \
            f"{next(i for i, (a, b) in enumerate(zip(result.tokens, expected)) if a != b)}"
        if which == "self":
            assert result.stats.alpha == 1.0
