"""The engine on CUDA in bf16 with no code changes. Runs only where CUDA exists."""

import pytest
import torch

from specdec.config import GenerationConfig
from specdec.drafters.base import NoDrafter
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.engine.generate import SpeculativeGenerator
from tests.conftest import TINY_VOCAB, tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_greedy_equivalence(dtype):
    target = tiny_model(0).to("cuda", dtype)
    prompt = [5, 17, 3, 88, 41, 5, 17]
    cfg = GenerationConfig(32, 4)
    plain = SpeculativeGenerator(target, NoDrafter(), 128).generate(prompt, cfg).tokens
    for drafter in (DraftModelDrafter(target, TINY_VOCAB, 128), NgramDrafter(3, 1)):
        assert SpeculativeGenerator(target, drafter, 128).generate(prompt, cfg).tokens == plain
