"""Lookahead decoding: the window layout, the n-gram pool and its trie, greedy equivalence with plain
decoding, the sampled distribution, and bad settings."""

import pytest
import torch

from specdec.config import GenerationConfig, SamplingParams
from specdec.drafters.base import DraftState, NoDrafter
from specdec.drafters.lookahead import LookaheadDrafter, window_layout
from specdec.engine.engine import Engine
from specdec.errors import SpecdecError
from tests.conftest import tiny_model
from tests.test_engine import N_TRIALS, PROMPTS, SMALL_VOCAB, exact_joint, sample_first3, tv, tv_bound


def test_window_layout_two_levels_three_columns():
    offsets, mask = window_layout(2, 3)
    assert offsets.tolist() == [1, 2, 3, 2, 3, 4]  # level r, column c at r + 1 + c
    expected = [  # columns: (0,0) (0,1) (0,2) (1,0) (1,1) (1,2)
        [1, 0, 0, 0, 0, 0],  # (0,0): itself
        [1, 1, 0, 0, 0, 0],  # (0,1): level 0 up to its column
        [1, 1, 1, 0, 0, 0],
        [1, 0, 0, 1, 0, 0],  # (1,0): level 0 column 0, then itself: offsets 1, 2
        [1, 1, 0, 0, 1, 0],  # (1,1): offsets 1, 2 on level 0, then 3
        [1, 1, 1, 0, 0, 1],
    ]
    assert mask.int().tolist() == expected
    # every row sees one position per offset, consecutively from 1: an ordinary causal sequence
    for row in range(6):
        seen = sorted(offsets[mask[row]].tolist())
        assert seen == list(range(1, len(seen) + 1)) and seen[-1] == offsets[row]


def test_pool_keeps_the_most_recent_continuations_per_key():
    d = LookaheadDrafter(window=2, ngram=3, candidates=2)
    d.start([7, 8])
    for gram in [(1, 2, 3), (1, 4, 5), (1, 2, 3), (1, 6, 7), (9, 9, 9)]:
        d.add_ngram(gram)
    assert list(d.pool[1]) == [(2, 3), (6, 7)]  # (4, 5) was the oldest when (6, 7) came
    assert d.pool_size() == 3


def test_proposal_is_a_trie_of_the_continuations_of_the_last_token():
    d = LookaheadDrafter(window=2, ngram=4, candidates=4)
    d.start([1])
    for gram in [(5, 1, 2, 3), (5, 1, 2, 9), (5, 4, 4, 4), (6, 1, 1, 1)]:
        d.add_ngram(gram)
    tree = d.propose(DraftState([0, 5], 3, SamplingParams(), None))
    # most recent first: 4 4 4, then 1 2 9, then 1 2 3 sharing the prefix 1 2
    assert tree.tokens.tolist() == [4, 4, 4, 1, 2, 9, 3]
    assert tree.parents.tolist() == [-1, 0, 1, -1, 3, 4, 4]
    short = d.propose(DraftState([0, 5], 1, SamplingParams(), None))
    assert short.tokens.tolist() == [4, 1] and short.parents.tolist() == [-1, -1]
    assert len(d.propose(DraftState([0, 3], 3, SamplingParams(), None))) == 0  # no n-gram starts with 3
    # the context room caps the nodes after the window's own slots
    capped = d.propose(DraftState([0, 5], 3, SamplingParams(), None, max_nodes=3 * 2 + 2))
    assert len(capped) == 2


@pytest.fixture(scope="module")
def plain_outputs(tiny_target):
    engine = Engine.single(tiny_target, NoDrafter(), 256)
    return [engine.generate(p, GenerationConfig(40, 4)).tokens for p in PROMPTS]


@pytest.mark.parametrize("window, ngram, candidates", [(4, 3, 4), (1, 2, 1), (6, 5, 3), (3, 2, 8)])
def test_greedy_equivalence(tiny_target, plain_outputs, window, ngram, candidates):
    drafter = LookaheadDrafter(window, ngram, candidates)
    engine = Engine.single(tiny_target, drafter, 256)
    for prompt, expected in zip(PROMPTS, plain_outputs):
        result = engine.generate(prompt, GenerationConfig(40, ngram - 1))
        assert result.tokens == expected
    assert len(drafter.levels) == ngram - 1 and drafter.pool_size() > 0


def test_greedy_equivalence_at_the_end_of_the_context(tiny_target):
    """A context that holds exactly prompt + budget + one step's scratch slots (tree + window)."""
    prompt = PROMPTS[1]
    plain = Engine.single(tiny_target, NoDrafter(), 64).generate(prompt, GenerationConfig(56, 4)).tokens
    drafter = LookaheadDrafter(4, 3, 4)
    engine = Engine.single(tiny_target, drafter, len(prompt) + 56 + drafter.max_tree_nodes)
    assert engine.generate(prompt, GenerationConfig(56, 2)).tokens == plain
    with pytest.raises(SpecdecError, match="does not fit"):
        engine.generate(prompt, GenerationConfig(57, 2))


def test_jacobi_guesses_are_accepted_on_a_predictable_model():
    """A 3-token vocabulary makes the Jacobi n-grams right often: more than one token per step."""
    target = tiny_model(10, vocab_size=SMALL_VOCAB, max_position_embeddings=256)
    engine = Engine.single(target, LookaheadDrafter(4, 4, 4), 256)
    result = engine.generate([0, 1, 2, 0, 1], GenerationConfig(60, 3))
    assert result.stats.tau > 1.2


def test_sampled_output_follows_the_target():
    target = tiny_model(10, vocab_size=SMALL_VOCAB, max_position_embeddings=64)
    prompt = [0, 1, 2, 0, 1]
    sampling = SamplingParams(1.0)
    joint = exact_joint(target, prompt, 3, sampling)
    counts = sample_first3(target, LookaheadDrafter(3, 3, 3), prompt, sampling)
    assert tv(counts, joint, N_TRIALS) < tv_bound(len(joint), N_TRIALS)


@pytest.mark.parametrize("kwargs, msg", [({"window": 0}, "window"), ({"ngram": 1}, "n-gram"),
                                         ({"candidates": 0}, "candidates")])
def test_bad_settings(kwargs, msg):
    with pytest.raises(SpecdecError, match=msg):
        LookaheadDrafter(**kwargs)


def test_window_never_reaches_the_committed_cache(tiny_target):
    """After a step the cache holds exactly the committed tokens' keys: equal to a plain prefill's."""
    prompt = PROMPTS[2]
    drafter = LookaheadDrafter(5, 3, 4)
    engine = Engine.single(tiny_target, drafter, 256)
    out = engine.generate(prompt, GenerationConfig(20, 2)).tokens
    seq = prompt + out[:-1]  # the last token is emitted but not yet fed
    assert engine.cache.length == len(seq)
    ref = tiny_target.new_cache(256)
    tiny_target(torch.tensor([seq]), ref, 0)
    torch.testing.assert_close(engine.cache.k[:, :, :, :len(seq)], ref.k[:, :, :, :len(seq)], atol=1e-4, rtol=1e-4)
