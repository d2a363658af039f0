"""Our fused CPU ops (specdec/model/fused_ops.c): RMSNorm, RoPE and attention against torch's, the
same bits for a position whatever the number of positions (the model on them: test_gguf_backend.py)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from specdec.model import cpu_kernels
from specdec.model.transformer import RMSNorm, apply_rope, causal_mask

pytestmark = pytest.mark.skipif(not cpu_kernels.available(),
                                reason=f"kernels unavailable: {cpu_kernels.unavailable_reason()}")


def test_rms_norm_matches_torch():
    torch.manual_seed(0)
    norm = RMSNorm(200, 1e-5)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(3, 5, 200) * 4
    torch.testing.assert_close(cpu_kernels.rms_norm(x, norm.weight, 1e-5), norm(x), atol=1e-5, rtol=1e-5)
    strided = torch.randn(3, 400)[:, :200]  # a non-contiguous input is copied, not misread
    torch.testing.assert_close(cpu_kernels.rms_norm(strided, norm.weight, 1e-5), norm(strided), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("head_dim", [16, 64, 128])
def test_rope_matches_torch(head_dim):
    torch.manual_seed(0)
    B, T, heads = 2, 3, 5
    y = torch.randn(B, T, (heads + 2) * head_dim)
    cos, sin = torch.randn(B, 1, T, head_dim), torch.randn(B, 1, T, head_dim)
    ref = apply_rope(y[..., :heads * head_dim].view(B, T, heads, head_dim).transpose(1, 2), cos, sin)
    rest = y[..., heads * head_dim:].clone()
    cpu_kernels.rope_(y, cos, sin, heads, head_dim)
    torch.testing.assert_close(y[..., :heads * head_dim].view(B, T, heads, head_dim).transpose(1, 2), ref,
                               atol=1e-5, rtol=1e-5)
    assert torch.equal(y[..., heads * head_dim:], rest)  # heads past `heads` untouched


BF16 = cpu_kernels.available() and cpu_kernels.attention_precision() == "bf16"
# bf16: the kernel's numerators (fp32 exp) and the reference's (fp64) can round to neighbouring bf16s,
# 2^-8 of one slot's weight; a wrong operand or pairing moves outputs by tenths
FP32_TOL = {"atol": 2e-5, "rtol": 1e-4}


def tolerance(head_dim: int) -> dict:
    return {"atol": 2e-3, "rtol": 1e-3} if BF16 and head_dim % 64 == 0 else FP32_TOL


def sdpa_reference(q, k_cache, v_cache, slots, heads, rows=None, mask=None, softcap=0.0):
    """Attention in fp64 on the kernel's operands: in a bf16 build (attend_bf16.h, for head sizes in 64s)
    q, k, the softmax numerators and v rounded to bf16, the sum taken over the unrounded numerators.
    softcap > 0: each scaled score s as softcap tanh(s / softcap), before the mask (Gemma 2)."""
    B, T = q.shape[:2]
    D = k_cache.shape[-1]
    rows = torch.arange(B) if rows is None else rows
    qh = q[..., :heads * D].view(B, T, heads, D).transpose(1, 2)
    keys, values = k_cache[rows, :, :slots], v_cache[rows, :, :slots]
    if mask is not None:
        mask = mask[..., :slots]
    if not (BF16 and D % 64 == 0) and not softcap:
        out = F.scaled_dot_product_attention(qh.double(), keys.double(), values.double(), attn_mask=mask,
                                             enable_gqa=True)
        return out.transpose(1, 2).reshape(B, T, heads * D).float()
    bf16 = BF16 and D % 64 == 0
    rounded = [x.bfloat16().double() if bf16 else x.double() for x in (qh, keys, values)]
    qh, keys, values = rounded[0], *(x.repeat_interleave(heads // keys.shape[1], 1) for x in rounded[1:])
    scores = (qh @ keys.transpose(-1, -2)).float() * np.float32(1 / np.sqrt(np.float32(D)))
    if softcap:
        scores = (scores.double() / softcap).tanh().float() * softcap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    e = (scores - scores.amax(-1, keepdim=True)).double().exp().nan_to_num(0.0)
    out = ((e.float().bfloat16().double() if bf16 else e) @ values) / e.sum(-1, keepdim=True).clamp_min(1e-300)
    return out.transpose(1, 2).reshape(B, T, heads * D).float()


@pytest.mark.parametrize("head_dim", [32, 64, 128])  # 32: the plain path (not a multiple of 4 vectors)
@pytest.mark.parametrize("heads,kv", [(12, 2), (14, 2), (9, 3), (4, 4)])
def test_attend_matches_sdpa(head_dim, heads, kv):
    torch.manual_seed(0)
    cache_rows, cap, slots = 3, 40, 29
    k_cache, v_cache = torch.randn(cache_rows, kv, cap, head_dim), torch.randn(cache_rows, kv, cap, head_dim)
    for T in (1, 2, 5, 8):
        q = torch.randn(2, T, (heads + 2 * kv) * head_dim)  # a qkv projection's output
        got = cpu_kernels.attend(q, k_cache, v_cache, slots, heads)
        torch.testing.assert_close(got, sdpa_reference(q, k_cache, v_cache, slots, heads), **tolerance(head_dim))
        causal = causal_mask(slots - T, T, "cpu")  # [T, slots]
        got = cpu_kernels.attend(q, k_cache, v_cache, slots, heads, mask=causal)
        torch.testing.assert_close(got, sdpa_reference(q, k_cache, v_cache, slots, heads, mask=causal),
                                   **tolerance(head_dim))
        # ragged: per-row masks over a wider mask, and cache rows out of order
        rows = torch.tensor([2, 0])
        mask = torch.rand(2, 1, T, slots + 3) < 0.6
        mask[..., 0] = True
        got = cpu_kernels.attend(q, k_cache, v_cache, slots, heads, rows=rows, mask=mask)
        torch.testing.assert_close(got, sdpa_reference(q, k_cache, v_cache, slots, heads, rows, mask),
                                   **tolerance(head_dim))


@pytest.mark.parametrize("head_dim", [32, 64, 256])  # the plain path, the blocked one and Gemma 2's head
def test_attend_soft_caps_the_scores(head_dim):
    """Gemma 2: each scaled score s becomes cap tanh(s / cap) before the softmax, in every path of the kernel;
    scores far above the cap (q scaled up) make the capped and uncapped outputs differ widely."""
    torch.manual_seed(1)
    heads, kv, slots, cap = 8, 4, 45, 1.5
    k_cache, v_cache = torch.randn(2, kv, 48, head_dim), torch.randn(2, kv, 48, head_dim)
    for T in (1, 5, 11):
        q = torch.randn(2, T, (heads + 2 * kv) * head_dim) * 2
        mask = causal_mask(slots - T, T, "cpu")
        got = cpu_kernels.attend(q, k_cache, v_cache, slots, heads, mask=mask, softcap=cap)
        torch.testing.assert_close(got, sdpa_reference(q, k_cache, v_cache, slots, heads, mask=mask, softcap=cap),
                                   **tolerance(head_dim))
        assert (got - cpu_kernels.attend(q, k_cache, v_cache, slots, heads, mask=mask)).abs().max() > 0.1
        one = cpu_kernels.attend(q[:, -1:].contiguous(), k_cache, v_cache, slots, heads, softcap=cap)
        assert torch.equal(one[:, 0], got[:, -1])  # a query's bits alone


@pytest.mark.parametrize("start,T", [(50, 8), (0, 37), (230, 21)])
def test_attend_same_bits_whatever_the_query_count_and_zeros_for_no_slot(start, T):
    """Queries are blocked by position (each key and value row loaded once for several positions) and
    their slots by chunks: a query must still get the bits it gets alone, in a prefill from slot 0, a
    prefill chunk after a cached prefix and a verify pass (prefix slots shared, the diagonal per position)."""
    torch.manual_seed(2)
    S = start + T
    k_cache, v_cache = torch.randn(1, 2, S + 3, 128), torch.randn(1, 2, S + 3, 128)
    q = torch.randn(1, T, 16 * 128)
    full = cpu_kernels.attend(q, k_cache, v_cache, S, 12, mask=causal_mask(start, T, "cpu"))
    for t in range(T):
        one = cpu_kernels.attend(q[:, t:t + 1].contiguous(), k_cache, v_cache, start + t + 1, 12)
        assert torch.equal(one[:, 0], full[:, t])
    blind = torch.zeros(1, 1, T, S, dtype=torch.bool)
    assert torch.equal(cpu_kernels.attend(q, k_cache, v_cache, S, 12, mask=blind), torch.zeros(1, T, 12 * 128))


def test_a_verify_pass_over_a_tree_gives_each_node_its_bits_alone():
    """Several tree nodes in one pass: their shared prefix goes through the blocked tiles, each node's
    ancestors on its own; each node must get what a pass of that node alone under its own mask gets."""
    torch.manual_seed(4)
    start, T = 70, 7
    k_cache, v_cache = torch.randn(1, 2, 80, 128), torch.randn(1, 2, 80, 128)
    q = torch.randn(1, T, 16 * 128)
    mask = causal_mask(start, T, "cpu").clone()
    mask[:, start:] &= torch.rand(T, T) < 0.5  # a node sees some of the nodes before it
    mask[3, 12] = False  # and one node misses a prefix slot: its run from slot 0 is shorter
    full = cpu_kernels.attend(q, k_cache, v_cache, start + T, 12, mask=mask)
    for t in range(T):
        one = cpu_kernels.attend(q[:, t:t + 1].contiguous(), k_cache, v_cache, start + T, 12,
                                 mask=mask[t:t + 1].contiguous())
        assert torch.equal(one[:, 0], full[:, t])


@pytest.mark.parametrize("head_dim", [128, 48])
def test_a_tree_node_gets_the_bits_of_its_path_at_consecutive_slots(head_dim):
    """A node of a token tree sees its prefix and its ancestors, with siblings masked between them; its
    attention must be what a plain step over the same keys at consecutive slots gives, bit for bit
    (else a near-tie can flip a greedy token and tree output stops being plain decoding's)."""
    torch.manual_seed(3)
    k_cache, v_cache = torch.randn(1, 2, 64, head_dim), torch.randn(1, 2, 64, head_dim)
    q = torch.randn(1, 1, 12 * head_dim)
    seen = list(range(37)) + [38, 41, 45]  # prefix 0..36, then ancestors; 37, 39, 40, 42-44 are siblings
    mask = torch.zeros(1, 1, 1, 46, dtype=torch.bool)
    mask[..., seen] = True
    tree = cpu_kernels.attend(q, k_cache, v_cache, 46, 12, mask=mask)
    k_path, v_path = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    k_path[:, :, :len(seen)], v_path[:, :, :len(seen)] = k_cache[:, :, seen], v_cache[:, :, seen]
    assert torch.equal(tree, cpu_kernels.attend(q, k_path, v_path, len(seen), 12))


def test_bad_input_is_a_clear_error():
    k_cache = torch.randn(1, 2, 16, 64)
    with pytest.raises(ValueError, match="float32 CPU"):
        cpu_kernels.rms_norm(torch.randn(2, 8, dtype=torch.float64), torch.ones(8), 1e-5)
    with pytest.raises(ValueError, match="weight of 7"):
        cpu_kernels.rms_norm(torch.randn(2, 8), torch.ones(7), 1e-5)
    with pytest.raises(ValueError, match="mask must be bool"):
        cpu_kernels.attend(torch.randn(1, 2, 4 * 64), k_cache, k_cache, 8, 4, mask=torch.zeros(2, 8))
    with pytest.raises(ValueError, match="slots"):
        cpu_kernels.attend(torch.randn(1, 1, 4 * 64), k_cache, k_cache, 17, 4)
    with pytest.raises(ValueError, match="cache rows"):
        cpu_kernels.attend(torch.randn(2, 1, 4 * 64), k_cache, k_cache, 8, 4, rows=torch.tensor([0]))
    with pytest.raises(ValueError, match="rope_"):
        cpu_kernels.rope_(torch.randn(1, 2, 64), torch.randn(1, 2, 64), torch.randn(1, 2, 64), 2, 64)
