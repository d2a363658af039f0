/* GGUF block formats (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_0, Q5_0, Q4_0, Q4_1, Q5_1, IQ4_NL, IQ4_XS, IQ3_S) dequantized to fp32: the embedding rows a
 * step looks up, a layer whose format the 8-bit GEMM does not take, the fp32 reference at load, and
 * the tests' oracle for quant_q8.c.
 *
 * Exact: every weight is the same fp32 value gguf-py computes (the same operations in the same
 * order: the block scale d (fp16, widened exactly) times the sub-block scale is exact in fp32; then
 * one multiply, or a multiply-add whose product is exact). AVX-512, AVX2 or, on aarch64, NEON (the
 * integers from simd.h's decoders, the same float operations).
 */
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "simd.h"

/* Per format, `prep` decodes a block's scales once (into pre[]), and `g32` gives group s (32 weights)
 * of the block as 32/VL fp32 vectors, in order of K, from the packed bits in registers. */
#define NV (32 / VL)
/* Q3_K: 256 weights, scale d * (sc[i] - 32) per 16 (12 bytes of 6-bit scales); pre: the 16 scales times d
 * (scalar: the same in every build) */
#define Q3_K_QK 256
#define Q3_K_BYTES 110
#define Q3_K_PRE 16
static inline void prep_q3_k(const uint8_t *b, float *pre) {
    const float d = f16_to_f32(b + 108);
    int8_t sc[16];
    q3_k_scales(b, sc);
    for (int i = 0; i < 16; i++) pre[i] = d * (float)sc[i];
}
/* Q2_K: 256 weights, d * sc[i] * q - dmin * m[i] per 16 (a byte each: sc low, m high); pre: the 16 scales
 * times d, then the 16 mins times dmin, negated (d sc q is exact, so d sc q + (-dmin m) rounds as gguf-py's
 * d sc q - dmin m) */
#define Q2_K_QK 256
#define Q2_K_BYTES 84
#define Q2_K_PRE 32
static inline void prep_q2_k(const uint8_t *b, float *pre) {
    const float d = f16_to_f32(b + 80), dmin = f16_to_f32(b + 82);
    for (int i = 0; i < 16; i++) pre[i] = d * (float)(b[i] & 15), pre[16 + i] = -(dmin * (float)(b[i] >> 4));
}
/* IQ4_NL: 32 weights d * IQ4_VALUES[q]; IQ4_XS: 256, d * sc[s] * IQ4_VALUES[q] per 32. pre: d, or the 8 d sc[s] */
#define IQ4_NL_QK 32
#define IQ4_NL_BYTES 18
#define IQ4_NL_PRE 1
static inline void prep_iq4_nl(const uint8_t *b, float *pre) { pre[0] = f16_to_f32(b); }
/* IQ4_XS and IQ3_S: pre the 8 d x f_scale(s), one per 32 weights. IQ3_S: 256, d (1 + 2 sc[s]) per 32 times the
 * codebook's signed magnitudes (exact in fp32, as gguf-py's) */
#define PREP_D_SCALES(f)                                                                             \
    static inline void prep_##f(const uint8_t *b, float *pre) {                                      \
        const float d = f16_to_f32(b);                                                               \
        for (int s = 0; s < 8; s++) pre[s] = d * (float)f##_scale(b, s);                             \
    }
#define IQ4_XS_QK 256
#define IQ4_XS_BYTES 136
#define IQ4_XS_PRE 8
PREP_D_SCALES(iq4_xs)
#define IQ3_S_QK 256
#define IQ3_S_BYTES 110
#define IQ3_S_PRE 8
PREP_D_SCALES(iq3_s)
#if SIMD_NEON
/* NEON (VL 8: a vec is two float32x4): the integers from simd.h's decoders, then the x86 build's float
 * operations (the same products and FMAs, so the same bits). */
static inline vec vf_u8(uint8x8_t b) { /* 8 bytes -> 8 float lanes */
    const uint16x8_t w = vmovl_u8(b);
    return v_pair(vcvtq_f32_u32(vmovl_u16(vget_low_u16(w))), vcvtq_f32_u32(vmovl_high_u16(w)));
}
static inline vec vf_s8(int8x8_t b) {
    const int16x8_t w = vmovl_s8(b);
    return v_pair(vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), vcvtq_f32_s32(vmovl_high_s16(w)));
}
/* the 32 integers of u (minus off, as int8 where off) as NV float vectors */
static inline void pieces(u8x32 u, int off, vec *f) {
    const uint8x16_t o = vdupq_n_u8((uint8_t)off);
    const int8x16_t lo = vreinterpretq_s8_u8(vsubq_u8(u.lo, o)), hi = vreinterpretq_s8_u8(vsubq_u8(u.hi, o));
    if (off) {
        f[0] = vf_s8(vget_low_s8(lo)), f[1] = vf_s8(vget_high_s8(lo)), f[2] = vf_s8(vget_low_s8(hi)), f[3] = vf_s8(vget_high_s8(hi));
    } else {
        f[0] = vf_u8(vget_low_u8(u.lo)), f[1] = vf_u8(vget_high_u8(u.lo)), f[2] = vf_u8(vget_low_u8(u.hi)), f[3] = vf_u8(vget_high_u8(u.hi));
    }
}
static inline void pieces_s8(u8x32 u, vec *f) { /* the bytes as int8 */
    const int8x16_t lo = vreinterpretq_s8_u8(u.lo), hi = vreinterpretq_s8_u8(u.hi);
    f[0] = vf_s8(vget_low_s8(lo)), f[1] = vf_s8(vget_high_s8(lo)), f[2] = vf_s8(vget_low_s8(hi)), f[3] = vf_s8(vget_high_s8(hi));
}
#define Q4_K_QK 256
#define Q4_K_BYTES 144
#define Q4_K_PRE 16
static inline void prep_q4_k(const uint8_t *b, float *pre) { /* d x the scales, -(dmin x the mins) */
    const float d = f16_to_f32(b), dmin = f16_to_f32(b + 2);
    uint32_t u[4];
    q4_k_scale_bytes(b, u);
    const uint8_t *sc = (const uint8_t *)u;
    for (int i = 0; i < 8; i++) pre[i] = d * (float)sc[i], pre[8 + i] = -(dmin * (float)sc[8 + i]);
}
static inline void g32_q4_k(const uint8_t *b, int s, const float *pre, vec *w) {
    vec f[NV];
    pieces(u_q4_k(b, s), 0, f);
    for (int v = 0; v < NV; v++) w[v] = VFMA(VSET1(pre[s]), f[v], VSET1(pre[8 + s]));
}
#define Q5_K_QK 256
#define Q5_K_BYTES 176
#define Q5_K_PRE 16
#define prep_q5_k prep_q4_k /* the same d, dmin and scale bytes */
static inline void g32_q5_k(const uint8_t *b, int s, const float *pre, vec *w) {
    vec f[NV];
    pieces(u_q5_k(b, s), 0, f);
    for (int v = 0; v < NV; v++) w[v] = VFMA(VSET1(pre[s]), f[v], VSET1(pre[8 + s]));
}
#define Q6_K_QK 256
#define Q6_K_BYTES 210
#define Q6_K_PRE 16
static inline void prep_q6_k(const uint8_t *b, float *pre) {
    const float d = f16_to_f32(b + 208);
    for (int i = 0; i < 16; i++) pre[i] = d * (float)(int8_t)b[192 + i];
}
static inline void g32_q6_k(const uint8_t *b, int s, const float *pre, vec *w) {
    vec f[NV];
    pieces(u_q6_k(b, s), 32, f);
    for (int v = 0; v < NV; v++) w[v] = VMUL(VSET1(pre[8 * (s >> 2) + 2 * (s & 3) + v / 2]), f[v]);
}
static inline void g32_q3_k(const uint8_t *b, int s, const float *pre, vec *w) {
    vec f[NV];
    pieces(u_q3_k(b, s), 4, f);
    for (int v = 0; v < NV; v++) w[v] = VMUL(VSET1(pre[2 * s + v / 2]), f[v]);
}
static inline void g32_q2_k(const uint8_t *b, int s, const float *pre, vec *w) {
    vec f[NV];
    pieces(u_q2_k(b, s), 0, f);
    for (int v = 0; v < NV; v++) w[v] = VFMA(VSET1(pre[2 * s + v / 2]), f[v], VSET1(pre[16 + 2 * s + v / 2]));
}
static inline void g32_iq4_nl(const uint8_t *b, int s, const float *pre, vec *w) {
    (void)s;
    vec f[NV];
    pieces_s8(u_iq4_nl(b), f);
    for (int v = 0; v < NV; v++) w[v] = VMUL(VSET1(pre[0]), f[v]);
}
static inline void g32_iq4_xs(const uint8_t *b, int s, const float *pre, vec *w) {
    vec f[NV];
    pieces_s8(u_iq4(b + 8 + 16 * s), f);
    for (int v = 0; v < NV; v++) w[v] = VMUL(VSET1(pre[s]), f[v]);
}
static inline void g32_iq3_s(const uint8_t *b, int s, const float *pre, vec *w) {
    vec f[NV];
    pieces_s8(u_iq3_s(b, s), f);
    for (int v = 0; v < NV; v++) w[v] = VMUL(VSET1(pre[s]), f[v]);
}
#define Q8_0_QK 32
#define Q8_0_BYTES 34
#define Q8_0_PRE 1
static inline void prep_q8_0(const uint8_t *b, float *pre) { pre[0] = f16_to_f32(b); }
static inline void g32_q8_0(const uint8_t *b, int s, const float *pre, vec *w) {
    (void)s;
    vec f[NV];
    pieces_s8(u_q8_0(b), f);
    for (int v = 0; v < NV; v++) w[v] = VMUL(VSET1(pre[0]), f[v]);
}
#define Q5_0_QK 32
#define Q5_0_BYTES 22
#define Q5_0_PRE 1
static inline void prep_q5_0(const uint8_t *b, float *pre) { pre[0] = f16_to_f32(b); }
static inline void g32_q5_0(const uint8_t *b, int s, const float *pre, vec *w) {
    (void)s;
    vec f[NV];
    pieces(u_q5_0(b), 16, f);
    for (int v = 0; v < NV; v++) w[v] = VMUL(VSET1(pre[0]), f[v]);
}
#define Q4_0_QK 32
#define Q4_0_BYTES 18
#define Q4_0_PRE 1
static inline void prep_q4_0(const uint8_t *b, float *pre) { pre[0] = f16_to_f32(b); }
static inline void g32_q4_0(const uint8_t *b, int s, const float *pre, vec *w) {
    (void)s;
    vec f[NV];
    pieces(u_q4_0(b), 8, f);
    for (int v = 0; v < NV; v++) w[v] = VMUL(VSET1(pre[0]), f[v]);
}
#define Q4_1_QK 32
#define Q4_1_BYTES 20
#define Q4_1_PRE 2
static inline void prep_q4_1(const uint8_t *b, float *pre) { pre[0] = f16_to_f32(b); pre[1] = f16_to_f32(b + 2); }
static inline void g32_q4_1(const uint8_t *b, int s, const float *pre, vec *w) {
    (void)s;
    vec f[NV];
    pieces(u_q4_1(b), 0, f);
    for (int v = 0; v < NV; v++) w[v] = VFMA(VSET1(pre[0]), f[v], VSET1(pre[1]));
}
#define Q5_1_QK 32
#define Q5_1_BYTES 24
#define Q5_1_PRE 2
#define prep_q5_1 prep_q4_1 /* d, m */
static inline void g32_q5_1(const uint8_t *b, int s, const float *pre, vec *w) {
    (void)s;
    vec f[NV];
    pieces(u_q5_1(b), 0, f);
    for (int v = 0; v < NV; v++) w[v] = VFMA(VSET1(pre[0]), f[v], VSET1(pre[1]));
}
#else
#if VL == 16
typedef __m512i veci;
#define ZX8(p) _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p)))   /* VL bytes -> int32 lanes */
#define SX8(p) _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p)))
#define IAND(a, m) _mm512_and_si512(a, _mm512_set1_epi32(m))
#define ISRL(a, n) _mm512_srli_epi32(a, n)
#define ISLL(a, n) _mm512_slli_epi32(a, n)
#define IOR(a, b) _mm512_or_si512(a, b)
#define ISUB(a, n) _mm512_sub_epi32(a, _mm512_set1_epi32(n))
#define I2F(a) _mm512_cvtepi32_ps(a)
#define VBCAST(p) _mm512_set1_ps(*(p))
#else
typedef __m256i veci;
#define ZX8(p) _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p)))
#define SX8(p) _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p)))
#define IAND(a, m) _mm256_and_si256(a, _mm256_set1_epi32(m))
#define ISRL(a, n) _mm256_srli_epi32(a, n)
#define ISLL(a, n) _mm256_slli_epi32(a, n)
#define IOR(a, b) _mm256_or_si256(a, b)
#define ISUB(a, n) _mm256_sub_epi32(a, _mm256_set1_epi32(n))
#define I2F(a) _mm256_cvtepi32_ps(a)
#define VBCAST(p) _mm256_set1_ps(*(p))
#endif

/* Q4_K: 256 weights in 8 sub-blocks of 32 (scale d * sc[i], offset dmin * m[i]); sub-block 2j is
 * the low nibbles of qs[32j .. 32j + 32], 2j + 1 their high nibbles. pre: 8 scales, 8 offsets. */
#define Q4_K_QK 256
#define Q4_K_BYTES 144
#define Q4_K_PRE 16
static inline void prep_q4_k(const uint8_t *b, float *pre) {
    const float d = f16_to_f32(b), dmin = f16_to_f32(b + 2);
    uint32_t u[4];
    q4_k_scale_bytes(b, u); /* bytes of u[0..1]: the 8 scales; of u[2..3]: the 8 mins */
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)u)));
    const __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(u + 2))));
    _mm256_storeu_ps(pre, _mm256_mul_ps(_mm256_set1_ps(d), sc));
    /* d*q - dm as d*q + (-dm): the product is exact, so one rounding either way (a true negation) */
    _mm256_storeu_ps(pre + 8, _mm256_xor_ps(_mm256_mul_ps(_mm256_set1_ps(dmin), mn), _mm256_set1_ps(-0.0f)));
}
static inline vec q_to_f(__m128i b, int sgn) { /* the low VL bytes of b -> VL float lanes */
#if VL == 16
    return _mm512_cvtepi32_ps(sgn ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b));
#else
    return _mm256_cvtepi32_ps(sgn ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b));
#endif
}
/* piece v (VL bytes, v < NV) of 32 bytes q, as VL float lanes (bytes signed where sgn) */
static inline vec piece_f(__m256i q, int v, int sgn) {
#if VL == 16
    return q_to_f(v ? _mm256_extracti128_si256(q, 1) : _mm256_castsi256_si128(q), sgn);
#else
    const __m128i h = (v >> 1) ? _mm256_extracti128_si256(q, 1) : _mm256_castsi256_si128(q);
    return q_to_f((v & 1) ? _mm_srli_si128(h, 8) : h, sgn);
#endif
}
static inline void g32_q4_k(const uint8_t *b, int s, const float *pre, vec *w) {
    const __m256i q = q4_k_group(b, s);
    const vec d = VBCAST(pre + s), m = VBCAST(pre + 8 + s);
    for (int v = 0; v < NV; v++) w[v] = VFMA(d, piece_f(q, v, 0), m);
}

/* Q5_K: Q4_K's scales, mins and nibbles (from byte 48), each weight with a fifth bit from qh (byte 16) */
#define Q5_K_QK 256
#define Q5_K_BYTES 176
#define Q5_K_PRE 16
#define prep_q5_k prep_q4_k
static inline void g32_q5_k(const uint8_t *b, int s, const float *pre, vec *w) {
    const __m256i q = q5_k_group(b, s);
    const vec d = VBCAST(pre + s), m = VBCAST(pre + 8 + s);
    for (int v = 0; v < NV; v++) w[v] = VFMA(d, piece_f(q, v, 0), m);
}

/* Q6_K: 256 weights, scale d * sc[i] per 16; 6-bit q = low nibble (ql) | 2 high bits (qh), minus 32.
 * Group s (32 weights): half h = s / 4 (128 weights), quarter t = s % 4 within it. pre: 16 scales. */
#define Q6_K_QK 256
#define Q6_K_BYTES 210
#define Q6_K_PRE 16
static inline void prep_q6_k(const uint8_t *b, float *pre) {
    const float d = f16_to_f32(b + 208);
    const int8_t *sc = (const int8_t *)(b + 192);
    const __m128i s16 = _mm_loadu_si128((const __m128i *)sc);
    _mm256_storeu_ps(pre, _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s16))));
    _mm256_storeu_ps(pre + 8, _mm256_mul_ps(_mm256_set1_ps(d),
                                            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(s16, 8)))));
}
static inline void g32_q6_k(const uint8_t *b, int s, const float *pre, vec *w) {
    const int h = s >> 2, t = s & 3;
    const __m256i q = _mm256_sub_epi8(q6_k_group(b, s), _mm256_set1_epi8(32));
    for (int v = 0; v < NV; v++) w[v] = VMUL(VBCAST(pre + 8 * h + 2 * t + (VL * v) / 16), piece_f(q, v, 1));
}

/* Q3_K: 3-bit q = two bits (qs) | one bit (hmask) above them, minus 4, times pre (prep_q3_k) */
static inline void g32_q3_k(const uint8_t *b, int s, const float *pre, vec *w) {
    const __m256i q = _mm256_sub_epi8(q3_k_group(b, s), _mm256_set1_epi8(4));
    for (int v = 0; v < NV; v++) w[v] = VMUL(VBCAST(pre + 2 * s + (VL * v) / 16), piece_f(q, v, 1));
}
/* Q2_K: q (0..3) times d sc plus -(dmin m), per 16 (prep_q2_k) */
static inline void g32_q2_k(const uint8_t *b, int s, const float *pre, vec *w) {
    const __m256i q = q2_k_group(b, s);
    for (int v = 0; v < NV; v++) {
        const int i = 2 * s + (VL * v) / 16;
        w[v] = VFMA(VBCAST(pre + i), piece_f(q, v, 0), VBCAST(pre + 16 + i));
    }
}
/* IQ4_NL, IQ4_XS: the table's int8 values (iq4_group) times pre (prep_iq4_nl, prep_iq4_xs) */
static inline void g32_iq4_nl(const uint8_t *b, int s, const float *pre, vec *w) {
    (void)s;
    const __m256i q = iq4_group(b + 2);
    for (int v = 0; v < NV; v++) w[v] = VMUL(VBCAST(pre), piece_f(q, v, 1));
}
static inline void g32_iq4_xs(const uint8_t *b, int s, const float *pre, vec *w) {
    const __m256i q = iq4_group(b + 8 + 16 * s);
    for (int v = 0; v < NV; v++) w[v] = VMUL(VBCAST(pre + s), piece_f(q, v, 1));
}
static inline void g32_iq3_s(const uint8_t *b, int s, const float *pre, vec *w) {
    const __m256i q = iq3_s_group(b, s);
    for (int v = 0; v < NV; v++) w[v] = VMUL(VBCAST(pre + s), piece_f(q, v, 1));
}

/* The 32-weight formats keep weights 0..15 in the low nibbles of 16 bytes, 16..31 in the high ones:
 * weights k0 .. k0 + VL as int32 lanes. */
static inline veci nib16(const uint8_t *qs, int k0) {
    const veci q = ZX8(qs + (k0 & 15));
    return k0 >= 16 ? ISRL(q, 4) : IAND(q, 0x0F);
}

/* Q8_0: 32 int8 weights times d. pre: d. */
#define Q8_0_QK 32
#define Q8_0_BYTES 34
#define Q8_0_PRE 1
static inline void prep_q8_0(const uint8_t *b, float *pre) { pre[0] = f16_to_f32(b); }
static inline void g32_q8_0(const uint8_t *b, int s, const float *pre, vec *w) {
    (void)s;
    for (int v = 0; v < NV; v++) w[v] = VMUL(VBCAST(pre), I2F(SX8(b + 2 + VL * v)));
}

/* Q5_0: 32 weights, (nibble | bit l of qh << 4) - 16, times d; weights 0..15 the low nibbles. */
#define Q5_0_QK 32
#define Q5_0_BYTES 22
#define Q5_0_PRE 2
static inline void prep_q5_0(const uint8_t *b, float *pre) {
    uint32_t qh;
    pre[0] = f16_to_f32(b);
    memcpy(&qh, b + 2, 4);
    memcpy(pre + 1, &qh, 4); /* the high bits, carried as raw bits */
}
/* Q5_0's and Q5_1's 5-bit weights k0 .. k0 + VL as int32 lanes: the nibbles at qs, bit k of qh above them */
static inline veci q5_lanes(const uint8_t *qs, uint32_t qh, int k0) {
#if VL == 16
    const veci bits = _mm512_srlv_epi32(_mm512_set1_epi32((int)(qh >> k0)),
                                        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
#else
    const veci bits = _mm256_srlv_epi32(_mm256_set1_epi32((int)(qh >> k0)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
#endif
    return IOR(nib16(qs, k0), ISLL(IAND(bits, 1), 4));
}
static inline void g32_q5_0(const uint8_t *b, int s, const float *pre, vec *w) {
    (void)s;
    uint32_t qh;
    memcpy(&qh, pre + 1, 4);
    for (int v = 0; v < NV; v++) w[v] = VMUL(VBCAST(pre), I2F(ISUB(q5_lanes(b + 6, qh, VL * v), 16)));
}

/* Q4_0: 32 weights, nibble - 8, times d. */
#define Q4_0_QK 32
#define Q4_0_BYTES 18
#define Q4_0_PRE 1
static inline void prep_q4_0(const uint8_t *b, float *pre) { pre[0] = f16_to_f32(b); }
static inline void g32_q4_0(const uint8_t *b, int s, const float *pre, vec *w) {
    (void)s;
    for (int v = 0; v < NV; v++) w[v] = VMUL(VBCAST(pre), I2F(ISUB(nib16(b + 2, VL * v), 8)));
}

/* Q4_1: 32 weights, d * nibble + m. */
#define Q4_1_QK 32
#define Q4_1_BYTES 20
#define Q4_1_PRE 2
static inline void prep_q4_1(const uint8_t *b, float *pre) { pre[0] = f16_to_f32(b); pre[1] = f16_to_f32(b + 2); }
static inline void g32_q4_1(const uint8_t *b, int s, const float *pre, vec *w) {
    (void)s;
    for (int v = 0; v < NV; v++) w[v] = VFMA(VBCAST(pre), I2F(nib16(b + 4, VL * v)), VBCAST(pre + 1));
}

/* Q5_1: 32 weights, d * (nibble | bit l of qh << 4) + m (d, m, qh, qs). */
#define Q5_1_QK 32
#define Q5_1_BYTES 24
#define Q5_1_PRE 3
static inline void prep_q5_1(const uint8_t *b, float *pre) {
    uint32_t qh;
    pre[0] = f16_to_f32(b), pre[1] = f16_to_f32(b + 2);
    memcpy(&qh, b + 4, 4);
    memcpy(pre + 2, &qh, 4); /* the high bits, carried as raw bits */
}
static inline void g32_q5_1(const uint8_t *b, int s, const float *pre, vec *w) {
    (void)s;
    uint32_t qh;
    memcpy(&qh, pre + 2, 4);
    for (int v = 0; v < NV; v++) w[v] = VFMA(VBCAST(pre), I2F(q5_lanes(b + 8, qh, VL * v)), VBCAST(pre + 1));
}
#endif

typedef struct {
    int qk, bytes;
    void (*deq)(const uint8_t *, float *); /* one block -> its qk fp32 weights */
} qkernels;

/* One block -> its QK fp32 weights (prep, then g32 per group). */
#define DEFINE_DEQ(F, f)                                                                             \
    static void f##_deq(const uint8_t *b, float *y) {                                                \
        float pre[F##_PRE];                                                                          \
        prep_##f(b, pre);                                                                            \
        for (int s = 0; s < F##_QK / 32; s++) {                                                      \
            vec w[NV];                                                                               \
            g32_##f(b, s, pre, w);                                                                   \
            for (int v = 0; v < NV; v++) VSTORE(y + 32 * s + VL * v, w[v]);                          \
        }                                                                                            \
    }

#define Q_FORMAT(F, f)                                                                               \
    DEFINE_DEQ(F, f)                                                                                 \
    static const qkernels K_##F = {F##_QK, F##_BYTES, f##_deq};
Q_FORMAT(Q2_K, q2_k)
Q_FORMAT(Q3_K, q3_k)
Q_FORMAT(Q4_K, q4_k)
Q_FORMAT(Q5_K, q5_k)
Q_FORMAT(Q6_K, q6_k)
Q_FORMAT(Q8_0, q8_0)
Q_FORMAT(Q5_0, q5_0)
Q_FORMAT(Q4_0, q4_0)
Q_FORMAT(Q4_1, q4_1)
Q_FORMAT(Q5_1, q5_1)
Q_FORMAT(IQ4_NL, iq4_nl)
Q_FORMAT(IQ4_XS, iq4_xs)
Q_FORMAT(IQ3_S, iq3_s)

static const qkernels *kernels_of(int type) {
    switch (type) {
    case T_Q2_K: return &K_Q2_K;
    case T_Q3_K: return &K_Q3_K;
    case T_Q4_K: return &K_Q4_K;
    case T_Q5_K: return &K_Q5_K;
    case T_Q6_K: return &K_Q6_K;
    case T_Q8_0: return &K_Q8_0;
    case T_Q5_0: return &K_Q5_0;
    case T_Q4_0: return &K_Q4_0;
    case T_Q4_1: return &K_Q4_1;
    case T_Q5_1: return &K_Q5_1;
    case T_IQ4_NL: return &K_IQ4_NL;
    case T_IQ4_XS: return &K_IQ4_XS;
    case T_IQ3_S: return &K_IQ3_S;
    default: return 0;
    }
}

/* Bytes of one row of K weights in GGUF block format `type` (a repacked layout's: quant_rp_row_bytes),
 * or 0 if the type is not supported or K does not fit it. */
int64_t quant_row_bytes(int type, int64_t K) {
    const qkernels *ks = kernels_of(type);
    return ks && K % ks->qk == 0 ? K / ks->qk * ks->bytes : 0;
}

/* Dequantize `rows` rows of K weights into out [rows, K]. */
void quant_dequantize(int type, const uint8_t *W, float *out, int64_t rows, int64_t K) {
    const qkernels *ks = kernels_of(type);
    if (!ks || K % ks->qk) return;
    const int64_t nb = K / ks->qk, rb = nb * ks->bytes;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < nb; i++) ks->deq(W + r * rb + i * ks->bytes, out + r * K + i * ks->qk);
}
