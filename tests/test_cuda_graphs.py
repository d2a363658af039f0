"""The fixed-shape forward behind CUDA graphs equals the ordinary forward (checked on CPU), and the
graphs themselves keep greedy output exact (CUDA only)."""

import pytest
import torch

from specdec.config import GenerationConfig
from specdec.drafters.base import NoDrafter
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.model.cuda_graphs import CudaGraphs, enable_cuda_graphs
from specdec.engine.engine import Engine
from specdec.errors import SpecdecError
from specdec.model.transformer import causal_mask
from tests.conftest import TINY_VOCAB, tiny_model


def static_call(model, cache, tokens, start, mask=None):
    t = tokens.shape[1]
    full = torch.zeros(t, cache.capacity, dtype=torch.bool)
    full[:, :start + t] = causal_mask(start, t, "cpu") if mask is None and t > 1 else (True if mask is None else mask)
    positions = torch.arange(start, start + t).expand(tokens.shape[0], t)
    return model.static_forward(tokens, cache, torch.arange(start, start + t), positions, full)


def test_static_forward_matches_forward_step_by_step():
    model = tiny_model(0)
    eager, static = model.new_cache(48, batch=2), model.new_cache(48, batch=2)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, TINY_VOCAB, (2, 9), generator=g)
    torch.testing.assert_close(static_call(model, static, prompt, 0), model(prompt, eager, 0), rtol=1e-5, atol=1e-5)
    start = 9
    for t in (1, 5, 1, 3):  # decode steps and verify passes
        x = torch.randint(0, TINY_VOCAB, (2, t), generator=g)
        torch.testing.assert_close(static_call(model, static, x, start), model(x, eager, start), rtol=1e-5, atol=1e-5)
        start += t
    # a tree-style custom mask: node 2 sees the root and itself only
    tree = torch.ones(3, start + 3, dtype=torch.bool)
    tree[:, start:] = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    x = torch.randint(0, TINY_VOCAB, (2, 3), generator=g)
    torch.testing.assert_close(static_call(model, static, x, start, tree), model(x, eager, start, mask=tree),
                               rtol=1e-5, atol=1e-5)


def test_cuda_graphs_refuse_a_cpu_model():
    with pytest.raises(SpecdecError, match="CUDA device"):
        CudaGraphs(tiny_model(0))


def test_cuda_graphs_refuse_a_mixture_of_experts():
    """Its routing reads the experts' ids on the host, which a graph cannot replay: refused by name."""
    moe = tiny_model(0, num_experts=4, experts_per_token=2, expert_intermediate_size=16)
    with pytest.raises(SpecdecError, match="mixture of experts"):
        CudaGraphs(moe)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_graphs_keep_greedy_output_exact(dtype):
    prompt = [5, 17, 3, 88, 41, 5, 17]
    cfg = GenerationConfig(32, 4)
    eager = tiny_model(0).to("cuda", dtype)
    plain = Engine.single(eager, NoDrafter(), 128).generate(prompt, cfg).tokens
    graphed = tiny_model(0).to("cuda", dtype)
    draft = tiny_model(0).to("cuda", dtype)
    enable_cuda_graphs(graphed)
    enable_cuda_graphs(draft)
    for drafter in (NoDrafter(), DraftModelDrafter(draft, TINY_VOCAB, 128)):
        gen = Engine.single(graphed, drafter, 128)
        assert gen.generate(prompt, cfg).tokens == plain
        assert gen.generate(prompt, cfg).tokens == plain  # replayed graphs, same caches
    assert 0 < graphed.graphs.captures <= graphed.graphs.max_graphs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_truncated_draft_head_gets_graphs_of_its_own():
    from specdec.drafters.draft_model import truncated_head
    model = tiny_model(0).to("cuda")
    enable_cuda_graphs(model)
    view = truncated_head(model, 40)
    assert view.graphs is not model.graphs and view.graphs.model is view
    cache = view.new_cache(16)
    assert view(torch.tensor([[1, 2, 3]], device="cuda"), cache, 0).shape[-1] == 40
