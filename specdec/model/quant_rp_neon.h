/* quant_rp.h's R_* primitives for NEON (aarch64): RP_W 4, so a 64-byte chunk is read as four 16-byte
 * quarters (RP_H = 4), lane i of quarter h = row 4h + i; each lane runs the x86 builds' integer and float
 * steps, so the bits are theirs. Included by quant_rp.h only, after quant_neon.h. */
#ifndef SPECDEC_QUANT_RP_NEON_H
#define SPECDEC_QUANT_RP_NEON_H

#define RP_W 4
typedef int32x4_t rvi;
typedef float32x4_t rvf;
static inline int32x4_t r_dot4(int32x4_t acc, int32x4_t a, int32x4_t b) { /* quant_neon.h's dot4 (sdot or its floor) */
    return dot4(acc, vreinterpretq_s8_s32(a), vreinterpretq_s8_s32(b));
}
static inline int32x4_t r_dpwssd(int32x4_t acc, int32x4_t a, int32x4_t b) { /* int16 pairs, summed per lane */
    const int16x8_t x = vreinterpretq_s16_s32(a), y = vreinterpretq_s16_s32(b);
    return vaddq_s32(acc, vpaddq_s32(vmull_s16(vget_low_s16(x), vget_low_s16(y)), vmull_high_s16(x, y)));
}
static inline int32x4_t r_u8_32(const uint8_t *p) { /* 4 bytes -> 4 int32 lanes */
    uint32_t v;
    memcpy(&v, p, 4);
    return vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(vmovl_u8(vcreate_u8(v)))));
}
static inline int32x4_t r_s8_32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return vmovl_s16(vget_low_s16(vmovl_s8(vcreate_s8(v))));
}
#define R_LOAD(p) vreinterpretq_s32_u8(vld1q_u8((const uint8_t *)(p)))
#define R_SET1(x) vdupq_n_s32(x)
#define R_SET1B(x) vreinterpretq_s32_s8(vdupq_n_s8((int8_t)(x)))
#define R_ZERO() vdupq_n_s32(0)
#define R_AND(a, b) vandq_s32(a, b)
#define R_OR(a, b) vorrq_s32(a, b)
#define R_SRLI16(a, n) vreinterpretq_s32_u16(vshrq_n_u16(vreinterpretq_u16_s32(a), n))
#define R_SLLI16(a, n) vreinterpretq_s32_u16(vshlq_n_u16(vreinterpretq_u16_s32(a), n))
#define R_SRLI32(a, n) vreinterpretq_s32_u32(vshrq_n_u32(vreinterpretq_u32_s32(a), n))
#define R_ADD(a, b) vaddq_s32(a, b)
#define R_MULLO(a, b) vmulq_s32(a, b)
#define R_DPBUSD(acc, u, s) r_dot4(acc, u, s) /* u <= 127 here: signed x signed is the same */
#define R_DPWSSD(acc, a, b) r_dpwssd(acc, a, b)
#define R_U8_32(p) r_u8_32((const uint8_t *)(p))
#define R_S8_32(p) r_s8_32((const uint8_t *)(p))
#define R_U8_16(p) vreinterpretq_s32_u16(vmovl_u8(vld1_u8((const uint8_t *)(p))))
#define R_F16(p) vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(const void *)(p))))
#define R_CVT(a) vcvtq_f32_s32(a)
#define R_FZERO() vdupq_n_f32(0.0f)
#define R_FSET1(x) vdupq_n_f32(x)
#define R_FMUL(a, b) vmulq_f32(a, b)
#define R_FMA(a, b, c) vfmaq_f32(c, a, b) /* a * b + c, fused */
#define R_STOREF(p, v) vst1q_f32(p, v)
#define R_TABLE16(p) R_LOAD(p)
#define R_LOOKUP(t, i) vreinterpretq_s32_u8(vqtbl1q_u8(vreinterpretq_u8_s32(t), vreinterpretq_u8_s32(i)))
#define R_VNNI 1
/* Q8_0_R16 stores w itself here (RP_Q8_BIAS 0, simd.h: sdot's signed operand): its dot product from 0 */
#define R_Q8_DOT(dot, raw, xv) r_dot4(dot, raw, xv)
#define R_Q8_START(o) R_ZERO()
/* R_VNNI: quant_rp.h's int32 sub-block sums (sdot, then the scale's multiply) */
/* the activations: 16 bytes in a register, lane g of them against every lane (sdot's by-element form) */
typedef int8x16_t rxv;
#define R_XLOAD(p) vld1q_s8((const int8_t *)(p))
static inline int32x4_t r_xdot(int32x4_t acc, int32x4_t u, int8x16_t xv, int g) {
#if defined(__ARM_FEATURE_DOTPROD)
    const int8x16_t w = vreinterpretq_s8_s32(u);
    switch (g & 3) { /* the lane must be a constant: one case a lane, folded where g is known */
    case 0: return vdotq_laneq_s32(acc, w, xv, 0);
    case 1: return vdotq_laneq_s32(acc, w, xv, 1);
    case 2: return vdotq_laneq_s32(acc, w, xv, 2);
    default: return vdotq_laneq_s32(acc, w, xv, 3);
    }
#else
    const int32x4_t x = vreinterpretq_s32_s8(xv);
    int32x4_t b;
    switch (g & 3) {
    case 0: b = vdupq_laneq_s32(x, 0); break;
    case 1: b = vdupq_laneq_s32(x, 1); break;
    case 2: b = vdupq_laneq_s32(x, 2); break;
    default: b = vdupq_laneq_s32(x, 3); break;
    }
    return r_dot4(acc, u, b);
#endif
}
#define R_XDOT(acc, u, xv, g) r_xdot(acc, u, xv, g)
#define R_Q8_XDOT(dot, raw, xv, g) r_xdot(dot, raw, xv, g)

#endif
