"""Triton kernels for the GPU's decode and verify steps: the small ops between the GEMMs, fused.

A 1.5B model's step on a GPU reads 3 GB in under a millisecond at the memory's rate, yet the torch
path launches about 45 kernels a layer (RMSNorm alone is six, RoPE a dozen), each a few microseconds
even inside a CUDA graph. These four cut a layer to ten launches (gpu_forward.py):

- `add_rms_norm`: the residual add of the branch before, then RMSNorm (one kernel a norm);
- `rope_store`: RoPE on q and k (after their per-head norms, Qwen3's), k and v written to the KV cache at
  each row's slots (one kernel);
- `attention`: each position's q heads over its cache row's keys up to its last slot, under a bool
  mask, in key splits (flash-decoding), each split reading its keys once for every q head of a kv head
  and every position; then one combine: two kernels, whatever the context;
- `silu_mul`: the gated MLP's silu(gate) * up (one kernel).

Each rounds where the torch path rounds (to the model's dtype after each op it runs), so in fp32 they
give the torch path's numbers up to the order of a sum, and in bf16 its roundings. Where every
position, slot and length comes from device tensors, nothing here syncs with the host: a CUDA graph
captures them. Triton is imported at first use; on a CPU the tests run these kernels in Triton's
interpreter (TRITON_INTERPRET=1), against the torch path's arithmetic on the same inputs.
"""

from __future__ import annotations

import functools

import torch

from specdec.errors import SpecdecError

SPLIT_KEYS = 256  # keys a split of the attention covers at most: the grid grows with the cache's capacity


def available() -> str | None:
    """None where Triton imports, else why not."""
    try:
        import triton  # noqa: F401
    except ImportError as e:
        return f"Triton is not installed ({e})"
    return None


@functools.cache
def _kernels():
    """The jitted kernels (Triton imported here, not with the package: only the GPU path needs it)."""
    reason = available()
    if reason is not None:
        raise SpecdecError(f"--gpu-kernels needs Triton: {reason}; pip install triton, or drop --gpu-kernels")
    import triton
    import triton.language as tl

    @triton.jit
    def add_rms_norm_kernel(x, delta, w, out, D, eps, HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        d = tl.arange(0, BLOCK)
        m = d < D
        dt = x.dtype.element_ty
        v = tl.load(x + r * D + d, mask=m, other=0.0).to(tl.float32)
        if HAS_DELTA:  # x + delta in the model's dtype, as torch adds them
            v = (v + tl.load(delta + r * D + d, mask=m, other=0.0).to(tl.float32)).to(dt).to(tl.float32)
            tl.store(x + r * D + d, v.to(dt), mask=m)
        inv = 1.0 / tl.sqrt(tl.sum(v * v, axis=0) / D + eps)
        h = (v * inv).to(dt).to(tl.float32) * tl.load(w + d, mask=m, other=0.0).to(tl.float32)
        tl.store(out + r * D + d, h.to(dt), mask=m)

    @triton.jit
    def rope_store_kernel(qkv, cos, sin, kc, vc, rows, slots, qn, kn, eps, T, W, H, KV, cos_sb, slot_sb, c_sb, c_sh,
                          HD: tl.constexpr, HEADS: tl.constexpr, QK_NORM: tl.constexpr):
        r = tl.program_id(0)  # the token: batch row b, position t; its q heads, then its k heads
        b = r // T
        t = r % T
        dt = qkv.dtype.element_ty
        hh = tl.arange(0, HEADS)[:, None]  # [HEADS, 1]
        d = tl.arange(0, HD)[None, :]  # [1, HD]
        is_q = hh < H
        is_k = (hh >= H) & (hh < H + KV)
        base = qkv + r.to(tl.int64) * W
        x = tl.load(base + hh * HD + d, mask=is_q | is_k, other=0.0).to(tl.float32)
        half = HD // 2
        partner = (d + half) % HD
        rot = tl.load(base + hh * HD + partner, mask=is_q | is_k, other=0.0).to(tl.float32)
        if QK_NORM:  # Qwen3: each head's RMSNorm before RoPE (q's weights, k's), rounded as torch's RMSNorm
            inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / HD + eps)[:, None]  # [HEADS, 1]: the row's, for both
            w = tl.where(is_q, tl.load(qn + d).to(tl.float32), tl.load(kn + d).to(tl.float32))
            w2 = tl.where(is_q, tl.load(qn + partner).to(tl.float32), tl.load(kn + partner).to(tl.float32))
            x = ((x * inv).to(dt).to(tl.float32) * w).to(dt).to(tl.float32)
            rot = ((rot * inv).to(dt).to(tl.float32) * w2).to(dt).to(tl.float32)
        rot = rot * tl.where(d < half, -1.0, 1.0)
        c = tl.load(cos + b * cos_sb + t * HD + d).to(tl.float32)
        s = tl.load(sin + b * cos_sb + t * HD + d).to(tl.float32)
        y = ((x * c).to(dt).to(tl.float32) + (rot * s).to(dt).to(tl.float32)).to(dt)  # torch's three roundings
        tl.store(base + hh * HD + d, y, mask=is_q & (d < HD))  # q, in place
        slot = tl.load(slots + b * slot_sb + t).to(tl.int64)
        at = tl.load(rows + b).to(tl.int64) * c_sb + (hh - H) * c_sh + slot * HD + d
        kmask = is_k & (d < HD)
        tl.store(kc + at, y, mask=kmask)
        tl.store(vc + at, tl.load(base + (hh + KV) * HD + d, mask=kmask, other=0.0), mask=kmask)

    @triton.jit
    def attention_split_kernel(qkv, kc, vc, rows, slots, mask, pm, pl, pacc, T, W, H, G, c_sb, c_sh, slot_sb,
                               mask_sb, mask_st, S, scale, NSPLIT, HD: tl.constexpr, HAS_MASK: tl.constexpr,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
                               UPCAST: tl.constexpr):
        bk = tl.program_id(0)  # batch row b, kv head
        kvh = bk % (H // G)
        b = bk // (H // G)
        sp = tl.program_id(2)
        rows_m = T * G  # query rows (t, g): position t, q head kvh * G + g; all read this kv head's keys
        r = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        live = r < rows_m
        t = r // G
        d = tl.arange(0, HD)
        q = tl.load(qkv + ((b * T + t).to(tl.int64) * W + (kvh * G + r % G) * HD)[:, None] + d[None, :],
                    mask=live[:, None], other=0.0)  # [BLOCK_M, HD]
        if UPCAST:  # the same products (exact in fp32) and fp32 sums: what the interpreter can run
            q = q.to(tl.float32)
        # the row's keys end at its last written slot (no query sees past it: causal, tree and ragged masks)
        end = tl.minimum(tl.load(slots + b * slot_sb + T - 1).to(tl.int32) + 1, S)
        lo = sp * SPLIT
        hi = tl.minimum(lo + SPLIT, end)
        kbase = tl.load(rows + b).to(tl.int64) * c_sb + kvh * c_sh
        m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HD], tl.float32)
        for start in range(lo, hi, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            ok = live[:, None] & (n < hi)[None, :]
            if HAS_MASK:
                ok = ok & (tl.load(mask + b * mask_sb + t[:, None] * mask_st + n[None, :], mask=ok, other=0) != 0)
            at = kbase + n.to(tl.int64)[:, None] * HD + d[None, :]
            k = tl.load(kc + at, mask=(n < hi)[:, None], other=0.0)  # [BLOCK_N, HD]
            if UPCAST:
                k = k.to(tl.float32)
            score = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # [BLOCK_M, BLOCK_N]
            score = tl.where(ok, score, -1.0e30)
            m_new = tl.maximum(m_i, tl.max(score, axis=1))
            p = tl.where(ok, tl.exp(score - m_new[:, None]), 0.0)
            keep = tl.exp(m_i - m_new)
            v = tl.load(vc + at, mask=(n < hi)[:, None], other=0.0)
            pv = p.to(v.dtype)  # as flash attention rounds it
            if UPCAST:
                pv, v = pv.to(tl.float32), v.to(tl.float32)
            acc = acc * keep[:, None] + tl.dot(pv, v, input_precision="ieee")
            l_i = l_i * keep + tl.sum(p, axis=1)
            m_i = m_new
        at = (bk * NSPLIT + sp) * rows_m + r
        # a split past the row's last key stores nothing (the combine stops before it); the bound as a block, which
        # every Triton's interpreter takes as a mask
        kept = live & (tl.full([BLOCK_M], lo, tl.int32) < end)
        tl.store(pm + at, m_i, mask=kept)
        tl.store(pl + at, l_i, mask=kept)
        tl.store(pacc + at.to(tl.int64)[:, None] * HD + d[None, :], acc, mask=kept[:, None])

    @triton.jit
    def attention_combine_kernel(pm, pl, pacc, out, slots, T, H, G, NSPLIT, slot_sb, S, HD: tl.constexpr,
                                 BLOCK_M: tl.constexpr, SPLIT: tl.constexpr):
        bk = tl.program_id(0)
        kvh = bk % (H // G)
        b = bk // (H // G)
        rows_m = T * G
        r = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        live = r < rows_m
        d = tl.arange(0, HD)
        m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HD], tl.float32)
        # the splits that hold keys of this row (up to its last slot); the rest of the grid found none
        end = tl.minimum(tl.load(slots + b * slot_sb + T - 1).to(tl.int32) + 1, S)
        for sp in range(0, tl.minimum(tl.cdiv(end, SPLIT), NSPLIT)):  # merged as the split kernel merges blocks
            at = (bk * NSPLIT + sp) * rows_m + r
            m = tl.load(pm + at, mask=live, other=-1.0e30)
            m_new = tl.maximum(m_i, m)
            keep = tl.exp(m_i - m_new)
            w = tl.exp(m - m_new)
            part = tl.load(pacc + at.to(tl.int64)[:, None] * HD + d[None, :], mask=live[:, None], other=0.0)
            acc = acc * keep[:, None] + part * w[:, None]
            l_i = l_i * keep + tl.load(pl + at, mask=live, other=0.0) * w
            m_i = m_new
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        dest = ((b * T + r // G) * H + kvh * G + r % G).to(tl.int64)
        tl.store(out + dest[:, None] * HD + d[None, :], o.to(out.dtype.element_ty), mask=live[:, None])

    @triton.jit
    def silu_mul_kernel(gu, out, I, BLOCK: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = c < I
        dt = out.dtype.element_ty
        g = tl.load(gu + r * 2 * I + c, mask=m, other=0.0).to(tl.float32)
        u = tl.load(gu + r * 2 * I + I + c, mask=m, other=0.0).to(tl.float32)
        a = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        tl.store(out + r * I + c, (a * u).to(dt), mask=m)

    return {"add_rms_norm": add_rms_norm_kernel, "rope_store": rope_store_kernel,
            "attention_split": attention_split_kernel, "attention_combine": attention_combine_kernel,
            "silu_mul": silu_mul_kernel, "next_power_of_2": triton.next_power_of_2}


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x += delta (in place; skipped for None), then RMSNorm(x) * weight: x, delta # [rows..., D] contiguous,
    weight # [D]; returns a new [rows..., D]."""
    k = _kernels()
    out = torch.empty_like(x)
    d = x.shape[-1]
    k["add_rms_norm"][(x.numel() // d,)](x, x if delta is None else delta, weight, out, d, eps,
                                         HAS_DELTA=delta is not None, BLOCK=k["next_power_of_2"](d))
    return out


def rope_store(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               rows: torch.Tensor, slots: torch.Tensor, heads: int, kv_heads: int, qk_norms=None) -> None:
    """RoPE on q and k of qkv # [B, T, (heads + 2 kv_heads) * head_dim] (q in place), k and v written to one
    layer's k_cache, v_cache # [batch, kv_heads, capacity, head_dim] at cache row rows[b] # [B], slots[b, t]
    # [B, T] (a batch stride of 0 shares one row of slots); cos, sin # [B, T, head_dim] (batch stride 0 too).
    qk_norms: (q's weight # [head_dim], k's, eps) of per-head RMSNorms before RoPE (Qwen3), or None."""
    b, t, w = qkv.shape
    hd = k_cache.shape[-1]
    k = _kernels()
    qn, kn, eps = qk_norms if qk_norms is not None else (cos, cos, 0.0)  # unread without norms
    k["rope_store"][(b * t,)](qkv, cos, sin, k_cache, v_cache, rows, slots, qn, kn, eps, t, w, heads, kv_heads,
                              cos.stride(0), slots.stride(0), k_cache.stride(0), k_cache.stride(1), HD=hd,
                              HEADS=k["next_power_of_2"](heads + kv_heads), QK_NORM=qk_norms is not None)


def attention(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, rows: torch.Tensor,
              slots: torch.Tensor, mask: torch.Tensor | None, heads: int, scale: float,
              split_keys: int = SPLIT_KEYS) -> torch.Tensor:
    """Softmax attention of the q heads of qkv # [B, T, (heads + 2 kv_heads) * head_dim] over cache row rows[b]
    of k_cache, v_cache # [batch, kv_heads, capacity, head_dim], keys 0..slots[b, T-1] (slots # [B, T]) under
    mask # [B or 1, T, S] bool (None: every key to the row's last slot; S caps the keys); q head h reads kv
    head h // (heads / kv_heads). One program a (row, kv head, rows block, key split) reads its keys once
    for every q head that shares them and every position; split_keys: keys a split covers at most (a power of
    two, at least 32). Returns [B, T, heads * head_dim] in qkv's dtype."""
    if split_keys < 32 or split_keys & (split_keys - 1):
        raise ValueError(f"split_keys must be a power of two of at least 32 (the kernel's key block), got {split_keys}")
    k = _kernels()
    b, t, w = qkv.shape
    kv, cap, hd = k_cache.shape[1:]
    g = heads // kv
    s = cap if mask is None else mask.shape[-1]
    nsplit = max(1, -(-s // split_keys))
    block_m = 16 if t * g <= 16 else 32
    grid = (b * kv, -(-(t * g) // block_m))
    dev = qkv.device
    pm = torch.empty(b * kv * nsplit * t * g, device=dev, dtype=torch.float32)
    pl = torch.empty_like(pm)
    pacc = torch.empty(pm.shape[0], hd, device=dev, dtype=torch.float32)
    # bool as bytes: compiled Triton reads a torch.bool pointer (*i1) bit-packed, not a byte an element
    m = mask.view(torch.uint8) if mask is not None else pm  # pm: unread without a mask
    m_sb, m_st = (mask.stride(0) if mask.shape[0] > 1 else 0, mask.stride(1)) if mask is not None else (0, 0)
    k["attention_split"][(*grid, nsplit)](
        qkv, k_cache, v_cache, rows, slots, m, pm, pl, pacc, t, w, heads, g, k_cache.stride(0), k_cache.stride(1),
        slots.stride(0), m_sb, m_st, s, scale, nsplit, HD=hd, HAS_MASK=mask is not None, BLOCK_M=block_m,
        BLOCK_N=32, SPLIT=split_keys, UPCAST=dev.type != "cuda")  # off CUDA: Triton's interpreter, whose dot
    # multiplies bf16's raw bits
    out = torch.empty(b, t, heads * hd, device=dev, dtype=qkv.dtype)
    k["attention_combine"][grid](pm, pl, pacc, out, slots, t, heads, g, nsplit, slots.stride(0), s, HD=hd,
                                 BLOCK_M=block_m, SPLIT=split_keys)
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of gate_up # [rows..., 2 I] (gate, then up), rounded as torch's two ops: [rows..., I]."""
    k = _kernels()
    i = gate_up.shape[-1] // 2
    out = torch.empty(*gate_up.shape[:-1], i, device=gate_up.device, dtype=gate_up.dtype)
    block = 1024
    k["silu_mul"][(gate_up.numel() // (2 * i), -(-i // block))](gate_up, out, i, BLOCK=block)
    return out
