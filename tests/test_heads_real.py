"""On SmolLM2-135M (its default quantized path): an EAGLE head trained for a few seconds on standard
library source drafts better than a random one, by the validation estimate of acceptance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specdec.heads.modules import build_head, eagle_config, target_parts
from specdec.model.registry import model_path
from specdec.training.corpus import build_plan
from specdec.training.data import open_source
from specdec.training.extract import extract, load_records
from specdec.training.overlap import OverlapGuard
from specdec.training.train import Trainer, TrainConfig
from specdec.training.vocab import select_vocab, token_counts

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def target(request):
    if not model_path("smollm2-135m-instruct").is_file():
        pytest.skip("smollm2-135m-instruct is not pulled (specdec pull smollm2-135m-instruct)")
    return request.getfixturevalue("smollm2")


def test_a_briefly_trained_eagle_head_beats_a_random_one(target, tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        head, parts, val, trainer = train_briefly(target, tmp_path)
        random_head = build_head(head.config)
        random_head.d2t.copy_(head.d2t)
        random_head.t2d.copy_(head.t2d)
        baseline = Trainer(random_head, parts, TrainConfig(), tmp_path / "random", {}).validate(val)
        trained = trainer.validate(val)
    finally:
        torch.set_num_threads(threads)
    assert trained["positions"] > 100
    assert trained["alpha"][0] > baseline["alpha"][0] + 0.04, (trained, baseline)
    assert trained["tau"] > baseline["tau"]


def train_briefly(target, tmp_path):
    docs = open_source(str(json_package_dir()), target.tokenizer)
    plan = build_plan(docs, target.tokenizer, OverlapGuard([]), 1280, 320, 128, {})
    extract(target.module, plan.chunks, tmp_path / "features", {}, top_k=16)
    records = {r.id: r for r in load_records(tmp_path / "features")}
    train = [records[c.id] for c in plan.chunks if c.split == "train"]
    val = [records[c.id] for c in plan.chunks if c.split == "val"]
    vocab = select_vocab(token_counts([r.tokens.tolist() for r in train], target.module.config.vocab_size), 2048,
                         target.eos_ids)
    head = build_head(eagle_config(target.module.config, vocab.size, intermediate_size=256, max_positions=512))
    head.d2t.copy_(vocab.d2t())
    head.t2d.copy_(vocab.t2d(target.module.config.vocab_size))
    parts = target_parts(target.module, vocab.ids)
    cfg = TrainConfig(lr=3e-3, batch_tokens=256, epochs=12, warmup=5, eval_every=10_000, save_every=10_000)
    trainer = Trainer(head, parts, cfg, tmp_path / "train", {})
    trainer.run(train, val)
    return head, parts, val, trainer


def json_package_dir():
    return Path(json.__file__).parent


def test_the_shipped_head_drafts_for_the_quantized_target_and_greedy_output_is_plain_decodings():
    """The head committed in heads/ (bf16), on qwen2.5-coder-1.5b-instruct's default quantized path:
    chains of 1 and 3 tokens give plain decoding's tokens exactly, and some drafts pass."""
    from specdec.config import GenerationConfig
    from specdec.drafters.base import NoDrafter
    from specdec.drafters.eagle import EagleDrafter
    from specdec.engine.engine import Engine
    from specdec.model import load_model
    from specdec.model.tokenizer import encode_prompt
    from specdec.heads.find import SHIPPED_HEADS, load_head_for
    name = "qwen2.5-coder-1.5b-instruct"
    if not model_path(name).is_file():
        pytest.skip(f"{name} is not pulled (specdec pull {name})")
    loaded = load_model(name)
    prepared = load_head_for(str(SHIPPED_HEADS / f"{name}-eagle"), loaded, name)
    target = loaded.module
    prompt = encode_prompt(loaded.tokenizer, "Write a Python function that returns the n-th Fibonacci number.", True)
    plain = Engine.single(target, NoDrafter(), 512).generate(prompt, GenerationConfig(40, 1), loaded.eos_ids)
    for k in (1, 3):
        engine = Engine.single(target, EagleDrafter(target, prepared, 512), 512)
        out = engine.generate(prompt, GenerationConfig(40, k), loaded.eos_ids)
        assert out.tokens == plain.tokens
        assert out.stats.accepted > 0
