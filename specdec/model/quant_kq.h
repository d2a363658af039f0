/* The K-quant kernels of quant_q8.c (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K: 256-weight blocks of 8 sub-blocks of 32,
 * against 8-bit activations in 256-value blocks): the templates DEFINE_Q2_K(C) .. DEFINE_Q6_K(C) of
 * q2_k_cC .. q6_k_cC, which quant_q8.c instantiates for C = 1..16 input rows. Included by quant_q8.c only, after its
 * act type, DPBUSD, hsum8, Q8_PAIRS and the prefetch settings; x86 only (the NEON build's are in
 * quant_neon.h, with the same float steps). */
#ifndef SPECDEC_QUANT_KQ_H
#define SPECDEC_QUANT_KQ_H

/* Q4_K (256 weights: 8 sub-blocks of 32, weight = d * sc[j] * q - dmin * m[j], q in 0..15), and Q5_K (the
 * same with q in 0..31): per activation block, sum_j sc[j] * (q . a)_j and sum_j m[j] * (sum a)_j are
 * integers (maddubs' pairs fit int16: 2 x 31 x 127). */
static inline void scales_q4_k(const uint8_t *b, __m256i *sv, __m256i *mn) {
    /* sv[s]: scale s in all 16 int16 lanes; mn: each min twice (against the two 16-sums of its 32). From
     * registers: shuffles, not stores and reloads (one 8-byte load of four-byte stores does not forward) */
    uint32_t u[4];
    q4_k_scale_bytes(b, u); /* bytes of u[0..1]: the 8 scales; of u[2..3]: the 8 mins */
    const __m128i s8 = _mm_setr_epi32((int)u[0], (int)u[1], (int)u[2], (int)u[3]);
    const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(s8));
    for (int s = 0; s < 8; s++) sv[s] = _mm256_shuffle_epi8(sc, _mm256_set1_epi16((short)((2 * s + 1) << 8 | 2 * s)));
    const __m128i m8 = _mm_unpackhi_epi64(s8, s8);
    *mn = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
}

/* sum over the 4 groups s of maddubs(q[s], x[s]) . sv[s], in int32 lanes (integers: the same sum in any order,
 * so the two halves of a block may be summed apart) */
static inline __m256i dot4_k(const __m256i *q, const __m256i *sv, const int8_t *xq) {
    const __m256i p0 = DPWSSD(_mm256_madd_epi16(_mm256_maddubs_epi16(q[0], _mm256_loadu_si256((const __m256i *)xq)), sv[0]),
                              _mm256_maddubs_epi16(q[1], _mm256_loadu_si256((const __m256i *)(xq + 32))), sv[1]);
    const __m256i p1 = DPWSSD(_mm256_madd_epi16(_mm256_maddubs_epi16(q[2], _mm256_loadu_si256((const __m256i *)(xq + 64))), sv[2]),
                              _mm256_maddubs_epi16(q[3], _mm256_loadu_si256((const __m256i *)(xq + 96))), sv[3]);
    return _mm256_add_epi32(p0, p1);
}

/* Q2_K (256 weights: 16 of 16, weight = d * sc[i] * q - dmin * m[i], q in 0..3, a byte of sc | m << 4 each):
 * Q6_K's scale arrangement (sc16, scales_q6_k) for sum_i sc[i] (q . a)_i, and Q4_K's float steps with the mins
 * against the 16-sums: mt = sum_i m[i] (sum a)_i (mn16: the 16 mins as int16) */
static inline void scales_q2_k(const uint8_t *b, __m256i *sc16, __m256i *mn16) {
    const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)b));
    *sc16 = _mm256_and_si256(v, _mm256_set1_epi16(15));
    *mn16 = _mm256_srli_epi16(v, 4);
}
#define Q2_K_BYTES 84
#define Q4_K_BYTES 144
#define Q5_K_BYTES 176
#define Q6_K_BYTES 210
#define Q3_K_BYTES 110
/* the 16 scales of 16 weights as int16: Q6_K's int8 bytes, Q3_K's 6-bit ones less 32 */
static inline __m256i sc16_q6_k(const uint8_t *b) { return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192))); }
static inline __m256i sc16_q3_k(const uint8_t *b) {
    int8_t sc[16];
    q3_k_scales(b, sc);
    return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
}

/* sv[s]: Q6_K's scale 2s in int16 lanes 0-7 and scale 2s + 1 in lanes 8-15, shuffled from sc16 (the 16 scales) */
static inline void scales_q6_k(__m256i sc16, __m256i *sv) {
    const __m256i lo = _mm256_permute2x128_si256(sc16, sc16, 0x00), hi = _mm256_permute2x128_si256(sc16, sc16, 0x11);
    for (int s = 0; s < 8; s++) {
        const int e = (2 * s) % 8; /* scale 2s is element e of its half; 2s + 1 is e + 1 */
        const __m256i m = _mm256_setr_epi8(2 * e, 2 * e + 1, 2 * e, 2 * e + 1, 2 * e, 2 * e + 1, 2 * e, 2 * e + 1,
            2 * e, 2 * e + 1, 2 * e, 2 * e + 1, 2 * e, 2 * e + 1, 2 * e, 2 * e + 1,
            2 * e + 2, 2 * e + 3, 2 * e + 2, 2 * e + 3, 2 * e + 2, 2 * e + 3, 2 * e + 2, 2 * e + 3,
            2 * e + 2, 2 * e + 3, 2 * e + 2, 2 * e + 3, 2 * e + 2, 2 * e + 3, 2 * e + 2, 2 * e + 3);
        sv[s] = _mm256_shuffle_epi8(s < 4 ? lo : hi, m);
    }
}

#if Q8_PAIRS
static inline __m512i both(__m256i v) { return _mm512_inserti64x4(_mm512_castsi256_si512(v), v, 1); }
static inline __m512 floats2(const float *p0, const float *p1) { /* *p0 in the low 8 lanes, *p1 in the high */
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_broadcast_ss(p0)), _mm256_broadcast_ss(p1), 1);
}
static inline __m512i load2(const uint8_t *p) { /* 32 bytes in both halves */
    return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
}
/* dot4_k for a pair of rows, from their interleaved copy at xp (act's qp) */
static inline __m512i dot4_k2(const __m512i *q, const __m512i *sv, const int8_t *xp) {
    const __m512i p0 = _mm512_dpwssd_epi32(_mm512_madd_epi16(_mm512_maddubs_epi16(q[0], _mm512_loadu_si512(xp)), sv[0]),
                                           _mm512_maddubs_epi16(q[1], _mm512_loadu_si512(xp + 64)), sv[1]);
    const __m512i p1 = _mm512_dpwssd_epi32(_mm512_madd_epi16(_mm512_maddubs_epi16(q[2], _mm512_loadu_si512(xp + 128)), sv[2]),
                                           _mm512_maddubs_epi16(q[3], _mm512_loadu_si512(xp + 192)), sv[3]);
    return _mm512_add_epi32(p0, p1);
}
static inline void low4(const __m512i *v, __m256i *lo) { /* the low halves: what the 256-bit kernel holds */
    for (int g = 0; g < 4; g++) lo[g] = _mm512_castsi512_si256(v[g]);
}
/* Q4_K's groups 4h .. 4h + 3 in both halves: the integers q2 and the scales sv2 (from sc2: the 8
 * scales as int16 in each 128-bit lane) */
static inline void q4_k_pass2(const uint8_t *blk, int h, __m512i sc2, __m512i *q2, __m512i *sv2) {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    for (int j = 0; j < 2; j++) {
        const __m512i raw = load2(blk + 16 + 32 * (2 * h + j));
        q2[2 * j] = _mm512_and_si512(raw, nib);
        q2[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nib);
    }
    for (int g = 0; g < 4; g++) {
        const int s = 4 * h + g;
        sv2[g] = _mm512_shuffle_epi8(sc2, _mm512_set1_epi16((short)((2 * s + 1) << 8 | 2 * s)));
    }
}
/* Q5_K's groups 4h .. 4h + 3 in both halves (q5_k_group), with Q4_K's scales */
static inline void q5_k_pass2(const uint8_t *blk, int h, __m512i sc2, __m512i *q2, __m512i *sv2) {
    for (int g = 0; g < 4; g++) {
        const int s = 4 * h + g;
        q2[g] = both(q5_k_group(blk, s));
        sv2[g] = _mm512_shuffle_epi8(sc2, _mm512_set1_epi16((short)((2 * s + 1) << 8 | 2 * s)));
    }
}
static inline void scales_q4_k2(const uint8_t *b, __m512i *sc2, __m512i *mn2) {
    uint32_t u[4];
    q4_k_scale_bytes(b, u);
    const __m128i s8 = _mm_setr_epi32((int)u[0], (int)u[1], (int)u[2], (int)u[3]);
    *sc2 = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(s8));
    const __m128i m8 = _mm_unpackhi_epi64(s8, s8);
    *mn2 = both(_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8)));
}
/* Q6_K's (Q3_K's) groups 4h .. 4h + 3 in both halves, as q6_k_group (q3_k_group) and scales_q6_k make them */
static inline void q6_k_pass2(const uint8_t *blk, int h, __m256i sc16, __m512i *q2, __m512i *sv2) {
    __m256i sv[8];
    scales_q6_k(sc16, sv);
    for (int g = 0; g < 4; g++) q2[g] = both(q6_k_group(blk, 4 * h + g)), sv2[g] = both(sv[4 * h + g]);
}
static inline void q3_k_pass2(const uint8_t *blk, int h, __m256i sc16, __m512i *q2, __m512i *sv2) {
    __m256i sv[8];
    scales_q6_k(sc16, sv);
    for (int g = 0; g < 4; g++) q2[g] = both(q3_k_group(blk, 4 * h + g)), sv2[g] = both(sv[4 * h + g]);
}
static inline void q2_k_pass2(const uint8_t *blk, int h, __m256i sc16, __m512i *q2, __m512i *sv2) {
    __m256i sv[8];
    scales_q6_k(sc16, sv);
    for (int g = 0; g < 4; g++) q2[g] = both(q2_k_group(blk, 4 * h + g)), sv2[g] = both(sv[4 * h + g]);
}
static inline float hsum_lo(__m512 v) { return hsum8(_mm512_castps512_ps256(v)); }
static inline float hsum_hi(__m512 v) { return hsum8(_mm512_extractf32x8_ps(v, 1)); }
#endif

#if Q8_PAIRS
#define DEFINE_KQ_PAIRS(fmt, BYTES, PREP, PASS, PAIR_STEP, ROW_STEP, C)                              \
    static void fmt##_c##C(const uint8_t *w, const act *a, float *y, int64_t ldy) {                  \
        enum { NP = C / 2, C1 = 2 * (C / 2) }; /* rows 0 .. C1 - 1 in pairs, an odd last row alone */ \
        __m512 f2[NP + 1];                                                                           \
        __m512i part2[NP + 1];                                                                       \
        __m256 f[C];                                                                                 \
        __m256i part[C];                                                                             \
        for (int p = 0; p < NP; p++) f2[p] = _mm512_setzero_ps();                                    \
        for (int c = C1; c < C; c++) f[c] = _mm256_setzero_ps();                                     \
        const int64_t K = a->K, K16 = K / 16, nb = K / 256;                                          \
        for (int64_t ib = 0; ib < nb; ib++) {                                                        \
            const uint8_t *blk = w + ib * BYTES;                                                     \
            for (int b = 0; b < BYTES; b += 64) _mm_prefetch((const char *)blk + QPF_BYTES + b, QPF_HINT); \
            PREP                                                                                     \
            __m512i q2[4], sv2[4];                                                                   \
            __m256i q[4], sv[4];                                                                     \
            const int8_t *xq = a->q + ib * 256, *xp = a->qp + ib * 512;                              \
            const int16_t *xs = a->s + ib * 16, *xsp = a->sp + ib * 32;                              \
            PASS(0);                                                                                 \
            low4(q2, q), low4(sv2, sv);                                                              \
            for (int p = 0; p < NP; p++) part2[p] = dot4_k2(q2, sv2, xp + 2 * p * K);                \
            for (int c = C1; c < C; c++) part[c] = dot4_k(q, sv, xq + c * K);                        \
            PASS(1);                                                                                 \
            low4(q2, q), low4(sv2, sv);                                                              \
            for (int p = 0; p < NP; p++) {                                                           \
                const __m512i acc = _mm512_add_epi32(part2[p], dot4_k2(q2, sv2, xp + 2 * p * K + 256)); \
                const __m512 da = floats2(a->d + 2 * p * nb + ib, a->d + (2 * p + 1) * nb + ib);     \
                PAIR_STEP                                                                            \
            }                                                                                        \
            for (int c = C1; c < C; c++) {                                                           \
                const __m256i acc = _mm256_add_epi32(part[c], dot4_k(q, sv, xq + c * K + 128));      \
                const __m256 da = _mm256_broadcast_ss(a->d + c * nb + ib);                           \
                ROW_STEP                                                                             \
            }                                                                                        \
        }                                                                                            \
        for (int p = 0; p < NP; p++) y[2 * p * ldy] = hsum_lo(f2[p]), y[(2 * p + 1) * ldy] = hsum_hi(f2[p]); \
        for (int c = C1; c < C; c++) y[c * ldy] = hsum8(f[c]);                                       \
    }

/* Q4_K: weight = d * sc[j] * q - dmin * m[j]; the mins meet the 16-sums (mt) */
#define Q4_K_PREP                                                                                    \
    const __m512 dv = _mm512_set1_ps(f16_to_f32(blk)), ndminv = _mm512_set1_ps(-f16_to_f32(blk + 2)); \
    __m512i sc2, mn2;                                                                                \
    scales_q4_k2(blk, &sc2, &mn2);
#define Q4_K_PASS(h) q4_k_pass2(blk, h, sc2, q2, sv2)
#define Q4_K_PAIR_STEP                                                                               \
    const __m512i mt = _mm512_madd_epi16(mn2, _mm512_loadu_si512(xsp + 2 * p * K16));                \
    f2[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(dv, da), f2[p]);                  \
    f2[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mt), _mm512_mul_ps(ndminv, da), f2[p]);
#define Q4_K_ROW_STEP                                                                                \
    const __m256i mt = _mm256_madd_epi16(_mm512_castsi512_si256(mn2), _mm256_loadu_si256((const __m256i *)(xs + c * K16))); \
    f[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_mul_ps(_mm512_castps512_ps256(dv), da), f[c]); \
    f[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mt), _mm256_mul_ps(_mm512_castps512_ps256(ndminv), da), f[c]);
/* Q6_K: weight = d * sc[i] * (q - 32) per 16; the -32 meets the 16-sums (off). Q3_K: the same with
 * q - 4 (its d at byte 108, its scales unpacked) */
#define KQ6_PREP(f, D_AT)                                                                            \
    const __m512 dv = _mm512_set1_ps(f16_to_f32(blk + D_AT));                                        \
    const __m256i sc16 = sc16_##f(blk);
#define Q6_K_PREP KQ6_PREP(q6_k, 208)
#define Q3_K_PREP KQ6_PREP(q3_k, 108)
#define Q6_K_PASS(h) q6_k_pass2(blk, h, sc16, q2, sv2)
#define Q3_K_PASS(h) q3_k_pass2(blk, h, sc16, q2, sv2)
#define KQ6_PAIR_STEP(SHIFT)                                                                         \
    const __m512i off = _mm512_madd_epi16(both(sc16), _mm512_loadu_si512(xsp + 2 * p * K16));        \
    f2[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc, _mm512_slli_epi32(off, SHIFT))), \
                            _mm512_mul_ps(dv, da), f2[p]);
#define KQ6_ROW_STEP(SHIFT)                                                                          \
    const __m256i off = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)(xs + c * K16))); \
    f[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc, _mm256_slli_epi32(off, SHIFT))),  \
                           _mm256_mul_ps(_mm512_castps512_ps256(dv), da), f[c]);
#define Q6_K_PAIR_STEP KQ6_PAIR_STEP(5)
#define Q6_K_ROW_STEP KQ6_ROW_STEP(5)
#define Q3_K_PAIR_STEP KQ6_PAIR_STEP(2)
#define Q3_K_ROW_STEP KQ6_ROW_STEP(2)
/* Q2_K: Q6_K's scales for the products, Q4_K's steps with the 16 mins (mn2) against the 16-sums */
#define Q2_K_PREP                                                                                    \
    const __m512 dv = _mm512_set1_ps(f16_to_f32(blk + 80)), ndminv = _mm512_set1_ps(-f16_to_f32(blk + 82)); \
    __m256i sc16, mn16;                                                                              \
    scales_q2_k(blk, &sc16, &mn16);                                                                  \
    const __m512i mn2 = both(mn16);
#define Q2_K_PASS(h) q2_k_pass2(blk, h, sc16, q2, sv2)
#define DEFINE_Q2_K(C) DEFINE_KQ_PAIRS(q2_k, Q2_K_BYTES, Q2_K_PREP, Q2_K_PASS, Q4_K_PAIR_STEP, Q4_K_ROW_STEP, C)
#define DEFINE_Q4_K(C) DEFINE_KQ_PAIRS(q4_k, Q4_K_BYTES, Q4_K_PREP, Q4_K_PASS, Q4_K_PAIR_STEP, Q4_K_ROW_STEP, C)
#define Q5_K_PASS(h) q5_k_pass2(blk, h, sc2, q2, sv2)
#define DEFINE_Q5_K(C) DEFINE_KQ_PAIRS(q5_k, Q5_K_BYTES, Q4_K_PREP, Q5_K_PASS, Q4_K_PAIR_STEP, Q4_K_ROW_STEP, C)
#define DEFINE_Q6_K(C) DEFINE_KQ_PAIRS(q6_k, Q6_K_BYTES, Q6_K_PREP, Q6_K_PASS, Q6_K_PAIR_STEP, Q6_K_ROW_STEP, C)
#define DEFINE_Q3_K(C) DEFINE_KQ_PAIRS(q3_k, Q3_K_BYTES, Q3_K_PREP, Q3_K_PASS, Q3_K_PAIR_STEP, Q3_K_ROW_STEP, C)
#else
/* A weight block meets the C inputs in two passes, groups 0-3 then 4-7: each pass holds only its
 * half of the block's integers and scales in registers (all of them do not fit in AVX2's 16, and
 * reloading them for every input row made the loads, not the multiplies, the bound). The first
 * pass leaves each row's integer half-sum in part[]. The float steps per row and block are those
 * of one pass (d * da and -dmin * da as vector products: the same roundings as the scalar ones). */
#define DEFINE_KQ4(f4, BYTES, D_AT, C)                                                               \
    static void f4##_c##C(const uint8_t *w, const act *a, float *y, int64_t ldy) {                  \
        __m256 f[C];                                                                                 \
        __m256i part[C];                                                                             \
        for (int c = 0; c < C; c++) f[c] = _mm256_setzero_ps();                                      \
        const int64_t K = a->K, K16 = K / 16, nb = K / 256;                                          \
        for (int64_t ib = 0; ib < nb; ib++) {                                                        \
            const uint8_t *blk = w + ib * BYTES;                                                     \
            for (int p = 0; p < BYTES; p += 64) _mm_prefetch((const char *)blk + QPF_BYTES + p, QPF_HINT); \
            const __m256 dv = _mm256_set1_ps(f16_to_f32(blk + D_AT)), ndminv = _mm256_set1_ps(-f16_to_f32(blk + D_AT + 2)); \
            __m256i mn, q[8], sv[8];                                                                 \
            f4##_scales(blk, sv, &mn);                                                               \
            for (int s = 0; s < 8; s++) q[s] = f4##_group(blk, s);                                   \
            const int8_t *xq = a->q + ib * 256;                                                      \
            const int16_t *xs = a->s + ib * 16;                                                      \
            for (int c = 0; c < C; c++) part[c] = dot4_k(q, sv, xq + c * K);                         \
            for (int c = 0; c < C; c++) {                                                            \
                const __m256i acc = _mm256_add_epi32(part[c], dot4_k(q + 4, sv + 4, xq + c * K + 128)); \
                const __m256i mt = _mm256_madd_epi16(mn, _mm256_loadu_si256((const __m256i *)(xs + c * K16))); \
                const __m256 da = _mm256_broadcast_ss(a->d + c * nb + ib);                           \
                f[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_mul_ps(dv, da), f[c]);        \
                f[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mt), _mm256_mul_ps(ndminv, da), f[c]);     \
            }                                                                                        \
        }                                                                                            \
        for (int c = 0; c < C; c++) y[c * ldy] = hsum8(f[c]);                                        \
    }

/* sv[8] and mn, as the kernel above meets them: Q4_K's (Q5_K's) 8 scales and each min twice; Q2_K's 16 scales
 * two a group (scales_q6_k) and its 16 mins */
#define q4_k_scales scales_q4_k
#define q5_k_scales scales_q4_k
static inline void q2_k_scales(const uint8_t *b, __m256i *sv, __m256i *mn) {
    __m256i sc16;
    scales_q2_k(b, &sc16, mn);
    scales_q6_k(sc16, sv);
}
#define DEFINE_Q4_K(C) DEFINE_KQ4(q4_k, Q4_K_BYTES, 0, C)
#define DEFINE_Q5_K(C) DEFINE_KQ4(q5_k, Q5_K_BYTES, 0, C)
#define DEFINE_Q2_K(C) DEFINE_KQ4(q2_k, Q2_K_BYTES, 80, C)

/* Q6_K (256 weights, weight = d * sc[i] * (q - 32) per 16, q in 0..63): sum_i sc[i] * ((q . a)_i -
 * 32 (sum a)_i), all integer per activation block; in two passes over the inputs as Q4_K. Q3_K: the
 * same with q in 0..7 and q - 4 (SHIFT 2: the offsets times 4, not 32). */
#define DEFINE_KQ6(f6, BYTES, D_AT, SHIFT, C)                                                        \
    static void f6##_c##C(const uint8_t *w, const act *a, float *y, int64_t ldy) {                  \
        __m256 f[C];                                                                                 \
        __m256i part[C];                                                                             \
        for (int c = 0; c < C; c++) f[c] = _mm256_setzero_ps();                                      \
        const int64_t K = a->K, K16 = K / 16, nb = K / 256;                                          \
        for (int64_t ib = 0; ib < nb; ib++) {                                                        \
            const uint8_t *blk = w + ib * BYTES;                                                     \
            for (int p = 0; p < BYTES; p += 64)                                                      \
                _mm_prefetch((const char *)blk + QPF_BYTES + p, QPF_HINT);                        \
            const __m256 dv = _mm256_set1_ps(f16_to_f32(blk + D_AT));                                \
            const __m256i sc16 = sc16_##f6(blk);                                                     \
            __m256i q[8], sv[8];                                                                     \
            scales_q6_k(sc16, sv);                                                                   \
            for (int s = 0; s < 8; s++) q[s] = f6##_group(blk, s);                                   \
            const int8_t *xq = a->q + ib * 256;                                                      \
            const int16_t *xs = a->s + ib * 16;                                                      \
            for (int c = 0; c < C; c++) part[c] = dot4_k(q, sv, xq + c * K);                         \
            for (int c = 0; c < C; c++) {                                                            \
                __m256i acc = _mm256_add_epi32(part[c], dot4_k(q + 4, sv + 4, xq + c * K + 128));    \
                const __m256i off = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)(xs + c * K16))); \
                acc = _mm256_sub_epi32(acc, _mm256_slli_epi32(off, SHIFT));                          \
                f[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_mul_ps(dv, _mm256_broadcast_ss(a->d + c * nb + ib)), f[c]); \
            }                                                                                        \
        }                                                                                            \
        for (int c = 0; c < C; c++) y[c * ldy] = hsum8(f[c]);                                        \
    }
#define DEFINE_Q6_K(C) DEFINE_KQ6(q6_k, Q6_K_BYTES, 208, 5, C)
#define DEFINE_Q3_K(C) DEFINE_KQ6(q3_k, Q3_K_BYTES, 108, 2, C)
#endif

/* IQ4_XS (256 weights: 8 sub-blocks of 32, weight = d * sc[s] * v with v = IQ4_VALUES[q], signed, and sc in
 * -32..31): per activation block sum_s sc[s] (v . a)_s, an integer, from maddubs(|v|, sign(a, v)) (pairs of
 * |v|, |a| <= 127 fit int16) met by sc[s] in one vpmaddwd; lane l takes bytes 4l .. 4l + 3 of every group, as
 * the NEON build's sdot lanes do. Every x86 build runs this one kernel (no pairs form). IQ3_S is the same
 * kernel: v its codebook's signed magnitudes (1..15), sc = 1 + 2 x its 4-bit scale. */
#define IQ4_XS_BYTES 136
#define IQ3_S_BYTES 110
#define iq4_xs_group(blk, s) iq4_group((blk) + 8 + 16 * (s))
#define DEFINE_IQ_K(FMT, BYTES, C)                                                                   \
    static void FMT##_c##C(const uint8_t *w, const act *a, float *y, int64_t ldy) {                 \
        __m256 f[C];                                                                                 \
        for (int c = 0; c < C; c++) f[c] = _mm256_setzero_ps();                                      \
        const int64_t K = a->K, nb = K / 256;                                                        \
        for (int64_t ib = 0; ib < nb; ib++) {                                                        \
            const uint8_t *blk = w + ib * BYTES;                                                     \
            for (int p = 0; p < BYTES; p += 64) _mm_prefetch((const char *)blk + QPF_BYTES + p, QPF_HINT); \
            const __m256 dv = _mm256_set1_ps(f16_to_f32(blk));                                       \
            __m256i v[8];                                                                            \
            short sc[8];                                                                             \
            for (int s = 0; s < 8; s++) v[s] = FMT##_group(blk, s), sc[s] = (short)FMT##_scale(blk, s); \
            for (int c = 0; c < C; c++) {                                                            \
                const int8_t *xq = a->q + c * K + 256 * ib;                                          \
                __m256i acc = _mm256_setzero_si256();                                                \
                for (int s = 0; s < 8; s++) {                                                        \
                    const __m256i x = _mm256_loadu_si256((const __m256i *)(xq + 32 * s));            \
                    acc = DPWSSD(acc, _mm256_maddubs_epi16(_mm256_abs_epi8(v[s]), _mm256_sign_epi8(x, v[s])), \
                                 _mm256_set1_epi16(sc[s]));                                          \
                }                                                                                    \
                f[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_mul_ps(dv, _mm256_broadcast_ss(a->d + c * nb + ib)), f[c]); \
            }                                                                                        \
        }                                                                                            \
        for (int c = 0; c < C; c++) y[c * ldy] = hsum8(f[c]);                                        \
    }
#define DEFINE_IQ4_XS(C) DEFINE_IQ_K(iq4_xs, IQ4_XS_BYTES, C)
#define DEFINE_IQ3_S(C) DEFINE_IQ_K(iq3_s, IQ3_S_BYTES, C)

#endif
