/* Repacking at load, once: a GGUF matrix in any format the kernels read rewritten into tiles of RP_ROWS output
 * rows (the layouts: quant_rp.h, whose kernels read them), and for the 4-bit (3-bit) draft any
 * 32-weight or K-quant format re-encoded as Q4_0 (Q3_0) and tiled the same way. Scalar code (but the draft encodings'
 * extremes, in vectors): it runs once per matrix, on the block formats' integers as simd.h decodes
 * them (one decoder per format). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "simd.h"

typedef struct {
    int64_t qk, tile; /* weights a block, a tile's bytes a block */
} rp_block;

static rp_block rp_block_of(int rtype) {
    rp_block b = {0, 0};
    switch (rtype) {
    case T_Q2_K_R16: b.qk = 256, b.tile = RP_Q2_K_TILE; break;
    case T_Q3_K_R16: b.qk = 256, b.tile = RP_Q3_K_TILE; break;
    case T_Q4_K_R16: b.qk = 256, b.tile = RP_Q4_K_TILE; break;
    case T_Q5_K_R16: b.qk = 256, b.tile = RP_Q5_K_TILE; break;
    case T_Q6_K_R16: b.qk = 256, b.tile = RP_Q6_K_TILE; break;
    case T_Q8_0_R16: b.qk = 32, b.tile = RP_Q8_0_TILE; break;
    case T_Q4_0_R16: b.qk = 32, b.tile = RP_Q4_0_TILE; break;
    case T_Q4_1_R16: b.qk = 32, b.tile = RP_Q4_1_TILE; break;
    case T_Q5_0_R16: b.qk = 32, b.tile = RP_Q5_0_TILE; break;
    case T_Q5_1_R16: b.qk = 32, b.tile = RP_Q5_1_TILE; break;
    case T_Q3_0_R16: b.qk = 32, b.tile = RP_Q3_0_TILE; break;
    case T_IQ4_NL_R16: b.qk = 32, b.tile = RP_IQ4_NL_TILE; break;
    case T_IQ4_XS_R16: b.qk = 256, b.tile = RP_IQ4_XS_TILE; break;
    default: break;
    }
    return b;
}

/* Q4_K (Q5_K) block -> q[256] (0..15; Q5_K 0..31), sc[8], mn[8]: the two formats' d, dmin and scale bytes
 * lie alike */
static void unpack_k4(const uint8_t *b, int five, uint8_t *q, uint8_t *sc, uint8_t *mn) {
    uint32_t u[4];
    q4_k_scale_bytes(b, u);
    memcpy(sc, u, 8);
    memcpy(mn, u + 2, 8);
    if (five) q5_k_values(b, q);
    else q4_k_values(b, q);
}

/* one block of 16 rows of Q4_K (Q5_K) -> a Q4_K_R16 (Q5_K_R16) tile: the fifth bits (Q5_K) after Q4_K_R16's
 * bytes, a chunk per sub-block s laid as the nibbles' chunks: row i's byte e holds at bit r the fifth bit
 * of chunk 4s + r's low-nibble weight e and at bit 4 + r that of its high-nibble one */
static void repack_k4_tile(const uint8_t *src, int64_t rb, uint8_t *dst, int five) {
    uint8_t q[16][256], sc[16][8], mn[16][8];
    for (int i = 0; i < 16; i++) unpack_k4(src + i * rb, five, q[i], sc[i], mn[i]);
    for (int s = 0; s < 8; s++)
        for (int r = 0; r < 4; r++)
            for (int i = 0; i < 16; i++)
                for (int e = 0; e < 4; e++) {
                    const uint8_t lo = q[i][32 * s + 4 * r + e], hi = q[i][32 * s + 16 + 4 * r + e];
                    dst[(4 * s + r) * 64 + 4 * i + e] = (uint8_t)((lo & 15) | (hi & 15) << 4);
                    if (!five) continue;
                    uint8_t *hb = dst + RP_Q4_K_TILE + 64 * s + 4 * i + e;
                    if (r == 0) *hb = 0;
                    *hb |= (uint8_t)((lo >> 4) << r | (hi >> 4) << (4 + r));
                }
    for (int s = 0; s < 8; s++)
        for (int i = 0; i < 16; i++) dst[2048 + 16 * s + i] = sc[i][s];
    for (int p = 0; p < 4; p++)
        for (int i = 0; i < 16; i++) dst[2176 + 32 * p + 2 * i] = mn[i][2 * p], dst[2176 + 32 * p + 2 * i + 1] = mn[i][2 * p + 1];
    for (int i = 0; i < 16; i++) memcpy(dst + 2304 + 2 * i, src + i * rb, 2), memcpy(dst + 2336 + 2 * i, src + i * rb + 2, 2);
}

static void repack_q6_k_tile(const uint8_t *src, int64_t rb, uint8_t *dst) {
    uint8_t q[16][256];
    for (int i = 0; i < 16; i++)
        q6_k_values(src + i * rb, q[i]);
    for (int u = 0; u < 16; u++)
        for (int i = 0; i < 16; i++)
            for (int e = 0; e < 4; e++) {
                const uint8_t *g = q[i] + 16 * u + e; /* g[0], g[4], g[8], g[12]: the four groups' e-th weights */
                uint8_t *o = dst + 192 * u + 4 * i + e;
                o[0] = (uint8_t)((g[0] & 15) | (g[4] & 15) << 4);
                o[64] = (uint8_t)((g[8] & 15) | (g[12] & 15) << 4);
                o[128] = (uint8_t)(g[0] >> 4 | (g[4] >> 4) << 2 | (g[8] >> 4) << 4 | (g[12] >> 4) << 6);
            }
    for (int u = 0; u < 16; u++)
        for (int i = 0; i < 16; i++) dst[3072 + 16 * u + i] = src[i * rb + 192 + u];
    for (int i = 0; i < 16; i++) memcpy(dst + 3328 + 2 * i, src + i * rb + 208, 2);
}

/* one block of 16 rows of IQ4_NL (IQ4_XS) -> an IQ4_NL_R16 (IQ4_XS_R16) tile: the index bytes as they lie,
 * four of each row side by side (a byte holds weights j and 16 + j, as Q4_0_R16's) */
static void repack_iq4_tile(const uint8_t *src, int64_t rb, uint8_t *dst, int xs) {
    for (int s = 0; s < (xs ? 8 : 1); s++)
        for (int g = 0; g < 4; g++)
            for (int i = 0; i < 16; i++)
                memcpy(dst + 256 * s + 64 * g + 4 * i, src + i * rb + (xs ? 8 + 16 * s : 2) + 4 * g, 4);
    for (int i = 0; i < 16; i++) {
        if (xs)
            for (int s = 0; s < 8; s++) dst[2048 + 16 * s + i] = (uint8_t)(int8_t)iq4_xs_scale(src + i * rb, s);
        memcpy(dst + (xs ? 2176 : 256) + 2 * i, src + i * rb, 2);
    }
}

/* one block of 16 rows of Q3_K -> a Q3_K_R16 tile (quant_rp.h) */
static void repack_q3_k_tile(const uint8_t *src, int64_t rb, uint8_t *dst) {
    uint8_t q[16][256];
    int8_t sc[16][16];
    memset(dst, 0, 1536);
    for (int i = 0; i < 16; i++) q3_k_values(src + i * rb, q[i]), q3_k_scales(src + i * rb, sc[i]);
    for (int u = 0; u < 16; u++)
        for (int i = 0; i < 16; i++)
            for (int g = 0; g < 4; g++)
                for (int e = 0; e < 4; e++) {
                    const uint8_t v = q[i][16 * u + 4 * g + e];
                    dst[64 * u + 4 * i + e] |= (uint8_t)((v & 3) << (2 * g));
                    dst[1024 + 64 * (u >> 1) + 4 * i + e] |= (uint8_t)((v >> 2) << (4 * (u & 1) + g));
                }
    for (int u = 0; u < 16; u++)
        for (int i = 0; i < 16; i++) dst[1536 + 16 * u + i] = (uint8_t)sc[i][u];
    for (int i = 0; i < 16; i++) memcpy(dst + 1792 + 2 * i, src + i * rb + 108, 2);
}

/* one block of 16 rows of Q4_0, Q4_1, Q5_0 or Q5_1 -> its tile (quant_rp.h): the file's qs bytes as they are
 * (byte j: weights j and 16 + j, as Q4_0_R16's), for Q5 the 32 fifth bits of each row spread as Q5_K_R16's
 * (byte e, bit g: weight 4g + e; bit 4 + g: weight 16 + 4g + e), then d and m as 16 halves each */
static void repack_b32_tile(const uint8_t *src, int64_t rb, uint8_t *dst, int type) {
    const int five = type == T_Q5_0 || type == T_Q5_1, min = type == T_Q4_1 || type == T_Q5_1;
    const int qs_at = 2 + 2 * min + 4 * five, d_at = five ? 320 : 256;
    for (int i = 0; i < 16; i++) {
        const uint8_t *b = src + i * rb;
        for (int g = 0; g < 4; g++) memcpy(dst + 64 * g + 4 * i, b + qs_at + 4 * g, 4);
        if (five) {
            uint32_t qh;
            memcpy(&qh, b + 2 + 2 * min, 4);
            for (int e = 0; e < 4; e++) {
                uint8_t v = 0;
                for (int g = 0; g < 4; g++) v |= (uint8_t)(((qh >> (4 * g + e)) & 1) << g | ((qh >> (16 + 4 * g + e)) & 1) << (4 + g));
                dst[256 + 4 * i + e] = v;
            }
        }
        memcpy(dst + d_at + 2 * i, b, 2);
        if (min) memcpy(dst + d_at + 32 + 2 * i, b + 2, 2);
    }
}

/* one block of 16 rows of Q2_K -> a Q2_K_R16 tile (quant_rp.h): the 2-bit fields as Q3_K_R16's, the scale
 * bytes as they are, two a row side by side */
static void repack_q2_k_tile(const uint8_t *src, int64_t rb, uint8_t *dst) {
    uint8_t q[16][256];
    memset(dst, 0, 1024);
    for (int i = 0; i < 16; i++) q2_k_values(src + i * rb, q[i]);
    for (int u = 0; u < 16; u++)
        for (int i = 0; i < 16; i++)
            for (int g = 0; g < 4; g++)
                for (int e = 0; e < 4; e++) dst[64 * u + 4 * i + e] |= (uint8_t)(q[i][16 * u + 4 * g + e] << (2 * g));
    for (int u = 0; u < 16; u++)
        for (int i = 0; i < 16; i++) dst[1024 + 32 * (u >> 1) + 2 * i + (u & 1)] = src[i * rb + u];
    for (int i = 0; i < 16; i++) memcpy(dst + 1280 + 2 * i, src + i * rb + 80, 2), memcpy(dst + 1312 + 2 * i, src + i * rb + 82, 2);
}

static void repack_q8_0_tile(const uint8_t *src, int64_t rb, uint8_t *dst) {
    for (int g = 0; g < 8; g++)
        for (int i = 0; i < 16; i++)
            for (int e = 0; e < 4; e++) dst[64 * g + 4 * i + e] = src[i * rb + 2 + 4 * g + e] ^ RP_Q8_BIAS;
    for (int i = 0; i < 16; i++) memcpy(dst + 512 + 2 * i, src + i * rb, 2);
}

/* the repacked type of a GGUF type, 0 if none */
int quant_repacked_type(int type) {
    switch (type) {
    case T_Q2_K: return T_Q2_K_R16;
    case T_Q4_0: return T_Q4_0_R16;
    case T_Q4_1: return T_Q4_1_R16;
    case T_Q5_0: return T_Q5_0_R16;
    case T_Q5_1: return T_Q5_1_R16;
    case T_Q3_K: return T_Q3_K_R16;
    case T_IQ4_NL: return T_IQ4_NL_R16;
    case T_IQ4_XS: return T_IQ4_XS_R16;
    case T_Q4_K: return T_Q4_K_R16;
    case T_Q5_K: return T_Q5_K_R16;
    case T_Q6_K: return T_Q6_K_R16;
    case T_Q8_0: return T_Q8_0_R16;
    default: return 0;
    }
}

/* Bytes a row takes in repacked `rtype` (a tile's bytes over 16), 0 if not a repacked type or K does not fit */
int64_t quant_rp_row_bytes(int rtype, int64_t K) {
    const rp_block rk = rp_block_of(rtype);
    return rk.qk && K > 0 && K % rk.qk == 0 ? K / rk.qk * rk.tile / RP_ROWS : 0;
}

/* rows (a multiple of 16) rows of K weights in GGUF `type` at src -> repacked at dst
 * (rows x quant_rp_row_bytes bytes). Returns the repacked type, or -1. */
int quant_repack(int type, const uint8_t *src, uint8_t *dst, int64_t rows, int64_t K, int nthreads) {
    const int rtype = quant_repacked_type(type);
    const rp_block rk = rp_block_of(rtype);
    if (!rk.qk || rows % RP_ROWS || K <= 0 || K % rk.qk) return -1;
    const int64_t nb = K / rk.qk, rb = quant_row_bytes(type, K), tiles = rows / RP_ROWS;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t t = 0; t < tiles; t++)
        for (int64_t ib = 0; ib < nb; ib++) {
            const uint8_t *s = src + t * RP_ROWS * rb + ib * (rb / nb);
            uint8_t *d = dst + (t * nb + ib) * rk.tile;
            if (type == T_Q4_K || type == T_Q5_K) repack_k4_tile(s, rb, d, type == T_Q5_K);
            else if (type == T_Q6_K) repack_q6_k_tile(s, rb, d);
            else if (type == T_Q3_K) repack_q3_k_tile(s, rb, d);
            else if (type == T_Q2_K) repack_q2_k_tile(s, rb, d);
            else if (type == T_Q4_0 || type == T_Q4_1 || type == T_Q5_0 || type == T_Q5_1) repack_b32_tile(s, rb, d, type);
            else if (type == T_IQ4_NL || type == T_IQ4_XS) repack_iq4_tile(s, rb, d, type == T_IQ4_XS);
            else repack_q8_0_tile(s, rb, d);
        }
    return rtype;
}


/* ---- the 4-bit (3-bit) draft: any 32-weight or K-quant format re-encoded as Q4_0 (Q3_0) and repacked ---- */

/* one block of 32 weights, symmetric at `bits` bits (Q4_0 at 4, llama.cpp's rounding; Q3_0 at 3): with L =
 * 2^(bits - 1), d = the largest-magnitude weight (the first such) / -L, q = min(2L - 1, trunc(w / d + L + 0.5)),
 * so the extreme lands on q = 0 and a weight is d (q - L). The extremes come from lane-wise max and min; a
 * block whose largest and smallest are equal in magnitude (all zeros, or +a beside -a) takes the scalar
 * search for the first, as llama.cpp's loop finds it. q [32] and d are written; the caller lays them out. */
static float sym_block(const float *x, int bits, uint8_t *q) {
    vec hi = VLOAD(x), lo = hi;
    for (int j = VL; j < 32; j += VL) {
        const vec v = VLOAD(x + j);
        hi = VMAX(hi, v), lo = VMIN(lo, v);
    }
    const float top = vhmax(hi), bottom = vhmin(lo);
    float max = top > -bottom ? top : bottom;
    if (top == -bottom) {
        float amax = 0.0f;
        max = 0.0f;
        for (int j = 0; j < 32; j++)
            if (amax < (x[j] < 0 ? -x[j] : x[j])) amax = x[j] < 0 ? -x[j] : x[j], max = x[j];
    }
    const int L = 1 << (bits - 1);
    const float d = max / (float)-L;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; j++) {
        const int v = (int)(x[j] * id + ((float)L + 0.5f));
        q[j] = (uint8_t)(v < 0 ? 0 : v > 2 * L - 1 ? 2 * L - 1 : v);
    }
    return d;
}

/* row i of a Q4_0_R16 tile: its nibbles' four 4-byte groups 64 bytes apart (low nibbles weights 0-15,
 * high 16-31), its fp16 d at o + 256 + 2i */
static void q4_0_block(const float *x, uint8_t *o, int i) {
    uint8_t q[32], b[16];
    const uint16_t d16 = f32_to_f16(sym_block(x, 4, q));
    memcpy(o + 256 + 2 * i, &d16, 2);
    for (int j = 0; j < 16; j++) b[j] = (uint8_t)(q[j] | q[16 + j] << 4);
    for (int g = 0; g < 4; g++) memcpy(o + 64 * g + 4 * i, b + 4 * g, 4);
}

/* row i of a Q3_0_R16 tile (quant_rp.h): byte b of its 4 at o + 64c + 4i (c = 0..2) holds q[4(2c) + b] at
 * bits 0-2, q[4(2c + 1) + b] at bits 4-6, and bit c of q[24 + b] and of q[28 + b] at bits 3 and 7; its fp16
 * d at o + 192 + 2i */
static void q3_0_block(const float *x, uint8_t *o, int i) {
    uint8_t q[32];
    const uint16_t d16 = f32_to_f16(sym_block(x, 3, q));
    memcpy(o + 192 + 2 * i, &d16, 2);
    for (int c = 0; c < 3; c++)
        for (int b = 0; b < 4; b++)
            o[64 * c + 4 * i + b] = (uint8_t)(q[8 * c + b] | q[8 * c + 4 + b] << 4 | ((q[24 + b] >> c) & 1) << 3 |
                                              ((q[28 + b] >> c) & 1) << 7);
}

/* rows (a multiple of 16) rows of K weights in GGUF `type` -> tiles of `tile` bytes a block, each row's
 * block written by `block`. Returns rtype, or -1. Lossy: a draft's weights only (its numerics never reach
 * the output). */
static int requant(int type, const uint8_t *src, uint8_t *dst, int64_t rows, int64_t K, int nthreads, int rtype,
                   int64_t tile, void (*block)(const float *, uint8_t *, int)) {
    const int64_t rb = quant_row_bytes(type, K);
    if (!rb || rows % RP_ROWS || K % 32) return -1;
    const int64_t nb = K / 32, tiles = rows / RP_ROWS;
    int bad = 0;
#pragma omp parallel num_threads(nthreads) reduction(| : bad)
    {
        float *x = malloc(sizeof(float) * (size_t)(RP_ROWS * K));
        if (!x) bad = 1;
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; t++) {
            if (!x) continue;
            quant_dequantize(type, src + t * RP_ROWS * rb, x, RP_ROWS, K);
            for (int64_t ib = 0; ib < nb; ib++) {
                uint8_t *o = dst + (t * nb + ib) * tile;
                for (int i = 0; i < RP_ROWS; i++) block(x + i * K + 32 * ib, o, i);
            }
        }
        free(x);
    }
    return bad ? -1 : rtype;
}

/* rows x K weights in GGUF `type` -> Q4_0_R16 (Q3_0_R16) at dst (rows x quant_rp_row_bytes) */
int quant_requant_q4_0(int type, const uint8_t *src, uint8_t *dst, int64_t rows, int64_t K, int nthreads) {
    return requant(type, src, dst, rows, K, nthreads, T_Q4_0_R16, RP_Q4_0_TILE, q4_0_block);
}

int quant_requant_q3_0(int type, const uint8_t *src, uint8_t *dst, int64_t rows, int64_t K, int nthreads) {
    return requant(type, src, dst, rows, K, nthreads, T_Q3_0_R16, RP_Q3_0_TILE, q3_0_block);
}
