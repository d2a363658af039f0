"""Logprobs: every emitted token's logprob (and its top alternatives) is log_softmax of the target's raw
logits at the row that predicted it, for plain, chain and tree steps, drafters with a verify of their own,
and the batched slot pool; the prompt's too where asked. Asking changes neither the tokens nor the
acceptance."""

from __future__ import annotations

import pytest
import torch

from specdec.config import GenerationConfig, SamplingParams, TreeConfig
from specdec.drafters.base import NoDrafter
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.layer_skip import LayerSkipDrafter
from specdec.drafters.lookahead import LookaheadDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.engine.generate import SpeculativeGenerator
from specdec.errors import SpecdecError
from specdec.sampling.logprobs import token_logprobs
from specdec.server.stepper import StepwiseGenerator
from tests.conftest import TINY_VOCAB

PROMPTS = [[5, 17, 3, 88, 41], [1, 2, 3, 1, 2, 3, 1, 2], list(range(30, 60))]
TOL = 1e-4
TOP = 5

DRAFTERS = {
    "plain": lambda t, d: NoDrafter(),
    "ngram": lambda t, d: NgramDrafter(3, 1),
    "chain-self": lambda t, d: DraftModelDrafter(t, TINY_VOCAB, 256),
    "chain-other": lambda t, d: DraftModelDrafter(d, TINY_VOCAB, 256),
    "tree-self": lambda t, d: DraftModelDrafter(t, TINY_VOCAB, 256, tree=TreeConfig(8, 3, 2)),
    "tree-other": lambda t, d: DraftModelDrafter(d, TINY_VOCAB, 256, tree=TreeConfig(8, 3, 2)),
    "lookahead": lambda t, d: LookaheadDrafter(2, 3, 2),
    "layer-skip": lambda t, d: LayerSkipDrafter(t, 1, 256),
}


def direct(target, tokens: list[int]) -> torch.Tensor:
    """log_softmax of one plain forward over `tokens`: row i scores tokens[i + 1] # [T, vocab]."""
    cache = target.new_cache(len(tokens) + 8)
    return torch.log_softmax(target(torch.tensor([tokens]), cache, 0)[0].float(), dim=-1)


def assert_scores(target, prompt: list[int], new: list[int], scores, top: int = TOP) -> None:
    """Each new token's logprob and top alternatives against a direct forward over prompt + new."""
    assert len(scores) == len(new)
    lp = direct(target, prompt + new)
    for i, (tok, s) in enumerate(zip(new, scores)):
        row = lp[len(prompt) + i - 1]
        assert s.token == tok
        assert s.logprob == pytest.approx(float(row[tok]), abs=TOL)
        assert len(s.top) == top
        values, ids = row.topk(top)
        assert [v for _, v in s.top] == pytest.approx(values.tolist(), abs=TOL)
        assert {t for t, _ in s.top} == set(ids.tolist()) or values[-1] - row.topk(top + 1).values[-1] < TOL


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("which", list(DRAFTERS))
def test_logprobs_equal_a_direct_forward(tiny_target, tiny_draft, which, temperature):
    engine = SpeculativeGenerator(tiny_target, DRAFTERS[which](tiny_target, tiny_draft), 256)
    accepted = 0
    for seed, prompt in enumerate(PROMPTS):
        cfg = GenerationConfig(24, 3, SamplingParams(temperature, 0, 1.0, seed), logprobs=TOP)
        result = engine.generate(prompt, cfg)
        assert_scores(tiny_target, prompt, result.tokens, result.logprobs)
        assert result.prompt_logprobs is None
        accepted += result.stats.accepted
    if which.endswith("-self") or which == "layer-skip":
        assert accepted > 0  # drafts were accepted: multi-token steps were scored


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("which", ["ngram", "chain-other", "tree-other"])
def test_asking_changes_neither_tokens_nor_acceptance(tiny_target, tiny_draft, which, temperature):
    for seed, prompt in enumerate(PROMPTS):
        runs = []
        for logprobs in (None, 0, 3):
            engine = SpeculativeGenerator(tiny_target, DRAFTERS[which](tiny_target, tiny_draft), 256)
            cfg = GenerationConfig(30, 3, SamplingParams(temperature, 0, 0.95, 100 + seed), logprobs=logprobs)
            r = engine.generate(prompt, cfg)
            runs.append((r.tokens, r.stats.drafted, r.stats.accepted, r.stats.steps))
            assert (r.logprobs is None) == (logprobs is None)
        assert runs[0] == runs[1] == runs[2]


def test_top_zero_gives_the_token_alone_and_eos_cuts_alike(tiny_target):
    engine = SpeculativeGenerator(tiny_target, NgramDrafter(3, 1), 256)
    full = engine.generate(PROMPTS[1], GenerationConfig(30, 4, logprobs=0))
    assert all(s.top == () for s in full.logprobs)
    eos = full.tokens[7]
    cut = engine.generate(PROMPTS[1], GenerationConfig(30, 4, logprobs=0), {eos})
    assert cut.finish_reason == "stop" and cut.tokens == full.tokens[:full.tokens.index(eos) + 1]
    assert cut.logprobs == full.logprobs[:len(cut.tokens)]


def test_prompt_logprobs_equal_a_direct_forward(tiny_target, tiny_draft):
    engine = SpeculativeGenerator(tiny_target, DraftModelDrafter(tiny_draft, TINY_VOCAB, 256), 256)
    prompt = PROMPTS[2]
    r = engine.generate(prompt, GenerationConfig(6, 3, logprobs=2, prompt_logprobs=True))
    assert len(r.prompt_logprobs) == len(prompt) and r.prompt_logprobs[0] is None
    assert_scores(tiny_target, prompt[:1], prompt[1:], r.prompt_logprobs[1:], top=2)
    assert_scores(tiny_target, prompt, r.tokens, r.logprobs, top=2)


def test_batched_pool_scores_every_row_and_the_prompt_past_the_prefix_cache(tiny_target, tiny_draft):
    """Four sequences in three slots, chains verified together, the prompt prefilled in chunks of 7;
    a repeated prompt that asks for the prompt's logprobs is prefilled whole again."""
    pool = StepwiseGenerator(tiny_target, lambda: DraftModelDrafter(tiny_draft, TINY_VOCAB, 256), 256, 3,
                             prefill_chunk=7)
    prompts = PROMPTS + [PROMPTS[2]]
    asks = [GenerationConfig(20, 3, SamplingParams(0.0), logprobs=TOP),
            GenerationConfig(20, 3, SamplingParams(1.0, 0, 1.0, 7), logprobs=TOP),
            GenerationConfig(20, 3, SamplingParams(0.0), logprobs=TOP),
            GenerationConfig(20, 3, SamplingParams(0.0), logprobs=TOP, prompt_logprobs=True)]
    done, pending, widest = {}, list(enumerate(zip(prompts, asks))), 1
    for _ in range(200):
        while pending and pool.free:
            i, (p, cfg) = pending.pop(0)
            pool.add(p, cfg, tag=i)
        if not pool.active:
            break
        for seq in pool.run_round():
            done[seq.tag] = seq
            pool.release(seq)
        widest = max(widest, pool.decode_batch)
    assert len(done) == 4 and widest > 1
    for i, seq in done.items():
        assert_scores(tiny_target, prompts[i], seq.new_tokens, seq.logprobs)
    last = done[3]
    assert last.stats.cached_tokens == 0 and len(last.prompt_logprobs) == len(prompts[3])
    assert_scores(tiny_target, prompts[3][:1], prompts[3][1:], last.prompt_logprobs[1:])
    assert done[2].new_tokens == last.new_tokens


def test_token_logprobs_is_log_softmax():
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.5], [0.0, 0.0, 0.0, 4.0]])
    out = token_logprobs(logits, [0, 3], 2)
    lp = torch.log_softmax(logits, -1)
    assert out[0].logprob == pytest.approx(float(lp[0, 0])) and out[1].logprob == pytest.approx(float(lp[1, 3]))
    assert [t for t, _ in out[0].top] == [2, 1] and out[1].top[0][0] == 3
    with pytest.raises(ValueError):
        token_logprobs(logits, [0], 2)


def test_bad_logprobs_settings_are_refused():
    with pytest.raises(SpecdecError, match="logprobs"):
        GenerationConfig(4, 2, logprobs=-1)
    with pytest.raises(SpecdecError, match="prompt_logprobs"):
        GenerationConfig(4, 2, prompt_logprobs=True)
