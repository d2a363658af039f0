/* The 32-weight repacked tiles (Q8_0_R16, Q4_0_R16) with i8mm's smmla (aarch64, __ARM_FEATURE_MATMUL_INT8),
 * for two activation rows at a time (C >= 2). Included by quant_rp.h only, before the kernels' dispatch.
 *
 * smmla multiplies a 2 x 8 block of int8 by another's transpose into a 2 x 2 block of int32 sums:
 * two consecutive 4-byte chunks of a tile, zipped (vzip1q_s32 / vzip2q_s32), give 8 consecutive
 * weights of two rows, and 8 consecutive activations of two input rows are the other operand. The
 * per-row sums are the body's integers exactly (Q8_0: w . a from 0; Q4_0: -8 (sum a) + q . a), and
 * the float step is the body's FMA, so the bits are the other builds'. */
#ifndef SPECDEC_QUANT_RP_MM_H
#define SPECDEC_QUANT_RP_MM_H

/* the activations of two rows for one smmla: 8 bytes of each */
static inline int8x16_t mm_x2(const int8_t *x0, const int8_t *x1) { return vcombine_s8(vld1_s8(x0), vld1_s8(x1)); }

/* quarter h of a Q8_0 (q4 = 0) or Q4_0 (q4 = 1) block's chunks as four smmla steps: w[j][0] rows
 * 4h, 4h + 1 and w[j][1] rows 4h + 2, 4h + 3, against the 8 activations from off[j] */
static inline void mm_weights(const uint8_t *blk, int h, int q4, int8x16_t w[4][2], int off[4]) {
    for (int p = 0; p < (q4 ? 2 : 4); p++) {
        uint8x16_t c0 = vld1q_u8(blk + 128 * p + 16 * h), c1 = vld1q_u8(blk + 128 * p + 64 + 16 * h);
        for (int n = 0; n < (q4 ? 2 : 1); n++) { /* Q4_0: the low nibbles (weights 8p ..), the high (16 + 8p ..) */
            const uint8x16_t u0 = q4 ? (n ? vshrq_n_u8(c0, 4) : vandq_u8(c0, vdupq_n_u8(15))) : c0; /* Q8_0: w itself */
            const uint8x16_t u1 = q4 ? (n ? vshrq_n_u8(c1, 4) : vandq_u8(c1, vdupq_n_u8(15))) : c1;
            const int j = q4 ? 2 * n + p : p;
            w[j][0] = vreinterpretq_s8_u32(vzip1q_u32(vreinterpretq_u32_u8(u0), vreinterpretq_u32_u8(u1)));
            w[j][1] = vreinterpretq_s8_u32(vzip2q_u32(vreinterpretq_u32_u8(u0), vreinterpretq_u32_u8(u1)));
            off[j] = 16 * n + 8 * p;
        }
    }
}

static void rp_b32_mm(const uint8_t *w, const act *a, float *y, int64_t ldy, int C, int q4) {
    const int64_t K = a->K, nb = K / 32, K16 = K / 16, tile = q4 ? RP_Q4_0_TILE : RP_Q8_0_TILE;
    for (int h = 0; h < RP_ROWS / 4; h++) {
        float32x4_t f[RP_MAXC];
        for (int c = 0; c < C; c++) f[c] = vdupq_n_f32(0.0f);
        for (int64_t ib = 0; ib < nb; ib++) {
            const uint8_t *blk = w + ib * tile;
            if (h == 0)
                for (int l = 0; l < (tile + 63) / 64; l++) SD_PREFETCH(blk + RP_PF + 64 * l);
            int8x16_t wt[4][2];
            int off[4];
            mm_weights(blk, h, q4, wt, off);
            const float32x4_t dv = vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(blk + (q4 ? 4 : 8) * 64 + 8 * h)));
            for (int c = 0; c < C; c += 2) {
                const int c1 = c + 1 < C ? c + 1 : c; /* an odd last row: its own pair, the copy dropped */
                const int8_t *x0 = a->q + c * K + 32 * ib, *x1 = a->q + c1 * K + 32 * ib;
                int32x4_t s01 = vdupq_n_s32(0), s23 = vdupq_n_s32(0);
                for (int j = 0; j < 4; j++) {
                    const int8x16_t xp = mm_x2(x0 + off[j], x1 + off[j]);
                    s01 = vmmlaq_s32(s01, wt[j][0], xp), s23 = vmmlaq_s32(s23, wt[j][1], xp);
                }
                /* s01 = [r0.x0, r0.x1, r1.x0, r1.x1], s23 likewise: row c's four rows, then row c1's */
                int32x4_t dot[2] = {vuzp1q_s32(s01, s23), vuzp2q_s32(s01, s23)};
                for (int e = 0; e < 2 && c + e < C; e++) {
                    if (q4) dot[e] = vaddq_s32(dot[e], vdupq_n_s32(a->o[(c + e) * K16 + 2 * ib]));
                    f[c + e] = vfmaq_f32(f[c + e], vcvtq_f32_s32(dot[e]), vmulq_f32(dv, vdupq_n_f32(a->d[(c + e) * nb + ib])));
                }
            }
        }
        for (int c = 0; c < C; c++) vst1q_f32(y + c * ldy + 4 * h, f[c]);
    }
}

#endif
