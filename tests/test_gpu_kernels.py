"""The GPU path's Triton kernels (specdec/model/gpu_kernels.py) and its layer loop (gpu_forward.py) against
the torch path's arithmetic on the same inputs. Without CUDA they run in Triton's interpreter
(TRITON_INTERPRET=1, set here before Triton is first imported), so every CI run checks them. The
interpreter casts fp32 to bf16 by truncation where a GPU rounds to nearest, so in bf16 the checks that
are exact on a GPU (the residual add, RoPE's three roundings) allow one rounding on the CPU."""

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from conftest import run_engine, tiny_model  # noqa: E402
from specdec.config import GenerationConfig  # noqa: E402
from specdec.drafters.base import NoDrafter  # noqa: E402
from specdec.engine.engine import Engine  # noqa: E402
from specdec.errors import SpecdecError  # noqa: E402
from specdec.model import gpu_forward, gpu_kernels  # noqa: E402
from specdec.model.transformer import RMSNorm, apply_rope, causal_mask  # noqa: E402
from specdec.sampling.verify import ragged_inputs  # noqa: E402
from specdec.tree import DraftTree  # noqa: E402
from specdec.sampling.verify import tree_attention_mask  # noqa: E402

DEV = "cuda" if CUDA else "cpu"
DTYPES = [torch.float32, torch.bfloat16]


def close(a, b, dtype, fp32_tol=1e-5):
    """fp32: the same numbers up to the order of a sum (fp32_tol; a whole forward's logits gather more);
    bf16: within a rounding or two on a GPU (2^-7 relative), four under the interpreter's truncation."""
    tol = fp32_tol if dtype is torch.float32 else 1e-2 if CUDA else 3e-2
    torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)


def same_roundings(a, b, dtype):
    """Equal where the kernel rounds as torch does: in fp32, and in bf16 on a GPU (see the docstring)."""
    if dtype is torch.float32 or CUDA:
        assert torch.equal(a, b)
    else:
        close(a, b, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_is_the_residual_add_then_rmsnorm(dtype):
    g = torch.Generator().manual_seed(0)
    x, delta = (torch.randn(2, 3, 200, generator=g).to(DEV, dtype) for _ in range(2))
    norm = RMSNorm(200, 1e-6).to(DEV, dtype)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.1, generator=torch.Generator(DEV).manual_seed(1))
    want_x = x + delta
    got_x = x.clone()
    h = gpu_kernels.add_rms_norm(got_x, delta, norm.weight, 1e-6)
    same_roundings(got_x, want_x, dtype)  # the add rounds once, as torch's
    close(h, norm(want_x), dtype)
    plain = x.clone()
    close(gpu_kernels.add_rms_norm(plain, None, norm.weight, 1e-6), norm(x), dtype)
    assert torch.equal(plain, x)  # no delta: x untouched


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_is_the_gated_activation(dtype):
    gu = torch.randn(3, 2, 2 * 1500, generator=torch.Generator().manual_seed(2)).to(DEV, dtype)
    gate, up = gu.chunk(2, dim=-1)
    close(gpu_kernels.silu_mul(gu), torch.nn.functional.silu(gate) * up, dtype)


def qkv_and_tables(b, t, heads, kv, hd, dtype, seed=3):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(b, t, (heads + 2 * kv) * hd, generator=g).to(DEV, dtype)
    angles = torch.rand(b, t, hd // 2, generator=g) * 6.28
    cos, sin = (torch.cat([f(angles)] * 2, -1).to(DEV, dtype) for f in (torch.cos, torch.sin))  # [B, T, hd]
    return qkv, cos, sin


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qk_norm", [False, True], ids=["rope", "qk-norm-then-rope"])
def test_rope_store_rotates_q_in_place_and_writes_k_v_at_each_rows_slots(dtype, qk_norm):
    b, t, heads, kv, hd, cap = 2, 3, 4, 2, 16, 20
    qkv, cos, sin = qkv_and_tables(b, t, heads, kv, hd, dtype)
    kc, vc = (torch.zeros(3, kv, cap, hd, device=DEV, dtype=dtype) for _ in range(2))  # 3 cache rows
    rows = torch.tensor([2, 0], device=DEV)
    slots = torch.tensor([[5, 6, 7], [11, 12, 13]], device=DEV)
    q, k, v = qkv.split([heads * hd, kv * hd, kv * hd], -1)
    q, k = q.view(b, t, heads, hd).transpose(1, 2), k.view(b, t, kv, hd).transpose(1, 2)  # [B, heads, T, hd]
    norms = None
    if qk_norm:  # Qwen3's per-head norms before RoPE, each its own weights
        qn, kn = (RMSNorm(hd, 1e-6).to(DEV, dtype) for _ in range(2))
        with torch.no_grad():
            qn.weight.normal_(1.0, 0.2, generator=torch.Generator(DEV).manual_seed(2))
            kn.weight.normal_(1.0, 0.2, generator=torch.Generator(DEV).manual_seed(3))
        q, k, norms = qn(q), kn(k), (qn.weight, kn.weight, 1e-6)
    want_q = apply_rope(q, cos[:, None], sin[:, None])
    want_k = apply_rope(k, cos[:, None], sin[:, None])  # [B, kv, T, hd]
    v = v.view(b, t, kv, hd).transpose(1, 2).clone()
    gpu_kernels.rope_store(qkv, cos, sin, kc, vc, rows, slots, heads, kv, norms)
    check = same_roundings if not qk_norm else close  # a norm's sum in another order may round apart
    check(qkv[..., :heads * hd].view(b, t, heads, hd).transpose(1, 2), want_q, dtype)  # torch's roundings
    for i, (row, s) in enumerate(zip(rows.tolist(), slots.tolist())):
        check(kc[row][:, s], want_k[i], dtype)
        assert torch.equal(vc[row][:, s], v[i])
    assert kc[1].abs().sum() == 0 and kc[0][:, :11].abs().sum() == 0  # nothing else written


def sdpa(q, keys, values, mask, scale):
    """The torch path's attention: q [B, H, T, hd] over keys, values [B, KV, S, hd] under mask [B, 1, T, S]."""
    return torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale,
                                                            enable_gqa=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["decode", "causal", "ragged", "tree", "long", "splits32"])
def test_attention_matches_sdpa_over_the_cache(dtype, case):
    heads, kv, hd, cap = 4, 2, 16, 700  # 700: three key splits
    b, t = (2, 3) if case == "ragged" else (1, 1 if case in ("decode", "long", "splits32") else 5)
    lengths = {"decode": [9], "causal": [40], "ragged": [30, 7], "tree": [12], "long": [600], "splits32": [600]}[case]
    qkv, _, _ = qkv_and_tables(b, t, heads, kv, hd, dtype, seed=4)
    g = torch.Generator().manual_seed(5)
    kc, vc = (torch.randn(b, kv, cap, hd, generator=g).to(DEV, dtype) for _ in range(2))
    rows = torch.arange(b, device=DEV)
    if case == "ragged":
        _, slots, _, mask4 = ragged_inputs(lengths, [[1, 2, 3], [1]], DEV)
        mask = mask4.flatten(1, 2)  # [B, T, S]
    elif case == "tree":
        tree = DraftTree(torch.tensor([1, 2, 3, 4]), torch.tensor([-1, 0, 0, 1]))
        mask = tree_attention_mask(tree, lengths[0], DEV)[None]  # [1, T, S]
        slots = torch.arange(lengths[0], lengths[0] + t, device=DEV)[None]
    else:
        slots = torch.arange(lengths[0], lengths[0] + t, device=DEV)[None]
        m = causal_mask(lengths[0], t, DEV)
        mask = None if m is None else m[None]
    split = {"splits32": 32}.get(case, gpu_kernels.SPLIT_KEYS)  # 32: 19 of 22 splits hold keys
    got = gpu_kernels.attention(qkv, kc, vc, rows, slots, mask, heads, 0.25, split_keys=split)
    q = qkv[..., :heads * hd].view(b, t, heads, hd).transpose(1, 2)
    s = int(slots.max()) + 1
    full = torch.arange(s, device=DEV)[None, None, :] <= slots[:, :, None]  # [B, T, S]: up to each row's own slot
    want_mask = full if mask is None else mask.expand(b, t, s)
    want = sdpa(q.float(), kc[..., :s, :].float(), vc[..., :s, :].float(), want_mask[:, None], 0.25)
    close(got.view(b, t, heads, hd).transpose(1, 2), want.to(dtype), dtype)


@pytest.mark.parametrize("split", [16, 96])
def test_attention_refuses_a_key_split_it_cannot_run(split):
    qkv, _, _ = qkv_and_tables(1, 1, 4, 2, 16, torch.float32, seed=4)
    cache = torch.zeros(1, 2, 64, 16, device=DEV)
    with pytest.raises(ValueError, match="power of two of at least 32"):
        gpu_kernels.attention(qkv, cache, cache, torch.zeros(1, dtype=torch.long, device=DEV),
                              torch.zeros(1, 1, dtype=torch.long, device=DEV), None, 4, 0.25, split_keys=split)


def fused_and_plain(seed=0, **overrides):
    """A tiny model with the fused loop and the same weights on the torch path."""
    plain = tiny_model(seed, attention_bias=True, **overrides).to(DEV)
    fused = tiny_model(seed, attention_bias=True, **overrides).to(DEV)
    gpu_forward.enable(fused)
    return fused, plain


FAMILY_SWITCHES = {"qwen2": {}, "qwen3": {"qk_norm": True},
                   "granite": dict(embedding_multiplier=6.0, residual_multiplier=0.3, logits_scaling=3.0,
                                   attn_scale=0.1)}


@pytest.mark.parametrize("family", sorted(FAMILY_SWITCHES))
def test_the_fused_forward_gives_the_torch_paths_logits_and_cache(family):
    fused, plain = fused_and_plain(**FAMILY_SWITCHES[family])
    x = torch.randint(0, 96, (1, 30), generator=torch.Generator().manual_seed(0)).to(DEV)
    caches = [m.new_cache(64) for m in (fused, plain)]
    for m, c in zip((fused, plain), caches):
        m(x[:, :20], c, 0)  # a 20-row prefill
    outs = [m(x[:, 20:25], c, 20) for m, c in zip((fused, plain), caches)]  # a 5-row verify
    close(outs[0], outs[1], torch.float32, 1e-4)
    outs = [m(x[:, 25:26], c, 25) for m, c in zip((fused, plain), caches)]  # a decode step
    close(outs[0], outs[1], torch.float32, 1e-4)
    close(caches[0].k[:, :, :, :26], caches[1].k[:, :, :, :26], torch.float32)
    close(caches[0].v[:, :, :, :26], caches[1].v[:, :, :, :26], torch.float32)


def test_the_fused_forward_serves_static_and_ragged_forwards():
    fused, plain = fused_and_plain(1)
    x = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(1)).to(DEV)
    caches = [m.new_cache(32, batch=2) for m in (fused, plain)]
    for m, c in zip((fused, plain), caches):
        m(x[:, :8], c, 0)
    tokens, slots, positions, mask = ragged_inputs([8, 5], [[1, 2, 3], [4]], DEV)
    outs = [m(tokens, c, 0, positions=positions, mask=mask, slots=slots) for m, c in zip((fused, plain), caches)]
    close(outs[0], outs[1], torch.float32, 1e-4)
    single = [m.new_cache(32) for m in (fused, plain)]
    for m, c in zip((fused, plain), single):
        m(x[:1, :8], c, 0)
    slots = torch.tensor([8, 9], device=DEV)
    cap_mask = torch.arange(32, device=DEV)[None, :] <= slots[:, None]  # [T, capacity]
    outs = [m.static_forward(x[:1, 8:10], c, slots, slots[None], cap_mask) for m, c in zip((fused, plain), single)]
    close(outs[0], outs[1], torch.float32, 1e-4)


def test_greedy_decoding_through_the_fused_loop_gives_the_torch_paths_tokens():
    fused, plain = fused_and_plain(2)
    prompts = [[3, 14, 15, 92, 65], [35, 89, 79]]
    cfg = GenerationConfig(max_new_tokens=24, k=1, stop_at_eos=False)
    got = [run_engine(Engine.single(m, NoDrafter(), 64), prompts, cfg, set()) for m in (fused, plain)]
    assert got[0] == got[1] and all(len(t) == 24 for t in got[0].values())


def test_models_the_loop_does_not_serve_are_a_clear_error():
    with pytest.raises(SpecdecError, match="sandwich norms"):
        gpu_forward.enable(tiny_model(0, sandwich_norms=True))
    with pytest.raises(SpecdecError, match="power of two"):
        gpu_forward.enable(tiny_model(0, head_dim=24, hidden_size=96))
    with pytest.raises(SpecdecError, match="mixtures of experts"):
        gpu_forward.enable(tiny_model(0, num_experts=4, experts_per_token=2, expert_intermediate_size=16))


def test_a_ragged_forward_under_a_capacity_wide_mask_is_the_same_forward():
    """What a graphed ragged batch runs (cuda_graphs.py): the mask padded to the cache's capacity."""
    fused, _ = fused_and_plain(3)
    x = torch.randint(0, 96, (2, 10), generator=torch.Generator().manual_seed(3)).to(DEV)
    caches = [fused.new_cache(40, batch=2) for _ in range(2)]
    for c in caches:
        fused(x[:, :6], c, 0)
    tokens, slots, positions, mask = ragged_inputs([6, 4], [[1, 2, 3], [4, 5]], DEV)
    wide = torch.zeros(2, 1, 3, 40, dtype=torch.bool, device=DEV)
    wide[..., :mask.shape[-1]] = mask
    a = fused(tokens, caches[0], 0, positions=positions, mask=mask, slots=slots)
    b = fused(tokens, caches[1], 0, positions=positions, mask=wide, slots=slots)
    assert torch.equal(a, b) and torch.equal(caches[0].k, caches[1].k)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graphs_over_the_fused_loop_keep_greedy_output_exact(dtype):
    """In fp32 on a random model; in bf16 on the GPU bench's successor models, whose greedy margins are
    wider than bf16's rounding (a random model's near-ties break either way under another summation order)."""
    from specdec.bench.synthetic import successor_model
    from specdec.drafters.draft_model import DraftModelDrafter
    from specdec.model.cuda_graphs import enable_cuda_graphs

    def models():
        if dtype is torch.float32:
            return tiny_model(0).to("cuda"), tiny_model(1).to("cuda")
        return (successor_model(shape, "cuda", dtype, 0)[0] for shape in ("tiny-target", "tiny-draft"))
    prompts = [[5, 17, 3, 88, 41, 5, 17], [9, 2, 61, 2, 9]]
    cfg = GenerationConfig(32, 4, stop_at_eos=False)
    plain = run_engine(Engine.single(next(iter(models())), NoDrafter(), 128), prompts, cfg, set())
    graphed, draft = models()
    vocab = graphed.config.vocab_size
    for m in (graphed, draft):
        gpu_forward.enable(m)
        enable_cuda_graphs(m)
    for factory in (NoDrafter, lambda: DraftModelDrafter(draft, vocab, 128)):
        assert run_engine(Engine.single(graphed, factory(), 128), prompts, cfg, set()) == plain
        batched = Engine(graphed, factory, 128, max_batch=2)  # ragged verifies, graphed through the fused loop
        assert run_engine(batched, prompts, cfg, set()) == plain
    assert any(key[-1] for key in graphed.graphs.graphs)  # a ragged batch was captured
