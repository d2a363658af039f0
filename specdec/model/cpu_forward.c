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
 * or GELU-tanh gate, sliding-window layers with their own RoPE rows and mask, the attention's scale and
 * soft-cap, a mixture of experts for the MLP (moe_rows, which moe.py also calls for forwards of any length).
 * The caller falls back to the Python loop for anything else.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "simd.h"

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

/* a . b over D floats: FMAs in steps of VL, vsum's tree, then the tail; one order for every call */
static float dot_f32(const float *a, const float *b, int64_t D) {
    vec acc = VZERO();
    int64_t d = 0;
    for (; d + VL <= D; d += VL) acc = VFMA(VLOAD(a + d), VLOAD(b + d), acc);
    float s = vsum(acc);
    for (; d < D; d++) s += a[d] * b[d];
    return s;
}

/* One token's routing: the router's scores of x [D], their softmax, the k most probable experts into id [k]
 * (the larger probability first, the lower id on a tie) and their probabilities into w [k], renormalised to
 * sum to 1 where m->norm. p: E floats of scratch. Nothing here depends on the other tokens of the call. */
static void route(const fw_moe *m, const float *x, int64_t D, float *p, int64_t *id, float *w) {
    float top = -INFINITY, sum = 0.0f, picked = 0.0f;
    for (int64_t e = 0; e < m->E; e++) {
        p[e] = dot_f32(m->router + e * D, x, D);
        if (p[e] > top) top = p[e];
    }
    for (int64_t e = 0; e < m->E; e++) sum += p[e] = expf(p[e] - top);
    for (int64_t j = 0; j < m->k; j++) {
        int64_t best = -1;
        for (int64_t e = 0; e < m->E; e++)
            if (p[e] >= 0.0f && (best < 0 || p[e] > p[best])) best = e;
        id[j] = best, w[j] = p[best] / sum, picked += w[j];
        p[best] = -1.0f; /* taken */
    }
    if (m->norm)
        for (int64_t j = 0; j < m->k; j++) w[j] /= picked;
}

/* out [n, D] = a mixture of experts' output for rows h [n, D] (moe.py's math): each row routed by itself
 * (route), then expert by expert in ascending id, the rows routed to it through its gate/up GEMM, the gate
 * and its down GEMM, each added to its row's sum times the row's weight for it. The GEMMs read an expert's
 * weights once for all its rows and give a row the same bits in any company, so a row's output does not
 * depend on n. Returns 0, or -1 (no memory, or a GEMM refused). */
int moe_rows(const fw_moe *m, const float *h, float *out, int64_t n, int64_t D, int act, int nthreads) {
    if (n < 1) return 0;
    const int64_t E = m->E, k = m->k, I = m->gate_up[0].N / 2;
    float *p = malloc(sizeof(float) * E), *w = malloc(sizeof(float) * n * k), *wr = malloc(sizeof(float) * n);
    float *xs = malloc(sizeof(float) * n * D), *gu = malloc(sizeof(float) * n * 2 * I);
    float *a = malloc(sizeof(float) * n * I), *ys = malloc(sizeof(float) * n * D);
    int64_t *id = malloc(sizeof(int64_t) * n * k), *rows = malloc(sizeof(int64_t) * n);
    int rc = !(p && w && wr && xs && gu && a && ys && id && rows) ? -1 : 0;
    for (int64_t i = 0; !rc && i < n; i++) route(m, h + i * D, D, p, id + i * k, w + i * k);
    if (!rc) memset(out, 0, sizeof(float) * n * D);
    for (int64_t e = 0; !rc && e < E; e++) {
        int64_t c = 0;
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < k; j++)
                if (id[i * k + j] == e) {
                    rows[c] = i, wr[c] = w[i * k + j];
                    memcpy(xs + c++ * D, h + i * D, sizeof(float) * D);
                }
        if (c == 0) continue;
        rc = linear(&m->gate_up[e], xs, gu, c, nthreads);
        for (int64_t j = 0; !rc && j < c; j++) gate_mul(gu + j * 2 * I, gu + j * 2 * I + I, a + j * I, I, act);
        if (!rc) rc = linear(&m->down[e], a, ys, c, nthreads);
        for (int64_t j = 0; !rc && j < c; j++)
            for (int64_t d = 0; d < D; d++) out[rows[j] * D + d] += wr[j] * ys[j * D + d];
    }
    free(p), free(w), free(wr), free(xs), free(gu), free(a), free(ys), free(id), free(rows);
    return rc ? -1 : 0;
}

/* Floats of scratch forward_layers needs for n rows (all the batch's positions): h [n, D], y [n, (H + 2 KV) hd],
 * att [n, H hd], t [n, D], gu [n, 2 I], a [n, I]. */
int64_t forward_scratch_floats(int64_t n, int64_t D, int64_t H, int64_t KV, int64_t hd, int64_t I) {
    return n * (2 * D + (H + 2 * KV) * hd + H * hd + 3 * I);
}

/* h = a branch's input: x [n, D] normed by w, or x itself where the layer has no input norm (w NULL) */
static void input_norm(const float *x, const float *w, float *h, int64_t n, int64_t D, float eps) {
    if (w)
        rms_norm(x, w, h, n, D, D, eps);
    else
        memcpy(h, x, sizeof(float) * n * D);
}

/* x += r t over n floats: a branch's output t into the residual stream x (r t rounded first, as torch's x + t * r) */
static void add_branch(float *x, const float *t, int64_t n, float r) {
    if (r == 1.0f)
        for (int64_t i = 0; i < n; i++) x[i] += t[i];
    else
        for (int64_t i = 0; i < n; i++) x[i] += r * t[i];
}

/* x [B T, D] (the embeddings in, the last layer's output out) through layers[0 .. L), for B sequences of T
 * new positions each: a decode step or verify pass of one sequence (B = 1), or a ragged batch (the
 * server's), whose GEMMs then read each weight once for all B T rows.
 * cos, sin [B T, hd]: the RoPE rows of the positions. kc, vc: the caches, [KV, cap, hd] a layer and a row:
 * row r (of n_rows) of layer l at kc + l * layer_stride + r * row_stride; batch row b is cache row rows[b]
 * (rows NULL: row b). Position t of row b writes its key and value at slot slots[b T + t] (slots NULL:
 * start + t) and attends to the first S slots, those with mask[b smb + t smt + s] set (bool; NULL: all S).
 * A sliding-window layer takes lcos, lsin and lmask (strides lsmb, lsmt) instead. q.k is scaled by
 * `scale` (then soft-capped where the layer's softcap > 0). Returns 0, or -1 (bad sizes, a slot outside the cache, or a GEMM that refused: nothing was
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
        input_norm(x, ly->ln1, h, n, D, eps);
        if (linear(&ly->qkv, h, y, n, nthreads)) return -1;
        if (ly->q_norm) { /* each head, or (qk_whole) all of q as one and all of k as one */
            const int64_t qh = ly->qk_whole ? 1 : H, kh = ly->qk_whole ? 1 : KV;
            head_norm(y, ly->q_norm, n, qh, H * hd / qh, nq, eps);
            head_norm(y + H * hd, ly->k_norm, n, kh, KV * hd / kh, nq, eps);
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
               H * hd, scale, ly->softcap, nthreads);
        if (linear(&ly->o, att, t, n, nthreads)) return -1;
        if (ly->attn_post) rms_norm(t, ly->attn_post, t, n, D, D, eps);
        add_branch(x, t, n * D, ly->residual);
        input_norm(x, ly->ln2, h, n, D, eps);
        if (ly->moe) {
            if (moe_rows(ly->moe, h, t, n, D, ly->act, nthreads)) return -1;
        } else {
            if (linear(&ly->gate_up, h, gu, n, nthreads)) return -1;
            for (int64_t i = 0; i < n; i++) gate_mul(gu + i * 2 * I, gu + i * 2 * I + I, a + i * I, I, ly->act);
            if (linear(&ly->down, a, t, n, nthreads)) return -1;
        }
        if (ly->mlp_post) rms_norm(t, ly->mlp_post, t, n, D, D, eps);
        add_branch(x, t, n * D, ly->residual);
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
