"""Sampling and verification: logit processing, greedy matching, and the distribution of
rejection sampling (the emitted tokens must be distributed exactly as the target's p)."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from specdec.config import LLAMA_ORDER, SAMPLER_ORDER, SamplingParams
from specdec.sampling.infill import InfillVocab
from specdec.sampling.logits import probs_from_logits, processed, sample
from specdec.sampling.rejection import Acceptance, greedy_accept, rejection_accept, residual_probs

# Fixed target p [k + 1, vocab] and draft q [k, vocab], k = 3, vocab = 6: every row different and
# p far from q, so roughly half the drafts are rejected and every path (accept, recover, bonus) runs.
P_TABLE = torch.tensor([
    [0.05, 0.05, 0.10, 0.20, 0.30, 0.30],
    [0.30, 0.25, 0.20, 0.10, 0.10, 0.05],
    [0.10, 0.40, 0.05, 0.05, 0.30, 0.10],
    [0.20, 0.10, 0.30, 0.05, 0.25, 0.10],
])  # [k + 1, vocab]
Q_TABLE = torch.tensor([
    [0.40, 0.30, 0.10, 0.10, 0.05, 0.05],
    [0.05, 0.10, 0.15, 0.20, 0.20, 0.30],
    [0.30, 0.10, 0.30, 0.10, 0.10, 0.10],
])  # [k, vocab]
K, VOCAB = Q_TABLE.shape
TRIALS = 10_000
MIN_SAMPLES = 300  # positions reached by fewer trials are not checked (bound too loose to matter)


def tv_bound(num_samples: int, vocab: int, delta: float = 1e-6) -> float:
    """Bound on TV(empirical, true) for num_samples iid draws that fails with probability < delta.

    E[TV] = 0.5 * sum_v E|f_v - p_v| <= 0.5 * sum_v sqrt(p_v (1 - p_v) / N) <= 0.5 * sqrt(vocab / N)
    (Jensen, then Cauchy-Schwarz). One draw moves TV by at most 1/N, so McDiarmid gives
    P(TV > E[TV] + t) <= exp(-2 N t^2), i.e. t = sqrt(ln(1 / delta) / (2 N)). The bound is
    c / sqrt(N) with c = 0.5 sqrt(vocab) + sqrt(ln(1 / delta) / 2), about 3.9 for vocab 6: it
    shrinks with N, and a correct sampler trips it with probability < 1e-6 (seeds are fixed anyway).
    """
    return (0.5 * math.sqrt(vocab) + math.sqrt(math.log(1 / delta) / 2)) / math.sqrt(num_samples)


def rate_bound(num_samples: int, delta: float = 1e-6) -> float:
    """Hoeffding: |empirical rate - true rate| exceeds this with probability < delta."""
    return math.sqrt(math.log(2 / delta) / (2 * num_samples))


def total_variation(tokens: torch.Tensor, p: torch.Tensor) -> float:
    """tokens # [m] int64 samples; p # [vocab] -> TV(empirical, p)."""
    freq = torch.bincount(tokens, minlength=p.numel()).float() / tokens.numel()  # [vocab]
    return 0.5 * (freq - p).abs().sum().item()


def run_trials(accept_fn, p: torch.Tensor, q: torch.Tensor | None, drafts: torch.Tensor,
               seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify one chain per trial. drafts # [k, trials] -> (num_accepted # [trials],
    emitted # [trials, k + 1] with -1 after the next token). q is what the verifier is told."""
    generator = torch.Generator().manual_seed(seed)
    results = [accept_fn(drafts[:, t], p, q, generator) for t in range(drafts.shape[1])]
    num, nxt = torch.tensor(results).T  # [trials] each
    padded = torch.cat([drafts, torch.full((1, drafts.shape[1]), -1)])  # [k + 1, trials]
    j = torch.arange(drafts.shape[0] + 1).unsqueeze(1)  # [k + 1, 1]
    emitted = torch.where(j < num, padded, torch.where(j == num, nxt, -1))  # [k + 1, trials]
    return num, emitted.T


def sampled_drafts(q: torch.Tensor, trials: int = TRIALS, seed: int = 1) -> torch.Tensor:
    """Draft tokens x_i ~ q_i, independent per position: q # [k, vocab] -> # [k, trials]."""
    return torch.multinomial(q, trials, replacement=True, generator=torch.Generator().manual_seed(seed))


def assert_emits_p(emitted: torch.Tensor, p: torch.Tensor) -> None:
    """emitted # [trials, k + 1]; p # [k + 1, vocab]. p and q here ignore history, so the j-th
    emitted token (over trials that reach it) is distributed as p_j. Positions 0 and 1 must be checked."""
    checked = 0
    for j in range(p.shape[0]):
        tokens = emitted[:, j][emitted[:, j] >= 0]  # [m]
        if tokens.numel() < MIN_SAMPLES:
            continue
        tv, bound = total_variation(tokens, p[j]), tv_bound(tokens.numel(), p.shape[1])
        assert tv < bound, f"position {j}: TV {tv:.4f} >= bound {bound:.4f} over {tokens.numel()} draws"
        checked += 1
    assert checked >= 2


def assert_first_accept_rate(num: torch.Tensor, expected: float) -> None:
    """A verifier that rejects too often still emits p; the acceptance rate catches that."""
    rate = (num >= 1).float().mean().item()
    assert abs(rate - expected) < rate_bound(num.numel()), f"accept rate {rate:.4f} vs {expected:.4f}"


def resample_from_p_on_rejection(draft_tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
                                 generator: torch.Generator) -> Acceptance:
    """WRONG on purpose: the classic bug of drawing the recovered token from p_n, not the residual."""
    for i, x in enumerate(draft_tokens.tolist()):
        if torch.rand((), generator=generator) * q[i, x] >= p[i, x]:
            return Acceptance(i, int(torch.multinomial(p[i], 1, generator=generator)))
    k = draft_tokens.numel()
    return Acceptance(k, int(torch.multinomial(p[k], 1, generator=generator)))


# ---------------------------------------------------------------- probs_from_logits


def row_probs(logits: list[float], **params) -> list[float]:
    return probs_from_logits(torch.tensor(logits), SamplingParams(**params)).tolist()


@pytest.mark.parametrize("logits, params, expected", [
    ([0.0, math.log(2), math.log(4)], dict(temperature=1.0), [1 / 7, 2 / 7, 4 / 7]),
    ([0.0, math.log(2), math.log(4)], dict(temperature=2.0), [1 / 4.414214, 1.414214 / 4.414214, 2 / 4.414214]),
    ([0.0, math.log(2), math.log(4)], dict(temperature=0.5), [1 / 21, 4 / 21, 16 / 21]),
    ([1.0, 3.0, 2.0, 0.0], dict(temperature=1.0, top_k=2), [0.0, 0.731059, 0.268941, 0.0]),
    ([1.0, 2.0, 2.0, 0.0], dict(temperature=1.0, top_k=1), [0.0, 0.5, 0.5, 0.0]),  # ties: keep >= k
    ([1.0, 3.0, 2.0, 0.0], dict(temperature=1.0, top_k=9), torch.tensor([1.0, 3, 2, 0]).softmax(0).tolist()),
    # probs [0.15, 0.5, 0.05, 0.3]: sorted 0.5, 0.3, 0.15, 0.05
    ([math.log(0.15), math.log(0.5), math.log(0.05), math.log(0.3)], dict(temperature=1.0, top_p=0.75),
     [0.0, 0.625, 0.0, 0.375]),
    ([math.log(0.15), math.log(0.5), math.log(0.05), math.log(0.3)], dict(temperature=1.0, top_p=0.85),
     [0.15 / 0.95, 0.5 / 0.95, 0.0, 0.3 / 0.95]),
    # top token alone exceeds top_p: it is still kept
    ([math.log(0.15), math.log(0.5), math.log(0.05), math.log(0.3)], dict(temperature=1.0, top_p=0.1),
     [0.0, 1.0, 0.0, 0.0]),
    # top-k then top-p: top_k=2 leaves [4/7, 3/7]; top_p=0.5 then keeps only the top token
    ([math.log(0.4), math.log(0.3), math.log(0.2), math.log(0.1)], dict(temperature=1.0, top_k=2, top_p=0.5),
     [1.0, 0.0, 0.0, 0.0]),
    ([math.log(0.4), math.log(0.3), math.log(0.2), math.log(0.1)], dict(temperature=1.0, top_p=0.5),
     [4 / 7, 3 / 7, 0.0, 0.0]),
    ([0.5, -1.0, 2.5, 2.0], dict(temperature=0.0), [0.0, 0.0, 1.0, 0.0]),
    ([0.5, -1.0, 2.5, 2.0], dict(temperature=0.0, top_k=3, top_p=0.5), [0.0, 0.0, 1.0, 0.0]),
])
def test_probs_from_logits_table(logits, params, expected):
    assert row_probs(logits, **params) == pytest.approx(expected, abs=1e-5)


def test_probs_from_logits_low_precision_input_gives_fp32():
    logits = torch.tensor([0.0, 1.0, 2.0], dtype=torch.bfloat16)  # [vocab]
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0))
    assert probs.dtype == torch.float32
    assert probs.tolist() == pytest.approx(torch.tensor([0.0, 1.0, 2.0]).softmax(0).tolist(), abs=1e-6)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.8, top_k=5, top_p=0.9),
])
def test_probs_from_logits_batch_matches_rows(params):
    logits = torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(3))  # [2, 3, vocab]
    probs = probs_from_logits(logits, params)  # [2, 3, vocab]
    assert probs.shape == (2, 3, 11)
    rows = torch.stack([probs_from_logits(row, params) for row in logits.reshape(6, 11)])  # [6, vocab]
    torch.testing.assert_close(probs.reshape(6, 11), rows)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 3))


def sorted_reference(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """probs_from_logits by the book, in float64: the whole vocabulary masked step by step in params.order,
    the nucleus read off a full sort of what is left."""
    x = logits.double()
    for step in params.order:
        if step == "temperature":
            x = x / params.temperature
        elif step == "min_p" and params.min_p > 0:
            x = x.masked_fill(x < x.amax(-1, keepdim=True) + math.log(params.min_p), float("-inf"))
        elif step == "top_k" and params.top_k > 0:
            x = x.masked_fill(x < x.topk(params.top_k, dim=-1).values[..., -1:], float("-inf"))
        elif step == "top_p" and params.top_p < 1:
            p, order = torch.softmax(x, -1).sort(dim=-1, descending=True)
            keep = torch.zeros_like(p, dtype=torch.bool).scatter_(-1, order, p.cumsum(-1) - p < params.top_p)
            x = x.masked_fill(~keep, float("-inf"))
    return torch.softmax(x, -1).float()


def llama_cpp_reference(row: list[float], k: int, top_p: float, min_p: float, temperature: float) -> dict[int, float]:
    """llama.cpp's default chain on one row, as its samplers do it on a candidate list: top-k (sorted,
    the first k), top-p (softmax over the candidates, kept up to the first whose running sum reaches
    top_p), min-p (logits at least the top one's plus log min_p), then the temperature; {token: p}."""
    cands = sorted(enumerate(row), key=lambda t: -t[1])[:k]
    total = sum(math.exp(v - cands[0][1]) for _, v in cands)
    kept, run = [], 0.0
    for token, v in cands:
        kept.append((token, v))
        run += math.exp(v - cands[0][1]) / total
        if run >= top_p:
            break
    if min_p > 0:
        kept = [(t, v) for t, v in kept if v >= kept[0][1] + math.log(min_p)]
    z = sum(math.exp((v - kept[0][1]) / temperature) for _, v in kept)
    return {t: math.exp((v - kept[0][1]) / temperature) / z for t, v in kept}


def test_llama_cpp_order_samples_llama_cpp_s_distribution():
    """In LLAMA_ORDER (llama-server's endpoints) the probabilities are llama.cpp's chain's, row by row;
    in the default order (the temperature first) they differ wherever the temperature moves the nucleus."""
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(6, 3000, generator=g) * torch.tensor([[6.0], [3.0], [2.0], [1.0], [0.5], [0.2]])
    for settings in ((40, 0.95, 0.05, 0.8), (100, 0.9, 0.0, 1.5), (3000, 0.5, 0.1, 0.6)):
        k, top_p, min_p, temperature = settings
        params = SamplingParams(temperature, k, top_p, min_p=min_p, order=LLAMA_ORDER)
        for probs in (probs_from_logits(logits, params), processed(logits, params, on_host=False)):
            for r in range(len(logits)):
                want = llama_cpp_reference(logits[r].tolist(), k, top_p, min_p, temperature)
                assert set(probs[r].nonzero().flatten().tolist()) == set(want), settings
                got = {t: probs[r, t].item() for t in want}
                assert all(abs(got[t] - want[t]) <= 1e-5 + 1e-4 * want[t] for t in want), settings
        other = probs_from_logits(logits, SamplingParams(temperature, k, top_p, min_p=min_p))
        assert not torch.allclose(other, probs_from_logits(logits, params)), settings


@pytest.mark.parametrize("params", [
    SamplingParams(1.0, top_p=0.9), SamplingParams(0.7, top_p=0.95), SamplingParams(1.3, top_p=0.5),
    SamplingParams(0.8, top_k=40, top_p=0.95, min_p=0.05), SamplingParams(1.0, top_k=7),
    SamplingParams(1.0, top_k=300, top_p=0.99), SamplingParams(1.0, min_p=0.01, top_p=0.9),
    SamplingParams(0.8, top_k=40, top_p=0.95, min_p=0.05, order=LLAMA_ORDER),
    SamplingParams(1.4, top_k=300, top_p=0.9, min_p=0.02, order=("top_p", "temperature", "top_k", "min_p")),
    SamplingParams(0.6, top_p=0.8, min_p=0.05, order=("min_p", "top_p", "temperature", "top_k")),
], ids=lambda s: f"t{s.temperature}-k{s.top_k}-p{s.top_p}-m{s.min_p}-{''.join(x[-1] for x in s.order)}")
def test_the_nucleus_and_top_k_without_sorting_the_vocabulary_are_the_book_s(params):
    """The top-p nucleus from topk (grown while a row's nucleus is wider, here up to thousands of tokens)
    and the top-k path worked out on the k best logits keep exactly the book's tokens, at its
    probabilities: peaked rows, flat rows, a whole batch and one row."""
    g = torch.Generator().manual_seed(7)
    spread = torch.tensor([[8.0], [3.0], [1.0], [0.3]])  # peaked .. nearly flat
    logits = torch.randn(4, 5000, generator=g) * spread  # [rows, vocab]
    got = probs_from_logits(logits, params)
    want = sorted_reference(logits, params)
    assert torch.equal(got > 0, want > 0)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    device_path = processed(logits, params, on_host=False)  # what a CUDA graph runs: no value read back
    assert torch.equal(device_path > 0, want > 0)
    torch.testing.assert_close(device_path, want, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(probs_from_logits(logits[2], params), want[2], rtol=1e-4, atol=1e-6)
    if params.top_p < 1 and params.top_k == 0:
        assert (got[3] > 0).sum() > 4 * 64  # a nucleus far wider than topk's first look


def test_top_k_keeps_every_tie_at_its_kth_value():
    logits = torch.tensor([[3.0, 1.0, 2.0, 2.0, 2.0, 0.5]])
    got = probs_from_logits(logits, SamplingParams(1.0, top_k=2))
    assert (got > 0).tolist() == [[True, False, True, True, True, False]]
    torch.testing.assert_close(got, sorted_reference(logits, SamplingParams(1.0, top_k=2)))


def test_sample_shapes_and_one_hot():
    probs = torch.nn.functional.one_hot(torch.tensor([[1, 4, 0], [2, 2, 3]]), 5).float()  # [2, 3, vocab]
    tokens = sample(probs, torch.Generator().manual_seed(0))  # [2, 3]
    assert tokens.dtype == torch.int64
    assert tokens.tolist() == [[1, 4, 0], [2, 2, 3]]
    assert sample(probs[0, 0], torch.Generator().manual_seed(0)).shape == ()


def test_sampling_first_under_inference_mode_then_outside_it_works(monkeypatch):
    """The kept cumsum buffer made by a first draw under inference mode (a drafter's device chain) is
    written by the next draw outside it (the engine's)."""
    from specdec.sampling import logits as module
    monkeypatch.setattr(module, "_buffers", threading.local())  # no buffer yet: the first draw makes it
    probs = torch.softmax(torch.randn(4, 37), -1)
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        inside = sample(probs, gen)
    outside = sample(probs, torch.Generator().manual_seed(0))
    assert torch.equal(inside, outside)


def test_sample_draws_each_token_at_its_share_of_the_mass_and_never_a_zero():
    """Unnormalised weights with zeros first, inside and last: the empirical distribution of many draws
    is the weights' (total variation bound), a zero is never drawn, and large vocabularies work."""
    w = torch.tensor([0.0, 0.5, 0.05, 1.2, 0.0, 0.0, 0.9, 0.001, 0.6, 0.449, 0.0])  # sum 3.7
    draws = sample(w.expand(TRIALS, -1), torch.Generator().manual_seed(3))  # [TRIALS]
    assert total_variation(draws, w / w.sum()) < tv_bound(TRIALS, w.numel())
    assert not torch.isin(draws, torch.tensor([0, 4, 5, 10])).any()
    big = torch.zeros(151936)
    big[[7, 151935]] = torch.tensor([1.0, 3.0])
    draws = sample(big.expand(4000, -1)[:400], torch.Generator().manual_seed(5))
    assert set(draws.tolist()) == {7, 151935} and abs((draws == 151935).float().mean().item() - 0.75) < rate_bound(400)


# ---------------------------------------------------------------- greedy_accept


def logits_with_argmax(best: list[int], vocab: int = 8) -> torch.Tensor:
    """Hand-built logits # [len(best), vocab] whose row i has its argmax at best[i]."""
    logits = torch.randn(len(best), vocab, generator=torch.Generator().manual_seed(7))  # [n, vocab]
    logits[torch.arange(len(best)), best] = 10.0
    return logits


@pytest.mark.parametrize("draft, best, expected", [
    ([3, 1, 4], [3, 1, 4, 6], (3, 6)),  # all accepted -> bonus from the last row
    ([2, 1, 4], [3, 1, 4, 6], (0, 3)),  # first rejected -> target's choice at row 0
    ([3, 5, 4], [3, 1, 4, 6], (1, 1)),  # middle rejected; the later match does not count
    ([3, 1, 0], [3, 1, 4, 6], (2, 4)),  # last rejected
    ([], [5], (0, 5)),  # k = 0: plain decoding
])
def test_greedy_accept_exact(draft, best, expected):
    result = greedy_accept(torch.tensor(draft, dtype=torch.long), logits_with_argmax(best))
    assert result == expected
    assert isinstance(result.num_accepted, int) and isinstance(result.next_token, int)


def test_greedy_probs_through_rejection_match_greedy_accept():
    """With one-hot p (temperature 0) rejection sampling is greedy matching, for any seed."""
    gen = torch.Generator().manual_seed(5)
    for _ in range(50):
        logits = torch.randn(K + 1, VOCAB, generator=gen)  # [k + 1, vocab]
        draft = torch.where(torch.rand(K, generator=gen) < 0.7, logits[:-1].argmax(-1),
                            torch.randint(VOCAB, (K,), generator=gen))  # [k]
        p = probs_from_logits(logits, SamplingParams(temperature=0.0))  # [k + 1, vocab]
        q = torch.nn.functional.one_hot(draft, VOCAB).float()  # [k, vocab]
        expected = greedy_accept(draft, logits)
        assert rejection_accept(draft, p, None, gen) == expected
        assert rejection_accept(draft, p, q, gen) == expected


# ---------------------------------------------------------------- rejection_accept: distributions


def test_rejection_chain_sampled_q_emits_p():
    drafts = sampled_drafts(Q_TABLE)
    num, emitted = run_trials(rejection_accept, P_TABLE, Q_TABLE, drafts)
    assert_emits_p(emitted, P_TABLE)
    assert_first_accept_rate(num, torch.minimum(P_TABLE[0], Q_TABLE[0]).sum().item())
    assert {0, 1, 2, 3} <= set(num.tolist())


def test_rejection_deterministic_drafter_emits_p():
    drafts = torch.tensor([4, 0, 1]).unsqueeze(1).expand(K, TRIALS)  # [k, trials], fixed as for n-gram
    num, emitted = run_trials(rejection_accept, P_TABLE, None, drafts)
    assert_emits_p(emitted, P_TABLE)
    assert_first_accept_rate(num, P_TABLE[0, 4].item())


def test_rejection_q_equal_p_accepts_everything_and_emits_p():
    drafts = sampled_drafts(P_TABLE[:K])
    num, emitted = run_trials(rejection_accept, P_TABLE, P_TABLE[:K].clone(), drafts)
    assert bool((num == K).all())
    assert_emits_p(emitted, P_TABLE)


@pytest.mark.parametrize("order", [SAMPLER_ORDER, LLAMA_ORDER])
def test_rejection_with_temperature_top_k_top_p_emits_processed_p(order):
    params = SamplingParams(temperature=0.7, top_k=4, top_p=0.9, order=order)
    p = probs_from_logits(P_TABLE.log() * 1.3, params)  # [k + 1, vocab], some entries zeroed
    q = probs_from_logits((0.5 * P_TABLE[:K] + 0.5 * Q_TABLE).log(), params)  # [k, vocab], overlaps p
    assert bool((p == 0).any()) and bool((q == 0).any())
    num, emitted = run_trials(rejection_accept, p, q, sampled_drafts(q))
    assert_emits_p(emitted, p)
    assert_first_accept_rate(num, torch.minimum(p[0], q[0]).sum().item())


def test_tv_check_rejects_a_wrong_sampler():
    """The same check fails a sampler that draws the recovered token from p instead of the residual."""
    # Its first token follows min(p, q) + (1 - sum min(p, q)) * p, far from p for this table.
    accept = torch.minimum(P_TABLE[0], Q_TABLE[0])  # [vocab]
    wrong = accept + (1 - accept.sum()) * P_TABLE[0]  # [vocab]
    expected_tv = 0.5 * (wrong - P_TABLE[0]).abs().sum().item()
    assert expected_tv > 2 * tv_bound(TRIALS, VOCAB)
    _, emitted = run_trials(resample_from_p_on_rejection, P_TABLE, Q_TABLE, sampled_drafts(Q_TABLE))
    with pytest.raises(AssertionError, match="position 0"):
        assert_emits_p(emitted, P_TABLE)


# ---------------------------------------------------------------- rejection_accept: edges


def test_rejection_k_zero_samples_p0():
    gen = torch.Generator().manual_seed(0)
    empty = torch.empty(0, dtype=torch.long)  # [0]
    one_hot = torch.tensor([[0.0, 0.0, 1.0, 0.0]])  # [1, vocab]
    assert rejection_accept(empty, one_hot, torch.empty(0, 4), gen) == (0, 2)
    assert rejection_accept(empty, one_hot, None, gen) == (0, 2)


def test_residual_probs():
    p = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5]])  # [2, vocab]
    q = torch.tensor([[0.2, 0.3, 0.5], [0.2, 0.3, 0.5]])  # [2, vocab]
    torch.testing.assert_close(residual_probs(p, q), torch.tensor([[1.0, 0.0, 0.0], [0.2, 0.3, 0.5]]))
    torch.testing.assert_close(residual_probs(p, torch.zeros_like(p)), p)


def test_rejection_rejects_bad_shapes():
    with pytest.raises(ValueError):
        rejection_accept(torch.tensor([1, 2]), P_TABLE, Q_TABLE, torch.Generator())
    with pytest.raises(ValueError):
        greedy_accept(torch.tensor([1, 2, 3]), P_TABLE[:3])


def test_same_seed_same_output():
    drafts = sampled_drafts(Q_TABLE, trials=100)  # [k, 100]
    first = run_trials(rejection_accept, P_TABLE, Q_TABLE, drafts, seed=11)
    again = run_trials(rejection_accept, P_TABLE, Q_TABLE, drafts, seed=11)
    other = run_trials(rejection_accept, P_TABLE, Q_TABLE, drafts, seed=12)
    assert torch.equal(first[1], again[1])
    assert not torch.equal(first[1], other[1])
    probs = P_TABLE.expand(50, -1, -1)  # [50, k + 1, vocab]
    assert torch.equal(sample(probs, torch.Generator().manual_seed(4)), sample(probs, torch.Generator().manual_seed(4)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_processing_and_runs():
    params = SamplingParams(temperature=0.7, top_k=4, top_p=0.9)
    logits = torch.randn(K + 1, VOCAB, generator=torch.Generator().manual_seed(2))  # [k + 1, vocab]
    p = probs_from_logits(logits.cuda().half(), params)  # [k + 1, vocab] on CUDA
    torch.testing.assert_close(p.cpu(), probs_from_logits(logits.half(), params))
    gen = torch.Generator(device="cuda").manual_seed(0)
    draft = sample(p[:K], gen)  # [k] on CUDA
    num, token = rejection_accept(draft, p, p[:K], gen)
    assert num == K and 0 <= token < VOCAB
    assert greedy_accept(draft, logits.cuda()) == greedy_accept(draft.cpu(), logits)


def test_verifiers_report_the_target_s_top_probability_per_row_without_changing_the_outcome():
    """Asked for, both verifiers also return the target's top probability at each of the k + 1 rows
    (greedy: of the logits' softmax; sampled: of the processed p), for the policy; the outcome and
    the random draws are the same as without, and the result still compares and unpacks as
    (num_accepted, next_token)."""
    logits = logits_with_argmax([3, 1, 4, 6])  # [4, vocab]
    draft = torch.tensor([3, 1, 0])
    scored = greedy_accept(draft, logits, confidence=True)
    assert scored == greedy_accept(draft, logits) == (2, 4)
    num, token = scored
    assert scored.confidence == pytest.approx(torch.softmax(logits, -1).amax(-1).tolist(), rel=1e-5)
    assert greedy_accept(draft, logits).confidence == ()
    draft = torch.tensor([1, 2, 0])  # k = 3: P_TABLE's 4 rows
    for seed in range(20):
        plain = rejection_accept(draft, P_TABLE, Q_TABLE, torch.Generator().manual_seed(seed))
        scored = rejection_accept(draft, P_TABLE, Q_TABLE, torch.Generator().manual_seed(seed), confidence=True)
        assert scored == plain
        assert scored.confidence == pytest.approx(P_TABLE.amax(-1).tolist())


# ---- llama.cpp's infill sampler (sampling/infill.py) ----

def toy_infill(texts: dict[int, bytes], eog=(9,), end: int = 9) -> InfillVocab:
    return InfillVocab(frozenset(eog), end, lambda i: texts.get(i, b""))


def infill_probs(probs: dict[int, float], vocab: InfillVocab, size: int = 10) -> dict[int, float]:
    """The infill sampler alone on a row of these probabilities (the rest of the row left out)."""
    logits = torch.full((size,), float("-inf"))
    for token, p in probs.items():
        logits[token] = math.log(p)
    params = SamplingParams(1.0, order=(*SAMPLER_ORDER, "infill"), infill_vocab=vocab)
    out = probs_from_logits(logits, params)
    return {i: round(out[i].item(), 4) for i in out.nonzero().flatten().tolist()}


def test_infill_keeps_only_the_end_tokens_where_they_hold_enough_mass():
    texts = {1: b"a", 2: b"b"}
    assert infill_probs({1: 0.6, 2: 0.25, 9: 0.15}, toy_infill(texts)) == {9: 1.0}  # 3 x 0.15 x 3 > 0.85
    # 3 x 0.09 x 3 = 0.81 is under 0.91: the text stays, but 'b' (0.3 of the 1.0 left) is under 1/3
    assert infill_probs({1: 0.61, 2: 0.3, 9: 0.09}, toy_infill(texts)) == {1: round(0.61 / 0.7, 4),
                                                                             9: round(0.09 / 0.7, 4)}


def test_infill_merges_a_prefix_into_the_likelier_token_and_cuts_by_the_merged_mass():
    """'de' begins 'def': its 0.25 moves to 'def' (0.55), 'de' leaves; 'y' (0.19) is under 0.2; of 'def',
    'x' and the end token, renormalised, 'x' (0.31) is under 1/3. What stays keeps its own logit."""
    texts = {1: b"def", 2: b"de", 3: b"x", 4: b"y"}
    got = infill_probs({1: 0.3, 2: 0.25, 3: 0.25, 4: 0.19, 9: 0.01}, toy_infill(texts))
    assert got == {1: round(0.3 / 0.31, 4), 9: round(0.01 / 0.31, 4)}
    kept_both = infill_probs({1: 0.45, 2: 0.05, 3: 0.45, 9: 0.05}, toy_infill(texts))
    assert kept_both == {1: round(0.45 / 0.95, 4), 3: round(0.45 / 0.95, 4), 9: round(0.05 / 0.95, 4)}


def test_infill_falls_back_to_the_end_token_where_no_text_is_likely_enough():
    texts = {i: bytes([96 + i]) for i in range(1, 7)}  # 'a'..'f': no prefixes
    got = infill_probs({**{i: 0.165 for i in range(1, 7)}, 9: 0.01}, toy_infill(texts, eog=(9, 8), end=8))
    assert got == {8: 1.0}  # the end token, though it was no candidate


def test_infill_kept_tokens_match_a_reference_on_random_rows():
    """The merge loop against a direct reading of llama.cpp's: random rows of 12 candidates over 3-letter
    pieces with shared prefixes."""
    g = torch.Generator().manual_seed(5)
    letters = [b"a", b"ab", b"abc", b"b", b"ba", b"c", b"ca", b"cab", b"d", b"da", b"e", b""]
    vocab = toy_infill({i: letters[i] for i in range(11)}, eog=(11,), end=11)
    for _ in range(200):
        logits = torch.randn(12, generator=g) * 1.5
        got = {i for i in (probs_from_logits(logits, SamplingParams(1.0, order=(*SAMPLER_ORDER, "infill"),
                                                                      infill_vocab=vocab)) > 0).nonzero().flatten().tolist()}
        assert got == set(infill_reference(logits.tolist(), letters, {11}, 11))


def infill_reference(row: list[float], pieces: list[bytes], eog: set[int], end: int) -> list[int]:
    """llama.cpp's llama_sampler_infill_apply, read line by line, on one row (every entry a candidate)."""
    cand = sorted(range(len(row)), key=lambda i: -row[i])
    m = max(row)
    z = sum(math.exp(v - m) for v in row)
    p = {i: math.exp(row[i] - m) / z for i in cand}
    p_eog = sum(p[i] for i in cand if i in eog)
    p_txt = sum(p[i] for i in cand if i not in eog)
    if 3 * p_eog * len(cand) > p_txt:
        return [i for i in cand if i in eog]
    dead = set()
    for a in cand:
        for b in cand:
            if a in dead:
                break
            if a == b or b in dead:
                continue
            pa, pb = (b"" if a in eog else pieces[a]), (b"" if b in eog else pieces[b])
            if len(pa) > 0 and len(pa) <= len(pb) and pb[:len(pa)] == pa:
                dst, src = (b, a) if p[b] > p[a] else (a, b)
                p[dst] += p[src]
                p[src] = 0.0
                dead.add(src)
    stay = [i for i in cand if i not in dead and (i in eog or p[i] >= 0.2)]
    n_txt = sum(i not in eog for i in stay)
    if n_txt == 0:
        return [end]
    total = sum(p[i] for i in stay)
    return [i for i in stay if i in eog or p[i] / total >= 1.0 / (n_txt + 1)]


def test_rejection_under_the_infill_sampler_emits_its_p():
    """The infill sampler shapes the target's p and the drafter's q alike (a mask of each row's logits):
    rejection sampling still emits p."""
    vocab = toy_infill({0: b"a", 1: b"ab", 2: b"b", 3: b"c", 4: b"cd"}, eog=(5,), end=5)
    params = SamplingParams(1.0, order=(*SAMPLER_ORDER, "infill"), infill_vocab=vocab)
    p = probs_from_logits(P_TABLE.log(), params)  # [k + 1, vocab]
    q = probs_from_logits((0.5 * P_TABLE[:K] + 0.5 * Q_TABLE).log(), params)  # [k, vocab]
    assert bool((p == 0).any()) and not torch.equal(p > 0, torch.ones_like(p, dtype=torch.bool))
    num, emitted = run_trials(rejection_accept, p, q, sampled_drafts(q))
    assert_emits_p(emitted, p)
