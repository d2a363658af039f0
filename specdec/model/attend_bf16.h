/* Attention's two products in bf16, included by fused_ops.c in place of attend_block where the build has
 * a bf16 dot product: vdpbf16ps (AVX-512 BF16: Zen 4 and later, Sapphire Rapids and later) or BFDOT
 * (aarch64 with FEAT_BF16: Graviton 3 and later, Apple M2 and later, Armv8.6-A cores).
 *
 * A query's scores q.k and its output sum p v take their operands rounded to bf16 (8 bits of mantissa,
 * fp32's range) and add in fp32: one vdpbf16ps does 32 products where an fp32 FMA does 16, and the
 * operands are half the bytes. The cache stays fp32; each chunk of keys and values is rounded as a task
 * reads it. The ARM build's speed is not measured (no ARM host; its bits are checked under qemu). On
 * Qwen2.5-Coder-1.5B over 1024 positions of real text this moves the logits by less than an
 * fp32 kernel adding in another order does (mean KL to our fp32 attention 0.0028 against 0.0026,
 * docs/performance.md), so the choice is the build's, not a flag.
 *
 * Bits: as attend_block's, a query's arithmetic does not depend on the blocking.
 *   - score of slot s: one lane's chain over the head, pair (2i, 2i+1) of dims at step i, in order; the lane
 *     is the slot (keys transposed per chunk), and a slot the task shares or a position's own slot goes
 *     through the same chain (kt built from the rows either way);
 *   - softmax: attend_block's, in fp32;
 *   - output lane d: one chain over the query's visible slots in pairs (2m, 2m + 1) of its list, in order,
 *     p and v rounded to bf16, an odd last slot paired with zeros. The shared run is cut to an even length
 *     so that a pair never straddles it.
 */
#define ATT_BF16_SC 32 /* slots a chunk (kt's row length) */

/* The primitives, per instruction set:
 *   q_pairs    queries -> their bf16 pairs;       k_pairs_t   a chunk of keys -> pairs, transposed (lane = slot);
 *   scores_bf16  the chains of the scores;        v_pairs     two value rows -> interleaved pairs;
 *   p_pairs    a row of softmax numerators -> bf16; values_bf16 the chains of the outputs (lane = dim). */
#if !SIMD_NEON
static inline __m512 dpbf(__m512 acc, __m512i a, __m512i b) {
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

/* x[0 .. 32) -> 16 dwords: the bf16 pair (x[2i], x[2i + 1]), the lower element in the low half */
static inline __m512i bf16_pairs(const float *x) {
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x));
}

/* r[c] = (r[0][c], ..., r[15][c]) in place: a 16 x 16 block of dwords transposed */
static inline void transpose16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int g = 0; g < 4; g++) {
        t[4 * g] = _mm512_unpacklo_epi32(r[4 * g], r[4 * g + 1]);
        t[4 * g + 1] = _mm512_unpackhi_epi32(r[4 * g], r[4 * g + 1]);
        t[4 * g + 2] = _mm512_unpacklo_epi32(r[4 * g + 2], r[4 * g + 3]);
        t[4 * g + 3] = _mm512_unpackhi_epi32(r[4 * g + 2], r[4 * g + 3]);
        /* u[4 g + e], 128-bit lane L: rows 4g .. 4g + 3 of column 4 L + e */
        u[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
        u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
    }
    for (int e = 0; e < 4; e++) {
        const __m512i a0 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0x44), a1 = _mm512_shuffle_i32x4(u[e], u[4 + e], 0xEE);
        const __m512i b0 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0x44);
        const __m512i b1 = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0xEE);
        r[e] = _mm512_shuffle_i32x4(a0, b0, 0x88), r[4 + e] = _mm512_shuffle_i32x4(a0, b0, 0xDD);
        r[8 + e] = _mm512_shuffle_i32x4(a1, b1, 0x88), r[12 + e] = _mm512_shuffle_i32x4(a1, b1, 0xDD);
    }
}

/* qb[u * D / 2 + i] = query u's pair i, for queries [0, nq) */
static void q_pairs(const float *const *qs, int64_t nq, int64_t D, uint32_t *qb) {
    for (int64_t u = 0; u < nq; u++)
        for (int64_t c = 0; c < D; c += 32) _mm512_storeu_si512(qb + u * D / 2 + c / 2, bf16_pairs(qs[u] + c));
}

/* kt[i * ATT_BF16_SC + s] = pair i of key rows[s], for slots s < ns (<= ATT_BF16_SC), 16 slots at a time */
static void k_pairs_t(const float *const *rows, int64_t ns, int64_t D, uint32_t *kt) {
    for (int64_t g = 0; g < ns; g += 16)
        for (int64_t c = 0; c < D; c += 32) {
            __m512i r[16];
            for (int s = 0; s < 16; s++) r[s] = g + s < ns ? bf16_pairs(rows[g + s] + c) : _mm512_setzero_si512();
            transpose16(r);
            for (int e = 0; e < 16; e++) _mm512_storeu_si512(kt + (c / 2 + e) * ATT_BF16_SC + g, r[e]);
        }
}

/* ps[q][s0 + s] = scale * q.k_s for queries [0, nq) (pairs qb) and the ns <= ATT_BF16_SC slots of kt */
#define SCORES_BF16(NAME, NQ, NV)                                                                       \
    static inline void NAME(const uint32_t *qb, const uint32_t *kt, int64_t D, float scale, float *const *ps, \
                            int64_t s0, __mmask16 m0, __mmask16 m1) {                                  \
        __m512 acc[NQ][NV];                                                                            \
        for (int t = 0; t < NQ; t++)                                                                   \
            for (int v = 0; v < NV; v++) acc[t][v] = _mm512_setzero_ps();                              \
        for (int64_t i = 0; i < D / 2; i++) {                                                          \
            __m512i k[NV];                                                                             \
            for (int v = 0; v < NV; v++) k[v] = _mm512_loadu_si512(kt + i * ATT_BF16_SC + 16 * v);      \
            for (int t = 0; t < NQ; t++) {                                                             \
                const __m512i b = _mm512_set1_epi32((int)qb[t * D / 2 + i]);                           \
                for (int v = 0; v < NV; v++) acc[t][v] = dpbf(acc[t][v], k[v], b);                     \
            }                                                                                          \
        }                                                                                              \
        const __m512 w = _mm512_set1_ps(scale);                                                        \
        for (int t = 0; t < NQ; t++) {                                                                 \
            _mm512_mask_storeu_ps(ps[t] + s0, m0, _mm512_mul_ps(acc[t][0], w));                        \
            if (NV > 1) _mm512_mask_storeu_ps(ps[t] + s0 + 16, m1, _mm512_mul_ps(acc[t][NV - 1], w));  \
        }                                                                                              \
    }
SCORES_BF16(scores_bf16_4x2, 4, 2)
SCORES_BF16(scores_bf16_1x2, 1, 2)
SCORES_BF16(scores_bf16_4x1, 4, 1)
SCORES_BF16(scores_bf16_1x1, 1, 1)

static void scores_bf16(const uint32_t *qb, int64_t nq, const uint32_t *kt, int64_t ns, int64_t D, float scale,
                        float *const *ps, int64_t s0) {
    const __mmask16 m0 = ns >= 16 ? 0xFFFF : (__mmask16)((1u << ns) - 1);
    const __mmask16 m1 = ns >= 32 ? 0xFFFF : ns > 16 ? (__mmask16)((1u << (ns - 16)) - 1) : 0;
    int64_t q = 0;
    if (ns > 16) {
        for (; q + 4 <= nq; q += 4) scores_bf16_4x2(qb + q * D / 2, kt, D, scale, ps + q, s0, m0, m1);
        for (; q < nq; q++) scores_bf16_1x2(qb + q * D / 2, kt, D, scale, ps + q, s0, m0, m1);
    } else {
        for (; q + 4 <= nq; q += 4) scores_bf16_4x1(qb + q * D / 2, kt, D, scale, ps + q, s0, m0, m1);
        for (; q < nq; q++) scores_bf16_1x1(qb + q * D / 2, kt, D, scale, ps + q, s0, m0, m1);
    }
}

/* vp[d] = the pair (a[d], b[d]) for d < D (b NULL: zeros) */
static void v_pairs(const float *a, const float *b, int64_t D, uint32_t *vp) {
    /* cvtne2ps puts a's 16 in bf16 lanes 0-15 and b's in 16-31; word 2l <- l, word 2l + 1 <- 16 + l */
    static const uint16_t order[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                       8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i mix = _mm512_loadu_si512(order);
    for (int64_t d = 0; d < D; d += 16) {
        const __m512 hi = b ? _mm512_loadu_ps(b + d) : _mm512_setzero_ps();
        const __m512i x = (__m512i)_mm512_cvtne2ps_pbh(hi, _mm512_loadu_ps(a + d));
        _mm512_storeu_si512(vp + d, _mm512_permutexvar_epi16(mix, x));
    }
}

/* os[t][c0 : c0 + 64] = (first ? 0 : os[t][...]) + the chain over pairs m in [0, np) of pbs[t][m0 + m] . vp[m],
 * for NB queries */
#define VALUES_BF16(NAME, NB)                                                                          \
    static inline void NAME(const uint32_t *const *pbs, int64_t m0, int64_t np, const uint32_t *vp, int64_t D, \
                            int64_t c0, float *const *os, int first) {                                 \
        __m512 acc[NB][4];                                                                             \
        for (int t = 0; t < NB; t++)                                                                   \
            for (int c = 0; c < 4; c++) acc[t][c] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(os[t] + c0 + 16 * c); \
        for (int64_t m = 0; m < np; m++) {                                                             \
            __m512i v[4];                                                                              \
            for (int c = 0; c < 4; c++) v[c] = _mm512_loadu_si512(vp + m * D + c0 + 16 * c);            \
            for (int t = 0; t < NB; t++) {                                                             \
                const __m512i b = _mm512_set1_epi32((int)pbs[t][m0 + m]);                              \
                for (int c = 0; c < 4; c++) acc[t][c] = dpbf(acc[t][c], v[c], b);                      \
            }                                                                                          \
        }                                                                                              \
        for (int t = 0; t < NB; t++)                                                                   \
            for (int c = 0; c < 4; c++) _mm512_storeu_ps(os[t] + c0 + 16 * c, acc[t][c]);              \
    }
VALUES_BF16(values_bf16_4, 4)
VALUES_BF16(values_bf16_1, 1)
#define VALUES_SPAN 64 /* dims a values tile covers */

/* pb[0 .. m) = p[0 .. m) in bf16, zeros after it to the next 16 (an odd last slot's partner) */
static void p_pairs(const float *p, int64_t m, uint16_t *pb) {
    for (int64_t j = 0; j < m; j += 16) {
        const __mmask16 k = m - j >= 16 ? 0xFFFF : (__mmask16)((1u << (m - j)) - 1);
        const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(k, p + j));
        _mm256_storeu_si256((__m256i *)(pb + j), (__m256i)h);
    }
}
#else
/* NEON with BFDOT: 4 lanes a vector; the same chains lane by lane (BFDOT's own rounding of a pair's sum) */
static inline bfloat16x8_t bf16_8(const float *x) { /* x[0 .. 8) in bf16, in order: pair i = (x[2i], x[2i + 1]) */
    return vcvtq_high_bf16_f32(vcvtq_low_bf16_f32(vld1q_f32(x)), vld1q_f32(x + 4));
}
static inline bfloat16x8_t as_bf(uint32x4_t x) { return vreinterpretq_bf16_u32(x); }

static void q_pairs(const float *const *qs, int64_t nq, int64_t D, uint32_t *qb) {
    for (int64_t u = 0; u < nq; u++)
        for (int64_t c = 0; c < D; c += 8) vst1q_u32(qb + u * D / 2 + c / 2, vreinterpretq_u32_bf16(bf16_8(qs[u] + c)));
}

/* kt[i * ATT_BF16_SC + s] = pair i of key rows[s], 4 slots at a time (slots past ns in the last 4: zeros) */
static void k_pairs_t(const float *const *rows, int64_t ns, int64_t D, uint32_t *kt) {
    for (int64_t g = 0; g < ns; g += 4)
        for (int64_t c = 0; c < D; c += 8) {
            uint32x4_t r[4];
            for (int s = 0; s < 4; s++) r[s] = g + s < ns ? vreinterpretq_u32_bf16(bf16_8(rows[g + s] + c)) : vdupq_n_u32(0);
            const uint64x2_t t0 = vreinterpretq_u64_u32(vtrn1q_u32(r[0], r[1])), t1 = vreinterpretq_u64_u32(vtrn2q_u32(r[0], r[1]));
            const uint64x2_t t2 = vreinterpretq_u64_u32(vtrn1q_u32(r[2], r[3])), t3 = vreinterpretq_u64_u32(vtrn2q_u32(r[2], r[3]));
            uint32_t *o = kt + c / 2 * ATT_BF16_SC + g;
            vst1q_u32(o, vreinterpretq_u32_u64(vtrn1q_u64(t0, t2)));
            vst1q_u32(o + ATT_BF16_SC, vreinterpretq_u32_u64(vtrn1q_u64(t1, t3)));
            vst1q_u32(o + 2 * ATT_BF16_SC, vreinterpretq_u32_u64(vtrn2q_u64(t0, t2)));
            vst1q_u32(o + 3 * ATT_BF16_SC, vreinterpretq_u32_u64(vtrn2q_u64(t1, t3)));
        }
}

/* NQ queries x NV vectors of 4 slots from slot vector v0; ns: the chunk's slots (a last vector's rest unstored) */
#define SCORES_BF16_NEON(NAME, NQ, NV)                                                                  \
    static inline void NAME(const uint32_t *qb, const uint32_t *kt, int64_t D, float scale, float *const *ps, \
                            int64_t s0, int64_t v0, int64_t ns) {                                      \
        float32x4_t acc[NQ][NV];                                                                       \
        for (int t = 0; t < NQ; t++)                                                                   \
            for (int v = 0; v < NV; v++) acc[t][v] = vdupq_n_f32(0.f);                                 \
        for (int64_t i = 0; i < D / 2; i += 4) {                                                       \
            bfloat16x8_t qv[NQ];                                                                       \
            for (int t = 0; t < NQ; t++) qv[t] = as_bf(vld1q_u32(qb + t * D / 2 + i));                 \
            STEP_LANE(0, NQ, NV) STEP_LANE(1, NQ, NV) STEP_LANE(2, NQ, NV) STEP_LANE(3, NQ, NV)        \
        }                                                                                              \
        for (int t = 0; t < NQ; t++)                                                                   \
            for (int v = 0; v < NV; v++) {                                                             \
                const int64_t s = 4 * (v0 + v), left = ns - s;                                         \
                const float32x4_t x = vmulq_n_f32(acc[t][v], scale);                                   \
                if (left >= 4) vst1q_f32(ps[t] + s0 + s, x);                                           \
                else {                                                                                 \
                    float f[4];                                                                        \
                    vst1q_f32(f, x);                                                                   \
                    for (int64_t j = 0; j < left; j++) ps[t][s0 + s + j] = f[j];                       \
                }                                                                                      \
            }                                                                                          \
    }
#define STEP_LANE(L, NQ, NV)                                                                                 \
    {                                                                                                  \
        bfloat16x8_t k[NV];                                                                            \
        for (int v = 0; v < NV; v++) k[v] = as_bf(vld1q_u32(kt + (i + L) * ATT_BF16_SC + 4 * (v0 + v))); \
        for (int t = 0; t < NQ; t++)                                                                   \
            for (int v = 0; v < NV; v++) acc[t][v] = vbfdotq_laneq_f32(acc[t][v], k[v], qv[t], L);     \
    }
SCORES_BF16_NEON(scores_neon_4x4, 4, 4)
SCORES_BF16_NEON(scores_neon_1x4, 1, 4)
SCORES_BF16_NEON(scores_neon_4x1, 4, 1)
SCORES_BF16_NEON(scores_neon_1x1, 1, 1)
#undef STEP_LANE

static void scores_bf16(const uint32_t *qb, int64_t nq, const uint32_t *kt, int64_t ns, int64_t D, float scale,
                        float *const *ps, int64_t s0) {
    const int64_t nv = (ns + 3) / 4;
    int64_t q = 0, v;
    for (; q + 4 <= nq; q += 4) {
        for (v = 0; v + 4 <= nv; v += 4) scores_neon_4x4(qb + q * D / 2, kt, D, scale, ps + q, s0, v, ns);
        for (; v < nv; v++) scores_neon_4x1(qb + q * D / 2, kt, D, scale, ps + q, s0, v, ns);
    }
    for (; q < nq; q++) {
        for (v = 0; v + 4 <= nv; v += 4) scores_neon_1x4(qb + q * D / 2, kt, D, scale, ps + q, s0, v, ns);
        for (; v < nv; v++) scores_neon_1x1(qb + q * D / 2, kt, D, scale, ps + q, s0, v, ns);
    }
}

static void v_pairs(const float *a, const float *b, int64_t D, uint32_t *vp) {
    for (int64_t d = 0; d < D; d += 4) {
        const uint16x4_t x = vreinterpret_u16_bf16(vcvt_bf16_f32(vld1q_f32(a + d)));
        const uint16x4_t y = b ? vreinterpret_u16_bf16(vcvt_bf16_f32(vld1q_f32(b + d))) : vdup_n_u16(0);
        vst1q_u16((uint16_t *)(vp + d), vcombine_u16(vzip1_u16(x, y), vzip2_u16(x, y)));
    }
}

static void p_pairs(const float *p, int64_t m, uint16_t *pb) {
    for (int64_t j = 0; j < m; j += 8) {
        float f[8] = {0};
        for (int64_t i = 0; i < 8 && j + i < m; i++) f[i] = p[j + i];
        vst1q_u16(pb + j, vreinterpretq_u16_bf16(bf16_8(f)));
    }
}

/* os[t][c0 : c0 + 16] (+)= the chain over pairs m in [0, np) of pbs[t][m0 + m] . vp[m], for NB queries */
#define VALUES_BF16_NEON(NAME, NB)                                                                     \
    static inline void NAME(const uint32_t *const *pbs, int64_t m0, int64_t np, const uint32_t *vp, int64_t D, \
                            int64_t c0, float *const *os, int first) {                                 \
        float32x4_t acc[NB][4];                                                                        \
        for (int t = 0; t < NB; t++)                                                                   \
            for (int c = 0; c < 4; c++) acc[t][c] = first ? vdupq_n_f32(0.f) : vld1q_f32(os[t] + c0 + 4 * c); \
        for (int64_t m = 0; m < np; m++) {                                                             \
            bfloat16x8_t v[4];                                                                         \
            for (int c = 0; c < 4; c++) v[c] = as_bf(vld1q_u32(vp + m * D + c0 + 4 * c));              \
            for (int t = 0; t < NB; t++) {                                                             \
                const bfloat16x8_t b = as_bf(vdupq_n_u32(pbs[t][m0 + m]));                             \
                for (int c = 0; c < 4; c++) acc[t][c] = vbfdotq_f32(acc[t][c], v[c], b);               \
            }                                                                                          \
        }                                                                                              \
        for (int t = 0; t < NB; t++)                                                                   \
            for (int c = 0; c < 4; c++) vst1q_f32(os[t] + c0 + 4 * c, acc[t][c]);                      \
    }
VALUES_BF16_NEON(values_bf16_4, 4)
VALUES_BF16_NEON(values_bf16_1, 1)
#define VALUES_SPAN 16

#endif

/* the output chains of queries [0, nq) over pairs [m0, m0 + np) (vp), a tile of VALUES_SPAN dims at a time */
static void values_bf16(const uint32_t *const *pbs, int64_t nq, int64_t m0, int64_t np, const uint32_t *vp, int64_t D,
                        float *const *os, int first) {
    int64_t t = 0;
    for (; t + 4 <= nq; t += 4)
        for (int64_t c0 = 0; c0 < D; c0 += VALUES_SPAN) values_bf16_4(pbs + t, m0, np, vp, D, c0, os + t, first);
    for (; t < nq; t++)
        for (int64_t c0 = 0; c0 < D; c0 += VALUES_SPAN) values_bf16_1(pbs + t, m0, np, vp, D, c0, os + t, first);
}

/* attend_block's task for D % 64 == 0 in bf16 products. Scratch: qb [P G D / 2], kt [D / 2, ATT_BF16_SC],
 * vp [ATT_BF16_SC / 2, D] dwords; pbs[q] -> >= n + 32 uint16 a query (its p in bf16, pairs as dwords) */
static void attend_block_bf16(const float *const *qs, float *const *os, float *const *ps, int64_t P, int64_t G,
                              int64_t *const *idx, const int64_t *n, int64_t shared, const float *kg,
                              const float *vg, int64_t D, float scale, float cap, float *inv, uint32_t *qb,
                              uint32_t *kt,
                              uint32_t *vp, uint32_t *const *pbs) {
    const int64_t nq = P * G;
    const float *rows[ATT_BF16_SC];
    q_pairs(qs, nq, D, qb);
    for (int64_t s0 = 0; s0 < shared; s0 += ATT_BF16_SC) { /* the shared slots: every query, a chunk at a time */
        const int64_t ns = shared - s0 < ATT_BF16_SC ? shared - s0 : ATT_BF16_SC;
        for (int64_t s = 0; s < ns; s++) rows[s] = kg + (s0 + s) * D;
        k_pairs_t(rows, ns, D, kt);
        scores_bf16(qb, nq, kt, ns, D, scale, ps, s0);
    }
    for (int64_t u = 0; u < P; u++) /* each position's own slots, through the same chains */
        for (int64_t j0 = shared; j0 < n[u]; j0 += ATT_BF16_SC) {
            const int64_t ns = n[u] - j0 < ATT_BF16_SC ? n[u] - j0 : ATT_BF16_SC;
            for (int64_t s = 0; s < ns; s++) rows[s] = kg + (idx[u] ? idx[u][j0 + s] : j0 + s) * D;
            k_pairs_t(rows, ns, D, kt);
            scores_bf16(qb + u * G * D / 2, G, kt, ns, D, scale, ps + u * G, j0);
        }
    for (int64_t q = 0; q < nq; q++) { /* softmax numerators in place (attend_block's), then their bf16 pairs */
        inv[q] = numerators(ps[q], n[q / G], cap);
        p_pairs(ps[q], n[q / G], (uint16_t *)pbs[q]);
    }
    const int64_t even = shared & ~(int64_t)1; /* pairs of the shared run; the rest per position */
    for (int64_t j0 = 0; j0 < even; j0 += ATT_BF16_SC) {
        const int64_t j1 = even - j0 < ATT_BF16_SC ? even : j0 + ATT_BF16_SC;
        for (int64_t j = j0; j < j1; j += 2) v_pairs(vg + j * D, vg + (j + 1) * D, D, vp + (j - j0) / 2 * D);
        values_bf16((const uint32_t *const *)pbs, nq, j0 / 2, (j1 - j0) / 2, vp, D, os, j0 == 0);
    }
    for (int64_t u = 0; u < P; u++) {
        const uint32_t *const *pu = (const uint32_t *const *)pbs + u * G;
        if (n[u] <= even && even > 0) continue;
        if (n[u] == 0) values_bf16(pu, G, 0, 0, vp, D, os + u * G, 1); /* a blind query: zeros */
        for (int64_t j0 = even; j0 < n[u]; j0 += ATT_BF16_SC) {
            const int64_t j1 = n[u] - j0 < ATT_BF16_SC ? n[u] : j0 + ATT_BF16_SC;
            for (int64_t j = j0; j < j1; j += 2) {
                const float *a = vg + (idx[u] ? idx[u][j] : j) * D;
                const float *b = j + 1 < j1 ? vg + (idx[u] ? idx[u][j + 1] : j + 1) * D : NULL;
                v_pairs(a, b, D, vp + (j - j0) / 2 * D);
            }
            values_bf16(pu, G, j0 / 2, (j1 - j0 + 1) / 2, vp, D, os + u * G, j0 == 0);
        }
    }
    for (int64_t q = 0; q < nq; q++) { /* times 1 / sum */
        const vec w = VSET1(inv[q]);
        for (int64_t c = 0; c < D; c += VL) VSTORE(os[q] + c, VMUL(VLOAD(os[q] + c), w));
    }
}
