"""Logit bias, repetition / presence / frequency penalties and min_p: each verify row is penalised by its
own text, so speculation keeps plain decoding's output under the same settings (greedy: token for token;
sampled: the exact distribution)."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch

from specdec.config import GenerationConfig, SamplingParams, TreeConfig
from specdec.drafters.base import NoDrafter
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.lookahead import LookaheadDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.engine.engine import Engine
from specdec.errors import SpecdecError
from specdec.sampling.logits import probs_from_logits
from specdec.sampling.penalties import Penalties, paths_of
from specdec.tree import DraftTree
from tests.conftest import TINY_VOCAB, run_engine, tiny_model
from tests.test_engine import N_TRIALS, tv, tv_bound

PENALISED = SamplingParams(repetition_penalty=1.4, presence_penalty=0.7, frequency_penalty=0.3,
                           logit_bias=((4, 2.5), (11, -100.0)))


def reference_row(logits: list[float], prompt: list[int], answer: list[int], s: SamplingParams) -> list[float]:
    """One row penalised by hand: the bias, then the repetition penalty over prompt + answer, then
    presence and frequency over the answer; with penalty_last_n n, all three over the text's last n tokens
    (llama.cpp's penalties sampler: its ring buffer of the last n tokens accepted, the prompt's first)."""
    bias = dict(s.logit_bias)
    window = (prompt + answer)[-s.penalty_last_n:] if s.penalty_last_n else None
    out = []
    for t, v in enumerate(logits):
        v += bias.get(t, 0.0)
        if (t in window) if window is not None else (t in prompt or t in answer):
            v = v / s.repetition_penalty if v > 0 else v * s.repetition_penalty
        n = (window if window is not None else answer).count(t)
        out.append(v - s.frequency_penalty * n - s.presence_penalty * (n > 0))
    return out


@pytest.mark.parametrize("last_n", [0, 3, 6, 100])
def test_each_row_is_penalised_by_its_own_text(last_n):
    """A tree's rows (root, then every node) against the hand-computed rows, with tokens repeated in the
    prompt, the answer and along the paths; and with llama.cpp's window of the last n tokens, short
    enough to drop the prompt and part of the answer, or longer than the text."""
    vocab, prompt, answer = 16, [1, 2, 3, 2], [5, 3, 5, 7]
    tree = DraftTree(torch.tensor([5, 9, 5, 7, 7]), torch.tensor([-1, -1, 0, 2, 1]))
    paths = paths_of(tree)
    assert paths == [[], [5], [9], [5, 5], [5, 5, 7], [9, 7]]
    logits = torch.randn(len(paths), vocab, generator=torch.Generator().manual_seed(0)) * 3
    s = dataclasses.replace(PENALISED, logit_bias=((4, 2.5), (9, -1.0)), penalty_last_n=last_n)
    pen = Penalties(s, prompt, vocab)
    pen.rows(answer[:2], [[]])  # counted in two calls, as a generation goes
    got = pen.rows(answer, paths).apply(logits)
    for j, path in enumerate(paths):
        want = reference_row(logits[j].tolist(), prompt, answer + path, s)
        torch.testing.assert_close(got[j], torch.tensor(want), rtol=1e-6, atol=1e-5)
    assert paths_of(DraftTree.chain(torch.tensor([3, 3, 8]))) == [[], [3], [3, 3], [3, 3, 8]]


def test_min_p_drops_what_is_below_its_share_of_the_top_token():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.12, 0.08]]))
    got = probs_from_logits(logits, SamplingParams(1.0, min_p=0.2))  # floor 0.1: 0.08 goes
    torch.testing.assert_close(got, torch.tensor([[0.5, 0.3, 0.12, 0.0]]) / 0.92)
    assert torch.equal(probs_from_logits(logits, SamplingParams(1.0, min_p=1.0)), torch.tensor([[1.0, 0, 0, 0]]))


@pytest.mark.parametrize("sampling", [
    PENALISED,
    SamplingParams(repetition_penalty=0.8),  # below 1: seen tokens favoured, drafts that repeat pass more often
    SamplingParams(logit_bias=((7, 100.0),)),  # one token forced: every draft fails
    dataclasses.replace(PENALISED, penalty_last_n=4),  # llama.cpp's counting: the last 4 tokens
], ids=["all", "repetition-below-1", "forced", "window"])
@pytest.mark.parametrize("method", ["draft", "draft-on-device", "ngram", "tree", "lookahead", "batched"])
def test_greedy_output_is_plain_decodings_under_the_same_penalties(tiny_target, tiny_draft, sampling, method):
    prompts = [[5, 17, 3, 5, 17, 3, 5], [1, 2, 3, 1, 2, 3, 1, 2], list(range(30, 44))]
    cfg = GenerationConfig(40, 4, sampling)
    expected = [Engine.single(tiny_target, NoDrafter(), 256).generate(p, cfg).tokens for p in prompts]
    unpenalised = [Engine.single(tiny_target, NoDrafter(), 256).generate(p, GenerationConfig(40, 4)).tokens
                   for p in prompts]
    assert expected != unpenalised  # the settings bite
    factory = {"draft": lambda: DraftModelDrafter(tiny_target, TINY_VOCAB, 256),  # the target's own copy drafts
               "draft-on-device": lambda: DraftModelDrafter(tiny_draft, TINY_VOCAB, 256, on_device=True),
               "ngram": lambda: NgramDrafter(3, 1),
               "tree": lambda: DraftModelDrafter(tiny_target, TINY_VOCAB, 256, tree=TreeConfig(8, 3, 2)),
               "lookahead": lambda: LookaheadDrafter(2, 3, 2),
               "batched": lambda: DraftModelDrafter(tiny_target, TINY_VOCAB, 256)}[method]
    if method == "batched":  # three slots verified together (one forward over ragged rows)
        got = run_engine(Engine(tiny_target, factory, 256, max_batch=3), prompts, cfg, set(), limits=(None,))
        assert [got[i] for i in range(len(prompts))] == expected
        return
    for p, want in zip(prompts, expected):
        result = Engine.single(tiny_target, factory(), 256).generate(p, cfg)
        assert result.tokens == want
    if method == "draft" and sampling is PENALISED:
        assert result.stats.accepted > 0  # the drafts are really verified, not all rejected


SMALL_VOCAB = 3


def penalised_joint(model, prompt: list[int], n: int, s: SamplingParams) -> dict:
    """P(t1..tn | prompt) under the penalties, by enumeration: each row penalised by hand by its own text."""
    joint = {}
    for seq in itertools.product(range(SMALL_VOCAB), repeat=n):
        logits = model(torch.tensor([prompt + list(seq)]), model.new_cache(64), 0)[0]  # [T, vocab]
        p = 1.0
        for i, t in enumerate(seq):
            row = reference_row(logits[len(prompt) - 1 + i].tolist(), prompt, list(seq[:i]), s)
            p *= probs_from_logits(torch.tensor([row]), s)[0, t].item()
        joint[seq] = p
    return joint


@pytest.mark.parametrize("method", ["plain", "draft", "ngram"])
def test_speculative_sampling_keeps_the_penalised_distribution(method):
    """The first three tokens' joint law under penalties, a bias and min_p, against the enumeration."""
    target = tiny_model(10, vocab_size=SMALL_VOCAB, max_position_embeddings=64)
    draft = tiny_model(11, vocab_size=SMALL_VOCAB, max_position_embeddings=64)
    prompt = [0, 1, 0, 1, 0]  # token 2 unseen: the repetition penalty parts the tokens
    s = SamplingParams(1.0, min_p=0.05, repetition_penalty=1.5, presence_penalty=0.6, frequency_penalty=0.4,
                       logit_bias=((1, 0.8),))
    joint = penalised_joint(target, prompt, 3, s)
    bound = tv_bound(len(joint), N_TRIALS)
    unpenalised = penalised_joint(target, prompt, 3, SamplingParams(1.0))
    assert 0.5 * sum(abs(joint[k] - unpenalised[k]) for k in joint) > 1.5 * bound  # the test can tell them apart
    drafter = {"plain": NoDrafter(), "draft": DraftModelDrafter(draft, SMALL_VOCAB, 64), "ngram": NgramDrafter(2, 1)}
    engine = Engine.single(target, drafter[method], capacity=64)
    counts: dict = {}
    for seed in range(N_TRIALS):
        out = engine.generate(prompt, GenerationConfig(4, 3, dataclasses.replace(s, seed=seed))).tokens[:3]
        counts[tuple(out)] = counts.get(tuple(out), 0) + 1
    assert tv(counts, joint, N_TRIALS) < bound
    assert math.isclose(sum(joint.values()), 1.0, rel_tol=1e-5)


def test_bad_settings_are_clear_errors(tiny_target):
    for bad, match in [(dict(min_p=1.5), "min_p"), (dict(repetition_penalty=0.0), "repetition_penalty"),
                       (dict(presence_penalty=3.0), "presence_penalty"), (dict(frequency_penalty=-2.5), "frequency"),
                       (dict(logit_bias=((-1, 1.0),)), "logit_bias"), (dict(logit_bias=((3, 200.0),)), "logit_bias")]:
        with pytest.raises(SpecdecError, match=match):
            SamplingParams(**bad)
    engine = Engine.single(tiny_target, NoDrafter(), 64)
    with pytest.raises(SpecdecError, match="logit_bias names token 96"):
        engine.generate([1, 2], GenerationConfig(4, 1, SamplingParams(logit_bias=((TINY_VOCAB, 1.0),))))


def test_bad_flags_are_clear_errors(capsys):
    """--logit-bias takes ID=BIAS pairs; values out of range are the sampling settings' errors."""
    from tests.test_cli import argparse_error, cli_error
    for bad in ("28", "x=1", "5=high"):
        assert "ID=BIAS" in argparse_error(["generate", "--logit-bias", bad, "hi"], capsys)
    assert "logit_bias" in cli_error(["generate", "--logit-bias", "5=300", "hi"], capsys)
    assert "repetition_penalty" in cli_error(["generate", "--repetition-penalty", "0", "hi"], capsys)
    for bad in ("top_k,top_k", "top_k,dry"):
        assert "at most once" in argparse_error(["generate", "--samplers", bad, "hi"], capsys)
    from specdec.cli import build_parser
    assert build_parser().parse_args(["generate", "--samplers", "top_p;temperature", "hi"]).order == (
        "top_p", "temperature", "min_p", "top_k")


@pytest.mark.parametrize("last_n", [0, 4])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("batched", [False, True])
def test_a_draft_model_drafts_from_the_penalised_distribution(tiny_target, temperature, batched, last_n):
    """The target's own copy drafting under the penalties guesses exactly what the target keeps: its
    penalised q equals p (up to rounding), so every drafted token is accepted, greedy or sampled
    (min(1, p/q) = 1). A draft that ignored the penalties would lose the tokens they change."""
    prompts = [[5, 17, 3, 5, 17, 3, 5], [1, 2, 3, 1, 2, 3, 1, 2], list(range(30, 44))]
    sampling = dataclasses.replace(PENALISED, temperature=temperature, seed=3, penalty_last_n=last_n)
    cfg = GenerationConfig(40, 4, sampling)
    drafter = lambda: DraftModelDrafter(tiny_target, TINY_VOCAB, 256)  # noqa: E731
    if batched:  # three slots: the pool drafts their chains together, one forward a position
        engine, stats = Engine(tiny_target, drafter, 256, max_batch=3), []
        for i, p in enumerate(prompts):
            engine.add_request(p, cfg, set(), tag=i)
        while engine.has_work:
            stats += [seq.stats for seq in engine.step()]
        assert len(stats) == len(prompts)
    else:
        stats = [Engine.single(tiny_target, drafter(), 256).generate(p, cfg).stats for p in prompts]
    drafted, accepted = sum(s.drafted for s in stats), sum(s.accepted for s in stats)
    assert drafted > 60 and accepted == drafted


@pytest.mark.parametrize("drafter", ["draft", "head", "head-pooled"])
def test_drafters_draft_what_a_forcing_bias_leaves(tiny_target, tiny_draft, drafter):
    """A logit bias of +100 on one token makes the target emit nothing else. A drafter of other
    weights (a random draft model, a random EAGLE head over part of the vocabulary; alone, and
    a head pooled over three slots) that drafts from its logits with the same bias drafts that
    token every time, so every draft is accepted; one that ignored the bias would draft its own guesses."""
    from specdec.drafters.eagle import EagleDrafter
    from tests.test_eagle import eagle_head
    prompts = [[5, 17, 3, 5, 17, 3, 5], [1, 2, 3, 1, 2, 3, 1, 2], list(range(30, 44))]
    cfg = GenerationConfig(30, 3, SamplingParams(logit_bias=((7, 100.0),)))
    if drafter == "draft":
        make = lambda: DraftModelDrafter(tiny_draft, TINY_VOCAB, 256)  # noqa: E731
    else:
        head = eagle_head(tiny_target, list(range(0, TINY_VOCAB, 2)) + [7])
        make = lambda: EagleDrafter(tiny_target, head, 256)  # noqa: E731
    engine = Engine(tiny_target, make, 256, max_batch=3 if drafter == "head-pooled" else 1)
    seqs = [engine.add_request(p, cfg, set(), tag=i) for i, p in enumerate(prompts)]
    while any(s.finish_reason is None for s in seqs):
        engine.step()
    assert all(s.new_tokens == [7] * 30 for s in seqs)
    drafted, accepted = sum(s.stats.drafted for s in seqs), sum(s.stats.accepted for s in seqs)
    assert drafted > 40 and accepted == drafted
