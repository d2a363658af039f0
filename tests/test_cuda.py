"""The engine on CUDA, bf16 and fp32, with no code changes: every drafter, trees, the adaptive policy,
the batched engine, the server's stepper, sampling, CUDA graphs and the CLI. Runs only where CUDA
exists (the CPU suite covers the same paths on CPU)."""

import functools

import pytest
import torch

from specdec.config import GenerationConfig, SamplingParams, TreeConfig
from specdec.drafters.base import NoDrafter
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.hybrid import HybridDrafter
from specdec.drafters.layer_skip import LayerSkipDrafter
from specdec.drafters.lookahead import LookaheadDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.drafters.suffix import SuffixDrafter
from specdec.model.cuda_graphs import enable_cuda_graphs
from specdec.engine.engine import Engine
from specdec.policy import AdaptivePolicy, CostModel, PolicyConfig
from tests.conftest import TINY_VOCAB, run_engine, tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CAP = 256
PROMPTS = [[5, 17, 3, 88, 41, 5, 17], [1, 2, 3, 1, 2, 3, 1, 2], list(range(30, 50))]
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@functools.cache
def models(dtype: str, graphs: bool):
    """(target, draft) on CUDA; with graphs, their fixed-shape forwards replay as CUDA graphs."""
    target = tiny_model(0).to("cuda", DTYPES[dtype])
    draft = tiny_model(1, num_layers=1).to("cuda", DTYPES[dtype])
    if graphs:
        enable_cuda_graphs(target)
        enable_cuda_graphs(draft)
    return target, draft


@functools.cache
def plain(dtype: str) -> list[list[int]]:
    target, _ = models(dtype, False)
    return [Engine.single(target, NoDrafter(), CAP).generate(p, GenerationConfig(32, 4)).tokens for p in PROMPTS]


def assert_greedy_match(model, dtype, prompt, got, expected, what):
    """fp32: the same tokens. bf16: the same tokens up to the first divergence, which must sit on a
    near-tie of the target's logits (within 4 bf16 ulps of the largest): verifying k + 1 positions or
    a ragged batch rounds differently from a one-token step, so a tie within rounding may break either
    way there, and only there (vLLM and HF document the same)."""
    if got == expected:
        return
    assert dtype == "bf16", f"{what}: diverged in fp32"
    i = next((j for j, (a, b) in enumerate(zip(got, expected)) if a != b), None)
    assert i is not None, f"{what}: one output is a prefix of the other ({len(got)} vs {len(expected)} tokens)"
    x = torch.tensor([prompt + expected[:i]], device="cuda")
    logits = model(x, model.new_cache(x.shape[1] + 1), 0)[0, -1].float()  # model: eager, no graphs
    gap = (logits[expected[i]] - logits[got[i]]).abs().item()
    assert gap <= 4 * 2 ** -7 * logits.abs().max().item(), f"{what}: diverged at token {i} with a logit gap of {gap}"


def adaptive():  # free verification: the policy drafts, choosing k per step
    return AdaptivePolicy(CostModel({1: 1.0, 9: 1.0}, 0.1), PolicyConfig(k_max=6))


DRAFTERS = {
    "none": lambda t, d: NoDrafter(),
    "ngram": lambda t, d: NgramDrafter(3, 1),
    "suffix": lambda t, d: SuffixDrafter(),
    "lookahead": lambda t, d: LookaheadDrafter(4, 3, 4),
    "layer-skip": lambda t, d: LayerSkipDrafter(t, 1, CAP),
    "draft": lambda t, d: DraftModelDrafter(d, TINY_VOCAB, CAP),
    "self": lambda t, d: DraftModelDrafter(t, TINY_VOCAB, CAP),  # every draft accepted
    "truncated-head": lambda t, d: DraftModelDrafter(t, TINY_VOCAB, CAP, head_rows=48),
    "p-min": lambda t, d: DraftModelDrafter(d, TINY_VOCAB, CAP, p_min=0.3),
    "tree": lambda t, d: DraftModelDrafter(d, TINY_VOCAB, CAP, tree=TreeConfig(10, 3, 3)),
    "self-tree": lambda t, d: DraftModelDrafter(t, TINY_VOCAB, CAP, tree=TreeConfig(12, 3, 3)),
    "hybrid": lambda t, d: HybridDrafter(DraftModelDrafter(d, TINY_VOCAB, CAP), copy_n=2),
}


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("method", list(DRAFTERS))
def test_greedy_equals_plain_for_every_drafter(method, dtype, graphs):
    target, draft = models(dtype, graphs)
    for policy in (None, adaptive()):
        engine = Engine.single(target, DRAFTERS[method](target, draft), CAP, policy=policy)
        for prompt, expected in zip(PROMPTS, plain(dtype)):
            result = engine.generate(prompt, GenerationConfig(32, 4))
            assert_greedy_match(models(dtype, False)[0], dtype, prompt, result.tokens, expected,
                                f"{method} {dtype} graphs={graphs} policy={policy is not None}: {prompt}")
            if method == "self" and policy is None and dtype == "fp32":
                assert result.stats.alpha == 1.0


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("method", ["none", "ngram", "draft"])
def test_batched_greedy_equals_single_sequence(method, dtype, graphs):
    target, draft = models(dtype, graphs)
    prompts = PROMPTS + [[7], [9, 9, 9, 9, 9, 9]]
    cfg = GenerationConfig(30, 4)
    expected = [Engine.single(target, DRAFTERS[method](target, draft), CAP).generate(p, cfg).tokens
                for p in prompts]
    stepper = Engine(target, lambda: DRAFTERS[method](target, draft), CAP, max_batch=3)
    done = run_engine(stepper, prompts, cfg, set(), limits=(None,))
    for i, p in enumerate(prompts):
        assert_greedy_match(models(dtype, False)[0], dtype, p, done[i], expected[i], f"{method} row {i}")


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("method", ["none", "ngram", "draft", "tree", "hybrid"])
def test_stepper_equals_engine(tiny_qwen_dir, method, dtype):
    """The server's slot pool (pooled drafting, batched verify, a changing k limit) on CUDA."""
    from specdec.model import load_model
    from tests.conftest import make_drafter
    dt = {"bf16": "bfloat16", "fp32": "float32"}[dtype]
    target = load_model(str(tiny_qwen_dir), device="cuda", dtype=dt, progress=lambda m: None)
    draft = load_model(str(tiny_qwen_dir), device="cuda", dtype=dt, progress=lambda m: None)
    assert target.module.lm_head.weight.is_cuda

    def factory():
        return make_drafter("draft" if method == "tree" else method, target, CAP,
                             draft if method in ("draft", "tree", "hybrid") else None,
                             tree=TreeConfig(8, 3, 2) if method == "tree" else None)

    prompts = PROMPTS + [[7], [9, 9, 9, 9, 9, 9, 9]]
    cfg = GenerationConfig(24, 4)
    expected = [Engine.single(target.module, factory(), CAP).generate(p, cfg, target.eos_ids).tokens
                for p in prompts]
    stepper = Engine(target.module, factory, CAP, max_batch=3, prefill_chunk=4)
    got = run_engine(stepper, prompts, cfg, target.eos_ids)
    for i, p in enumerate(prompts):
        assert_greedy_match(target.module, dtype, p, got[i], expected[i], f"{method} sequence {i}")


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_seeded_sampling_repeats_and_stays_in_vocabulary(dtype):
    target, draft = models(dtype, False)
    for method in ("draft", "tree", "hybrid", "ngram"):
        cfg = GenerationConfig(24, 4, SamplingParams(0.8, top_k=20, top_p=0.9, seed=7))
        runs = [Engine.single(target, DRAFTERS[method](target, draft), CAP).generate(PROMPTS[0], cfg).tokens
                for _ in range(2)]
        assert runs[0] == runs[1], method
        assert len(runs[0]) == 24 and all(0 <= t < TINY_VOCAB for t in runs[0]), method


def test_sampled_speculation_follows_the_target_distribution_on_cuda():
    """The first 3 tokens of speculative sampling on CUDA against the exact joint (computed on CPU)."""
    from tests.test_engine import N_TRIALS, SMALL_VOCAB, exact_joint, sample_first3, tv, tv_bound
    sampling = SamplingParams(1.0)
    target_cpu = tiny_model(10, vocab_size=SMALL_VOCAB, max_position_embeddings=64)
    target = tiny_model(10, vocab_size=SMALL_VOCAB, max_position_embeddings=64).cuda()
    draft = tiny_model(11, vocab_size=SMALL_VOCAB, max_position_embeddings=64).cuda()
    prompt = [0, 1, 2, 0, 1]
    joint = exact_joint(target_cpu, prompt, 3, sampling)
    bound = tv_bound(len(joint), N_TRIALS)
    for name, drafter in (("draft", DraftModelDrafter(draft, SMALL_VOCAB, 64)),
                          ("tree", DraftModelDrafter(draft, SMALL_VOCAB, 64, tree=TreeConfig(4, 2, 2))),
                          ("hybrid", HybridDrafter(DraftModelDrafter(draft, SMALL_VOCAB, 64), copy_n=2))):
        assert tv(sample_first3(target, drafter, prompt, sampling), joint, N_TRIALS) < bound, name


def test_cli_generate_on_cuda_with_graphs(tiny_llama_dir, capsys):
    from specdec.cli import main
    argv = ["generate", "--model", str(tiny_llama_dir), "--draft", str(tiny_llama_dir), "--k", "3",
            "--device", "cuda", "--dtype", "bfloat16", "--cuda-graphs", "--max-new-tokens", "12", "w1 w2 w3"]
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert out.strip()
