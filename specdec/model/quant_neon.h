/* The NEON (aarch64) build of quant_q8.c's x86 pieces: quantize_row and the raw-block kernels, the
 * templates DEFINE_B32 (Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, IQ4_NL) and DEFINE_Q2_K, DEFINE_Q3_K, DEFINE_Q4_K, DEFINE_Q5_K, DEFINE_Q6_K,
 * DEFINE_IQ4_XS, DEFINE_IQ3_S. Included by quant_q8.c
 * only, after its act type, the format constants and QPF_BYTES.
 *
 * Bits: the integer sums are exact (sdot, or its floor without dotprod), and every float operation is
 * the AVX2 build's (non-pairs) in the same order: an 8-lane float vector is two float32x4 halves,
 * FMAs stay FMAs (vfmaq_f32), products stay products, and the reductions run in hsum8's order. So a
 * row gets the x86-64-v3 build's bits on any aarch64 CPU (tests/test_arm.py). */
#ifndef SPECDEC_QUANT_NEON_H
#define SPECDEC_QUANT_NEON_H

#include <arm_neon.h>

#define Q4_K_BYTES 144
#define Q5_K_BYTES 176
#define Q6_K_BYTES 210
#define Q3_K_BYTES 110
#define Q2_K_BYTES 84
#define IQ4_XS_BYTES 136
#define IQ3_S_BYTES 110

/* acc + per 32-bit lane i the sum of the 4 products of bytes 4i..4i+3 of a and b (int8 x int8):
 * sdot where the CPU has it, else widening products whose pairs fit int16 here (|a| <= 128, |b| <= 127) */
static inline int32x4_t dot4(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, a, b);
#else
    return vpadalq_s16(acc, vpaddq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)), vmull_high_s8(a, b)));
#endif
}
static inline int32x4_t dot4u(int32x4_t acc, uint8x16_t u, const int8_t *x) { /* u <= 127 (or int8 bits) */
    return dot4(acc, vreinterpretq_s8_u8(u), vld1q_s8(x));
}

/* One row of K floats in blocks of B (32 or 256): d = max|x| / 127, q = round-to-nearest-even(x * 127 / max|x|);
 * s: the 16-sums of q, sa (B = 32): d x the block's q sum. The x86 bits, the tiniest blocks included
 * (q8_inverse). */
static void quantize_row(const float *x, int64_t K, int64_t B, int8_t *q, float *d, int16_t *s, float *sa) {
    for (int64_t b0 = 0; b0 < K; b0 += B) {
        float32x4_t m = vdupq_n_f32(0.0f);
        for (int64_t i = 0; i < B; i += 4) m = vmaxq_f32(m, vabsq_f32(vld1q_f32(x + b0 + i)));
        const float amax = vmaxvq_f32(m);
        const float db = amax / 127.0f;
        d[b0 / B] = db;
        const float32x4_t id = vdupq_n_f32(q8_inverse(amax));
        for (int64_t i = 0; i < B; i += 32) {
            int32x4_t v[8];
            for (int j = 0; j < 8; j++) v[j] = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(x + b0 + i + 4 * j), id));
            const int s0 = vaddvq_s32(vaddq_s32(vaddq_s32(v[0], v[1]), vaddq_s32(v[2], v[3])));
            const int s1 = vaddvq_s32(vaddq_s32(vaddq_s32(v[4], v[5]), vaddq_s32(v[6], v[7])));
            s[(b0 + i) / 16] = (int16_t)s0;
            s[(b0 + i) / 16 + 1] = (int16_t)s1;
            if (B == 32) sa[b0 / 32] = db * (float)(s0 + s1);
            for (int h = 0; h < 2; h++) { /* saturating narrowing, as the x86 packs */
                const int16x8_t lo = vcombine_s16(vqmovn_s32(v[4 * h]), vqmovn_s32(v[4 * h + 1]));
                const int16x8_t hi = vcombine_s16(vqmovn_s32(v[4 * h + 2]), vqmovn_s32(v[4 * h + 3]));
                vst1q_s8(q + b0 + i + 16 * h, vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi)));
            }
        }
    }
}

/* the fp16 at p, p + stride, p + 2 stride, p + 3 stride, as floats */
static inline float32x4_t halves4(const uint8_t *p, int64_t stride) {
    uint16_t h[4];
    for (int j = 0; j < 4; j++) memcpy(h + j, p + j * stride, 2);
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h)));
}

/* the integer dot product of 32 weights u with 32 activations at x, per lane (lane sums are the block's) */
static inline int32x4_t dot32(u8x32 u, const int8_t *x) { return dot4u(dot4u(vdupq_n_s32(0), u.lo, x), u.hi, x + 16); }
/* four blocks' lane vectors -> one vector, lane j the sum of p[j]'s lanes */
static inline int32x4_t lane_sums4(const int32x4_t *p) {
    return vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]));
}

/* The 32-weight formats (quant_q8.c: weight = d * (u - o) or d * u + m): eight blocks' integer dot
 * products meet their d * da in one 8-lane FMA (lanes 0-3, 4-7), the rest of the blocks one at a time
 * into lane 0, the offsets (ow . sa) at the end, all as the AVX2 build orders them. Q8_0's weights are
 * signed, the others' unsigned (<= 31): sdot takes both as they are. */
#define DEFINE_B32(F, f, C)                                                                          \
    static void f##_c##C(const uint8_t *w, const act *a, float *y, int64_t ldy) {                   \
        float32x4_t acc[C][2];                                                                       \
        for (int c = 0; c < C; c++) acc[c][0] = acc[c][1] = vdupq_n_f32(0.0f);                       \
        const int64_t nb = a->K / 32, ng = nb / 8 * 8;                                               \
        float ow[QMAX_K / 32];                                                                       \
        for (int64_t g = 0; g < ng; g += 8) { /* eight blocks at a time */                           \
            const uint8_t *blk = w + g * F##_BYTES;                                                  \
            for (int p = 0; p < 8 * F##_BYTES; p += 64) SD_PREFETCH(blk + QPF_BYTES + p);            \
            float32x4_t dv[2];                                                                       \
            u8x32 u[8];                                                                              \
            for (int h = 0; h < 2; h++) {                                                            \
                dv[h] = halves4(blk + 4 * h * F##_BYTES, F##_BYTES);                                 \
                vst1q_f32(ow + g + 4 * h, F##_M >= 0 ? halves4(blk + 4 * h * F##_BYTES + (F##_M >= 0 ? F##_M : 0), F##_BYTES) \
                                                   : vmulq_f32(dv[h], vdupq_n_f32(-F##_O)));        \
            }                                                                                        \
            for (int j = 0; j < 8; j++) u[j] = u_##f(blk + j * F##_BYTES);                           \
            for (int c = 0; c < C; c++) {                                                            \
                const int8_t *xq = a->q + c * a->K + 32 * g;                                         \
                int32x4_t p[8];                                                                      \
                for (int j = 0; j < 8; j++) p[j] = dot32(u[j], xq + 32 * j);                         \
                for (int h = 0; h < 2; h++)                                                          \
                    acc[c][h] = vfmaq_f32(acc[c][h], vcvtq_f32_s32(lane_sums4(p + 4 * h)),          \
                                          vmulq_f32(dv[h], vld1q_f32(a->d + c * nb + g + 4 * h)));   \
            }                                                                                        \
        }                                                                                            \
        for (int64_t ib = ng; ib < nb; ib++) { /* the rest, a block at a time, into lane 0 */        \
            const uint8_t *blk = w + ib * F##_BYTES;                                                 \
            const float d = f16_to_f32(blk);                                                         \
            ow[ib] = F##_M >= 0 ? f16_to_f32(blk + (F##_M >= 0 ? F##_M : 0)) : -F##_O * d;           \
            const u8x32 u = u_##f(blk);                                                              \
            for (int c = 0; c < C; c++) {                                                            \
                const float s = (float)vaddvq_s32(dot32(u, a->q + c * a->K + 32 * ib)) * (d * a->d[c * nb + ib]); \
                acc[c][0] = vsetq_lane_f32(vgetq_lane_f32(acc[c][0], 0) + s, acc[c][0], 0);          \
            }                                                                                        \
        }                                                                                            \
        for (int c = 0; c < C; c++) {                                                                \
            float r = vsum4(acc[c][0], acc[c][1]);                                                   \
            if (F##_O != 0.0f || F##_M >= 0) {                                                       \
                float32x4_t o[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};                           \
                const float *sa = a->sa + c * nb;                                                    \
                int64_t ib = 0;                                                                      \
                for (; ib + 8 <= nb; ib += 8)                                                        \
                    for (int h = 0; h < 2; h++) o[h] = vfmaq_f32(o[h], vld1q_f32(ow + ib + 4 * h), vld1q_f32(sa + ib + 4 * h)); \
                r += vsum4(o[0], o[1]);                                                              \
                for (; ib < nb; ib++) r += ow[ib] * sa[ib];                                          \
            }                                                                                        \
            y[c * ldy] = r;                                                                          \
        }                                                                                            \
    }

/* The K-quants: an 8-lane int32 sum per block and row whose lane l holds, as in the AVX2 build, the
 * products of bytes 4l..4l+3 of every group of 32 (times the group's scale): sdot's lanes of the two
 * 16-byte halves are lanes 0-3 and 4-7. Then the AVX2 build's float steps on the two halves. */
static inline int16x8_t load_s16(const int16_t *p) { return vld1q_s16(p); }

/* Q4_K and Q5_K: lane l = sum_s sc[s] (q . a over bytes 4l..4l+3 of group s); the mins meet the 32-sums:
 * mt lane l = m[l] x (sum a over sub-block l) */
#define DEFINE_KQ4(f4, BYTES, C)                                                                     \
    static void f4##_c##C(const uint8_t *w, const act *a, float *y, int64_t ldy) {                  \
        float32x4_t f[C][2];                                                                         \
        for (int c = 0; c < C; c++) f[c][0] = f[c][1] = vdupq_n_f32(0.0f);                           \
        const int64_t K = a->K, K16 = K / 16, nb = K / 256;                                          \
        for (int64_t ib = 0; ib < nb; ib++) {                                                        \
            const uint8_t *blk = w + ib * BYTES;                                                     \
            for (int p = 0; p < BYTES; p += 64) SD_PREFETCH(blk + QPF_BYTES + p);                    \
            const float d = f16_to_f32(blk), ndmin = -f16_to_f32(blk + 2);                           \
            uint32_t su[4];                                                                          \
            q4_k_scale_bytes(blk, su); /* bytes 0..7: the scales, 8..15: the mins */                 \
            const uint8_t *sc = (const uint8_t *)su;                                                 \
            const uint16x8_t mn16 = vmovl_u8(vld1_u8(sc + 8));                                       \
            const int32x4_t mn[2] = {vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(mn16))),           \
                                     vreinterpretq_s32_u32(vmovl_high_u16(mn16))};                   \
            u8x32 q[8];                                                                              \
            for (int s = 0; s < 8; s++) q[s] = u_##f4(blk, s);                                       \
            for (int c = 0; c < C; c++) {                                                            \
                const int8_t *x = a->q + c * K + 256 * ib;                                           \
                const int16_t *xs = a->s + c * K16 + 16 * ib;                                        \
                int32x4_t acc[2] = {vdupq_n_s32(0), vdupq_n_s32(0)};                                 \
                for (int s = 0; s < 8; s++) {                                                        \
                    acc[0] = vmlaq_n_s32(acc[0], dot4u(vdupq_n_s32(0), q[s].lo, x + 32 * s), sc[s]); \
                    acc[1] = vmlaq_n_s32(acc[1], dot4u(vdupq_n_s32(0), q[s].hi, x + 32 * s + 16), sc[s]); \
                }                                                                                    \
                const float da = a->d[c * nb + ib];                                                  \
                const float32x4_t dd = vdupq_n_f32(d * da), nd = vdupq_n_f32(ndmin * da);            \
                for (int h = 0; h < 2; h++) {                                                        \
                    const int32x4_t mt = vmulq_s32(vpaddlq_s16(load_s16(xs + 8 * h)), mn[h]);        \
                    f[c][h] = vfmaq_f32(f[c][h], vcvtq_f32_s32(acc[h]), dd);                         \
                    f[c][h] = vfmaq_f32(f[c][h], vcvtq_f32_s32(mt), nd);                             \
                }                                                                                    \
            }                                                                                        \
        }                                                                                            \
        for (int c = 0; c < C; c++) y[c * ldy] = vsum4(f[c][0], f[c][1]);                            \
    }

/* IQ4_XS and IQ3_S: the x86 kernel's integers (lane l = sum_s sc[s] (v . a over bytes 4l..4l+3 of group s),
 * signed values in sdot) and its one FMA a block */
#define u_iq4_xs(blk, s) u_iq4((blk) + 8 + 16 * (s))
#define DEFINE_IQ_K(FMT, BYTES, C)                                                                   \
    static void FMT##_c##C(const uint8_t *w, const act *a, float *y, int64_t ldy) {                 \
        float32x4_t f[C][2];                                                                         \
        for (int c = 0; c < C; c++) f[c][0] = f[c][1] = vdupq_n_f32(0.0f);                           \
        const int64_t K = a->K, nb = K / 256;                                                        \
        for (int64_t ib = 0; ib < nb; ib++) {                                                        \
            const uint8_t *blk = w + ib * BYTES;                                                     \
            for (int p = 0; p < BYTES; p += 64) SD_PREFETCH(blk + QPF_BYTES + p);                    \
            const float d = f16_to_f32(blk);                                                         \
            u8x32 q[8];                                                                              \
            int sc[8];                                                                               \
            for (int s = 0; s < 8; s++) q[s] = u_##FMT(blk, s), sc[s] = FMT##_scale(blk, s);         \
            for (int c = 0; c < C; c++) {                                                            \
                const int8_t *x = a->q + c * K + 256 * ib;                                           \
                int32x4_t acc[2] = {vdupq_n_s32(0), vdupq_n_s32(0)};                                 \
                for (int s = 0; s < 8; s++) {                                                        \
                    acc[0] = vmlaq_n_s32(acc[0], dot4u(vdupq_n_s32(0), q[s].lo, x + 32 * s), sc[s]); \
                    acc[1] = vmlaq_n_s32(acc[1], dot4u(vdupq_n_s32(0), q[s].hi, x + 32 * s + 16), sc[s]); \
                }                                                                                    \
                const float32x4_t dd = vdupq_n_f32(d * a->d[c * nb + ib]);                           \
                for (int h = 0; h < 2; h++) f[c][h] = vfmaq_f32(f[c][h], vcvtq_f32_s32(acc[h]), dd);  \
            }                                                                                        \
        }                                                                                            \
        for (int c = 0; c < C; c++) y[c * ldy] = vsum4(f[c][0], f[c][1]);                            \
    }
#define DEFINE_IQ4_XS(C) DEFINE_IQ_K(iq4_xs, IQ4_XS_BYTES, C)
#define DEFINE_IQ3_S(C) DEFINE_IQ_K(iq3_s, IQ3_S_BYTES, C)
#define DEFINE_Q4_K(C) DEFINE_KQ4(q4_k, Q4_K_BYTES, C)
#define DEFINE_Q5_K(C) DEFINE_KQ4(q5_k, Q5_K_BYTES, C) /* Q4_K's scales and steps; q in 0..31 */

/* Q6_K: lanes 0-3 take the first 16 of each group s (scale 2s), lanes 4-7 the second (scale 2s + 1);
 * the -32 meets the 16-sums: off lane l = sc[2l] s[2l] + sc[2l + 1] s[2l + 1], subtracted x 32. Q3_K: the
 * same with q - 4 (SHIFT 2), its d at byte 108 and its scales unpacked. Q2_K (MINS 1): q in 0..3, no
 * offset; its 16 mins meet the 16-sums as the scales do (mt) and take Q4_K's second FMA, by -dmin da */
static inline void sc_q6_k(const uint8_t *b, int8_t sc[16]) { memcpy(sc, b + 192, 16); }
#define sc_q3_k q3_k_scales
static inline void sc_q2_k(const uint8_t *b, int8_t sc[16]) {
    for (int i = 0; i < 16; i++) sc[i] = (int8_t)(b[i] & 15);
}
#define DEFINE_KQ6(f6, BYTES, D_AT, SHIFT, MINS, C)                                                  \
    static void f6##_c##C(const uint8_t *w, const act *a, float *y, int64_t ldy) {                  \
        float32x4_t f[C][2];                                                                         \
        for (int c = 0; c < C; c++) f[c][0] = f[c][1] = vdupq_n_f32(0.0f);                           \
        const int64_t K = a->K, K16 = K / 16, nb = K / 256;                                          \
        for (int64_t ib = 0; ib < nb; ib++) {                                                        \
            const uint8_t *blk = w + ib * BYTES;                                                     \
            for (int p = 0; p < BYTES; p += 64) SD_PREFETCH(blk + QPF_BYTES + p);                    \
            const float d = f16_to_f32(blk + D_AT), ndmin = MINS ? -f16_to_f32(blk + D_AT + 2) : 0.0f; \
            int8_t sc[16];                                                                           \
            sc_##f6(blk, sc);                                                                        \
            const int16x8_t sc16[2] = {vmovl_s8(vld1_s8(sc)), vmovl_s8(vld1_s8(sc + 8))};            \
            const uint8x16_t mn8 = vshrq_n_u8(vld1q_u8(blk), 4); /* Q2_K's mins */                  \
            const int16x8_t mn16[2] = {vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mn8))),            \
                                       vreinterpretq_s16_u16(vmovl_high_u8(mn8))};                   \
            u8x32 q[8];                                                                              \
            for (int s = 0; s < 8; s++) q[s] = u_##f6(blk, s);                                       \
            for (int c = 0; c < C; c++) {                                                            \
                const int8_t *x = a->q + c * K + 256 * ib;                                           \
                const int16_t *xs = a->s + c * K16 + 16 * ib;                                        \
                int32x4_t acc[2] = {vdupq_n_s32(0), vdupq_n_s32(0)};                                 \
                for (int s = 0; s < 8; s++) {                                                        \
                    acc[0] = vmlaq_n_s32(acc[0], dot4u(vdupq_n_s32(0), q[s].lo, x + 32 * s), sc[2 * s]); \
                    acc[1] = vmlaq_n_s32(acc[1], dot4u(vdupq_n_s32(0), q[s].hi, x + 32 * s + 16), sc[2 * s + 1]); \
                }                                                                                    \
                const float da = a->d[c * nb + ib];                                                  \
                const float32x4_t dd = vdupq_n_f32(d * da), nd = vdupq_n_f32(ndmin * da);            \
                (void)nd;                                                                            \
                for (int h = 0; h < 2; h++) {                                                        \
                    const int16x8_t xv = load_s16(xs + 8 * h), by = MINS ? mn16[h] : sc16[h];        \
                    const int32x4_t off = vpaddq_s32(vmull_s16(vget_low_s16(by), vget_low_s16(xv)), vmull_high_s16(by, xv)); \
                    if (MINS) {                                                                      \
                        f[c][h] = vfmaq_f32(f[c][h], vcvtq_f32_s32(acc[h]), dd);                     \
                        f[c][h] = vfmaq_f32(f[c][h], vcvtq_f32_s32(off), nd);                        \
                    } else {                                                                         \
                        f[c][h] = vfmaq_f32(f[c][h], vcvtq_f32_s32(vsubq_s32(acc[h], vshlq_n_s32(off, SHIFT))), dd); \
                    }                                                                                \
                }                                                                                    \
            }                                                                                        \
        }                                                                                            \
        for (int c = 0; c < C; c++) y[c * ldy] = vsum4(f[c][0], f[c][1]);                            \
    }
#define DEFINE_Q6_K(C) DEFINE_KQ6(q6_k, Q6_K_BYTES, 208, 5, 0, C)
#define DEFINE_Q3_K(C) DEFINE_KQ6(q3_k, Q3_K_BYTES, 108, 2, 0, C)
#define DEFINE_Q2_K(C) DEFINE_KQ6(q2_k, Q2_K_BYTES, 80, 0, 1, C)

#endif
