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
 * the AVX2 build's reduction order): aarch64 gets the x86-64-v3 build's bits (tests/test_arm.py).
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

/* One task of attend(): the G = H / KV query heads q [G, D] of one position that share one kv head
 * (keys kg, values vg [slots, D]), over the n slots it sees, in order: slot idx[j] for j < n (idx
 * NULL: slots 0..n-1). Writes o [G, D]. Scratch: p [G, n], mx [G], sum [G]. Needs D % (4 VL) == 0.
 *
 * The visible slots are taken in their order and nothing else enters a sum, so a query gets the same
 * bits wherever its slots lie: a token tree's node (its prefix and its ancestors, siblings masked
 * between them) gets what a plain step over the same tokens at consecutive slots gets.
 *
 * The work is a pair of tiny GEMMs; blocks of queries keep independent FMA chains in flight (one
 * query at a time waits on one chain's latency, about 5x slower). */
#define SCORES_BLOCK(NB)                                                                            \
    static inline void scores_##NB(const float *q, const float *ks, int64_t D, float scale, float *p, \
                                   int64_t n, int64_t j) {                                           \
        vec acc[NB];                                                                                \
        for (int i = 0; i < NB; i++) acc[i] = VZERO();                                              \
        for (int64_t c = 0; c < D; c += VL) {                                                       \
            vec kv = VLOAD(ks + c);                                                                 \
            for (int i = 0; i < NB; i++) acc[i] = VFMA(VLOAD(q + i * D + c), kv, acc[i]);          \
        }                                                                                           \
        for (int i = 0; i < NB; i++) p[i * n + j] = vsum(acc[i]) * scale;                           \
    }
SCORES_BLOCK(4)
SCORES_BLOCK(2)
SCORES_BLOCK(1)

/* o[i, j0 : j0 + 4 VL] = sum over the seen slots j of p[i, j] v[slot j, j0 : j0 + 4 VL], for NB queries. */
#define VALUES_BLOCK(NB)                                                                            \
    static inline void values_##NB(const float *p, int64_t n, const float *vg, const int64_t *idx, int64_t D, \
                                   int64_t j0, const float *inv, float *o) {                         \
        vec acc[NB][4];                                                                             \
        for (int i = 0; i < NB; i++)                                                                \
            for (int c = 0; c < 4; c++) acc[i][c] = VZERO();                                        \
        for (int64_t j = 0; j < n; j++) {                                                           \
            const float *vs = vg + (idx ? idx[j] : j) * D + j0;                                     \
            vec v0 = VLOAD(vs), v1 = VLOAD(vs + VL), v2 = VLOAD(vs + 2 * VL), v3 = VLOAD(vs + 3 * VL); \
            for (int i = 0; i < NB; i++) {                                                          \
                vec e = VSET1(p[i * n + j]);                                                        \
                acc[i][0] = VFMA(e, v0, acc[i][0]);                                                 \
                acc[i][1] = VFMA(e, v1, acc[i][1]);                                                 \
                acc[i][2] = VFMA(e, v2, acc[i][2]);                                                 \
                acc[i][3] = VFMA(e, v3, acc[i][3]);                                                 \
            }                                                                                       \
        }                                                                                           \
        for (int i = 0; i < NB; i++) {                                                              \
            vec w = VSET1(inv[i]);                                                                  \
            for (int c = 0; c < 4; c++) VSTORE(o + i * D + j0 + c * VL, VMUL(acc[i][c], w));        \
        }                                                                                           \
    }
VALUES_BLOCK(4)
VALUES_BLOCK(2)
VALUES_BLOCK(1)

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

static void attend_task(const float *q, const float *kg, const float *vg, const int64_t *idx, int64_t n, float *o,
                        int64_t G, int64_t D, float scale, float *p, float *mx, float *sum) {
    if (n == 0) { /* saw no slot: zeros */
        for (int64_t j = 0; j < G * D; j++) o[j] = 0.f;
        return;
    }
    for (int64_t j = 0; j < n; j++) {
        const float *ks = kg + (idx ? idx[j] : j) * D;
        int64_t i = 0;
        for (; i + 4 <= G; i += 4) scores_4(q + i * D, ks, D, scale, p + i * n, n, j);
        for (; i + 2 <= G; i += 2) scores_2(q + i * D, ks, D, scale, p + i * n, n, j);
        for (; i < G; i++) scores_1(q + i * D, ks, D, scale, p + i * n, n, j);
    }
    for (int64_t i = 0; i < G; i++) { /* softmax numerators in place */
        float *pi = p + i * n, x = -INFINITY;
        for (int64_t j = 0; j < n; j++) x = pi[j] > x ? pi[j] : x;
        mx[i] = x;
#pragma omp simd
        for (int64_t j = 0; j < n; j++) pi[j] = exp_nonpos(pi[j] - x);
        sum[i] = 1.f / lane_sum(pi, n);
    }
    for (int64_t j0 = 0; j0 < D; j0 += 4 * VL) {
        int64_t i = 0;
        for (; i + 4 <= G; i += 4) values_4(p + i * n, n, vg, idx, D, j0, sum + i, o + i * D);
        for (; i + 2 <= G; i += 2) values_2(p + i * n, n, vg, idx, D, j0, sum + i, o + i * D);
        for (; i < G; i++) values_1(p + i * n, n, vg, idx, D, j0, sum + i, o + i * D);
    }
}

/* The same for any D, one query at a time, plainly. */
static void attend_task_any(const float *q, const float *kg, const float *vg, const int64_t *idx, int64_t n,
                            float *o, int64_t G, int64_t D, float scale, float *p, float *mx, float *sum) {
    for (int64_t i = 0; i < G; i++) {
        const float *qi = q + i * D;
        float *pi = p + i * n, *oi = o + i * D, x = -INFINITY, total = 0.f;
        for (int64_t j = 0; j < D; j++) oi[j] = 0.f;
        for (int64_t j = 0; j < n; j++) {
            const float *ks = kg + (idx ? idx[j] : j) * D;
            float dot = 0.f;
            for (int64_t c = 0; c < D; c++) dot += qi[c] * ks[c];
            pi[j] = dot * scale;
            x = pi[j] > x ? pi[j] : x;
        }
        mx[i] = x;
        if (n == 0) continue;
        for (int64_t j = 0; j < n; j++) {
            const float *vs = vg + (idx ? idx[j] : j) * D;
            float e = exp_nonpos(pi[j] - x);
            total += e;
            for (int64_t c = 0; c < D; c++) oi[c] += e * vs[c];
        }
        sum[i] = 1.f / total;
        for (int64_t c = 0; c < D; c++) oi[c] *= sum[i];
    }
}

/* Attention of B x T queries over S cached slots, grouped-query (H query heads share KV heads).
 *   q:    head h of query (b, t) at q + b * sqb + t * sqt + h * D
 *   k, v: the cache of one layer; slot s of kv head g of cache row r at k + r * skr + g * skh + s * D
 *   rows: cache row of batch row b (NULL: row b)
 *   mask: bool, query (b, t) sees slot s iff mask[b * smb + t * smt + s] (NULL: all S slots)
 *   out:  head h of query (b, t) at out + b * sob + t * sot + h * D
 * A query that sees no slot gets zeros. Softmax in fp32 of q.k times `scale`. Each query's result
 * is computed by the same code whatever B and T are. */
void attend(const float *q, const float *k, const float *v, const int64_t *rows, const uint8_t *mask, float *out,
            int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, int64_t S, int64_t sqb, int64_t sqt,
            int64_t skr, int64_t skh, int64_t smb, int64_t smt, int64_t sob, int64_t sot, float scale,
            int nthreads) {
    const int64_t G = H / KV, tasks = B * KV * T;
#pragma omp parallel num_threads(nthreads)
    {
        float *p = malloc(sizeof(float) * (size_t)(G * (S > 0 ? S : 1) + 2 * G));
        int64_t *idx = malloc(sizeof(int64_t) * (size_t)(S > 0 ? S : 1)); /* the slots a masked query sees */
#pragma omp for schedule(static)
        for (int64_t task = 0; task < tasks; task++) {
            int64_t b = task / (KV * T), g = (task / T) % KV, t = task % T;
            int64_t r = rows ? rows[b] : b;
            const float *qg = q + b * sqb + t * sqt + g * G * D;
            const float *kg = k + r * skr + g * skh, *vg = v + r * skr + g * skh;
            const uint8_t *m = mask ? mask + b * smb + t * smt : NULL;
            float *o = out + b * sob + t * sot + g * G * D;
            float *mx = p + G * S, *sum = mx + G;
            int64_t n = S;
            if (m) {
                n = 0;
                for (int64_t s = 0; s < S; s++)
                    if (m[s]) idx[n++] = s;
            }
            if (D % (4 * VL) == 0) attend_task(qg, kg, vg, m ? idx : NULL, n, o, G, D, scale, p, mx, sum);
            else attend_task_any(qg, kg, vg, m ? idx : NULL, n, o, G, D, scale, p, mx, sum);
        }
        free(p);
        free(idx);
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
