/* Skinny GEMM on GGUF-quantized weights with 8-bit activations (llama.cpp's arithmetic):
 * Y[n, N] ~= X[n, K] . deq(W)[N, K]^T (+ b), any n (decode steps and verify passes, and prefill: the
 * kernels take 16 input rows at a time).
 *
 * Each input row is first quantized to int8 in blocks (one fp32 scale per
 * block: 256 values for the K-quants, as llama.cpp's Q8_K; 32 for the 32-weight formats, as Q8_0/Q8_1),
 * and the weights' integers meet the activations' in integer dot products (VNNI vpdpbusd/vpdpwssd
 * where the CPU has them, else AVX2's maddubs/madd, which give the same integers here: no sum can
 * saturate; on aarch64 NEON's sdot, or without dotprod its floor of widening multiplies: quant_neon.h).
 * The block scales are applied in fp32 once per block.
 *
 * Not the fp32 model's bits (the activations are rounded to 8 bits), but deterministic per row: a
 * row's integers are exact, its float operations run in a fixed order that does not depend on the
 * row count or the thread count, so a verify pass of k + 1 rows gives each row exactly what a
 * one-row step gives it, and greedy speculative decoding stays token for token plain decoding.
 * The float operations are the same in every build (x86-64-v3, AVX-512, aarch64 with or without
 * dotprod and i8mm), so a row's bits are the same on every CPU (tests/test_arm.py).
 *
 * Layout of a quantized activation row (act): q int8 [K]; d float [K / B] (the block scales);
 * s int16 [K / 16] (sums of each 16 q's: the K-quants' offsets); sa float [K / 32] (32-weight
 * formats: d * the block's q sum, their offsets); qp, sp: see act.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "simd.h"

/* What this build needs of the CPU, in /proc/cpuinfo's names (cpu_kernels.py checks them at load) */
const char *kernels_isa(void) {
    return ""
#if defined(__x86_64__) || defined(__i386__)
#if defined(__AVX2__)
           " avx2"
#endif
#if defined(__FMA__)
           " fma"
#endif
#if defined(__F16C__)
           " f16c"
#endif
#if defined(__BMI2__)
           " bmi2"
#endif
#if defined(__AVX512F__)
           " avx512f"
#endif
#if defined(__AVX512BW__)
           " avx512bw"
#endif
#if defined(__AVX512DQ__)
           " avx512dq"
#endif
#if defined(__AVX512VL__)
           " avx512vl"
#endif
#if defined(__AVX512VNNI__)
           " avx512_vnni"
#endif
#if defined(__AVXVNNI__)
           " avx_vnni"
#endif
#if defined(__AVX512BF16__)
           " avx512_bf16"
#endif
#endif
#if defined(__aarch64__)
           " asimd"
#if defined(__ARM_FEATURE_DOTPROD)
           " asimddp"
#endif
#if defined(__ARM_FEATURE_MATMUL_INT8)
           " i8mm"
#endif
#if defined(__ARM_FEATURE_FP16_VECTOR_ARITHMETIC)
           " asimdhp"
#endif
#if defined(__ARM_FEATURE_BF16_VECTOR_ARITHMETIC)
           " bf16"
#endif
#if defined(__ARM_FEATURE_SVE)
           " sve"
#endif
#endif
        ;
}

#define QMAX_C 16
#ifndef Q8_CHUNK
#define Q8_CHUNK QMAX_C /* inputs a kernel call takes in a long prefill (at most QMAX_C, even: whole pairs) */
#endif
#define QMAX_K 65536
#ifndef Q8_TILE_BYTES
#define Q8_TILE_BYTES (128 * 1024)
#endif

#if !SIMD_NEON
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define DPBUSD(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#define DPWSSD(acc, a, b) _mm256_dpwssd_epi32(acc, a, b)
#elif defined(__AVXVNNI__)
#define DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#define DPWSSD(acc, a, b) _mm256_dpwssd_avx_epi32(acc, a, b)
#else /* exact too: every pair of u8 * s8 products below fits int16 (u <= 128, |s| <= 127) */
#define DPBUSD(acc, u, s) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)))
#define DPWSSD(acc, a, b) _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
#endif
#define NIB8 _mm256_set1_epi8(0x0F)
#endif

/* Q8_PAIRS: the K-quant kernels take two input rows in one 512-bit register (AVX-512BW with VNNI),
 * row c in the low 256 bits and row c + 1 in the high, the weight's integers and scales the same in
 * both halves. Each half runs the 256-bit kernel's integer and float operations on its row, so a row
 * gets the same bits at any row count and in either build; where the vector unit is 512 bits wide,
 * a pair costs about what one row costs. */
#if !defined(Q8_PAIRS)
#if defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512DQ__)
#define Q8_PAIRS 1
#else
#define Q8_PAIRS 0
#endif
#endif

#if !SIMD_NEON
static inline float hsum8(__m256 v) { /* fixed order */
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
static inline int hsum8i(__m256i v) {
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    __m128i s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
    return _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 1)));
}
#endif

typedef struct {
    int8_t *q;
    float *d, *sa;
    int16_t *s;
    int8_t *qp; /* Q8_PAIRS, the K-quants: q and s again, rows 2p and 2p + 1 interleaved, 32 q or 16 s */
    int16_t *sp; /* of each in turn (one 512-bit load takes both rows' share of a group) */
    int32_t *o; /* repacked formats: [K / 16] a row, their offsets ready (quant_rp.h) */
    int64_t K, B; /* row length, block size */
    int o_kind; /* what o holds (quant_rp.h's O_*), 0: nothing */
} act;

#if !SIMD_NEON
/* One row of K floats in blocks of B (32 or 256): d = max|x| / 127, q = round-to-nearest-even(x * 127 / max|x|). */
static void quantize_row(const float *x, int64_t K, int64_t B, int8_t *q, float *d, int16_t *s, float *sa) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t b0 = 0; b0 < K; b0 += B) {
        __m256 m = _mm256_setzero_ps();
        for (int64_t i = 0; i < B; i += 8) m = _mm256_max_ps(m, _mm256_and_ps(absmask, _mm256_loadu_ps(x + b0 + i)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
        const float db = amax / 127.0f;
        d[b0 / B] = db;
        const __m256 id = _mm256_set1_ps(q8_inverse(amax));
        for (int64_t i = 0; i < B; i += 32) {
            const float *xp = x + b0 + i;
            __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xp), id));
            __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xp + 8), id));
            __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xp + 16), id));
            __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xp + 24), id));
            const int s0 = hsum8i(_mm256_add_epi32(i0, i1)), s1 = hsum8i(_mm256_add_epi32(i2, i3));
            s[(b0 + i) / 16] = (int16_t)s0;
            s[(b0 + i) / 16 + 1] = (int16_t)s1;
            if (B == 32) sa[b0 / 32] = db * (float)(s0 + s1);
            /* int32 -> int8 in order: the packs interleave 128-bit lanes, the permute undoes it */
            const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
            _mm256_storeu_si256((__m256i *)(q + b0 + i),
                                _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        }
    }
}
#endif

/* software prefetch distance in the file's blocks: x86 prefetches far ahead into L2 (the repacked
 * kernels' rule, simd.h's SD_PREFETCH), NEON near into L1 (unmeasured on an ARM host) */
#ifndef QPF_BYTES
#define QPF_BYTES (SIMD_NEON ? 1024 : 8192)
#endif
#ifndef QPF_HINT
#define QPF_HINT _MM_HINT_T1 /* into L2 */
#endif

#if !SIMD_NEON
#include "quant_kq.h"

/* The 32-weight formats: weight = d * (u - o) (Q8_0, IQ4_NL: o = 0, u signed; Q4_0: o = 8; Q5_0: o = 16) or
 * d * u + m (Q4_1, Q5_1), u unsigned. Per block, u . a is an integer; eight blocks' dot products are
 * summed across their lanes into one vector (a block a lane), which meets the eight d * da in one
 * fp32 FMA. The offsets (-o * d or m, times da * sum a = sa) are one dot product over the row's
 * blocks at the end. */
static inline __m256i nib32(const uint8_t *qs) { /* weights 0..15 the low nibbles of 16 bytes, 16..31 the high */
    const __m128i x = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(x, 4), x), NIB8);
}
static inline __m256i with_bit4(__m256i u, const uint8_t *qhp) { /* bit i of the 32 at qhp -> bit 4 of byte i */
    uint32_t qh;
    memcpy(&qh, qhp, 4);
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    return _mm256_mask_add_epi8(u, (__mmask32)qh, u, _mm256_set1_epi8(0x10)); /* bit 4 of u is 0: add is or */
#else
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
        _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
    const __m256i sel = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_or_si256(u, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, sel), sel),
                                               _mm256_set1_epi8(0x10)));
#endif
}
#endif

/* per format: block bytes, the bytes u of a block, u signed?, o (weight = d * (u - o)), the byte
 * offset of m (Q4_1, Q5_1; -1: none) */
#define Q8_0_BYTES 34
#define Q4_0_BYTES 18
#define Q5_0_BYTES 22
#define Q4_1_BYTES 20
#define Q5_1_BYTES 24
#define IQ4_NL_BYTES 18
#if !SIMD_NEON
static inline __m256i u_q8_0(const uint8_t *b) { return _mm256_loadu_si256((const __m256i *)(b + 2)); }
static inline __m256i u_q4_0(const uint8_t *b) { return nib32(b + 2); }
static inline __m256i u_q5_0(const uint8_t *b) { return with_bit4(nib32(b + 6), b + 2); }
static inline __m256i u_q4_1(const uint8_t *b) { return nib32(b + 4); }
static inline __m256i u_q5_1(const uint8_t *b) { return with_bit4(nib32(b + 8), b + 4); }
static inline __m256i u_iq4_nl(const uint8_t *b) { return iq4_group(b + 2); } /* int8 values, as Q8_0's */
#endif
#define Q8_0_SIGNED 1
#define Q4_0_SIGNED 0
#define Q5_0_SIGNED 0
#define Q4_1_SIGNED 0
#define Q5_1_SIGNED 0
#define IQ4_NL_SIGNED 1
#define Q8_0_O 0.0f
#define Q4_0_O 8.0f
#define Q5_0_O 16.0f
#define Q4_1_O 0.0f
#define Q5_1_O 0.0f
#define IQ4_NL_O 0.0f
#define Q8_0_M (-1)
#define Q4_0_M (-1)
#define Q5_0_M (-1)
#define Q4_1_M 2
#define Q5_1_M 2
#define IQ4_NL_M (-1)

#if SIMD_NEON
#include "quant_neon.h" /* quantize_row and the raw-block kernels (DEFINE_B32, DEFINE_Q2_K .. DEFINE_Q6_K) in NEON */
#else
/* the fp16 at p, p + stride, ..., 8 of them, as floats */
static inline __m256 halves8(const uint8_t *p, int64_t stride) {
#if defined(__F16C__)
    uint16_t h[8];
    for (int j = 0; j < 8; j++) memcpy(h + j, p + j * stride, 2);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
#else
    float f[8];
    for (int j = 0; j < 8; j++) f[j] = f16_to_f32(p + j * stride);
    return _mm256_loadu_ps(f);
#endif
}

/* eight vectors of int32 lanes -> one vector: lane j the sum of p[j]'s lanes (a fixed order) */
static inline __m256i lane_sums8(const __m256i *p) {
    const __m256i h0 = _mm256_hadd_epi32(p[0], p[1]), h1 = _mm256_hadd_epi32(p[2], p[3]);
    const __m256i h2 = _mm256_hadd_epi32(p[4], p[5]), h3 = _mm256_hadd_epi32(p[6], p[7]);
    const __m256i k0 = _mm256_hadd_epi32(h0, h1), k1 = _mm256_hadd_epi32(h2, h3);
    return _mm256_add_epi32(_mm256_permute2x128_si256(k0, k1, 0x20), _mm256_permute2x128_si256(k0, k1, 0x31));
}

#define DEFINE_B32(F, f, C)                                                                          \
    static void f##_c##C(const uint8_t *w, const act *a, float *y, int64_t ldy) {                   \
        __m256 acc[C];                                                                               \
        for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_ps();                                    \
        const int64_t nb = a->K / 32, ng = nb / 8 * 8;                                               \
        float ow[QMAX_K / 32];                                                                       \
        for (int64_t g = 0; g < ng; g += 8) { /* eight blocks at a time */                           \
            const uint8_t *blk = w + g * F##_BYTES;                                                  \
            for (int p = 0; p < 8 * F##_BYTES; p += 64)                                              \
                _mm_prefetch((const char *)blk + QPF_BYTES + p, QPF_HINT);                        \
            const __m256 dv = halves8(blk, F##_BYTES);                                               \
            _mm256_storeu_ps(ow + g, F##_M >= 0 ? halves8(blk + (F##_M >= 0 ? F##_M : 0), F##_BYTES) \
                                                : _mm256_mul_ps(dv, _mm256_set1_ps(-F##_O)));        \
            __m256i u[8], ua[8];                                                                     \
            for (int j = 0; j < 8; j++) {                                                            \
                u[j] = u_##f(blk + j * F##_BYTES);                                                   \
                ua[j] = F##_SIGNED ? _mm256_abs_epi8(u[j]) : u[j];                                   \
            }                                                                                        \
            for (int c = 0; c < C; c++) {                                                            \
                const int8_t *xq = a->q + c * a->K + 32 * g;                                         \
                __m256i p[8];                                                                        \
                for (int j = 0; j < 8; j++) {                                                        \
                    const __m256i xa = _mm256_loadu_si256((const __m256i *)(xq + 32 * j));           \
                    p[j] = DPBUSD(_mm256_setzero_si256(), ua[j], F##_SIGNED ? _mm256_sign_epi8(xa, u[j]) : xa); \
                }                                                                                    \
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lane_sums8(p)),                          \
                                         _mm256_mul_ps(dv, _mm256_loadu_ps(a->d + c * nb + g)), acc[c]); \
            }                                                                                        \
        }                                                                                            \
        for (int64_t ib = ng; ib < nb; ib++) { /* the rest, a block at a time */                     \
            const uint8_t *blk = w + ib * F##_BYTES;                                                 \
            const float d = f16_to_f32(blk);                                                         \
            ow[ib] = F##_M >= 0 ? f16_to_f32(blk + (F##_M >= 0 ? F##_M : 0)) : -F##_O * d;           \
            const __m256i u = u_##f(blk), ua = F##_SIGNED ? _mm256_abs_epi8(u) : u;                  \
            for (int c = 0; c < C; c++) {                                                            \
                const __m256i xa = _mm256_loadu_si256((const __m256i *)(a->q + c * a->K + 32 * ib)); \
                const __m256i dot = DPBUSD(_mm256_setzero_si256(), ua, F##_SIGNED ? _mm256_sign_epi8(xa, u) : xa); \
                /* lane 0 of acc: the same products as in the groups, one block's sum at a time */  \
                const __m256 s = _mm256_castps128_ps256(_mm_set_ss((float)hsum8i(dot) * (d * a->d[c * nb + ib]))); \
                acc[c] = _mm256_add_ps(acc[c], _mm256_and_ps(s, _mm256_castsi256_ps(_mm256_setr_epi32(-1, 0, 0, 0, 0, 0, 0, 0)))); \
            }                                                                                        \
        }                                                                                            \
        for (int c = 0; c < C; c++) {                                                                \
            float r = hsum8(acc[c]);                                                                 \
            if (F##_O != 0.0f || F##_M >= 0) {                                                       \
                __m256 o = _mm256_setzero_ps();                                                      \
                const float *sa = a->sa + c * nb;                                                    \
                int64_t ib = 0;                                                                      \
                for (; ib + 8 <= nb; ib += 8) o = _mm256_fmadd_ps(_mm256_loadu_ps(ow + ib), _mm256_loadu_ps(sa + ib), o); \
                r += hsum8(o);                                                                       \
                for (; ib < nb; ib++) r += ow[ib] * sa[ib];                                          \
            }                                                                                        \
            y[c * ldy] = r;                                                                          \
        }                                                                                            \
    }
#endif

typedef void (*q8_fn)(const uint8_t *, const act *, float *, int64_t);
#include "quant_rp.h"
#include "quant_rp_amx.h" /* Q4_K on AMX tiles where the build and the kernel allow */
#define Q_ALL_C(X, a, b, c) X(a, b, c, 1) X(a, b, c, 2) X(a, b, c, 3) X(a, b, c, 4) X(a, b, c, 5) X(a, b, c, 6) \
    X(a, b, c, 7) X(a, b, c, 8) X(a, b, c, 9) X(a, b, c, 10) X(a, b, c, 11) X(a, b, c, 12) X(a, b, c, 13)          \
    X(a, b, c, 14) X(a, b, c, 15) X(a, b, c, 16)
#define DK_Q2_K(a, b, c, C) DEFINE_Q2_K(C)
#define DK_Q3_K(a, b, c, C) DEFINE_Q3_K(C)
#define DK_Q4_K(a, b, c, C) DEFINE_Q4_K(C)
#define DK_Q5_K(a, b, c, C) DEFINE_Q5_K(C)
#define DK_Q6_K(a, b, c, C) DEFINE_Q6_K(C)
#define DK_IQ4_XS(a, b, c, C) DEFINE_IQ4_XS(C)
#define DK_IQ3_S(a, b, c, C) DEFINE_IQ3_S(C)
#define DK_B32(F, f, S, C) DEFINE_B32(F, f, C)
#define FN_OF(a, f, c, C) f##_c##C,
Q_ALL_C(DK_Q2_K, 0, 0, 0)
Q_ALL_C(DK_Q3_K, 0, 0, 0)
Q_ALL_C(DK_Q4_K, 0, 0, 0)
Q_ALL_C(DK_Q5_K, 0, 0, 0)
Q_ALL_C(DK_Q6_K, 0, 0, 0)
Q_ALL_C(DK_IQ4_XS, 0, 0, 0)
Q_ALL_C(DK_IQ3_S, 0, 0, 0)
Q_ALL_C(DK_B32, Q8_0, q8_0, 1)
Q_ALL_C(DK_B32, Q4_0, q4_0, 0)
Q_ALL_C(DK_B32, Q5_0, q5_0, 0)
Q_ALL_C(DK_B32, Q4_1, q4_1, 0)
Q_ALL_C(DK_B32, Q5_1, q5_1, 0)
Q_ALL_C(DK_B32, IQ4_NL, iq4_nl, 1)

typedef struct {
    q8_fn fn[QMAX_C + 1];
    int64_t qk, bytes, act_block;
} q8_kernels;
static const q8_kernels K8_Q2_K = {{0, Q_ALL_C(FN_OF, 0, q2_k, 0)}, 256, Q2_K_BYTES, 256};
static const q8_kernels K8_Q3_K = {{0, Q_ALL_C(FN_OF, 0, q3_k, 0)}, 256, Q3_K_BYTES, 256};
static const q8_kernels K8_Q4_K = {{0, Q_ALL_C(FN_OF, 0, q4_k, 0)}, 256, Q4_K_BYTES, 256};
static const q8_kernels K8_Q5_K = {{0, Q_ALL_C(FN_OF, 0, q5_k, 0)}, 256, Q5_K_BYTES, 256};
static const q8_kernels K8_Q6_K = {{0, Q_ALL_C(FN_OF, 0, q6_k, 0)}, 256, Q6_K_BYTES, 256};
static const q8_kernels K8_Q8_0 = {{0, Q_ALL_C(FN_OF, 0, q8_0, 0)}, 32, Q8_0_BYTES, 32};
static const q8_kernels K8_Q4_0 = {{0, Q_ALL_C(FN_OF, 0, q4_0, 0)}, 32, Q4_0_BYTES, 32};
static const q8_kernels K8_Q5_0 = {{0, Q_ALL_C(FN_OF, 0, q5_0, 0)}, 32, Q5_0_BYTES, 32};
static const q8_kernels K8_Q4_1 = {{0, Q_ALL_C(FN_OF, 0, q4_1, 0)}, 32, Q4_1_BYTES, 32};
static const q8_kernels K8_IQ4_NL = {{0, Q_ALL_C(FN_OF, 0, iq4_nl, 0)}, 32, IQ4_NL_BYTES, 32};
static const q8_kernels K8_IQ4_XS = {{0, Q_ALL_C(FN_OF, 0, iq4_xs, 0)}, 256, IQ4_XS_BYTES, 256};
static const q8_kernels K8_IQ3_S = {{0, Q_ALL_C(FN_OF, 0, iq3_s, 0)}, 256, IQ3_S_BYTES, 256};
static const q8_kernels K8_Q5_1 = {{0, Q_ALL_C(FN_OF, 0, q5_1, 0)}, 32, Q5_1_BYTES, 32};

static const q8_kernels *q8_kernels_of(int type) {
    switch (type) {
    case T_Q2_K: return &K8_Q2_K;
    case T_Q3_K: return &K8_Q3_K;
    case T_Q4_K: return &K8_Q4_K;
    case T_Q5_K: return &K8_Q5_K;
    case T_Q6_K: return &K8_Q6_K;
    case T_Q8_0: return &K8_Q8_0;
    case T_Q4_0: return &K8_Q4_0;
    case T_Q5_0: return &K8_Q5_0;
    case T_Q4_1: return &K8_Q4_1;
    case T_Q5_1: return &K8_Q5_1;
    case T_IQ4_NL: return &K8_IQ4_NL;
    case T_IQ4_XS: return &K8_IQ4_XS;
    case T_IQ3_S: return &K8_IQ3_S;
    default: return 0;
    }
}

/* Room for the quantized activations of n rows as `type`'s kernels read them, in a buffer of the
 * calling thread (kept between calls: no allocation per step); filled by quantize_rows. NULL if the
 * memory cannot be had. */
static inline char *up64(char *p) { return (char *)(((uintptr_t)p + 63) & ~(uintptr_t)63); }
static act *act_buffer(int type, int64_t n, int64_t K) {
    static __thread act a;
    static __thread void *buf;
    static __thread size_t cap;
    const int64_t n2 = n + 1; /* the pair copies: room for an odd last row's partner */
    /* each array starts on a cache line (the kernels' 64-byte loads then never straddle two) */
    const size_t need = 6 * 64 + (size_t)(n * K + 64) + sizeof(float) * (size_t)(n * K / 32 * 2 + 16)
                      + sizeof(int16_t) * (size_t)(n * K / 16 + 16) + (size_t)(n2 * K + 64) + sizeof(int16_t) * (size_t)(n2 * K / 16 + 32)
                      + 64 + sizeof(int32_t) * (size_t)(n * K / 16 + 16);
    if (need > cap) {
        void *p = realloc(buf, need);
        if (!p) return 0;
        buf = p;
        cap = need;
    }
    const rp_kernels *rk = rp_kernels_of(type);
    a.K = K;
    a.B = rk ? rk->act_block : q8_kernels_of(type)->act_block;
    a.o_kind = rk ? rk->o_kind : 0;
    a.d = (float *)up64((char *)buf);
    a.sa = (float *)up64((char *)(a.d + n * K / 32 + 8));
    a.s = (int16_t *)up64((char *)(a.sa + n * K / 32 + 8));
    a.sp = (int16_t *)up64((char *)(a.s + n * K / 16 + 16));
    a.q = (int8_t *)up64((char *)(a.sp + n2 * K / 16 + 16));
    a.qp = (int8_t *)up64((char *)(a.q + n * K + 32));
    a.o = (int32_t *)up64((char *)(a.qp + n2 * K + 32));
    return &a;
}

/* rows [c0, c1) of X into a (and, for the K-quants' pair kernels, into its pair copies where `pairs`:
 * a GEMM of one row has no pair to read them) */
static void quantize_rows(const act *a, const float *X, int64_t ldx, int64_t c0, int64_t c1, int pairs) {
    const int64_t K = a->K, B = a->B;
    for (int64_t c = c0; c < c1; c++) {
        quantize_row(X + c * ldx, K, B, a->q + c * K, a->d + c * (K / B), a->s + c * (K / 16), a->sa + c * (K / 32));
        if (a->o_kind) rp_offsets(a->o_kind, a->s + c * (K / 16), K, a->o + c * (K / 16));
        if (Q8_PAIRS && pairs && B == 256) {
            int8_t *qp = a->qp + (c & ~(int64_t)1) * K + 32 * (c & 1);
            int16_t *sp = a->sp + (c & ~(int64_t)1) * (K / 16) + 16 * (c & 1);
            for (int64_t j = 0; j < K / 32; j++) memcpy(qp + 64 * j, a->q + c * K + 32 * j, 32);
            for (int64_t j = 0; j < K / 256; j++) memcpy(sp + 32 * j, a->s + c * (K / 16) + 16 * j, 32);
        }
    }
}

/* a's rows from c0 on, as an act of their own */
static act act_from(const act *a, int64_t c0) {
    act o = *a;
    o.q += c0 * a->K;
    o.d += c0 * (a->K / a->B);
    o.s += c0 * (a->K / 16);
    o.sa += c0 * (a->K / 32);
    o.qp += c0 * a->K; /* c0 even: a pair's start */
    o.sp += c0 * (a->K / 16);
    o.o += c0 * (a->K / 16);
    return o;
}

/* 1 if quant_gemm_q8 takes `type` with rows of K weights. */
int quant_q8_supported(int type, int64_t K) {
    if (rp_kernels_of(type)) return quant_rp_row_bytes(type, K) > 0 && K <= QMAX_K;
    const q8_kernels *ks = q8_kernels_of(type);
    return ks && K > 0 && K % ks->qk == 0 && K <= QMAX_K;
}

/* Tests: the quantized activations of one row: q [K], d [K / B], s [K / 16], sa [K / 32] (B = 32). */
void quant_q8_activations(const float *x, int64_t K, int64_t B, int8_t *q, float *d, int16_t *s, float *sa) {
    quantize_row(x, K, B, q, d, s, sa);
}

/* Y[n, N] (row stride ldy) ~= X[n, K] (row stride ldx) . deq(W)[N, K]^T + b (b may be NULL), any n
 * (a prefill too: each weight row meets the inputs 16 at a time while it is in L1), W: N rows of
 * quant_row_bytes(type, K) bytes. Returns 0, or -1 for what it cannot take (or no memory). */
/* one tile's kernel call, into Y directly or, for a last tile of fewer than 16 valid rows, through a buffer */
static void rp_call(const rp_kernels *rk, int amx, int64_t C, const uint8_t *w, const act *a, float *y, int64_t ldy) {
#if RP_AMX
    if (amx && C >= RP_AMX_MIN_C) {
        rp_q4_k_amx(w, a, y, ldy, (int)C);
        return;
    }
#endif
    (void)amx;
    rk->fn[C](w, a, y, ldy);
}

static void rp_tile(const rp_kernels *rk, int amx, int64_t C, const uint8_t *w, const act *a, float *Y, int64_t ldy,
                    int64_t rows) {
    if (rows >= RP_ROWS) {
        rp_call(rk, amx, C, w, a, Y, ldy);
        return;
    }
    float t[RP_AMX_MAXC * RP_ROWS];
    rp_call(rk, amx, C, w, a, t, RP_ROWS);
    for (int64_t c = 0; c < C; c++) memcpy(Y + c * ldy, t + c * RP_ROWS, sizeof(float) * (size_t)rows);
}

/* quant_gemm_q8 on repacked weights: each thread takes whole tiles; a panel of tiles (about
 * Q8_TILE_BYTES) meets every chunk of RP_MAXC inputs while it is in L2. N need not be a multiple
 * of 16: the last tile's storage is whole (a view of a repacked matrix's first rows). */
static int rp_gemm(int type, const rp_kernels *rk, const uint8_t *W, const float *X, const float *b, float *Y,
                   int64_t N, int64_t K, int64_t n, int64_t ldx, int64_t ldy, int nthreads) {
    const act *a = act_buffer(type, n, K);
    if (!a) return -1;
    const int64_t rb = quant_rp_row_bytes(type, K), tb = RP_ROWS * rb;
    const int amx = rp_amx_takes(rk, n);
    const int64_t maxc = amx ? RP_AMX_MAXC : RP_MAXC; /* AMX takes up to 16 rows a call */
#pragma omp parallel num_threads(nthreads)
    {
        int64_t t, T;
        thread_index(&t, &T);
        quantize_rows(a, X, ldx, n * t / T, n * (t + 1) / T, 0);
        if (amx) rp_amx_begin();
#pragma omp barrier
        int64_t r0, r1;
        thread_rows(N, RP_ROWS, &r0, &r1);
        const int64_t panel = n <= RP_MAXC ? r1 - r0 : (Q8_TILE_BYTES / tb > 1 ? Q8_TILE_BYTES / tb : 1) * RP_ROWS;
        for (int64_t p0 = r0; p0 < r1; p0 += panel) {
            const int64_t p1 = p0 + panel < r1 ? p0 + panel : r1;
            for (int64_t c0 = 0; c0 < n; c0 += maxc) {
                const int64_t C = n - c0 < maxc ? n - c0 : maxc;
                const act part = act_from(a, c0);
                for (int64_t r = p0; r < p1; r += RP_ROWS)
                    rp_tile(rk, amx, C, W + r * rb, &part, Y + c0 * ldy + r, ldy, p1 - r);
            }
        }
        if (b && r0 < r1)
            for (int64_t c = 0; c < n; c++)
                for (int64_t i = r0; i < r1; i++) Y[c * ldy + i] += b[i];
    }
    return 0;
}

int quant_gemm_q8(int type, const uint8_t *W, const float *X, const float *b, float *Y, int64_t N, int64_t K,
                  int64_t n, int64_t ldx, int64_t ldy, int nthreads) {
    const rp_kernels *rk = rp_kernels_of(type);
    if (rk) return quant_q8_supported(type, K) && n >= 1 ? rp_gemm(type, rk, W, X, b, Y, N, K, n, ldx, ldy, nthreads) : -1;
    const q8_kernels *ks = q8_kernels_of(type);
    if (!ks || !quant_q8_supported(type, K) || n < 1) return -1;
    const act *a = act_buffer(type, n, K);
    if (!a) return -1;
    const int64_t rb = K / ks->qk * ks->bytes;
#pragma omp parallel num_threads(nthreads)
    {
        int64_t t, T;
        thread_index(&t, &T);
        quantize_rows(a, X, ldx, n * t / T, n * (t + 1) / T, n > 1);
#pragma omp barrier
        int64_t r0, r1;
        thread_rows(N, 8, &r0, &r1);
        /* a tile of weight rows (about Q8_TILE_BYTES) meets every chunk of 16 inputs while it is in L2,
         * so a long prefill streams neither the weights nor the activations more than once per tile */
        const int64_t tile = n <= QMAX_C ? r1 - r0 : (Q8_TILE_BYTES / rb > 1 ? Q8_TILE_BYTES / rb : 1);
        for (int64_t t0 = r0; t0 < r1; t0 += tile) {
            const int64_t t1 = t0 + tile < r1 ? t0 + tile : r1;
            const int64_t chunk = n <= QMAX_C ? QMAX_C : Q8_CHUNK;
            for (int64_t c0 = 0; c0 < n; c0 += chunk) {
                const int64_t C = n - c0 < chunk ? n - c0 : chunk;
                const act part = act_from(a, c0);
                for (int64_t r = t0; r < t1; r++) ks->fn[C](W + r * rb, &part, Y + c0 * ldy + r, ldy);
            }
        }
        if (b && r0 < r1)
            for (int64_t c = 0; c < n; c++)
                for (int64_t i = r0; i < r1; i++) Y[c * ldy + i] += b[i];
    }
    return 0;
}
