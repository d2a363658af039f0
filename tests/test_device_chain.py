"""A chain drafted on the device (specdec/drafters/device_chain.py, one host sync a chain; a CUDA graph
on a GPU) proposes what the token-by-token loop proposes, run eagerly here on the CPU: the same tokens,
q and stop-rule cuts, and greedy generation equal to plain decoding's."""

import pytest
import torch

from specdec.config import GenerationConfig, SamplingParams
from specdec.drafters.base import END, GO_ON, LAST, DraftState, NoDrafter
from specdec.drafters.device_chain import DeviceChains
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.engine.engine import Engine
from tests.conftest import TINY_VOCAB, pools_draft_alike, seat_in_pool

CAP = 160
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8], [5, 9, 5, 9, 5, 9, 11], [42]]


def pair(model, **kw):
    return DraftModelDrafter(model, TINY_VOCAB, CAP, **kw), DraftModelDrafter(model, TINY_VOCAB, CAP, on_device=True, **kw)


def propose_both(host, device, tokens, k, sampling=SamplingParams(), seed=0, stop=None, k_stop=0):
    out = []
    for d in (host, device):
        gen = None if sampling.greedy else torch.Generator().manual_seed(seed)
        out.append(d.propose(DraftState(list(tokens), k, sampling, gen, stop=stop, k_stop=k_stop)))
    return out


def test_the_device_chain_is_used_only_where_asked(tiny_draft):
    host, device = pair(tiny_draft)
    assert host.chains is None and isinstance(device.chains, DeviceChains)


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, top_k=20, top_p=0.9)],
                         ids=["greedy", "sampled"])
def test_device_chain_equals_the_host_loop_step_after_step(tiny_draft, sampling):
    host, device = pair(tiny_draft)
    for d in (host, device):
        d.start(PROMPTS[0])
    tokens = list(PROMPTS[0])
    g = torch.Generator().manual_seed(5)
    for step in range(8):  # accept a random prefix of each chain, then a new token, as verification would
        a, b = propose_both(host, device, tokens, 1 + step % 5, sampling, seed=step)
        assert a.tokens.tolist() == b.tokens.tolist()
        if not sampling.greedy:
            torch.testing.assert_close(a.q, b.q)
        keep = int(torch.randint(0, len(a) + 1, (1,), generator=g))
        tokens += a.tokens.tolist()[:keep] + [int(torch.randint(0, TINY_VOCAB, (1,), generator=g))]
    n = host.cache.length  # the host loop's cache holds what it fed; the device chain's holds more, then syncs
    torch.testing.assert_close(device.cache.k[:, :, :, :n], host.cache.k[:, :, :, :n])


def test_stop_rules_cut_the_chain_where_the_host_loop_stops(tiny_draft):
    host, device = pair(tiny_draft, p_min=0.2)
    for d in (host, device):
        d.start(PROMPTS[1])
    rules = {"end at 3": lambda i, p: END if i == 3 else GO_ON, "last at 2": lambda i, p: LAST if i == 2 else GO_ON,
             "confident": lambda i, p: GO_ON if p > 0.5 else END}
    tokens = list(PROMPTS[1])
    for name, rule in rules.items():
        a, b = propose_both(host, device, tokens, 4, stop=rule, k_stop=6)
        assert a.tokens.tolist() == b.tokens.tolist(), name
        tokens += a.tokens.tolist()[:1] + [7]


@pytest.mark.parametrize("self_draft", [False, True], ids=["draft", "self"])
def test_greedy_generation_with_device_chains_equals_plain(tiny_target, tiny_draft, self_draft):
    drafter = DraftModelDrafter(tiny_target if self_draft else tiny_draft, TINY_VOCAB, CAP, on_device=True)
    cfg = GenerationConfig(40, 4)
    for prompt in PROMPTS:
        expected = Engine.single(tiny_target, NoDrafter(), CAP).generate(prompt, cfg).tokens
        result = Engine.single(tiny_target, drafter, CAP).generate(prompt, cfg)
        assert result.tokens == expected
        if self_draft:
            assert result.stats.alpha == 1.0


def pool(model, n: int, on_device: bool, **kw):
    """n drafters whose caches are rows of one batched cache, as a server's slots hold them."""
    return seat_in_pool([DraftModelDrafter(model, TINY_VOCAB, CAP, on_device=on_device, **kw) for _ in range(n)])


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, top_k=20, top_p=0.9)],
                         ids=["greedy", "sampled"])
def test_rows_drafted_together_on_the_device_equal_the_host_loop(tiny_draft, sampling):
    """A pool's rows drafted together (one ragged feed, then every row's chain in one graph under CUDA graphs):
    each row's tokens and q are the host loop's, at its own limit and under its own stop rules, whichever rows
    draft in a step."""
    (host, host_cache), (device, device_cache) = pool(tiny_draft, 3, False, p_min=0.05), pool(tiny_draft, 3, True,
                                                                                               p_min=0.05)
    texts = [list(PROMPTS[b]) for b in range(3)]
    for d, text in zip(host + device, texts + texts):
        d.start(text)
    g = torch.Generator().manual_seed(7)
    rules = [None, lambda i, p: LAST if i == 2 else GO_ON, lambda i, p: GO_ON if p > 0.3 else END]
    for step in range(8):
        rows = [b for b in range(3) if (step + b) % 4]  # a row sits out now and then
        states = [[DraftState(list(texts[b]), 1 + (step + b) % 4, sampling,
                              None if sampling.greedy else torch.Generator().manual_seed(10 * step + b),
                              stop=None if not sampling.greedy else rules[b], k_stop=5) for b in rows]
                  for _ in range(2)]
        a = host[0].propose_pooled([host[b] for b in rows], states[0], host_cache, rows)
        b_ = device[0].propose_pooled([device[b] for b in rows], states[1], device_cache, rows)
        for row, x, y in zip(rows, a, b_):
            assert x.tokens.tolist() == y.tokens.tolist(), (step, row)
            if not sampling.greedy and len(x):
                torch.testing.assert_close(x.q, y.q)
            keep = int(torch.randint(0, len(x) + 1, (1,), generator=g))
            texts[row] += x.tokens.tolist()[:keep] + [int(torch.randint(0, TINY_VOCAB, (1,), generator=g))]
    for b in range(3):  # each row's cache holds what the host loop's holds, where both hold it
        n = host[b].cache.length
        torch.testing.assert_close(device[b].cache.k[:, :, :, :n], host[b].cache.k[:, :, :, :n])


def test_requests_of_other_seeds_replay_one_chain_graph(tiny_draft, monkeypatch):
    """A chain's graph is keyed by how its rows sample, not by their seeds (the uniforms come from each
    request's generator): a server's seeded requests do not capture a graph each."""
    from specdec.drafters import device_chain

    class Replayed:
        def replay(self):
            pass
    monkeypatch.setattr(device_chain, "capture", lambda fn, device: (Replayed(), fn()))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    drafter = DraftModelDrafter(tiny_draft, TINY_VOCAB, CAP, on_device=True)
    drafter.chains = DeviceChains(graphed=True)
    drafter.start(PROMPTS[0])
    for seed in (1, 2, 3):
        sampling = SamplingParams(temperature=0.8, top_k=20, seed=seed)
        drafter.propose(DraftState(PROMPTS[0] + [seed], 3, sampling, torch.Generator().manual_seed(seed)))
    assert drafter.chains.captures == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, top_k=20, top_p=0.9)],
                         ids=["greedy", "sampled"])
def test_graphed_chains_equal_eager_ones_on_cuda(sampling):
    from specdec.model.cuda_graphs import enable_cuda_graphs
    from tests.conftest import tiny_model
    eager_model, graph_model = tiny_model(1, num_layers=1).cuda(), tiny_model(1, num_layers=1).cuda()
    enable_cuda_graphs(graph_model)
    eager = DraftModelDrafter(eager_model, TINY_VOCAB, CAP, on_device=True)
    graphed = DraftModelDrafter(graph_model, TINY_VOCAB, CAP)
    tokens = list(PROMPTS[0])
    for d in (eager, graphed):
        d.start(tokens)
    for step in range(6):
        out = []
        for d in (eager, graphed):
            gen = None if sampling.greedy else torch.Generator("cuda").manual_seed(step)
            out.append(d.propose(DraftState(list(tokens), 4, sampling, gen)))
        assert out[0].tokens.tolist() == out[1].tokens.tolist()
        tokens += out[0].tokens.tolist()[:step % 4] + [3]
    assert graphed.chains.captures >= 1 and graphed.chains.graphs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, top_k=20, top_p=0.9)],
                         ids=["greedy", "sampled"])
def test_a_pools_graphed_chains_equal_eager_ones_on_cuda(sampling):
    from specdec.model.cuda_graphs import enable_cuda_graphs
    from tests.conftest import tiny_model
    eager_model, graph_model = tiny_model(1, num_layers=1).cuda(), tiny_model(1, num_layers=1).cuda()
    enable_cuda_graphs(graph_model)
    pools = [pool(m, 2, True) for m in (eager_model, graph_model)]
    texts = [list(PROMPTS[0]), list(PROMPTS[1])]
    for drafters, _ in pools:
        for d, text in zip(drafters, texts):
            d.start(text)
    pools_draft_alike(pools, texts, sampling)
