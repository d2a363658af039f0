"""The layer loop in one C call (cpu_forward.c): the same logits as the Python loop, bit for bit,
for one-token steps, verify passes, tree masks and ragged batches; it declines what it does not serve; silu_mul is
SiLU."""

import pytest
import torch

from specdec.model import cpu_kernels
from specdec.model.transformer import Ragged
from tests.conftest import ragged_step

kernel = pytest.mark.skipif(not cpu_kernels.available(), reason=f"kernel unavailable: {cpu_kernels.unavailable_reason()}")


@kernel
def test_silu_mul_is_silu_times_up():
    g = torch.cat([torch.randn(1000) * 5, torch.tensor([0.0, -0.0, 88.0, -88.0, 200.0, -200.0, 1e-30, -1e-30])])
    u = torch.randn(g.numel())
    ours = cpu_kernels.silu_mul(g, u)
    torch.testing.assert_close(ours, torch.nn.functional.silu(g) * u, rtol=3e-6, atol=1e-30)
    assert torch.isfinite(ours).all()
    with pytest.raises(ValueError, match="differ"):
        cpu_kernels.silu_mul(g, u[:5])


@kernel
def test_silu_mul_vector_lanes_give_the_scalar_bits_and_rows_take_the_fused_output():
    g = torch.cat([torch.randn(100_003) * 30, torch.tensor([0.0, -0.0, 87.0, -87.0, -86.9, -87.1, 3e38, -3e38,
                                                             float("inf"), -float("inf"), 1e-38, -1e-38])])
    u = torch.randn(g.numel())
    vec, scalar = cpu_kernels.silu_mul(g, u), torch.empty_like(g)
    cpu_kernels._lib.silu_mul_scalar(g.data_ptr(), u.data_ptr(), scalar.data_ptr(), g.numel())
    assert torch.equal(vec.view(torch.int32), scalar.view(torch.int32))  # every lane, every tail element
    gu = torch.randn(7, 3, 2 * 200)
    rows = cpu_kernels.silu_mul_rows(gu)
    gate, up = gu.chunk(2, dim=-1)
    assert rows.shape == (7, 3, 200) and torch.equal(rows, cpu_kernels.silu_mul(gate.contiguous(), up.contiguous()))
    with pytest.raises(ValueError, match="odd"):
        cpu_kernels.silu_mul_rows(torch.randn(2, 5))


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    if not cpu_kernels.available():
        pytest.skip(f"kernel unavailable: {cpu_kernels.unavailable_reason()}")
    from specdec.model import load_model
    return load_model(str(smollm2_path), device="cpu", progress=lambda *a: None).module


def both_loops(model, fn):
    """fn(model) with the C loop, then with the Python loop."""
    fast = model.layer_loop
    assert fast is not None
    try:
        a = fn(model)
        model.layer_loop = None
        b = fn(model)
    finally:
        model.layer_loop = fast
    return a, b


@pytest.mark.real
def test_c_loop_gives_the_python_loops_logits(smollm2):
    torch.manual_seed(0)
    prompt, steps = torch.randint(0, 1000, (1, 40)), torch.randint(0, 1000, (1, 16))

    def run(m):
        with torch.inference_mode():
            c = m.new_cache(128)
            m(prompt, c, 0)  # prefill: the Python loop either way (more than 16 positions)
            c.advance(40)
            out = [m(steps[:, i:i + 1], c, 40 + i) for i in range(16)]
            out += [m(steps[:, :n], c, 40) for n in (2, 5, 16)]
            # a tree: 4 nodes, two siblings at depth 1 each with a child; custom positions and mask
            mask = torch.zeros(4, 44, dtype=torch.bool)
            mask[:, :40] = True
            for i, anc in enumerate([[0], [1], [0, 2], [1, 3]]):
                mask[i, [40 + a for a in anc]] = True
            pos = torch.tensor([[40, 40, 41, 41]])
            out.append(m(steps[:, :4], c, 40, positions=pos, mask=mask))
            return out, c.k.clone()
    (a, ka), (b, kb) = both_loops(smollm2, run)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert torch.equal(ka, kb)  # the caches were written alike too
    assert torch.equal(a[16], torch.cat(a[:2], 1))  # a verify row is a one-token step


@pytest.mark.real
def test_c_loop_serves_a_row_of_a_batched_cache(smollm2):
    """A row of a batched cache (its layers apart in memory) takes the C loop: the Python loop's bits,
    written to that row alone."""
    torch.manual_seed(1)
    prompt, step = torch.randint(0, 1000, (1, 12)), torch.randint(0, 1000, (1, 3))

    row = smollm2.new_cache(32, batch=3).row(1)
    assert smollm2.layer_loop.takes(step, row, 12, smollm2.layer_inputs(torch.arange(3)[None], 12, None))

    def run(m):
        with torch.inference_mode():
            batch = m.new_cache(32, batch=3)
            row = batch.row(1)
            m(prompt, row, 0)
            return m(step, row, 12), batch.k.clone()
    (a, ka), (b, kb) = both_loops(smollm2, run)
    assert torch.equal(a, b) and torch.equal(ka, kb)
    assert ka[:, 0].abs().sum() == 0 and ka[:, 2].abs().sum() == 0 and ka[:, 1].abs().sum() > 0


@pytest.mark.real
@pytest.mark.parametrize("feeds", [[[5], [7]], [[5, 6, 7, 8, 9], [1, 2]], [[3] * 16, [4]]],
                         ids=["decode", "verify", "T16"])
def test_c_loop_gives_the_python_loops_bits_on_a_ragged_batch(smollm2, feeds):
    """A ragged batch (rows 2 and 0 of a 3-row cache, at different lengths, the shorter feed padded) takes
    the C loop: the Python loop's bits, in the logits and the cache; each row's logits are its sequence's
    own step's."""
    prompt = torch.randint(0, 1000, (1, 20), generator=torch.Generator().manual_seed(2))
    (a, ka, takes, alone), (b, kb, _, _) = both_loops(smollm2, lambda m: ragged_step(m, prompt, [20, 9], feeds, [2, 0]))
    assert takes
    assert torch.equal(a, b) and torch.equal(ka, kb)
    for row, (feed, own) in enumerate(zip(feeds, alone)):
        assert torch.equal(a[row, :len(feed)], own[0])
    assert ka[:, 1].abs().sum() == 0  # the row outside the batch is untouched


@pytest.mark.real
def test_c_loop_declines_what_it_does_not_serve(smollm2):
    fast = smollm2.layer_loop
    cache, batch2 = smollm2.new_cache(64), smollm2.new_cache(64, batch=2)
    tok = torch.zeros(1, 1, dtype=torch.long)

    def inputs(t, mask=None):
        return smollm2.layer_inputs(torch.arange(t)[None], 0, mask)
    assert fast.takes(tok, cache, 3, inputs(1))
    assert not fast.takes(torch.zeros(1, 17, dtype=torch.long), cache, 0, inputs(17))  # more than 16 positions
    assert not fast.takes(torch.zeros(2, 1, dtype=torch.long), batch2, 3, inputs(1))  # a batch
    assert not fast.takes(tok, cache, torch.tensor([3]), inputs(1))  # per-row slots
    assert not fast.takes(tok, cache, 3, inputs(1, torch.ones(1, 4)))  # a float mask
    with pytest.raises(RuntimeError, match="refused"):  # past the cache: a clear error, nothing written
        fast.run(torch.zeros(1, 2, smollm2.config.hidden_size), inputs(2), cache, 63)
    # a ragged batch: its mask must be bool [batch, 1, T, S]; a row or a slot outside the cache is refused
    x, pos = torch.zeros(2, 1, smollm2.config.hidden_size), torch.tensor([[3], [5]])
    mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    at = Ragged(torch.tensor([0, 1]), pos.clone())
    assert fast.takes(torch.zeros(2, 1, dtype=torch.long), batch2, at, smollm2.layer_inputs(pos, at, mask))
    assert not fast.takes(torch.zeros(2, 1, dtype=torch.long), batch2, at, smollm2.layer_inputs(pos, at, mask.float()))
    for rows, slots in (([0, 2], [[3], [5]]), ([0, 1], [[3], [64]])):
        bad = Ragged(torch.tensor(rows), torch.tensor(slots))
        with pytest.raises(RuntimeError, match="refused"):
            fast.run(x.clone(), smollm2.layer_inputs(pos, bad, mask), batch2, bad)


@pytest.mark.real
def test_fp32_weights_keep_the_python_loop(smollm2_path):
    if not cpu_kernels.available():
        pytest.skip("kernel unavailable")
    from specdec.model import load_model
    m = load_model(str(smollm2_path), device="cpu", weight_dtype="float32", progress=lambda *a: None).module
    assert m.layer_loop is None
