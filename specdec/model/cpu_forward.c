/* A forward of a few positions through every decoder layer in one call (decode steps and verify
 * passes on the CPU): the same ops the Python layer loop calls (rms_norm, rope, attend, silu_mul
 * of fused_ops.c; quant_gemm_q8 on each linear layer's GGUF blocks) in the same order
 * on the same data, so the result is that loop's, bit for bit, without its ~20 Python and ctypes
 * calls a layer (a third of the 0.5B draft model's step; cpu_forward.py).
 *
 * Scope: one sequence (batch 1), new positions written at slots start .. start + T - 1, T <= 16,
 * every linear layer on GGUF blocks, a Llama-shaped layer (RMSNorm, rotate-half RoPE, grouped-query
 * attention, gated MLP) with the switches of its family: per-head q/k norms, norms on the attention's
 * and the MLP's outputs, SiLU or GELU-tanh gate, sliding-window layers with their own RoPE rows and
 * mask, the attention's scale. The caller falls back to the Python loop for anything else.
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

/* Bytes of scratch forward_layers needs (floats): h [T, D], y [T, (H + 2 KV) hd], att [T, H hd],
 * t [T, D], gu [T, 2 I], a [T, I]. */
int64_t forward_scratch_floats(int64_t T, int64_t D, int64_t H, int64_t KV, int64_t hd, int64_t I) {
    return T * (2 * D + (H + 2 * KV) * hd + H * hd + 3 * I);
}

/* x [T, D] (the embeddings in, the last layer's output out) through layers[0 .. L).
 * cos, sin [T, hd]: the RoPE rows of the T positions. kc, vc: one sequence's caches, [KV, cap, hd] a layer,
 * layer l at kc + l * layer_stride (KV * cap * hd for a cache of one row; more for a row of a batched one);
 * the new keys and values go to slots start .. start + T - 1, and position t attends to slots
 * 0 .. start + t under mask [T, >= start + T] (bool, row stride mask_stride) or to all of them (NULL).
 * A sliding-window layer takes lcos, lsin and lmask (row stride lmask_stride) instead. q.k is scaled
 * by `scale`. Returns 0, or -1 (bad sizes, or a GEMM that refused: nothing was written past the
 * failing layer). */
int forward_layers(const fw_layer *layers, int64_t L, float *x, int64_t T, int64_t D, int64_t H, int64_t KV,
                   int64_t hd, int64_t I, float eps, float scale, const float *cos, const float *sin,
                   const float *lcos, const float *lsin, float *kc, float *vc, int64_t cap, int64_t layer_stride,
                   int64_t start, const uint8_t *mask, int64_t mask_stride, const uint8_t *lmask,
                   int64_t lmask_stride, float *scratch, int nthreads) {
    if (T < 1 || T > FW_MAX_T || start < 0 || start + T > cap || H % KV || layer_stride < KV * cap * hd) return -1;
    const int64_t nq = (H + 2 * KV) * hd, S = start + T;
    float *h = scratch, *y = h + T * D, *att = y + T * nq, *t = att + T * H * hd, *gu = t + T * D, *a = gu + T * 2 * I;
    for (int64_t l = 0; l < L; l++) {
        const fw_layer *ly = &layers[l];
        float *kl = kc + l * layer_stride, *vl = vc + l * layer_stride;
        const float *c = ly->local ? lcos : cos, *s = ly->local ? lsin : sin;
        const uint8_t *m = ly->local ? lmask : mask;
        const int64_t ms = ly->local ? lmask_stride : mask_stride;
        rms_norm(x, ly->ln1, h, T, D, D, eps);
        if (linear(&ly->qkv, h, y, T, nthreads)) return -1;
        if (ly->q_norm) {
            head_norm(y, ly->q_norm, T, H, hd, nq, eps);
            head_norm(y + H * hd, ly->k_norm, T, KV, hd, nq, eps);
        }
        rope(y, c, s, 1, T, H + KV, hd, 0, nq, 0, hd); /* q and k, in place */
        for (int64_t i = 0; i < T; i++)
            for (int64_t g = 0; g < KV; g++) {
                memcpy(kl + (g * cap + start + i) * hd, y + i * nq + (H + g) * hd, sizeof(float) * hd);
                memcpy(vl + (g * cap + start + i) * hd, y + i * nq + (H + KV + g) * hd, sizeof(float) * hd);
            }
        attend(y, kl, vl, 0, m, att, 1, T, H, KV, hd, S, 0, nq, 0, cap * hd, 0, ms, 0, H * hd, scale, nthreads);
        if (linear(&ly->o, att, t, T, nthreads)) return -1;
        if (ly->attn_post) rms_norm(t, ly->attn_post, t, T, D, D, eps);
        for (int64_t i = 0; i < T * D; i++) x[i] += t[i];
        rms_norm(x, ly->ln2, h, T, D, D, eps);
        if (linear(&ly->gate_up, h, gu, T, nthreads)) return -1;
        for (int64_t i = 0; i < T; i++) gate_mul(gu + i * 2 * I, gu + i * 2 * I + I, a + i * I, I, ly->act);
        if (linear(&ly->down, a, t, T, nthreads)) return -1;
        if (ly->mlp_post) rms_norm(t, ly->mlp_post, t, T, D, D, eps);
        for (int64_t i = 0; i < T * D; i++) x[i] += t[i];
    }
    return 0;
}
