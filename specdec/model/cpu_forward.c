/* A forward of a few positions through every decoder layer in one call (decode steps and verify
 * passes on the CPU): the same ops the Python layer loop calls (rms_norm, rope, attend, silu_mul
 * of fused_ops.c; quant_gemm_q8 on each linear layer's GGUF blocks) in the same order
 * on the same data, so the result is that loop's, bit for bit, without its ~20 Python and ctypes
 * calls a layer (a third of the 0.5B draft model's step; cpu_forward.py).
 *
 * Scope: one sequence (batch 1) writing new positions at slots start .. start + T - 1, or a ragged batch
 * (each row its own cache row, slots and mask), T <= 16 positions a row, every linear layer on GGUF
 * blocks, a Llama-shaped layer (RMSNorm, rotate-half RoPE, grouped-query attention, gated MLP) with
 * the switches of its family: per-head q/k norms, norms on the attention's and the MLP's outputs, SiLU
 * or GELU-tanh gate, sliding-window layers with their own RoPE rows and mask, the attention's scale.
 * The caller falls back to the Python loop for anything else.
 */
#include <stdint.h>
#include <string.h>

#include "kernels.h"

/* Y[T, N] = X[T, K] . W^T + b, as cpu_kernels.quant_linear does it (part by part, the bias per part) */
static int linear(const fw_linear *l, const float *X, float *Y, int64_t T, int nthreads) {
    int64_t off = 0;
    for (int64_t p = 0; p < l->n_parts; p++) {
        const fw_part *q = &l->parts[p];
        const float *b = l->bias ? l->bias + off : 0;
        const int rc = quant_gemm_q8(q->type, q->data, X, b, Y + off, q->rows, l->K, T, l->K, l->N, nthreads);
        if (rc) return rc;
        off += q->rows;
    }
    return 0;
}

/* Floats of scratch forward_layers needs for n rows (all the batch's positions): h [n, D], y [n, (H + 2 KV) hd],
 * att [n, H hd], t [n, D], gu [n, 2 I], a [n, I]. */
int64_t forward_scratch_floats(int64_t n, int64_t D, int64_t H, int64_t KV, int64_t hd, int64_t I) {
    return n * (2 * D + (H + 2 * KV) * hd + H * hd + 3 * I);
}

/* x [B T, D] (the embeddings in, the last layer's output out) through layers[0 .. L), for B sequences of T
 * new positions each: a decode step or verify pass of one sequence (B = 1), or a ragged batch (the
 * server's), whose GEMMs then read each weight once for all B T rows.
 * cos, sin [B T, hd]: the RoPE rows of the positions. kc, vc: the caches, [KV, cap, hd] a layer and a row:
 * row r (of n_rows) of layer l at kc + l * layer_stride + r * row_stride; batch row b is cache row rows[b]
 * (rows NULL: row b). Position t of row b writes its key and value at slot slots[b T + t] (slots NULL:
 * start + t) and attends to the first S slots, those with mask[b smb + t smt + s] set (bool; NULL: all S).
 * A sliding-window layer takes lcos, lsin and lmask (strides lsmb, lsmt) instead. q.k is scaled by
 * `scale`. Returns 0, or -1 (bad sizes, a slot outside the cache, or a GEMM that refused: nothing was
 * written past the failing layer). */
int forward_rows(const fw_layer *layers, int64_t L, float *x, int64_t B, int64_t T, int64_t D, int64_t H, int64_t KV,
                 int64_t hd, int64_t I, float eps, float scale, const float *cos, const float *sin,
                 const float *lcos, const float *lsin, float *kc, float *vc, int64_t cap, int64_t layer_stride,
                 int64_t row_stride, int64_t n_rows, const int64_t *rows, const int64_t *slots, int64_t start,
                 int64_t S,
                 const uint8_t *mask, int64_t smb, int64_t smt, const uint8_t *lmask, int64_t lsmb, int64_t lsmt,
                 float *scratch, int nthreads) {
    if (B < 1 || T < 1 || T > FW_MAX_T || S < 1 || S > cap || H % KV || row_stride < 0
        || layer_stride < KV * cap * hd) return -1;
    for (int64_t i = 0; i < B * T; i++) { /* every write lands inside the cache */
        const int64_t r = rows ? rows[i / T] : i / T, slot = slots ? slots[i] : start + i % T;
        if (r < 0 || r >= n_rows || slot < 0 || slot >= cap) return -1;
    }
    const int64_t n = B * T, nq = (H + 2 * KV) * hd;
    float *h = scratch, *y = h + n * D, *att = y + n * nq, *t = att + n * H * hd, *gu = t + n * D, *a = gu + n * 2 * I;
    for (int64_t l = 0; l < L; l++) {
        const fw_layer *ly = &layers[l];
        float *kl = kc + l * layer_stride, *vl = vc + l * layer_stride;
        const float *c = ly->local ? lcos : cos, *s = ly->local ? lsin : sin;
        const uint8_t *m = ly->local ? lmask : mask;
        const int64_t mb = ly->local ? lsmb : smb, mt = ly->local ? lsmt : smt;
        rms_norm(x, ly->ln1, h, n, D, D, eps);
        if (linear(&ly->qkv, h, y, n, nthreads)) return -1;
        if (ly->q_norm) {
            head_norm(y, ly->q_norm, n, H, hd, nq, eps);
            head_norm(y + H * hd, ly->k_norm, n, KV, hd, nq, eps);
        }
        rope(y, c, s, B, T, H + KV, hd, T * nq, nq, T * hd, hd); /* q and k, in place */
        for (int64_t i = 0; i < n; i++) {
            const int64_t r = rows ? rows[i / T] : i / T, slot = slots ? slots[i] : start + i % T;
            float *kr = kl + r * row_stride, *vr = vl + r * row_stride;
            for (int64_t g = 0; g < KV; g++) {
                memcpy(kr + (g * cap + slot) * hd, y + i * nq + (H + g) * hd, sizeof(float) * hd);
                memcpy(vr + (g * cap + slot) * hd, y + i * nq + (H + KV + g) * hd, sizeof(float) * hd);
            }
        }
        attend(y, kl, vl, rows, m, att, B, T, H, KV, hd, S, T * nq, nq, row_stride, cap * hd, mb, mt, T * H * hd,
               H * hd, scale, nthreads);
        if (linear(&ly->o, att, t, n, nthreads)) return -1;
        if (ly->attn_post) rms_norm(t, ly->attn_post, t, n, D, D, eps);
        for (int64_t i = 0; i < n * D; i++) x[i] += t[i];
        rms_norm(x, ly->ln2, h, n, D, D, eps);
        if (linear(&ly->gate_up, h, gu, n, nthreads)) return -1;
        for (int64_t i = 0; i < n; i++) gate_mul(gu + i * 2 * I, gu + i * 2 * I + I, a + i * I, I, ly->act);
        if (linear(&ly->down, a, t, n, nthreads)) return -1;
        if (ly->mlp_post) rms_norm(t, ly->mlp_post, t, n, D, D, eps);
        for (int64_t i = 0; i < n * D; i++) x[i] += t[i];
    }
    return 0;
}

/* forward_rows for one sequence (B = 1): x [T, D], cos, sin [T, hd]; its cache's layer l at kc + l * layer_stride;
 * new positions at slots start .. start + T - 1, position t attending to slots 0 .. start + t under mask
 * [T, >= start + T] (row stride mask_stride) or to all of them (NULL); the sliding layers' lmask likewise. */
int forward_layers(const fw_layer *layers, int64_t L, float *x, int64_t T, int64_t D, int64_t H, int64_t KV,
                   int64_t hd, int64_t I, float eps, float scale, const float *cos, const float *sin,
                   const float *lcos, const float *lsin, float *kc, float *vc, int64_t cap, int64_t layer_stride,
                   int64_t start, const uint8_t *mask, int64_t mask_stride, const uint8_t *lmask,
                   int64_t lmask_stride, float *scratch, int nthreads) {
    if (start < 0 || T < 1 || start + T > cap) return -1;
    return forward_rows(layers, L, x, 1, T, D, H, KV, hd, I, eps, scale, cos, sin, lcos, lsin, kc, vc, cap,
                        layer_stride, 0, 1, NULL, NULL, start, start + T, mask, 0, mask_stride, lmask, 0, lmask_stride,
                        scratch, nthreads);
}
