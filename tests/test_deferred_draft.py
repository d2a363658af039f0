"""A draft model loaded at its drafter's first start (generate's draft: off the first token's path)."""

from __future__ import annotations

import pytest

from specdec.config import GenerationConfig
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.hybrid import HybridDrafter
from specdec.engine.engine import Engine
from specdec.model import cpu_kernels
from specdec.policy.measure import fingerprint
from specdec.settings import SELF_DRAFT, ModelSettings

kernel = pytest.mark.skipif(not cpu_kernels.available(), reason=f"kernel unavailable: {cpu_kernels.unavailable_reason()}")
quiet = lambda *a: None  # noqa: E731
PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"


@pytest.fixture(scope="module")
def loaded(smollm2_path):
    settings = ModelSettings(model=str(smollm2_path), device="cpu")
    target = settings.load(progress=quiet)
    eager = settings.load(SELF_DRAFT, draft=True, progress=quiet, beside=target)
    return settings, target, eager


def deferred_draft(settings, target):
    draft = settings.load(SELF_DRAFT, draft=True, progress=quiet, beside=target, defer=True)
    assert getattr(draft.module, "deferred", False) and not draft.module.loaded
    return draft


@kernel
def test_a_deferred_draft_answers_from_the_header_until_it_starts(loaded):
    settings, target, eager = loaded
    draft = deferred_draft(settings, target)
    assert draft.tokenizer is target.tokenizer  # the target's, taken without building one
    assert draft.module.config == eager.module.config
    assert fingerprint(draft.module) == fingerprint(eager.module)  # the cost cache's entry, before loading
    assert fingerprint(draft.module) != fingerprint(target.module)  # the draft's re-encoded blocks are not the target's
    drafter = DraftModelDrafter(draft.module, target.module.config.vocab_size, 256, head_rows=8192)
    assert not draft.module.loaded and drafter.model is None and drafter.cache is None
    assert drafter.cost_model() is draft.module  # the policy reads its fingerprint without loading it
    lookup = HybridDrafter(drafter)
    lookup.start_lookup_only(target.tokenizer.encode(PROMPT))  # a request the policy keeps off the model
    assert not draft.module.loaded
    assert lookup.load() > 0 and draft.module.loaded
    assert draft.module.get().config == draft.module.config  # the header's shape is the loaded model's
    assert lookup.load() == 0.0


@kernel
def test_a_deferred_draft_drafts_what_the_loaded_one_drafts(loaded):
    settings, target, eager = loaded
    draft = deferred_draft(settings, target)
    ids = target.tokenizer.encode(PROMPT)
    vocab = target.module.config.vocab_size
    results = {}
    for name, module in (("eager", eager.module), ("deferred", draft.module)):
        engine = Engine(target.module, lambda m=module: DraftModelDrafter(m, vocab, 256), 256)
        results[name] = engine.generate(ids, GenerationConfig(40, 3), target.eos_ids)
        assert draft.module.loaded == (name == "deferred")
    assert results["deferred"].tokens == results["eager"].tokens
    assert results["deferred"].stats.steps == results["eager"].stats.steps
    assert results["deferred"].stats.accepted == results["eager"].stats.accepted
    assert results["eager"].stats.load_seconds == 0.0 < results["deferred"].stats.load_seconds
    assert "loaded at its start" in results["deferred"].stats.line()
