"""Token trees through the engine: greedy equivalence for every tree shape, the sampled distribution,
cache compaction, and bad tree settings."""

import pytest
import torch

from specdec.config import GenerationConfig, SamplingParams, TreeConfig
from specdec.drafters.base import DraftState, NoDrafter
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.engine.engine import Engine
from specdec.errors import SpecdecError
from tests.conftest import TINY_VOCAB, tiny_model
from tests.test_engine import N_TRIALS, PROMPTS, SMALL_VOCAB, exact_joint, sample_first3, tv, tv_bound

TREES = [TreeConfig(8, 3, 2), TreeConfig(16, 4, 4), TreeConfig(5, 5, 1), TreeConfig(32, 6, 4),
         TreeConfig(choices=((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)))]


@pytest.fixture(scope="module")
def plain_outputs(tiny_target):
    engine = Engine.single(tiny_target, NoDrafter(), 256)
    return [engine.generate(p, GenerationConfig(40, 4)).tokens for p in PROMPTS]


@pytest.mark.parametrize("tree", TREES, ids=lambda t: f"choices{len(t.choices)}" if t.choices else
                         f"b{t.budget}d{t.depth}k{t.topk}")
@pytest.mark.parametrize("which", ["other", "self"])
def test_greedy_equivalence_for_every_tree_shape(tiny_target, tiny_draft, plain_outputs, tree, which):
    model = tiny_target if which == "self" else tiny_draft
    engine = Engine.single(tiny_target, DraftModelDrafter(model, TINY_VOCAB, 256, tree=tree), 256)
    depth = 3 if tree.choices else tree.depth
    for prompt, expected in zip(PROMPTS, plain_outputs):
        result = engine.generate(prompt, GenerationConfig(40, depth))
        assert result.tokens == expected
        if which == "self":  # the target drafting for itself: its top-1 path is accepted as far as the tree has it
            assert result.stats.tau >= 2.0
            if tree.choices:  # [0], [0, 0], [0, 0, 0] are all there
                assert result.stats.tau == pytest.approx(depth + 1, abs=1.0)


def test_tree_beats_chain_acceptance_with_a_weak_draft(tiny_target, tiny_draft):
    """Same depth: extra branches can only add accepted paths (greedy), so tau never drops."""
    chain = Engine.single(tiny_target, DraftModelDrafter(tiny_draft, TINY_VOCAB, 256), 256)
    tree = Engine.single(tiny_target, DraftModelDrafter(tiny_draft, TINY_VOCAB, 256,
                                                               tree=TreeConfig(24, 3, 4)), 256)
    cfg = GenerationConfig(60, 3)
    taus = [(chain.generate(p, cfg).stats.tau, tree.generate(p, cfg).stats.tau) for p in PROMPTS]
    assert sum(t for _, t in taus) > sum(c for c, _ in taus)


def test_dynamic_tree_shape(tiny_draft):
    drafter = DraftModelDrafter(tiny_draft, TINY_VOCAB, 256, tree=TreeConfig(10, 3, 3))
    drafter.start(PROMPTS[0])
    tree = drafter.propose(DraftState(PROMPTS[0], 3, SamplingParams(), None))
    assert len(tree) == 10 and int(tree.depth.max()) <= 3
    assert all(p < i for i, p in enumerate(tree.parents.tolist()))
    assert drafter.cache.length == len(PROMPTS[0])  # the tree's draft slots are dropped again
    siblings = {}
    for i, p in enumerate(tree.parents.tolist()):
        siblings.setdefault(p, []).append(int(tree.tokens[i]))
    assert all(len(set(s)) == len(s) for s in siblings.values())  # distinct children per node


def test_sampled_tree_output_follows_the_target():
    target = tiny_model(10, vocab_size=SMALL_VOCAB, max_position_embeddings=64)
    draft = tiny_model(11, vocab_size=SMALL_VOCAB, max_position_embeddings=64)
    prompt = [0, 1, 2, 0, 1]
    sampling = SamplingParams(1.0)
    joint = exact_joint(target, prompt, 3, sampling)
    drafter = DraftModelDrafter(draft, SMALL_VOCAB, 64, tree=TreeConfig(6, 2, 2))
    counts = sample_first3(target, drafter, prompt, sampling)
    assert tv(counts, joint, N_TRIALS) < tv_bound(len(joint), N_TRIALS)


@pytest.mark.parametrize("choices, msg", [([], "empty"), ([[0], [0, 0, 1]], "prefix"), ([[0], [-1]], "negative"),
                                          ([[0], [0]], "duplicate")])
def test_bad_choices_are_refused(choices, msg):
    from specdec.tree import choices_to_parents
    with pytest.raises(SpecdecError, match=msg):
        choices_to_parents(choices)


def test_bad_tree_settings_are_clear_errors(tiny_target, tiny_draft):
    with pytest.raises(SpecdecError, match="depth"):
        TreeConfig(budget=3, depth=4)
    drafter = DraftModelDrafter(tiny_draft, TINY_VOCAB, 64, tree=TreeConfig(40, 4, 4))
    with pytest.raises(SpecdecError, match="tree of 40 nodes"):
        Engine.single(tiny_target, drafter, 64).generate(PROMPTS[0], GenerationConfig(20, 4))


def test_keep_compacts_the_accepted_path(tiny_target):
    """After a tree step the cache holds exactly what a plain forward over the emitted tokens gives."""
    drafter = DraftModelDrafter(tiny_target, TINY_VOCAB, 256, tree=TreeConfig(12, 3, 3))
    engine = Engine.single(tiny_target, drafter, 256)
    out = engine.generate(PROMPTS[0], GenerationConfig(10, 3)).tokens
    seq = PROMPTS[0] + out
    ref = tiny_target.new_cache(256)
    tiny_target(torch.tensor([seq[:-1]]), ref, 0)
    n = engine.cache.length
    assert n == len(seq) - 1
    torch.testing.assert_close(engine.cache.k[:, :, :, :n], ref.k[:, :, :, :n], rtol=1e-4, atol=1e-4)
