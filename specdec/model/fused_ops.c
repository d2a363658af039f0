/* Fused fp32 CPU ops of the CPU backend: RMSNorm (also per head), RoPE, attention, SiLU and GELU gates.
 *
 * Torch's versions are a dozen small ops per layer for RMSNorm and RoPE, and
 * scaled_dot_product_attention costs about 0.2 ms a call for one query on this CPU. Each op here
 * replaces those with one call.
 *
 * Numerics: each output row is computed by the same code whatever the number of rows, so a verify
 * pass gives the same bits as one-token steps for the same query and visible keys.
 *
 * The vector code is written once on simd.h's vec (AVX-512, AVX2, or NEON as two float32x4 halves with
 * the AVX2 build's reduction order): aarch64 gets the x86-64-v3 build's bits (tests/test_arm.py), but for
 * attention where the build has a bf16 dot product (attend_bf16.h).
 *
 * Built with the other kernels into one library by specdec/model/cpu_kernels.py.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels.h"
#include "simd.h"

/* sum of x[j]^2 in the order the x86-64-v3 build's vectorized reduction (below) takes: 8 lanes over
 * whole 8s, the rest into lane 0, then the lanes in turn from 0 */
static inline float sum_squares8(const float *x, int64_t dim) {
    float l[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, ss = 0.f;
    int64_t j = 0;
    for (; j + 8 <= dim; j += 8)
        for (int k = 0; k < 8; k++) l[k] += x[j + k] * x[j + k];
    for (; j < dim; j++) l[0] += x[j] * x[j];
    for (int k = 0; k < 8; k++) ss += l[k];
    return ss;
}

/* out[i, :] = w * (x[i, :] / sqrt(mean(x[i, :]^2) + eps)), rows of x at stride ldx, out contiguous.
 * On aarch64 the sum of squares is sum_squares8 (the AVX2 build's bits: the compiler's 4-lane
 * reduction would take another order). */
void rms_norm(const float *x, const float *w, float *out, int64_t n, int64_t dim, int64_t ldx, float eps) {
    for (int64_t i = 0; i < n; i++) {
        const float *xi = x + i * ldx;
        float *oi = out + i * dim;
#if SIMD_NEON
        const float ss = sum_squares8(xi, dim);
#else
        float ss = 0.f;
#pragma omp simd reduction(+ : ss)
        for (int64_t j = 0; j < dim; j++) ss += xi[j] * xi[j];
#endif
        float r = 1.f / sqrtf(ss / (float)dim + eps);
#pragma omp simd
        for (int64_t j = 0; j < dim; j++) oi[j] = w[j] * (xi[j] * r);
    }
}

/* In place, out = rms_norm of each of `heads` heads of hd floats in each of T rows of y (row stride ldy),
 * weight w [hd]: the per-head q/k norms of Qwen3 and Gemma 3 (rms_norm's bits, head by head). */
void head_norm(float *y, const float *w, int64_t T, int64_t heads, int64_t hd, int64_t ldy, float eps) {
    for (int64_t t = 0; t < T; t++) rms_norm(y + t * ldy, w, y + t * ldy, heads, hd, hd, eps);
}

/* In place, HF's rotate-half RoPE on `heads` heads of D floats for each of B x T positions:
 * head h of position (b, t) is at x + b * sxb + t * sxt + h * D; its cos, sin rows at
 * cs + b * scb + t * sct (D floats each). */
void rope(float *x, const float *cos, const float *sin, int64_t B, int64_t T, int64_t heads, int64_t D,
          int64_t sxb, int64_t sxt, int64_t scb, int64_t sct) {
    int64_t half = D / 2;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            const float *c = cos + b * scb + t * sct, *s = sin + b * scb + t * sct;
            for (int64_t h = 0; h < heads; h++) {
                float *p = x + b * sxb + t * sxt + h * D;
#pragma omp simd
                for (int64_t j = 0; j < half; j++) {
                    float lo = p[j], hi = p[j + half];
                    p[j] = lo * c[j] - hi * s[j];
                    p[j + half] = hi * c[j + half] + lo * s[j + half];
                }
            }
        }
}

/* exp(x) for x <= 0 (a softmax numerator), 0 below -87 (and for -inf). Cephes' expf: Cody-Waite
 * range reduction and a degree-6 polynomial, about 1 ulp; plain C so that the compiler vectorizes
 * the loop that calls it (libm's expf is scalar, and was half of attention's time at 5 queries). */
static inline float exp_nonpos(float x) {
    float xc = x < -87.f ? -87.f : x;
    float n = (xc * 1.44269504088896341f + 12582912.f) - 12582912.f; /* round to nearest */
    float r = xc - n * 0.693359375f - n * -2.12194440e-4f;
    float z = r * r;
    float y = ((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r + 4.1665795894e-2f) * r +
               1.6666665459e-1f) * r + 5.0000001201e-1f;
    y = y * z + r + 1.f;
    union { int32_t i; float f; } scale = {.i = ((int32_t)n + 127) << 23};
    return x < -87.f ? 0.f : y * scale.f;
}

/* Attention, blocked: one task takes ATT_QB consecutive positions of one kv head (their G = H / KV
 * query heads each), so each key and value row is loaded once for all of their queries rather than
 * once a query. A query-at-a-time loop streams the whole cache from memory for every position of a
 * long prompt; blocked, a chunk of ATT_SC slots stays in L1 while every query of the task uses it.
 *
 * The bits are those of one query alone, whatever the blocking: a query's score for a slot is one dot
 * product (FMAs over the head in steps of VL, then vsum, times the scale); its softmax takes its visible
 * slots in order (max, exp_nonpos, lane_sum); its output sums p[j] v[slot j] over them in order (one
 * FMA chain a lane), then multiplies by 1 / sum. Blocking changes which queries share a load, never the
 * order of a query's arithmetic. So a prefill (whole or in chunks), a verify pass, a tree node (its
 * prefix and ancestors, siblings masked between them) and a one-token step give a query the same bits.
 *
 * The slots every position of a task sees, from slot 0 on (the cache's prefix; in a causal prefill all
 * but the diagonal block), go through shared register tiles; each position's other visible slots (a
 * tree's ancestors, the diagonal) one position at a time. */
#define ATT_QB 8  /* positions a task */
#define ATT_SC 32 /* slots a pass over the keys or values keeps in L1 (16 KB at 128 dims) */
#if defined(__AVX512F__)
#define ATT_TQ 4 /* the scores' register tile: ATT_TQ queries x 4 slots (16 of 32 registers) */
#else
#define ATT_TQ 2 /* 8 accumulators: AVX2 has 16 registers, NEON's vec takes two */
#endif

/* ps[i][j + s] = scale * q_i . k_s for NQ queries qs[i] and NK consecutive slots ks + s * D */
#define SCORES_TILE(NAME, NQ, NK)                                                                      \
    static inline void NAME(const float *const *qs, const float *ks, int64_t D, float scale, float *const *ps, \
                            int64_t j) {                                                               \
        vec acc[NQ][NK];                                                                               \
        for (int i = 0; i < NQ; i++)                                                                   \
            for (int s = 0; s < NK; s++) acc[i][s] = VZERO();                                          \
        for (int64_t c = 0; c < D; c += VL) {                                                          \
            vec kv[NK];                                                                                \
            for (int s = 0; s < NK; s++) kv[s] = VLOAD(ks + s * D + c);                                \
            for (int i = 0; i < NQ; i++) {                                                             \
                const vec qv = VLOAD(qs[i] + c);                                                       \
                for (int s = 0; s < NK; s++) acc[i][s] = VFMA(qv, kv[s], acc[i][s]);                   \
            }                                                                                          \
        }                                                                                              \
        for (int i = 0; i < NQ; i++)                                                                   \
            for (int s = 0; s < NK; s++) ps[i][j + s] = vsum(acc[i][s]) * scale;                       \
    }
#if defined(__AVX512F__)
/* f[4 s + i] = vsum(a[4 i + s]) for 16 vectors, each through vsum's own tree of adds (halves, quarters,
 * lanes 0 + 2 and 1 + 3, then those two), so each sum has vsum's bits: the same pairs are added, four
 * sums to an instruction where vsum adds one. */
static inline __m512 vsum16(const __m512 *a) {
    __m512 r[8], w[4], z[2];
    for (int k = 0; k < 8; k++) /* r[k]: a[2k]'s halves summed in quarters 0-1, a[2k + 1]'s in 2-3 */
        r[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int k = 0; k < 4; k++) /* w[k]: quarter q holds a[4k + q]'s 4 partial sums */
        w[k] = _mm512_add_ps(_mm512_shuffle_f32x4(r[2 * k], r[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(r[2 * k], r[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int k = 0; k < 2; k++) /* z[k], quarter q: a[8k + q]'s 2 partial sums, then a[8k + 4 + q]'s */
        z[k] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * k], w[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(w[2 * k], w[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* SCORES_TILE(4, 4) with its 16 sums through vsum16 */
static inline void scores_tile(const float *const *qs, const float *ks, int64_t D, float scale, float *const *ps,
                               int64_t j) {
    __m512 acc[16];
    for (int a = 0; a < 16; a++) acc[a] = _mm512_setzero_ps();
    for (int64_t c = 0; c < D; c += VL) {
        const __m512 k0 = VLOAD(ks + c), k1 = VLOAD(ks + D + c), k2 = VLOAD(ks + 2 * D + c), k3 = VLOAD(ks + 3 * D + c);
        for (int i = 0; i < 4; i++) {
            const __m512 qv = VLOAD(qs[i] + c);
            acc[4 * i] = VFMA(qv, k0, acc[4 * i]), acc[4 * i + 1] = VFMA(qv, k1, acc[4 * i + 1]);
            acc[4 * i + 2] = VFMA(qv, k2, acc[4 * i + 2]), acc[4 * i + 3] = VFMA(qv, k3, acc[4 * i + 3]);
        }
    }
    float f[16];
    _mm512_storeu_ps(f, _mm512_mul_ps(vsum16(acc), _mm512_set1_ps(scale)));
    for (int i = 0; i < 4; i++)
        for (int s = 0; s < 4; s++) ps[i][j + s] = f[4 * s + i];
}
#else
SCORES_TILE(scores_tile, ATT_TQ, 4)
#endif
SCORES_TILE(scores_col, ATT_TQ, 1)
SCORES_TILE(scores_row, 1, 4)
SCORES_TILE(scores_one, 1, 1)

/* scores of queries [0, nq) for the consecutive slots [s0, s1) (keys kg + s * D) into ps[i][s] */
static void scores_span(const float *const *qs, float *const *ps, int64_t nq, int64_t s0, int64_t s1,
                        const float *kg, int64_t D, float scale) {
    int64_t i = 0;
    for (; i + ATT_TQ <= nq; i += ATT_TQ) {
        int64_t s = s0;
        for (; s + 4 <= s1; s += 4) scores_tile(qs + i, kg + s * D, D, scale, ps + i, s);
        for (; s < s1; s++) scores_col(qs + i, kg + s * D, D, scale, ps + i, s);
    }
    for (; i < nq; i++) {
        int64_t s = s0;
        for (; s + 4 <= s1; s += 4) scores_row(qs + i, kg + s * D, D, scale, ps + i, s);
        for (; s < s1; s++) scores_one(qs + i, kg + s * D, D, scale, ps + i, s);
    }
}

/* os[i][c0 : c0 + 4 VL] = (first ? 0 : os[i][...]) + sum over j in [j0, j1), in order, of
 * ps[i][j] v[slot][c0 : c0 + 4 VL] (slot idx[j], or j for idx NULL), for NB queries */
#define VALUES_RUN(NAME, NB)                                                                           \
    static inline void NAME(float *const *ps, int64_t j0, int64_t j1, const float *vg, const int64_t *idx, \
                            int64_t D, int64_t c0, float *const *os, int first) {                      \
        vec acc[NB][4];                                                                                \
        for (int i = 0; i < NB; i++)                                                                   \
            for (int c = 0; c < 4; c++) acc[i][c] = first ? VZERO() : VLOAD(os[i] + c0 + c * VL);      \
        for (int64_t j = j0; j < j1; j++) {                                                            \
            const float *vs = vg + (idx ? idx[j] : j) * D + c0;                                        \
            const vec v0 = VLOAD(vs), v1 = VLOAD(vs + VL), v2 = VLOAD(vs + 2 * VL), v3 = VLOAD(vs + 3 * VL); \
            for (int i = 0; i < NB; i++) {                                                             \
                const vec e = VSET1(ps[i][j]);                                                         \
                acc[i][0] = VFMA(e, v0, acc[i][0]);                                                    \
                acc[i][1] = VFMA(e, v1, acc[i][1]);                                                    \
                acc[i][2] = VFMA(e, v2, acc[i][2]);                                                    \
                acc[i][3] = VFMA(e, v3, acc[i][3]);                                                    \
            }                                                                                          \
        }                                                                                              \
        for (int i = 0; i < NB; i++)                                                                   \
            for (int c = 0; c < 4; c++) VSTORE(os[i] + c0 + c * VL, acc[i][c]);                        \
    }
VALUES_RUN(values_4, 4)
VALUES_RUN(values_1, 1)

/* values over slot indices [j0, j1) for queries [0, nq), every 4 VL of the head */
static void values_span(float *const *ps, float *const *os, int64_t nq, int64_t j0, int64_t j1, const float *vg,
                        const int64_t *idx, int64_t D, int first) {
    int64_t i = 0;
    for (; i + 4 <= nq; i += 4)
        for (int64_t c0 = 0; c0 < D; c0 += 4 * VL) values_4(ps + i, j0, j1, vg, idx, D, c0, os + i, first);
    for (; i < nq; i++)
        for (int64_t c0 = 0; c0 < D; c0 += 4 * VL) values_1(ps + i, j0, j1, vg, idx, D, c0, os + i, first);
}

/* sum of p[0 .. n) lane-wise in steps of VL (the tail padded with zeros), then vsum: a fixed order */
static inline float lane_sum(const float *p, int64_t S) {
    vec acc = VZERO();
    int64_t s = 0;
    for (; s + VL <= S; s += VL) acc = VADD(acc, VLOAD(p + s));
    if (s < S) {
        float tail[VL] = {0};
        for (int64_t j = 0; s + j < S; j++) tail[j] = p[s + j];
        acc = VADD(acc, VLOAD(tail));
    }
    return vsum(acc);
}

/* the largest of p[0 .. n) (-inf for none), lane-wise: a max is exact, so any order gives the scalar
 * loop's value (of two zeros, either sign: exp_nonpos(p - max) does not tell them apart) */
static inline float max_of(const float *p, int64_t n) {
    vec m = VSET1(-INFINITY);
    int64_t j = 0;
    for (; j + VL <= n; j += VL) m = VMAX(m, VLOAD(p + j));
    float x = vhmax(m);
    for (; j < n; j++) x = p[j] > x ? p[j] : x;
    return x;
}

/* p[0 .. m) -> cap tanh(p / cap), in place (Gemma 2's soft-capped scores): tanh |x| = (1 - e) / (1 + e) with
 * e = exp_nonpos(-2 |x|), the sign put back; absolute error a few ulp of cap, and an element's bits whatever m */
static inline void soft_cap(float *p, int64_t m, float cap) {
#pragma omp simd
    for (int64_t j = 0; j < m; j++) {
        const float x = p[j] / cap, e = exp_nonpos(-2.f * fabsf(x)), t = cap * ((1.f - e) / (1.f + e));
        p[j] = x < 0.f ? -t : t;
    }
}

/* p[0 .. m) -> the softmax's numerators exp(p - max), in place, after soft_cap where cap > 0; returns 1 / their
 * sum (0 for m = 0) */
static inline float numerators(float *p, int64_t m, float cap) {
    if (cap > 0.f) soft_cap(p, m, cap);
    const float x = max_of(p, m);
#pragma omp simd
    for (int64_t j = 0; j < m; j++) p[j] = exp_nonpos(p[j] - x);
    return m ? 1.f / lane_sum(p, m) : 0.f;
}

/* One task for D % (4 VL) == 0: P positions of G query heads each (query u * G + i at qs[u * G + i],
 * its output at os[u * G + i], its score row at ps[u * G + i], >= n[u] floats); position u sees the
 * slots idx[u][0 .. n[u]) of kg, vg (idx[u] NULL: slots 0 .. n[u] - 1), the first `shared` of them
 * slots 0 .. shared - 1 for every position. Scratch: inv [P G]. */
static void attend_block(const float *const *qs, float *const *os, float *const *ps, int64_t P, int64_t G,
                         int64_t *const *idx, const int64_t *n, int64_t shared, const float *kg, const float *vg,
                         int64_t D, float scale, float cap, float *inv) {
    const int64_t nq = P * G;
    for (int64_t s0 = 0; s0 < shared; s0 += ATT_SC) /* the shared slots: every query, a chunk at a time */
        scores_span(qs, ps, nq, s0, s0 + ATT_SC < shared ? s0 + ATT_SC : shared, kg, D, scale);
    for (int64_t u = 0; u < P; u++) /* each position's own slots, in its order */
        for (int64_t j = shared; j < n[u]; j++) {
            const int64_t s = idx[u] ? idx[u][j] : j;
            scores_span(qs + u * G, ps + u * G, G, j, j + 1, kg + (s - j) * D, D, scale);
        }
    for (int64_t q = 0; q < nq; q++) inv[q] = numerators(ps[q], n[q / G], cap); /* softmax numerators in place */
    for (int64_t s0 = 0; s0 < shared; s0 += ATT_SC)
        values_span(ps, os, nq, s0, s0 + ATT_SC < shared ? s0 + ATT_SC : shared, vg, NULL, D, s0 == 0);
    for (int64_t u = 0; u < P; u++)
        if (n[u] > shared || shared == 0) /* (shared == 0: starts every sum, at zero for a blind query) */
            values_span(ps + u * G, os + u * G, G, shared, n[u], vg, idx[u], D, shared == 0);
    for (int64_t q = 0; q < nq; q++) { /* times 1 / sum; a query that saw no slot gets zeros */
        const vec w = VSET1(inv[q]);
        for (int64_t c = 0; c < D; c += VL) VSTORE(os[q] + c, VMUL(VLOAD(os[q] + c), w));
    }
}

/* The same for any D, one query at a time, plainly. */
static void attend_task_any(const float *q, const float *kg, const float *vg, const int64_t *idx, int64_t n,
                            float *o, int64_t G, int64_t D, float scale, float cap, float *p) {
    for (int64_t i = 0; i < G; i++) {
        const float *qi = q + i * D;
        float *oi = o + i * D, x = -INFINITY, total = 0.f;
        for (int64_t j = 0; j < D; j++) oi[j] = 0.f;
        if (n == 0) continue;
        for (int64_t j = 0; j < n; j++) {
            const float *ks = kg + (idx ? idx[j] : j) * D;
            float dot = 0.f;
            for (int64_t c = 0; c < D; c++) dot += qi[c] * ks[c];
            p[j] = dot * scale;
        }
        if (cap > 0.f) soft_cap(p, n, cap);
        for (int64_t j = 0; j < n; j++) x = p[j] > x ? p[j] : x;
        for (int64_t j = 0; j < n; j++) {
            const float *vs = vg + (idx ? idx[j] : j) * D;
            float e = exp_nonpos(p[j] - x);
            total += e;
            for (int64_t c = 0; c < D; c++) oi[c] += e * vs[c];
        }
        const float inv = 1.f / total;
        for (int64_t c = 0; c < D; c++) oi[c] *= inv;
    }
}

#if (defined(__AVX512BF16__) && defined(__AVX512BW__)) || (SIMD_NEON && defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC))
#define ATT_BF16 1
#include "attend_bf16.h"
#else
#define ATT_BF16 0
#endif

/* The attention's products: "bf16" where attend_bf16.h is built in, else "fp32" */
const char *attention_precision(void) { return ATT_BF16 ? "bf16" : "fp32"; }

/* Attention of B x T queries over S cached slots, grouped-query (H query heads share KV heads).
 *   q:    head h of query (b, t) at q + b * sqb + t * sqt + h * D
 *   k, v: the cache of one layer; slot s of kv head g of cache row r at k + r * skr + g * skh + s * D
 *   rows: cache row of batch row b (NULL: row b)
 *   mask: bool, query (b, t) sees slot s iff mask[b * smb + t * smt + s] (NULL: all S slots)
 *   out:  head h of query (b, t) at out + b * sob + t * sot + h * D
 * A query that sees no slot gets zeros. Softmax in fp32 of q.k times `scale`, each such score s taken to
 * softcap tanh(s / softcap) first where softcap > 0 (Gemma 2). Each query's result
 * is computed by the same code whatever B and T are (attend_block). */
void attend(const float *q, const float *k, const float *v, const int64_t *rows, const uint8_t *mask, float *out,
            int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, int64_t S, int64_t sqb, int64_t sqt,
            int64_t skr, int64_t skh, int64_t smb, int64_t smt, int64_t sob, int64_t sot, float scale,
            float softcap, int nthreads) {
    /* blocks of at most ATT_QB positions, even in size, and enough of them for every thread to get a task */
    const int64_t G = H / KV, want = (nthreads + B * KV - 1) / (B * KV), S1 = S > 0 ? S : 1;
    int64_t blocks = (T + ATT_QB - 1) / ATT_QB;
    blocks = blocks < want ? (want < T ? want : T) : blocks;
    const int64_t per = (T + blocks - 1) / blocks;
    blocks = (T + per - 1) / per;
    const int64_t tasks = B * KV * blocks;
#pragma omp parallel num_threads(nthreads)
    {
        /* a thread's scratch: score rows [QB G, S], visible slots [QB, S], the rows' pointers, 1 / sums */
        float *pbuf = malloc(sizeof(float) * (size_t)(ATT_QB * G * S1 + ATT_QB * G));
        int64_t *ibuf = malloc(sizeof(int64_t) * (size_t)(ATT_QB * S1 + ATT_QB));
        const float **qs = malloc(sizeof(float *) * (size_t)(ATT_QB * G));
        float **os = malloc(sizeof(float *) * (size_t)(2 * ATT_QB * G));
        int64_t **idx = malloc(sizeof(int64_t *) * ATT_QB);
        if (!pbuf || !ibuf || !qs || !os || !idx) abort(); /* a few MB at most */
        float **ps = os + ATT_QB * G, *inv = pbuf + ATT_QB * G * S1;
        int64_t *n = ibuf + ATT_QB * S1;
#if ATT_BF16
        /* the bf16 task's: query pairs, a chunk of keys and one of values, each query's p */
        const int64_t pstride = (S1 + 32) / 2 + 16;
        uint32_t *bbuf = malloc(sizeof(uint32_t) * (size_t)(ATT_QB * G * D / 2 + D / 2 * ATT_BF16_SC +
                                                              ATT_BF16_SC / 2 * D + ATT_QB * G * pstride));
        uint32_t **pbs = malloc(sizeof(uint32_t *) * (size_t)(ATT_QB * G));
        if (!bbuf || !pbs) abort();
        uint32_t *qb = bbuf, *kt = qb + ATT_QB * G * D / 2, *vp = kt + D / 2 * ATT_BF16_SC;
        for (int64_t i = 0; i < ATT_QB * G; i++) pbs[i] = vp + ATT_BF16_SC / 2 * D + i * pstride;
#endif
#pragma omp for schedule(static, 1)
        for (int64_t task = 0; task < tasks; task++) {
            const int64_t b = task / (KV * blocks), g = (task / blocks) % KV, t0 = (task % blocks) * per;
            const int64_t P = T - t0 < per ? T - t0 : per, r = rows ? rows[b] : b;
            const float *kg = k + r * skr + g * skh, *vg = v + r * skr + g * skh;
            int64_t shared = S;
            for (int64_t u = 0; u < P; u++) {
                const int64_t t = t0 + u;
                const uint8_t *m = mask ? mask + b * smb + t * smt : NULL;
                for (int64_t i = 0; i < G; i++) {
                    qs[u * G + i] = q + b * sqb + t * sqt + (g * G + i) * D;
                    os[u * G + i] = out + b * sob + t * sot + (g * G + i) * D;
                    ps[u * G + i] = pbuf + (u * G + i) * S1;
                }
                idx[u] = NULL, n[u] = S;
                if (m) {
                    int64_t lead = 0, c = 0;
                    idx[u] = ibuf + u * S1;
                    while (lead < S && m[lead]) idx[u][c++] = lead++; /* the run of slots from 0 */
                    for (int64_t s = lead; s < S; s++)
                        if (m[s]) idx[u][c++] = s;
                    n[u] = c;
                    shared = lead < shared ? lead : shared;
                }
            }
#if ATT_BF16
            if (D % 64 == 0)
                attend_block_bf16(qs, os, ps, P, G, idx, n, shared, kg, vg, D, scale, softcap, inv, qb, kt, vp, pbs);
            else
#endif
            if (D % (4 * VL) == 0) attend_block(qs, os, ps, P, G, idx, n, shared, kg, vg, D, scale, softcap, inv);
            else
                for (int64_t u = 0; u < P; u++)
                    attend_task_any(qs[u * G], kg, vg, idx[u], n[u], os[u * G], G, D, scale, softcap, ps[u * G]);
        }
        free(pbuf), free(ibuf), free(qs), free(os), free(idx);
#if ATT_BF16
        free(bbuf), free(pbs);
#endif
    }
}

static inline float silu_mul1(float x, float u) {
    const float e = exp_nonpos(x < 0.f ? x : -x);
    return x * ((x < 0.f ? e : 1.f) / (1.f + e)) * u;
}

/* silu_mul1 on VL lanes: the same operations in the same order (the build does not contract a * b + c
 * into FMAs, -std=c11), so each lane gets silu_mul1's bits. */
#if SIMD_NEON
typedef struct {
    uint32x4_t lo, hi;
} vmask;
static inline vmask v_lt(vec a, vec b) {
    vmask m = {vcltq_f32(a.lo, b.lo), vcltq_f32(a.hi, b.hi)};
    return m;
}
static inline vec v_blend(vmask m, vec a, vec b) { return v_pair(vbslq_f32(m.lo, a.lo, b.lo), vbslq_f32(m.hi, a.hi, b.hi)); }
static inline vec v_sub(vec a, vec b) { return v_pair(vsubq_f32(a.lo, b.lo), vsubq_f32(a.hi, b.hi)); }
static inline vec v_div(vec a, vec b) { return v_pair(vdivq_f32(a.lo, b.lo), vdivq_f32(a.hi, b.hi)); }
static inline float32x4_t v_scale4(float32x4_t n) { /* 2^n for integral n (truncation, as cvttps) */
    return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23));
}
#define VLT(a, b) v_lt(a, b)
#define VBLEND(m, a, b) v_blend(m, a, b) /* m ? a : b */
#define VSUB(a, b) v_sub(a, b)
#define VDIV(a, b) v_div(a, b)
#define VSCALE(n) v_pair(v_scale4((n).lo), v_scale4((n).hi))
#elif VL == 16
typedef __mmask16 vmask;
#define VLT(a, b) _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ)
#define VBLEND(m, a, b) _mm512_mask_blend_ps(m, b, a) /* m ? a : b */
#define VSUB(a, b) _mm512_sub_ps(a, b)
#define VDIV(a, b) _mm512_div_ps(a, b)
#define VSCALE(n) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), \
                                                                         _mm512_set1_epi32(127)), 23))
#else
typedef __m256 vmask;
#define VLT(a, b) _mm256_cmp_ps(a, b, _CMP_LT_OQ)
#define VBLEND(m, a, b) _mm256_blendv_ps(b, a, m)
#define VSUB(a, b) _mm256_sub_ps(a, b)
#define VDIV(a, b) _mm256_div_ps(a, b)
#define VSCALE(n) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), \
                                                                         _mm256_set1_epi32(127)), 23))
#endif
static inline vec silu_mul_v(vec x, vec u) {
    const vmask neg = VLT(x, VZERO());
    const vec a = VBLEND(neg, x, VSUB(VZERO(), x)), lo = VSET1(-87.f);
    const vmask under = VLT(a, lo);
    const vec xc = VBLEND(under, lo, a), big = VSET1(12582912.f);
    const vec n = VSUB(VADD(VMUL(xc, VSET1(1.44269504088896341f)), big), big);
    const vec r = VSUB(VSUB(xc, VMUL(n, VSET1(0.693359375f))), VMUL(n, VSET1(-2.12194440e-4f)));
    const vec z = VMUL(r, r);
    vec y = VADD(VMUL(VSET1(1.9875691500e-4f), r), VSET1(1.3981999507e-3f));
    y = VADD(VMUL(y, r), VSET1(8.3334519073e-3f));
    y = VADD(VMUL(y, r), VSET1(4.1665795894e-2f));
    y = VADD(VMUL(y, r), VSET1(1.6666665459e-1f));
    y = VADD(VMUL(y, r), VSET1(5.0000001201e-1f));
    y = VADD(VADD(VMUL(y, z), r), VSET1(1.f));
    const vec e = VBLEND(under, VZERO(), VMUL(y, VSCALE(n)));
    const vec one = VSET1(1.f);
    return VMUL(VMUL(x, VDIV(VBLEND(neg, e, one), VADD(one, e))), u);
}

/* out[i] = silu(g[i]) * u[i] = g[i] * sigmoid(g[i]) * u[i], for i < n. sigmoid from exp of -|g| only
 * (exp_nonpos), so no overflow; the same bits for an element whatever n, vectorized. */
void silu_mul(const float *g, const float *u, float *out, int64_t n) {
    int64_t i = 0;
    for (; i + VL <= n; i += VL) VSTORE(out + i, silu_mul_v(VLOAD(g + i), VLOAD(u + i)));
    for (; i < n; i++) out[i] = silu_mul1(g[i], u[i]);
}

/* the scalar code on every element (tests: the vector lanes give its bits) */
void silu_mul_scalar(const float *g, const float *u, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = silu_mul1(g[i], u[i]);
}

/* out[i] = gelu_tanh(g[i]) * u[i] (PyTorch's gelu with approximate="tanh": Gemma's gate), for i < n;
 * scalar, so an element's bits do not depend on n. */
void gelu_mul(const float *g, const float *u, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float x = g[i], inner = 0.7978845608028654f * (x + 0.044715f * (x * x * x));
        out[i] = 0.5f * x * (1.f + tanhf(inner)) * u[i];
    }
}

/* The gated MLP's activation times up on n elements: act 0 SiLU (silu_mul), 1 GELU-tanh (gelu_mul). */
void gate_mul(const float *g, const float *u, float *out, int64_t n, int act) {
    if (act) gelu_mul(g, u, out, n);
    else silu_mul(g, u, out, n);
}

/* out [T, I] = act(gate) * up straight from the fused gate/up GEMM's rows gu [T, 2 I] (gate, then up):
 * gate_mul row by row, the rows split over the threads (the same bits as gate_mul on each row). */
void gate_mul_rows(const float *gu, float *out, int64_t T, int64_t I, int act, int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static) if (T > 1)
    for (int64_t t = 0; t < T; t++) gate_mul(gu + t * 2 * I, gu + t * 2 * I + I, out + t * I, I, act);
}

/* gate_mul_rows with SiLU. */
void silu_mul_rows(const float *gu, float *out, int64_t T, int64_t I, int nthreads) {
    gate_mul_rows(gu, out, T, I, 0, nthreads);
}
