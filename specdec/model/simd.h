/* Vector types and helpers shared by the kernels (fused_ops.c, quant_dequant.c, quant_repack.c, quant_q8.c): AVX-512 where the compiler
 * targets it (-march=native), else AVX2 + FMA; on aarch64, NEON with VL 8 (a vec is two float32x4 halves), so
 * every lane-wise sum and every reduction (vsum) runs in the AVX2 build's order and gives its bits. */
#ifndef SPECDEC_SIMD_H
#define SPECDEC_SIMD_H
#include <stdint.h>
#include <string.h>

#include "iq_grids.h"
#if defined(__aarch64__) && defined(__ARM_NEON)
#define SIMD_NEON 1
#include <arm_neon.h>
/* software prefetch of the line at p into L1 (unmeasured on an ARM host; x86 prefetches into L2) */
#define SD_PREFETCH(p) __builtin_prefetch((const void *)(p), 0, 3)
#else
#define SIMD_NEON 0
#include <immintrin.h>
/* software prefetch of the line at p into L2, not L1: a prefetch far ahead of a stream from DRAM would
 * hold one of L1's few miss buffers for a whole memory latency, and the loads behind it would wait for
 * a free one (into L1 at 8 KB ahead, a decode step ran 1.2x longer; docs/design.md, Decisions) */
#define SD_PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T1)
#endif
/* Q8_0_R16's weight bytes are w ^ RP_Q8_BIAS (quant_repack.c writes them, quant_rp.h's kernels read
 * them): w + 128 on x86 (vpdpbusd's unsigned operand), w itself on NEON (sdot's and smmla's signed one) */
#define RP_Q8_BIAS (SIMD_NEON ? 0 : 0x80)

#if SIMD_NEON
#define VL 8
typedef struct {
    float32x4_t lo, hi; /* lanes 0-3, 4-7 */
} vec;
static inline vec v_pair(float32x4_t lo, float32x4_t hi) {
    vec v = {lo, hi};
    return v;
}
static inline vec v_load(const float *p) { return v_pair(vld1q_f32(p), vld1q_f32(p + 4)); }
static inline void v_store(float *p, vec v) { vst1q_f32(p, v.lo), vst1q_f32(p + 4, v.hi); }
static inline vec v_set1(float x) { return v_pair(vdupq_n_f32(x), vdupq_n_f32(x)); }
/* a * b + c, fused (as _mm256_fmadd_ps) */
static inline vec v_fma(vec a, vec b, vec c) { return v_pair(vfmaq_f32(c.lo, a.lo, b.lo), vfmaq_f32(c.hi, a.hi, b.hi)); }
static inline vec v_mul(vec a, vec b) { return v_pair(vmulq_f32(a.lo, b.lo), vmulq_f32(a.hi, b.hi)); }
static inline vec v_add(vec a, vec b) { return v_pair(vaddq_f32(a.lo, b.lo), vaddq_f32(a.hi, b.hi)); }
#define VZERO() v_set1(0.0f)
#define VLOAD(p) v_load(p)
#define VFMA(a, b, c) v_fma(a, b, c)
/* the AVX2 build's order: halves, then lanes (0 + 2, 1 + 3), then those two */
static inline float vsum4(float32x4_t lo, float32x4_t hi) {
    const float32x4_t s4 = vaddq_f32(lo, hi);
    const float32x2_t s2 = vadd_f32(vget_low_f32(s4), vget_high_f32(s4));
    return vget_lane_f32(s2, 0) + vget_lane_f32(s2, 1);
}
static inline float vsum(vec v) { return vsum4(v.lo, v.hi); }
#elif defined(__AVX512F__)
#define VL 16
typedef __m512 vec;
#define VZERO() _mm512_setzero_ps()
#define VLOAD(p) _mm512_loadu_ps(p)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
static inline float vsum(vec v) {
    /* fixed order: halves, then quarters, ... (same for every call) */
    __m256 lo = _mm512_castps512_ps256(v);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    __m256 s8 = _mm256_add_ps(lo, hi);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    return _mm_cvtss_f32(s1);
}
#elif defined(__AVX2__) && defined(__FMA__)
#define VL 8
typedef __m256 vec;
#define VZERO() _mm256_setzero_ps()
#define VLOAD(p) _mm256_loadu_ps(p)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
static inline float vsum(vec v) {
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    return _mm_cvtss_f32(s1);
}
#else
#error "specdec's CPU kernels need AVX2+FMA, AVX-512 or aarch64 NEON"
#endif

#if SIMD_NEON
#define VSET1(x) v_set1(x)
#define VSTORE(p, v) v_store(p, v)
#define VMUL(a, b) v_mul(a, b)
#define VADD(a, b) v_add(a, b)
#elif VL == 16
#define VSET1(x) _mm512_set1_ps(x)
#define VSTORE(p, v) _mm512_storeu_ps(p, v)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VADD(a, b) _mm512_add_ps(a, b)
#else
#define VSET1(x) _mm256_set1_ps(x)
#define VSTORE(p, v) _mm256_storeu_ps(p, v)
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VADD(a, b) _mm256_add_ps(a, b)
#endif

/* lane-wise max and min, and a vector's largest and smallest lane (exact in any order: finite inputs) */
#if SIMD_NEON
static inline vec v_max(vec a, vec b) { return v_pair(vmaxq_f32(a.lo, b.lo), vmaxq_f32(a.hi, b.hi)); }
static inline vec v_min(vec a, vec b) { return v_pair(vminq_f32(a.lo, b.lo), vminq_f32(a.hi, b.hi)); }
#define VMAX(a, b) v_max(a, b)
#define VMIN(a, b) v_min(a, b)
static inline float vhmax(vec v) { return vmaxvq_f32(vmaxq_f32(v.lo, v.hi)); }
static inline float vhmin(vec v) { return vminvq_f32(vminq_f32(v.lo, v.hi)); }
#elif VL == 16
#define VMAX(a, b) _mm512_max_ps(a, b)
#define VMIN(a, b) _mm512_min_ps(a, b)
static inline float vhmax(vec v) { return _mm512_reduce_max_ps(v); }
static inline float vhmin(vec v) { return _mm512_reduce_min_ps(v); }
#else
#define VMAX(a, b) _mm256_max_ps(a, b)
#define VMIN(a, b) _mm256_min_ps(a, b)
static inline float vhmax(vec v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}
static inline float vhmin(vec v) {
    __m128 m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_min_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_min_ss(m, _mm_shuffle_ps(m, m, 1)));
}
#endif

/* Inside an OpenMP parallel region: this thread's index *t of *T (0 of 1 without OpenMP). */
static inline void thread_index(int64_t *t, int64_t *T) {
#ifdef _OPENMP
    extern int omp_get_thread_num(void);
    extern int omp_get_num_threads(void);
    *t = omp_get_thread_num();
    *T = omp_get_num_threads();
#else
    *t = 0;
    *T = 1;
#endif
}

/* Inside an OpenMP parallel region: this thread's contiguous range [*r0, *r1) of N rows, in whole
 * panels of `panel` rows (each thread streams its own region of a weight). */
static inline void thread_rows(int64_t N, int64_t panel, int64_t *r0, int64_t *r1) {
    int64_t t, T;
    thread_index(&t, &T);
    const int64_t per = ((N + T - 1) / T + panel - 1) / panel * panel;
    *r0 = t * per;
    *r1 = *r0 + per < N ? *r0 + per : N;
}

/* 127 / amax, the activations' quantizing factor; 0 where that is not finite (amax 0, or below
 * 127 / FLT_MAX): such a block reads as zeros in every build */
static inline float q8_inverse(float amax) {
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    return inv <= 3.4028234663852886e38f ? inv : 0.0f;
}

/* an IEEE half (2 bytes, little-endian) -> float, exactly */
static inline float f16_to_f32(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#if defined(__F16C__)
    return _cvtsh_ss(h);
#elif SIMD_NEON
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000 | (man << 13);
    } else if (exp) {
        u = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man) { /* subnormal: normalize */
        int e = -1;
        do { e++; man <<= 1; } while (!(man & 0x400));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    } else {
        u = sign;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

/* Q4_K's 12 bytes of 6-bit scales and mins (at b + 4) -> u: bytes 0..7 the 8 scales, 8..15 the 8 mins */
static inline void q4_k_scale_bytes(const uint8_t *b, uint32_t u[4]) {
    memcpy(u, b + 4, 12);
    const uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
    u[3] = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
    const uint32_t mins03 = u[1] & k1;
    u[1] = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
    u[2] = mins03;
    u[0] &= k1;
}

/* a float -> IEEE half (round to nearest even, as F16C's _cvtss_sh(x, 0) and NEON's fcvt) */
static inline uint16_t f32_to_f16(float x) {
#if defined(__F16C__)
    return _cvtss_sh(x, 0);
#elif SIMD_NEON
    return vget_lane_u16(vreinterpret_u16_f16(vcvt_f16_f32(vdupq_n_f32(x))), 0);
#else
    uint32_t u;
    memcpy(&u, &x, 4);
    const uint32_t sign = (u >> 16) & 0x8000, a = u & 0x7fffffff;
    if (a >= 0x7f800000) return (uint16_t)(sign | 0x7c00 | (a > 0x7f800000 ? 0x200 : 0)); /* inf, nan */
    if (a >= 0x477ff000) return (uint16_t)(sign | 0x7c00); /* rounds past the largest half */
    if (a < 0x38800000) { /* a half subnormal (or zero): units of 2^-24, rounded to even */
        float f;
        memcpy(&f, &a, 4);
        const float t = f * 16777216.0f; /* exact: a power of two */
        uint32_t q = (uint32_t)t;
        const float r = t - (float)q;
        q += r > 0.5f || (r == 0.5f && (q & 1));
        return (uint16_t)(sign | q);
    }
    const uint32_t m = a + 0xfff + ((a >> 13) & 1); /* round the 13 dropped bits to even */
    return (uint16_t)(sign | ((m - 0x38000000) >> 13));
#endif
}

/* The block formats' integers, decoded in one place per format for the repacking (scalar) and, on
 * NEON, for the dequantizer and the raw-block kernels (registers). */

/* Q4_K (144 bytes): weight 32s + k is the low (s even) or high (s odd) nibble of byte 16 + 32 (s / 2) + k */
static inline void q4_k_values(const uint8_t *b, uint8_t q[256]) {
    for (int s = 0; s < 8; s++)
        for (int k = 0; k < 32; k++) q[32 * s + k] = (uint8_t)((s & 1) ? b[16 + 32 * (s >> 1) + k] >> 4 : b[16 + 32 * (s >> 1) + k] & 15);
}
/* Q6_K (210 bytes): value 32s + k (0..63, before the -32): half h = s / 4, quarter t = s % 4; the low
 * nibble (t < 2) or high nibble of ql[64 h + 32 (t % 2) + k], bits 2t, 2t + 1 of qh[32 h + k] above it */
static inline void q6_k_values(const uint8_t *b, uint8_t q[256]) {
    for (int s = 0; s < 8; s++) {
        const int h = s >> 2, t = s & 3;
        for (int k = 0; k < 32; k++) {
            const uint8_t l = b[64 * h + 32 * (t & 1) + k];
            q[32 * s + k] = (uint8_t)(((t >> 1) ? l >> 4 : l & 15) | ((b[128 + 32 * h + k] >> (2 * t)) & 3) << 4);
        }
    }
}

/* IQ4_NL and IQ4_XS: a weight's 4-bit index into this table of int8 values (ggml's kvalues_iq4nl) */
static const int8_t IQ4_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
/* IQ4_XS (136 bytes: d, scales_h u16, scales_l [4], qs [128]): sub-block s's scale, less 32 (-32..31):
 * its low four bits from nibble s % 2 of scales_l[s / 2], its top two from bits 2s, 2s + 1 of scales_h */
static inline int iq4_xs_scale(const uint8_t *b, int s) {
    const int h = b[2] | b[3] << 8;
    return (((b[4 + s / 2] >> (4 * (s & 1))) & 15) | ((h >> (2 * s)) & 3) << 4) - 32;
}
/* IQ3_S (110 bytes: d, qs [64], qh [8], signs [32], scales [4]): sub-block s's (32 weights) scale 1 + 2 sc (1..31),
 * sc the nibble s % 2 of scales[s / 2]; its weight 4j + e (j 0..7) is byte e of IQ3_S_GRID[qs[8s + j] | bit j of
 * qh[s] << 8], negated where bit (4j + e) % 8 of signs[4s + (4j + e) / 8] is set, times d (1 + 2 sc) */
static inline int iq3_s_scale(const uint8_t *b, int s) { return 1 + 2 * ((b[106 + s / 2] >> (4 * (s & 1))) & 15); }
static inline void iq3_s_magnitudes(const uint8_t *b, int s, uint32_t m[8]) {
    for (int j = 0; j < 8; j++) m[j] = IQ3_S_GRID[b[2 + 8 * s + j] | ((b[66 + s] >> j) & 1) << 8];
}
/* Q3_K (110 bytes: hmask [32], qs [64], 12 bytes of 6-bit scales, d): the 16 scales (each 16 weights'),
 * less 32, as int8 */
static inline void q3_k_scales(const uint8_t *b, int8_t sc[16]) {
    uint32_t a[4];
    memcpy(a, b + 96, 12);
    const uint32_t k1 = 0x03030303, k2 = 0x0f0f0f0f, t = a[2];
    a[2] = ((a[0] >> 4) & k2) | (((t >> 4) & k1) << 4);
    a[3] = ((a[1] >> 4) & k2) | (((t >> 6) & k1) << 4);
    a[0] = (a[0] & k2) | ((t & k1) << 4);
    a[1] = (a[1] & k2) | (((t >> 2) & k1) << 4);
    const uint8_t *u = (const uint8_t *)a;
    for (int i = 0; i < 16; i++) sc[i] = (int8_t)(u[i] - 32);
}
/* Q3_K: weight 32s + k (before the -4) is bits 2 (s % 4), 2 (s % 4) + 1 of qs[32 (s / 4) + k] (byte 32 + ...),
 * with bit s of hmask[k] above them as bit 2; the weight is d sc[2s + k / 16] (q - 4) */
static inline void q3_k_values(const uint8_t *b, uint8_t q[256]) {
    for (int s = 0; s < 8; s++)
        for (int k = 0; k < 32; k++)
            q[32 * s + k] = (uint8_t)(((b[32 + 32 * (s >> 2) + k] >> (2 * (s & 3))) & 3) | ((b[k] >> s) & 1) << 2);
}
/* Q2_K (84 bytes: scales [16], qs [64], d, dmin): the scale byte of 16 weights i holds their scale (low nibble)
 * and min (high nibble); weight 32s + k is bits 2 (s % 4), 2 (s % 4) + 1 of qs[32 (s / 4) + k] (byte 16 + ...),
 * and the weight is d sc[2s + k / 16] q - dmin m[2s + k / 16] */
static inline void q2_k_values(const uint8_t *b, uint8_t q[256]) {
    for (int s = 0; s < 8; s++)
        for (int k = 0; k < 32; k++) q[32 * s + k] = (uint8_t)((b[16 + 32 * (s >> 2) + k] >> (2 * (s & 3))) & 3);
}
/* Q5_K (176 bytes: d, dmin, 12 bytes of scales and mins as Q4_K's, qh [32], qs [128]): weight 32s + k is the
 * low (s even) or high (s odd) nibble of qs[32 (s / 2) + k] (byte 48 + ...), with bit s of qh[k] (byte 16 + k)
 * above it as bit 4 */
static inline void q5_k_values(const uint8_t *b, uint8_t q[256]) {
    for (int s = 0; s < 8; s++)
        for (int k = 0; k < 32; k++) {
            const uint8_t l = b[48 + 32 * (s >> 1) + k];
            q[32 * s + k] = (uint8_t)(((s & 1) ? l >> 4 : l & 15) | ((b[16 + k] >> s) & 1) << 4);
        }
}
#if SIMD_NEON
typedef struct {
    uint8x16_t lo, hi; /* weights 0..15, 16..31 of a group of 32 */
} u8x32;
static inline u8x32 u8x32_of(uint8x16_t lo, uint8x16_t hi) {
    u8x32 v = {lo, hi};
    return v;
}
/* the 32-weight formats: weights 0..15 in the low nibbles of 16 bytes, 16..31 in the high ones */
static inline u8x32 nib32_n(const uint8_t *qs) {
    const uint8x16_t raw = vld1q_u8(qs);
    return u8x32_of(vandq_u8(raw, vdupq_n_u8(15)), vshrq_n_u8(raw, 4));
}
static inline u8x32 u_q8_0(const uint8_t *b) { return u8x32_of(vld1q_u8(b + 2), vld1q_u8(b + 18)); } /* int8 bits */
static inline u8x32 u_q4_0(const uint8_t *b) { return nib32_n(b + 2); }
static inline u8x32 u_q4_1(const uint8_t *b) { return nib32_n(b + 4); }
/* Q5_0 and Q5_1: bit i of the 32 at qh is bit 4 of weight i. The 4 bytes in every lane, byte i / 8 of them
 * taken to lane i (tbl), bit i % 8 tested, and 0x10 of the test's 0xFF / 0 put in (bsl) */
static inline u8x32 u_q5(const uint8_t *qh, const uint8_t *qs) {
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    static const uint8_t at[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                   2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
    uint32_t h;
    memcpy(&h, qh, 4);
    const uint8x16_t hv = vreinterpretq_u8_u32(vdupq_n_u32(h)), sel = vld1q_u8(bit), b4 = vdupq_n_u8(0x10);
    const u8x32 u = nib32_n(qs);
    return u8x32_of(vbslq_u8(b4, vtstq_u8(vqtbl1q_u8(hv, vld1q_u8(at)), sel), u.lo),
                    vbslq_u8(b4, vtstq_u8(vqtbl1q_u8(hv, vld1q_u8(at + 16)), sel), u.hi));
}
static inline u8x32 u_q5_0(const uint8_t *b) { return u_q5(b + 2, b + 6); }
static inline u8x32 u_q5_1(const uint8_t *b) { return u_q5(b + 4, b + 8); } /* d, m, qh, qs */
/* IQ4_NL and IQ4_XS: the 32 weights of 16 index bytes at qs (0..15 the low nibbles, 16..31 the high) as
 * their int8 values */
static inline u8x32 u_iq4(const uint8_t *qs) {
    const u8x32 n = nib32_n(qs);
    const uint8x16_t t = vreinterpretq_u8_s8(vld1q_s8(IQ4_VALUES));
    return u8x32_of(vqtbl1q_u8(t, n.lo), vqtbl1q_u8(t, n.hi));
}
static inline u8x32 u_iq4_nl(const uint8_t *b) { return u_iq4(b + 2); } /* d, qs */
/* IQ3_S sub-block s as int8 bits: the codebook's magnitudes, negated where the sign bit is set (bit i % 8 of the
 * sign byte i / 8, each taken to lane i and tested, as u_q5 takes qh's bits) */
static inline u8x32 u_iq3_s(const uint8_t *b, int s) {
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    static const uint8_t at[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                   2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
    uint32_t m[8], sg;
    iq3_s_magnitudes(b, s, m);
    memcpy(&sg, b + 74 + 4 * s, 4);
    const uint8x16_t sv = vreinterpretq_u8_u32(vdupq_n_u32(sg)), sel = vld1q_u8(bit);
    const uint8x16_t n0 = vtstq_u8(vqtbl1q_u8(sv, vld1q_u8(at)), sel), n1 = vtstq_u8(vqtbl1q_u8(sv, vld1q_u8(at + 16)), sel);
    const uint8x16_t v0 = vreinterpretq_u8_u32(vld1q_u32(m)), v1 = vreinterpretq_u8_u32(vld1q_u32(m + 4));
    return u8x32_of(vsubq_u8(veorq_u8(v0, n0), n0), vsubq_u8(veorq_u8(v1, n1), n1)); /* (v ^ n) - n: -v where n = 0xFF */
}
/* Q4_K sub-block s, as q4_k_values */
static inline u8x32 u_q4_k(const uint8_t *b, int s) {
    const uint8_t *p = b + 16 + 32 * (s >> 1);
    const uint8x16_t lo = vld1q_u8(p), hi = vld1q_u8(p + 16), m = vdupq_n_u8(15);
    return (s & 1) ? u8x32_of(vshrq_n_u8(lo, 4), vshrq_n_u8(hi, 4)) : u8x32_of(vandq_u8(lo, m), vandq_u8(hi, m));
}
/* Q5_K sub-block s, as q5_k_values: qh's bit s moved to bit 4 (mask first: a left shift by 4 - s, or right
 * by s - 4, of a lone bit s stays in its byte) */
static inline u8x32 u_q5_k(const uint8_t *b, int s) {
    const uint8_t *p = b + 48 + 32 * (s >> 1);
    const uint8x16_t lo = vld1q_u8(p), hi = vld1q_u8(p + 16), m = vdupq_n_u8(15);
    const uint8x16_t bit = vdupq_n_u8((uint8_t)(1 << s));
    const int8x16_t sh = vdupq_n_s8((int8_t)(4 - s));
    const uint8x16_t h0 = vshlq_u8(vandq_u8(vld1q_u8(b + 16), bit), sh), h1 = vshlq_u8(vandq_u8(vld1q_u8(b + 32), bit), sh);
    return (s & 1) ? u8x32_of(vorrq_u8(vshrq_n_u8(lo, 4), h0), vorrq_u8(vshrq_n_u8(hi, 4), h1))
                   : u8x32_of(vorrq_u8(vandq_u8(lo, m), h0), vorrq_u8(vandq_u8(hi, m), h1));
}
/* Q3_K sub-block s, as q3_k_values: the two bits shifted down, hmask's bit s masked and moved to bit 2 */
static inline u8x32 u_q3_k(const uint8_t *b, int s) {
    const uint8_t *p = b + 32 + 32 * (s >> 2);
    const int8_t down = (int8_t)(-2 * (s & 3));
    const uint8x16_t m3 = vdupq_n_u8(3), bit = vdupq_n_u8((uint8_t)(1 << s));
    const int8x16_t sh = vdupq_n_s8((int8_t)(2 - s));
    const uint8x16_t lo = vandq_u8(vshlq_u8(vld1q_u8(p), vdupq_n_s8(down)), m3);
    const uint8x16_t hi = vandq_u8(vshlq_u8(vld1q_u8(p + 16), vdupq_n_s8(down)), m3);
    return u8x32_of(vorrq_u8(lo, vshlq_u8(vandq_u8(vld1q_u8(b), bit), sh)),
                    vorrq_u8(hi, vshlq_u8(vandq_u8(vld1q_u8(b + 16), bit), sh)));
}
/* Q2_K sub-block s, as q2_k_values */
static inline u8x32 u_q2_k(const uint8_t *b, int s) {
    const uint8_t *p = b + 16 + 32 * (s >> 2);
    const int8x16_t down = vdupq_n_s8((int8_t)(-2 * (s & 3)));
    const uint8x16_t m3 = vdupq_n_u8(3);
    return u8x32_of(vandq_u8(vshlq_u8(vld1q_u8(p), down), m3), vandq_u8(vshlq_u8(vld1q_u8(p + 16), down), m3));
}
/* Q6_K group s (0..63), as q6_k_values */
static inline uint8x16_t q6_k_half16(uint8x16_t l, uint8x16_t qh, int t) {
    const uint8x16_t lo = (t >> 1) ? vshrq_n_u8(l, 4) : vandq_u8(l, vdupq_n_u8(15));
    const int8x16_t sh = vdupq_n_s8((int8_t)(4 - 2 * t)); /* ((qh >> 2t) & 3) << 4 = (qh & (3 << 2t)) shifted by 4 - 2t */
    return vorrq_u8(lo, vshlq_u8(vandq_u8(qh, vdupq_n_u8((uint8_t)(3 << (2 * t)))), sh));
}
static inline u8x32 u_q6_k(const uint8_t *b, int s) {
    const int h = s >> 2, t = s & 3;
    const uint8_t *l = b + 64 * h + 32 * (t & 1), *qh = b + 128 + 32 * h;
    return u8x32_of(q6_k_half16(vld1q_u8(l), vld1q_u8(qh), t), q6_k_half16(vld1q_u8(l + 16), vld1q_u8(qh + 16), t));
}
#endif

#if defined(__AVX2__)
/* Q4_K sub-block s (weights 32 s .. 32 s + 31, 0..15) as 32 bytes, as q4_k_values */
static inline __m256i q4_k_group(const uint8_t *b, int s) {
    const __m256i raw = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * (s >> 1)));
    return _mm256_and_si256((s & 1) ? _mm256_srli_epi16(raw, 4) : raw, _mm256_set1_epi8(0x0F));
}
/* IQ4_NL and IQ4_XS: the 32 weights of 16 index bytes at qs (0..15 the low nibbles, 16..31 the high) as
 * their int8 values (a table lookup in each 128-bit lane) */
static inline __m256i iq4_group(const uint8_t *qs) {
    const __m128i x = _mm_loadu_si128((const __m128i *)qs);
    const __m256i n = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(x, 4), x), _mm256_set1_epi8(0x0F));
    return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)IQ4_VALUES)), n);
}
/* IQ3_S sub-block s as 32 int8 bytes (as u_iq3_s): the codebook's magnitudes, negated where the sign bit is set
 * (the four sign bytes spread to their eight lanes each, bit i % 8 tested) */
static inline __m256i iq3_s_group(const uint8_t *b, int s) {
    /* the eight 9-bit indices (qs's bytes, qh's bit j above index j's) gathered from the codebook in one go */
    const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + 2 + 8 * s)));
    const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(b[66 + s]), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
                                        _mm256_set1_epi32(1));
    const __m256i v = _mm256_i32gather_epi32((const int *)IQ3_S_GRID, _mm256_or_si256(lo, _mm256_slli_epi32(hi, 8)), 4);
    uint32_t sg;
    memcpy(&sg, b + 74 + 4 * s, 4);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)sg),
        _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
    const __m256i sel = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i n = _mm256_cmpeq_epi8(_mm256_and_si256(spread, sel), sel);
    return _mm256_sub_epi8(_mm256_xor_si256(v, n), n);
}
/* Q3_K sub-block s (0..7) as 32 bytes, as q3_k_values: the pair of bits shifted down and masked (a 16-bit
 * shift by at most 6 keeps bits 0-1 of each byte its own), hmask's bit s masked first, then moved to bit 2 */
static inline __m256i q3_k_group(const uint8_t *b, int s) {
    const __m256i raw = _mm256_loadu_si256((const __m256i *)(b + 32 + 32 * (s >> 2)));
    const int t = s & 3;
    const __m256i lo = _mm256_and_si256(t == 0 ? raw : t == 1 ? _mm256_srli_epi16(raw, 2) : t == 2 ? _mm256_srli_epi16(raw, 4)
                                        : _mm256_srli_epi16(raw, 6), _mm256_set1_epi8(3));
    const __m256i hm = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)b), _mm256_set1_epi8((char)(1 << s)));
    const __m256i hi = s == 0 ? _mm256_slli_epi16(hm, 2) : s == 1 ? _mm256_slli_epi16(hm, 1) : s == 2 ? hm
                     : s == 3 ? _mm256_srli_epi16(hm, 1) : s == 4 ? _mm256_srli_epi16(hm, 2)
                     : s == 5 ? _mm256_srli_epi16(hm, 3) : s == 6 ? _mm256_srli_epi16(hm, 4) : _mm256_srli_epi16(hm, 5);
    return _mm256_or_si256(lo, hi);
}
/* Q2_K sub-block s (0..7) as 32 bytes, as q2_k_values (a 16-bit shift by at most 6, then the mask) */
static inline __m256i q2_k_group(const uint8_t *b, int s) {
    const __m256i raw = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * (s >> 2)));
    const int t = s & 3;
    return _mm256_and_si256(t == 0 ? raw : t == 1 ? _mm256_srli_epi16(raw, 2) : t == 2 ? _mm256_srli_epi16(raw, 4)
                            : _mm256_srli_epi16(raw, 6), _mm256_set1_epi8(3));
}
/* Q5_K sub-block s (0..7) as 32 bytes, as q5_k_values: Q4_K's nibbles (at byte 48) with qh's bit s as bit 4,
 * masked before the 16-bit shifts so no bit crosses a byte */
static inline __m256i q5_k_group(const uint8_t *b, int s) {
    const __m256i raw = _mm256_loadu_si256((const __m256i *)(b + 48 + 32 * (s >> 1)));
    const __m256i lo = _mm256_and_si256((s & 1) ? _mm256_srli_epi16(raw, 4) : raw, _mm256_set1_epi8(0x0F));
    const __m256i hm = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(b + 16)), _mm256_set1_epi8((char)(1 << s)));
    const __m256i hi = s == 0 ? _mm256_slli_epi16(hm, 4) : s == 1 ? _mm256_slli_epi16(hm, 3)
                     : s == 2 ? _mm256_slli_epi16(hm, 2) : s == 3 ? _mm256_slli_epi16(hm, 1)
                     : s == 4 ? hm : s == 5 ? _mm256_srli_epi16(hm, 1)
                     : s == 6 ? _mm256_srli_epi16(hm, 2) : _mm256_srli_epi16(hm, 3);
    return _mm256_or_si256(lo, hi);
}
/* Q6_K (210-byte blocks of 256): the 6-bit values q (0..63, before the -32) of group s (weights
 * 32 s .. 32 s + 31) as 32 bytes: half h = s / 4, quarter t = s % 4 within it; low nibbles from ql,
 * two high bits from qh */
static inline __m256i q6_k_group(const uint8_t *b, int s) {
    const int h = s >> 2, t = s & 3;
    const __m256i ql = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32 * (t & 1)));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
    const __m256i lo = _mm256_and_si256((t >> 1) ? _mm256_srli_epi16(ql, 4) : ql, _mm256_set1_epi8(0x0F));
    /* ((qh >> 2t) & 3) << 4, bytewise: mask first, so the 16-bit shifts move no bit across bytes */
    const __m256i hm = _mm256_and_si256(qh, _mm256_set1_epi8((char)(3 << (2 * t))));
    const __m256i hi = t == 0 ? _mm256_slli_epi16(hm, 4) : t == 1 ? _mm256_slli_epi16(hm, 2)
                     : t == 2 ? hm : _mm256_srli_epi16(hm, 2);
    return _mm256_or_si256(lo, hi);
}
#endif

#endif
