/* The kernels on repacked weights (included by quant_q8.c only, after its act type, DPBUSD and
 * DPWSSD); quant_repack.c writes the tiles at load.
 *
 * At load, a GGUF matrix in any of the formats the kernels read is rewritten in memory
 * into tiles of 16 output rows: for each block of K (256 or 32 weights) a tile holds the 16 rows'
 * integers interleaved four weights at a time (one 32-bit lane a row), so one 512-bit load carries
 * four consecutive weights of all 16 rows and one vpdpbusd against four broadcast activation bytes
 * adds them into 16 per-row sums. The sub-block scales and mins are expanded to a byte a row and the
 * block scales kept as 16 halves, so the scale work runs across the 16 rows in one register and no
 * horizontal sum is left at the end: each lane is one output.
 *
 * A kernel takes one tile against C <= RP_MAXC activation rows; the weights are unpacked once for
 * all C rows. Per output lane the integer sums are exact and the float operations (one conversion and
 * two FMAs a block for Q4_K, Q5_K and Q2_K, one for the others) run in block order whatever C is, and in the same
 * order in the AVX2 build (two 8-lane halves) and the NEON one (four 4-lane quarters: sdot, or its
 * floor without dotprod) as in the AVX-512 one: a row's bits depend on neither the row count nor the
 * build (tests/test_arm.py). The kernel bodies are written once, in the R_* macros each build defines.
 *
 * Tile layouts, per block (bytes; row i of the tile is lane i; "chunk" = 64 bytes, 4 per row):
 *   Q4_K_R16 (2368 = 16 x 148): chunk 4s + r (s = sub-block 0..7, r = 0..3): row i's byte b holds
 *     q[32s + 4r + b] in its low nibble and q[32s + 16 + 4r + b] in its high one; @2048 the scales
 *     u8 [8][16]; @2176 the mins u8 [4][16][2] (row i: m[2p], m[2p + 1]); @2304 d f16 [16];
 *     @2336 dmin f16 [16].
 *   Q5_K_R16 (2880 = 16 x 180): Q4_K_R16's bytes (q's low four bits), then @2368 a chunk per sub-block s:
 *     row i's byte b holds bit 4 of chunk 4s + r's low-nibble weight at bit r and of its high-nibble one
 *     at bit 4 + r.
 *   Q3_K_R16 (1824 = 16 x 114; q = w / (d sc) + 4 in 0..7): per 16 weights u (0..15) a chunk at 64u with
 *     group g's (16u + 4g + b) two low bits at bits 2g, 2g + 1; @1024 a chunk per pair of u, bit 4 (u % 2)
 *     + g their third bit; @1536 the scales i8 [16][16] (less 32); @1792 d f16 [16].
 *   Q2_K_R16 (1344 = 16 x 84, the file's own size): per 16 weights u (0..15) a chunk at 64u with group g's
 *     (16u + 4g + b) two bits at bits 2g, 2g + 1 (Q3_K_R16's first chunks); @1024 the file's scale bytes (scale
 *     low nibble, min high) u8 [8][16][2] (row i: those of u = 2p, 2p + 1); @1280 d f16 [16]; @1312 dmin f16 [16].
 *   Q6_K_R16 (3360 = 16 x 210): per 16 weights u (0..15) 192 bytes at 192u: a chunk with groups
 *     (16u + b, 16u + 4 + b) in its low / high nibbles, a chunk with (16u + 8 + b, 16u + 12 + b),
 *     and a chunk with the four groups' two high bits (bits 2g, 2g + 1 for group g); @3072 the
 *     scales i8 [16][16]; @3328 d f16 [16].
 *   Q8_0_R16 (544 = 16 x 34): chunk g (0..7): row i's byte b is w[4g + b] ^ RP_Q8_BIAS: w + 128
 *     (unsigned, vpdpbusd's operand) on x86, w itself (sdot's and smmla's signed operand) on NEON;
 *     @512 d f16 [16].
 *   Q4_0_R16 (288 = 16 x 18): chunk g (0..3): row i's byte b holds q[4g + b] (low nibble) and
 *     q[16 + 4g + b] (high), q = w / d + 8 in 0..15 (the file's qs bytes as they are); @256 d f16 [16].
 *   Q4_1_R16 (320 = 16 x 20): Q4_0_R16's nibbles (w = d q + m); @256 d f16 [16]; @288 m f16 [16].
 *   Q5_0_R16 (352 = 16 x 22): Q4_0_R16's nibbles, then @256 a chunk of fifth bits: row i's byte b holds bit 4 of
 *     chunk g's low-nibble weight at bit g and of its high-nibble one at bit 4 + g (Q5_K_R16's); q in 0..31,
 *     w = d (q - 16); @320 d f16 [16]. Q5_1_R16 (384 = 16 x 24): the same, w = d q + m; @320 d, @352 m.
 *   Q3_0_R16 (224 = 16 x 14; q = w / d + 4 in 0..7): chunk c (0..2): row i's byte b holds q[8c + b] at
 *     bits 0-2, q[8c + 4 + b] at bits 4-6, and bit c of q[24 + b] and of q[28 + b] at bits 3 and 7 (so six
 *     groups unpack as Q4_0's nibbles do, and the last two gather from the spare bits); @192 d f16 [16].
 *   IQ4_NL_R16 (288): Q4_0_R16's layout, the nibbles indices into IQ4_VALUES. IQ4_XS_R16 (2208 = 16 x 138): per
 *     32 weights s (0..7) such 256 bytes at 256s; @2048 the scales i8 [8][16] (ls - 32); @2176 d f16 [16].
 * The offsets meet the activations' sums: act.o holds them per 16 activations, made ready for each
 * format (Q4_K: the 32-sums in int16 pairs; Q6_K: -32 x the 16-sums, or in the int16 build -16 x them in
 * int16 pairs; Q2_K: the 16-sums in int16 pairs; the 32-weight formats: -o x
 * the 32-sums, the start value of each block's dot product). */
#ifndef SPECDEC_QUANT_RP_H
#define SPECDEC_QUANT_RP_H

#define RP_MAXC 8 /* activation rows a kernel call takes (the types, RP_ROWS, the tile sizes: kernels.h) */

#if SIMD_NEON
#include "quant_rp_neon.h" /* RP_W 4: four quarters of a chunk */
#elif defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#define RP_W 16
typedef __m512i rvi;
typedef __m512 rvf;
#define R_LOAD(p) _mm512_loadu_si512((const void *)(p))
#define R_SET1(x) _mm512_set1_epi32(x)
#define R_SET1B(x) _mm512_set1_epi8(x)
#define R_ZERO() _mm512_setzero_si512()
#define R_AND(a, b) _mm512_and_si512(a, b)
#define R_OR(a, b) _mm512_or_si512(a, b)
#define R_SRLI16(a, n) _mm512_srli_epi16(a, n)
#define R_SRLI32(a, n) _mm512_srli_epi32(a, n)
#define R_SLLI16(a, n) _mm512_slli_epi16(a, n)
#define R_ADD(a, b) _mm512_add_epi32(a, b)
#define R_MULLO(a, b) _mm512_mullo_epi32(a, b)
#define R_DPBUSD(acc, u, s) _mm512_dpbusd_epi32(acc, u, s)
#define R_DPWSSD(acc, a, b) _mm512_dpwssd_epi32(acc, a, b)
#define R_U8_32(p) _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p)))
#define R_S8_32(p) _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p)))
#define R_U8_16(p) _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(p)))
#define R_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define R_CVT(a) _mm512_cvtepi32_ps(a)
#define R_FZERO() _mm512_setzero_ps()
#define R_FSET1(x) _mm512_set1_ps(x)
#define R_FMUL(a, b) _mm512_mul_ps(a, b)
#define R_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define R_STOREF(p, v) _mm512_storeu_ps(p, v)
#define R_TABLE16(p) _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(p)))
#define R_LOOKUP(t, i) _mm512_shuffle_epi8(t, i)
#define R_VNNI 1
#else
#define RP_W 8
typedef __m256i rvi;
typedef __m256 rvf;
#define R_LOAD(p) _mm256_loadu_si256((const __m256i *)(p))
#define R_SET1(x) _mm256_set1_epi32(x)
#define R_SET1B(x) _mm256_set1_epi8(x)
#define R_ZERO() _mm256_setzero_si256()
#define R_AND(a, b) _mm256_and_si256(a, b)
#define R_OR(a, b) _mm256_or_si256(a, b)
#define R_SRLI16(a, n) _mm256_srli_epi16(a, n)
#define R_SRLI32(a, n) _mm256_srli_epi32(a, n)
#define R_SLLI16(a, n) _mm256_slli_epi16(a, n)
#define R_ADD(a, b) _mm256_add_epi32(a, b)
#define R_MULLO(a, b) _mm256_mullo_epi32(a, b)
#define R_DPBUSD(acc, u, s) DPBUSD(acc, u, s)
#define R_DPWSSD(acc, a, b) DPWSSD(acc, a, b)
#define R_U8_32(p) _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p)))
#define R_S8_32(p) _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p)))
#define R_U8_16(p) _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(p)))
#define R_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define R_CVT(a) _mm256_cvtepi32_ps(a)
#define R_FZERO() _mm256_setzero_ps()
#define R_FSET1(x) _mm256_set1_ps(x)
#define R_FMUL(a, b) _mm256_mul_ps(a, b)
#define R_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define R_STOREF(p, v) _mm256_storeu_ps(p, v)
#define R_TABLE16(p) _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(p)))
#define R_LOOKUP(t, i) _mm256_shuffle_epi8(t, i)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) || defined(__AVXVNNI__)
#define R_VNNI 1
#else
#define R_VNNI 0 /* DPBUSD is maddubs + madd: exact only while a pair of products fits int16 */
#endif
#endif
#define RP_H (RP_ROWS / RP_W) /* register widths a tile takes: 1 (AVX-512), 2 (AVX2) or 4 (NEON) */

/* The activations meet the weights four bytes at a time, those four bytes against every lane: x86
 * broadcasts them from memory (a load port's work); NEON loads 16 bytes once (R_XLOAD) and takes lane
 * g of them in sdot's by-element form. R_XDOT(acc, u, xv, g) is R_DPBUSD against bytes 4g..4g + 3 of
 * xv's 16; R_Q8_XDOT is R_Q8_DOT so. */
#ifndef R_XLOAD
typedef const int8_t *rxv;
#define R_XLOAD(p) ((const int8_t *)(p))
#define R_XDOT(acc, u, xv, g) R_DPBUSD(acc, u, R_SET1(ld32((xv) + 4 * (g))))
#define R_Q8_XDOT(dot, raw, xv, g) R_Q8_DOT(dot, raw, R_SET1(ld32((xv) + 4 * (g))))
#define R_XSET1(xv, g) R_SET1(ld32((xv) + 4 * (g)))
#define R_SUB_XDOT_AT(acc, u, p, g) R_SUB_DOT(acc, u, R_SET1(ld32(p)))
#else /* the four bytes at p are bytes 4g .. 4g + 3 of the 16 at p - 4g (one load for every g) */
#define R_SUB_XDOT_AT(acc, u, p, g) R_SUB_XDOT(acc, u, R_XLOAD((p) - 4 * (g)), g)
#endif

/* A sub-block's products and its scale. Per 32-bit lane (one output row): acc = R_SUB_DOT(acc, u, s)
 * adds the four products u * s (u: bytes 0..63, s: int8), R_SUB_SCALE(is, acc, sc) adds acc's sum
 * times the lane's scale (sc from R_SC_U8 / R_SC_S8), R_SUB_TOTAL(o, acc) is o plus acc's sum (the
 * 32-weight formats: no scale). R_SUB_FROM(o) starts a sum at o where the accumulator is int32 (Q6_K's
 * offsets; the int16 build adds them a block at a time instead). R_SUB_CAP_Q4 / R_SUB_CAP_Q6: how
 * many R_SUB_DOTs of nibbles / 6-bit values one acc takes. The integers are the same every way, so a
 * row's bits do not depend on which is built.
 *  - int32 (AVX-512 VNNI, AVX-VNNI): vpdpbusd, then vpmulld by the scale.
 *  - int16 (AVX2 without VNNI, R_SUB16 1): vpmaddubsw's pair sums added as int16 (exact while CAP of them
 *    fit: 8 x 2 x 15 x 127 and 2 x 2 x 63 x 127 < 2^15), then one vpmaddwd by the scale as an int16
 *    pair: no vpmulld, and no vpmaddwd by ones per four products as DPBUSD without VNNI needs. */
#ifndef R_SUB16
#define R_SUB16 (RP_W == 8 && !R_VNNI) /* AVX-VNNI: int32 measured faster (int16 sums: Q4_K 1.15-1.2x the time; raw/targets/rp-rows.txt) */
#endif
#if !R_SUB16
typedef rvi rsub;
#define R_SUB_ZERO() R_ZERO()
#define R_SUB_FROM(o) R_SET1(o)
#define R_SUB_DOT(acc, u, s) R_DPBUSD(acc, u, s)
#define R_SUB_XDOT(acc, u, xv, g) R_XDOT(acc, u, xv, g)
#define R_SUB_ADD(a, b) R_ADD(a, b)
#define R_SC_OF32(v) (v)
#define R_SC_U8(p) R_U8_32(p)
#define R_SC_S8(p) R_S8_32(p)
#define R_SUB_SCALE(is, acc, sc) R_ADD(is, R_MULLO(acc, sc))
#define R_SUB_TOTAL(o, acc) (acc)
#define R_SUB_CAP_Q4 64
#define R_SUB_CAP_Q6 64
#else
typedef __m256i rsub;
static inline __m256i r_pair16(__m256i v) { /* int32 lanes of int16 values -> (v, v) int16 pairs */
    return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(v, 16));
}
#define R_SUB_ZERO() _mm256_setzero_si256()
#define R_SUB_FROM(o) _mm256_setzero_si256()
#define R_SUB_DOT(acc, u, s) _mm256_add_epi16(acc, _mm256_maddubs_epi16(u, s))
#define R_SUB_XDOT(acc, u, xv, g) R_SUB_DOT(acc, u, R_XSET1(xv, g))
#define R_SUB_ADD(a, b) _mm256_add_epi16(a, b)
#define R_SC_OF32(v) r_pair16(v) /* a scale a lane as int32 -> as R_SUB_SCALE takes it */
#define R_SC_U8(p) r_pair16(R_U8_32(p))
#define R_SC_S8(p) r_pair16(R_S8_32(p))
#define R_SUB_SCALE(is, acc, sc) DPWSSD(is, acc, sc)
#define R_SUB_TOTAL(o, acc) DPWSSD(R_SET1(o), acc, _mm256_set1_epi16(1))
/* Q6_K's scales of 16-weight groups 2j and 2j + 1 (at p and p + 16) as an int16 pair a lane */
#define R_SC_PAIRS(p) _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(p)), \
                                                             _mm_loadl_epi64((const __m128i *)((p) + 16))))
#define R_SUB_CAP_Q4 8
#define R_SUB_CAP_Q6 2
#endif

#ifndef RP_PF
#define RP_PF 8192 /* software prefetch distance (bytes ahead in the tile's stream; 0: none) */
#endif
/* lines [l0, l0 + nl) of the stream RP_PF bytes ahead of p, into SD_PREFETCH's cache level (only the
 * first half prefetches) */
#define RP_PREFETCH(p, l0, nl, h)                                                                    \
    do {                                                                                             \
        if (RP_PF > 0 && (h) == 0)                                                                   \
            for (int l_ = (l0); l_ < (l0) + (nl); l_++) SD_PREFETCH((const char *)(p) + RP_PF + 64 * l_);          \
    } while (0)

static inline int32_t ld32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Q4_K: per sub-block s, its 32 weights' products q . a (exact) times sc[s] into isum; mt = sum m[j]
 * x (32-sum a)_j; f += isum x (d da) - ... as two FMAs (the K-quant kernel's float steps). With 16
 * vector registers (RP_UNPACK_FIRST) the sub-block's eight integer vectors are unpacked once and met
 * row by row; with 32, a quarter of them at a time meets every row's sums (which then stay in
 * registers). Up to two activation rows keep two product chains (the low and high nibbles) so the
 * latency does not bind. Q5_K (HB 1) is the same kernel with each weight's fifth bit put in from its
 * sub-block's chunk of them: a low-nibble weight of chunk r takes bit r, a high one bit 4 + r, both to bit
 * 4 by shifts that keep each bit in its byte. Its q up to 31 would overflow the int16 build's sum of
 * eight pairs (8 x 2 x 31 x 127), so there the two chains always run apart and meet the scale apart:
 * the same integers. */
/* a kernel's float sums, a lane per output row: f[RP_H][C] zeroed, and at the end stored to y's rows */
#define RP_F_ZERO(f, C)                                                                              \
    rvf f[RP_H][C];                                                                                  \
    for (int h = 0; h < RP_H; h++)                                                                   \
        for (int c = 0; c < (C); c++) f[h][c] = R_FZERO()
#define RP_F_STORE(f, C)                                                                             \
    for (int h = 0; h < RP_H; h++)                                                                   \
        for (int c = 0; c < (C); c++) R_STOREF(y + c * ldy + RP_W * h, f[h][c])
#define RP_UNPACK_FIRST (RP_W == 8)
/* a block's float steps with mins (Q4_K, Q5_K, Q2_K): per row, mt = sum_p mn[p] . o[p] (NP int16 pairs of mins
 * against act.o's int16 pairs of activation sums), then f += isum x (d da) + mt x (-dmin da) in two FMAs */
#define RP_MIN_STEPS(C, NP, mn, dv, ndv)                                                             \
    for (int c = 0; c < (C); c++) {                                                                  \
        const int32_t *o = a->o + c * K16 + (NP) * ib;                                               \
        rvi mt = R_DPWSSD(R_ZERO(), mn[0], R_SET1(o[0]));                                            \
        for (int p = 1; p < (NP); p++) mt = R_DPWSSD(mt, mn[p], R_SET1(o[p]));                       \
        const rvf da = R_FSET1(a->d[c * nb + ib]);                                                   \
        f[h][c] = R_FMA(R_CVT(is[c]), R_FMUL(dv, da), f[h][c]);                                      \
        f[h][c] = R_FMA(R_CVT(mt), R_FMUL(ndv, da), f[h][c]);                                        \
    }
/* the fifth bits of the sub-block's chunk r: tl for its low nibbles, th for its high ones; each step
 * takes bit 4 and moves the next chunk's bit there (hb's low half shifted up by 4, or as it is) */
#define RP_K5_BITS(lo, hi, tl, th, b4)                                                               \
    do {                                                                                             \
        lo = R_OR(lo, R_AND(tl, b4)), hi = R_OR(hi, R_AND(th, b4));                                  \
        tl = R_SRLI16(tl, 1), th = R_SRLI16(th, 1);                                                  \
    } while (0)
#define DEFINE_RP_K4(NAME, TILE, HB, C)                                                              \
    static void NAME##_c##C(const uint8_t *w, const act *a, float *y, int64_t ldy) {                \
        enum { TWO = C <= 2 || (HB && R_SUB16), APART = HB && R_SUB16 };                             \
        const int64_t K = a->K, nb = K / 256, K16 = K / 16;                                          \
        const rvi nib = R_SET1B(0x0F), b4 = R_SET1B(0x10);                                           \
        (void)b4;                                                                                    \
        RP_F_ZERO(f, C);                                                                             \
        for (int64_t ib = 0; ib < nb; ib++) {                                                        \
            for (int h = 0; h < RP_H; h++) {                                                         \
                const uint8_t *blk = w + ib * TILE;                                                  \
                rvi is[C];                                                                           \
                for (int c = 0; c < C; c++) is[c] = R_ZERO();                                        \
                for (int s = 0; s < 8; s++) {                                                        \
                    RP_PREFETCH(blk, (TILE / 64 + 7) / 8 * s, (TILE / 64 + 7) / 8, h);               \
                    rvi tl = R_ZERO(), th = R_ZERO();                                                \
                    if (HB) {                                                                        \
                        th = R_LOAD(blk + RP_Q4_K_TILE + 64 * s + 4 * RP_W * h);                     \
                        tl = R_SLLI16(th, 4);                                                        \
                    }                                                                                \
                    if (RP_UNPACK_FIRST) { /* the sub-block's integers once, then row by row */      \
                        rvi q[8];                                                                    \
                        for (int r = 0; r < 4; r++) {                                                \
                            const rvi raw = R_LOAD(blk + (4 * s + r) * 64 + 4 * RP_W * h);           \
                            q[2 * r] = R_AND(raw, nib), q[2 * r + 1] = R_AND(R_SRLI16(raw, 4), nib); \
                            if (HB) RP_K5_BITS(q[2 * r], q[2 * r + 1], tl, th, b4);                  \
                        }                                                                            \
                        const rvi sc = R_SC_U8(blk + 2048 + 16 * s + RP_W * h);                      \
                        for (int c = 0; c < C; c++) {                                                \
                            const int8_t *x = a->q + c * K + 256 * ib + 32 * s;                      \
                            const rxv xl = R_XLOAD(x), xh = R_XLOAD(x + 16);                         \
                            rsub acc = R_SUB_ZERO(), acc2 = R_SUB_ZERO();                            \
                            for (int r = 0; r < 4; r++) {                                            \
                                acc = R_SUB_XDOT(acc, q[2 * r], xl, r);                              \
                                if (TWO) acc2 = R_SUB_XDOT(acc2, q[2 * r + 1], xh, r);               \
                                else acc = R_SUB_XDOT(acc, q[2 * r + 1], xh, r);                     \
                            }                                                                        \
                            if (APART) is[c] = R_SUB_SCALE(R_SUB_SCALE(is[c], acc, sc), acc2, sc);   \
                            else is[c] = R_SUB_SCALE(is[c], TWO ? R_SUB_ADD(acc, acc2) : acc, sc);   \
                        }                                                                            \
                    } else { /* a quarter of the integers at a time against every row */            \
                        rsub acc[C], acc2[C];                                                        \
                        for (int c = 0; c < C; c++) acc[c] = R_SUB_ZERO(), acc2[c] = R_SUB_ZERO();   \
                        for (int r = 0; r < 4; r++) {                                                \
                            const rvi raw = R_LOAD(blk + (4 * s + r) * 64 + 4 * RP_W * h);           \
                            rvi lo = R_AND(raw, nib), hi = R_AND(R_SRLI16(raw, 4), nib);             \
                            if (HB) RP_K5_BITS(lo, hi, tl, th, b4);                                  \
                            for (int c = 0; c < C; c++) {                                            \
                                const int8_t *x = a->q + c * K + 256 * ib + 32 * s + 4 * r;          \
                                acc[c] = R_SUB_XDOT_AT(acc[c], lo, x, r);                            \
                                if (TWO) acc2[c] = R_SUB_XDOT_AT(acc2[c], hi, x + 16, r);            \
                                else acc[c] = R_SUB_XDOT_AT(acc[c], hi, x + 16, r);                  \
                            }                                                                        \
                        }                                                                            \
                        const rvi sc = R_SC_U8(blk + 2048 + 16 * s + RP_W * h);                      \
                        for (int c = 0; c < C; c++) {                                                \
                            if (APART) is[c] = R_SUB_SCALE(R_SUB_SCALE(is[c], acc[c], sc), acc2[c], sc); \
                            else is[c] = R_SUB_SCALE(is[c], TWO ? R_SUB_ADD(acc[c], acc2[c]) : acc[c], sc); \
                        }                                                                            \
                    }                                                                                \
                }                                                                                    \
                rvi mn[4];                                                                           \
                for (int p = 0; p < 4; p++) mn[p] = R_U8_16(blk + 2176 + 32 * p + 2 * RP_W * h);     \
                const rvf dv = R_F16(blk + 2304 + 2 * RP_W * h);                                     \
                const rvf ndv = R_FMUL(R_F16(blk + 2336 + 2 * RP_W * h), R_FSET1(-1.0f));           \
                RP_MIN_STEPS(C, 4, mn, dv, ndv)                                                      \
            }                                                                                        \
        }                                                                                            \
        RP_F_STORE(f, C);                                                                            \
    }

/* Q6_K (KIND 6): per 16 weights u, isum += sc[u] x (q . a - 32 (16-sum a)_u); f += isum x (d da). The int16
 * build adds the offsets once a block: act.o holds (-16 s[2j], -16 s[2j + 1]) as int16 pairs (O_PAIRS16),
 * which meet each row's scale pairs in one vpmaddwd per two groups; twice that is the offsets' sum.
 * Q3_K (KIND 3) is the same kernel on its own tile: q in 0..7, the offsets -4 (16-sum a) (act.o: O_NEG4_16,
 * or in the int16 build O_PAIRS16_2, -2 x the sums), each u's four groups from one chunk of 2-bit fields
 * and their third bits from the chunk u shares with its neighbour (u even: bits 0-3, odd: 4-7), taken
 * to bit 2 one step at a time. Q2_K (KIND 2): Q3_K's chunks of 2-bit fields alone, with no offset; the scale of u
 * from the file's byte (its low nibble), and the mins (its high nibbles, two u a lane as an int16 pair) meet
 * the 16-sums in int16 pairs (act.o: O_PAIRS16_1) in one vpmaddwd per two u, for Q4_K's second FMA by
 * -dmin da. Its four products of q <= 3 a u fit the int16 build's sum without a flush. */
#if R_SUB16
#define RP_K6_OFFSETS(C, SC_AT)                                                                      \
    {                                                                                                \
        rvi scp[8];                                                                                  \
        for (int j = 0; j < 8; j++) scp[j] = R_SC_PAIRS(blk + SC_AT + 32 * j + RP_W * h);            \
        for (int c = 0; c < C; c++) {                                                                \
            const int32_t *o = a->o + c * K16 + 8 * ib;                                              \
            rvi ofs = R_DPWSSD(R_ZERO(), scp[0], R_SET1(o[0]));                                      \
            for (int j = 1; j < 8; j++) ofs = R_DPWSSD(ofs, scp[j], R_SET1(o[j]));                   \
            is[c] = R_ADD(is[c], R_ADD(ofs, ofs));                                                   \
        }                                                                                            \
    }
#else
#define RP_K6_OFFSETS(C, SC_AT)
#endif
#define DEFINE_RP_K6(NAME, TILE, KIND, C)                                                            \
    static void NAME##_c##C(const uint8_t *w, const act *a, float *y, int64_t ldy) {                \
        enum { Q3 = KIND == 3, Q2 = KIND == 2, SC_AT = Q3 ? 1536 : Q2 ? 1024 : 3072,                  \
               D_AT = Q3 ? 1792 : Q2 ? 1280 : 3328, LINES = (TILE / 64 + 15) / 16 };                 \
        const int64_t K = a->K, nb = K / 256, K16 = K / 16;                                          \
        const rvi nib = R_SET1B(0x0F), m30 = R_SET1B(0x30), m3 = R_SET1B(0x03), m4 = R_SET1B(0x04);  \
        (void)nib, (void)m30, (void)m3, (void)m4;                                                    \
        RP_F_ZERO(f, C);                                                                             \
        for (int64_t ib = 0; ib < nb; ib++) {                                                        \
            for (int h = 0; h < RP_H; h++) {                                                         \
                const uint8_t *blk = w + ib * TILE;                                                  \
                rvi is[C];                                                                           \
                for (int c = 0; c < C; c++) is[c] = R_ZERO();                                        \
                for (int u = 0; u < 16; u++) {                                                       \
                    RP_PREFETCH(blk, LINES * u, LINES, h);                                           \
                    rvi q0, q1, q2, q3;                                                              \
                    if (Q2) {                                                                        \
                        rvi c2 = R_LOAD(blk + 64 * u + 4 * RP_W * h);                                \
                        q0 = R_AND(c2, m3), c2 = R_SRLI16(c2, 2);                                    \
                        q1 = R_AND(c2, m3), c2 = R_SRLI16(c2, 2);                                    \
                        q2 = R_AND(c2, m3), q3 = R_AND(R_SRLI16(c2, 2), m3);                         \
                    } else if (Q3) {                                                                 \
                        rvi c2 = R_LOAD(blk + 64 * u + 4 * RP_W * h);                                \
                        const rvi hb = R_LOAD(blk + 1024 + 64 * (u >> 1) + 4 * RP_W * h);            \
                        rvi t = (u & 1) ? R_SRLI16(hb, 2) : R_SLLI16(hb, 2);                         \
                        q0 = R_OR(R_AND(c2, m3), R_AND(t, m4));                                      \
                        c2 = R_SRLI16(c2, 2), t = R_SRLI16(t, 1);                                    \
                        q1 = R_OR(R_AND(c2, m3), R_AND(t, m4));                                      \
                        c2 = R_SRLI16(c2, 2), t = R_SRLI16(t, 1);                                    \
                        q2 = R_OR(R_AND(c2, m3), R_AND(t, m4));                                      \
                        c2 = R_SRLI16(c2, 2), t = R_SRLI16(t, 1);                                    \
                        q3 = R_OR(R_AND(c2, m3), R_AND(t, m4));                                      \
                    } else {                                                                         \
                        const uint8_t *b = blk + 192 * u + 4 * RP_W * h;                             \
                        const rvi n0 = R_LOAD(b), n1 = R_LOAD(b + 64), hb = R_LOAD(b + 128);         \
                        q0 = R_OR(R_AND(n0, nib), R_AND(R_SLLI16(hb, 4), m30));                      \
                        q1 = R_OR(R_AND(R_SRLI16(n0, 4), nib), R_AND(R_SLLI16(hb, 2), m30));         \
                        q2 = R_OR(R_AND(n1, nib), R_AND(hb, m30));                                   \
                        q3 = R_OR(R_AND(R_SRLI16(n1, 4), nib), R_AND(R_SRLI16(hb, 2), m30));         \
                    }                                                                                \
                    rvi sc;                                                                          \
                    if (Q2) {                                                                        \
                        const rvi sp = R_U8_16(blk + SC_AT + 32 * (u >> 1) + 2 * RP_W * h);          \
                        sc = R_SC_OF32(R_AND((u & 1) ? R_SRLI32(sp, 16) : sp, R_SET1(15)));           \
                    } else {                                                                         \
                        sc = R_SC_S8(blk + SC_AT + 16 * u + RP_W * h);                               \
                    }                                                                                \
                    for (int c = 0; c < C; c++) {                                                    \
                        const int8_t *x = a->q + c * K + 256 * ib + 16 * u;                          \
                        const rxv xv = R_XLOAD(x);                                                   \
                        rsub acc = R_SUB_XDOT(R_SUB_FROM(R_SUB16 || Q2 ? 0 : a->o[c * K16 + 16 * ib + u]), q0, xv, 0); \
                        acc = R_SUB_XDOT(acc, q1, xv, 1);                                            \
                        if (R_SUB_CAP_Q6 < 4 && !Q2) is[c] = R_SUB_SCALE(is[c], acc, sc), acc = R_SUB_ZERO(); \
                        acc = R_SUB_XDOT(acc, q2, xv, 2);                                            \
                        acc = R_SUB_XDOT(acc, q3, xv, 3);                                            \
                        is[c] = R_SUB_SCALE(is[c], acc, sc);                                         \
                    }                                                                                \
                }                                                                                    \
                if (!Q2) { RP_K6_OFFSETS(C, SC_AT) }                                                 \
                const rvf dv = R_F16(blk + D_AT + 2 * RP_W * h);                                     \
                if (Q2) {                                                                            \
                    rvi mn[8];                                                                       \
                    for (int p = 0; p < 8; p++) mn[p] = R_SRLI16(R_U8_16(blk + SC_AT + 32 * p + 2 * RP_W * h), 4); \
                    const rvf ndv = R_FMUL(R_F16(blk + D_AT + 32 + 2 * RP_W * h), R_FSET1(-1.0f));  \
                    RP_MIN_STEPS(C, 8, mn, dv, ndv)                                                  \
                } else {                                                                             \
                    for (int c = 0; c < C; c++)                                                      \
                        f[h][c] = R_FMA(R_CVT(is[c]), R_FMUL(dv, R_FSET1(a->d[c * nb + ib])), f[h][c]); \
                }                                                                                    \
            }                                                                                        \
        }                                                                                            \
        RP_F_STORE(f, C);                                                                            \
    }

/* The 32-weight formats: dot = q . a from the start value -o (32-sum a) (act.o), f += dot x (d da).
 * Q8_0's unsigned w + 128 against signed activations overflows AVX2's maddubs pairs, so without
 * VNNI it meets them as |w| . sign(a, w) from 0: the same integer. */
#if defined(R_Q8_DOT) /* the build's own (NEON) */
#elif R_VNNI
#define R_Q8_DOT(dot, raw, xv) R_DPBUSD(dot, raw, xv)
#define R_Q8_START(o) R_SET1(o)
#else
#define R_Q8_DOT(dot, raw, xv)                                                                       \
    _mm256_add_epi32(dot, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(_mm256_xor_si256(raw, _mm256_set1_epi8((char)0x80))), \
        _mm256_sign_epi8(xv, _mm256_xor_si256(raw, _mm256_set1_epi8((char)0x80)))), _mm256_set1_epi16(1)))
#define R_Q8_START(o) R_ZERO()
#endif
/* GROUPS: the chunks before d (d at 64 GROUPS); MIN: an m f16 [16] after d, met by the activations' sums sa
 * (da x their 32-sum) in a second FMA */
#define DEFINE_RP_B32(NAME, TILE, GROUPS, BODY, MIN)                                                 \
    static inline __attribute__((always_inline)) void NAME(const uint8_t *w, const act *a, float *y, int64_t ldy, \
                                                            int C) {                                          \
        const int64_t K = a->K, nb = K / 32, K16 = K / 16;                                           \
        (void)K16;                                                                                   \
        rvf f[RP_H][RP_MAXC];                                                                        \
        for (int h = 0; h < RP_H; h++)                                                               \
            for (int c = 0; c < C; c++) f[h][c] = R_FZERO();                                         \
        for (int64_t ib = 0; ib < nb; ib++) {                                                        \
            for (int h = 0; h < RP_H; h++) {                                                         \
                const uint8_t *blk = w + ib * TILE;                                                  \
                RP_PREFETCH(blk, 0, (TILE + 63) / 64, h);                                            \
                rvi dot[RP_MAXC];                                                                    \
                BODY                                                                                 \
                const rvf dv = R_F16(blk + GROUPS * 64 + 2 * RP_W * h);                              \
                for (int c = 0; c < C; c++)                                                          \
                    f[h][c] = R_FMA(R_CVT(dot[c]), R_FMUL(dv, R_FSET1(a->d[c * nb + ib])), f[h][c]); \
                if (MIN) {                                                                           \
                    const rvf mv = R_F16(blk + GROUPS * 64 + 32 + 2 * RP_W * h);                     \
                    for (int c = 0; c < C; c++) f[h][c] = R_FMA(mv, R_FSET1(a->sa[c * nb + ib]), f[h][c]); \
                }                                                                                    \
            }                                                                                        \
        }                                                                                            \
        RP_F_STORE(f, C);                                                                            \
    }
#define RP_Q8_0_BODY                                                                                 \
    for (int c = 0; c < C; c++) dot[c] = R_Q8_START(a->o[c * K16 + 2 * ib]);                         \
    for (int g = 0; g < 8; g++) {                                                                    \
        const rvi raw = R_LOAD(blk + 64 * g + 4 * RP_W * h);                                         \
        for (int c = 0; c < C; c++)                                                                  \
            dot[c] = R_Q8_XDOT(dot[c], raw, R_XLOAD(a->q + c * K + 32 * ib + 16 * (g >> 2)), g & 3);  \
    }
/* Q4_0 and Q3_0 (and Q4_1, Q5_0, Q5_1): q[g] holds weights 4g .. 4g + 3 of a lane (g 0..7); dot = o + q . a, row
 * by row (O: the start value, act.o's, or 0 where a min, not an offset, follows). Five-bit q (FIVE) would overflow
 * the int16 build's sum of eight pairs (8 x 2 x 31 x 127), so there the low and high halves sum apart (4 pairs
 * each) and meet in int32 */
#define RP_B32_DOTS(O, FIVE)                                                                         \
    for (int c = 0; c < C; c++) {                                                                    \
        const int8_t *x = a->q + c * K + 32 * ib;                                                    \
        const int32_t o = O;                                                                         \
        const rxv xl = R_XLOAD(x), xh = R_XLOAD(x + 16);                                             \
        rsub acc = R_SUB_FROM(o), acc2 = R_SUB_ZERO();                                               \
        for (int g = 0; g < 4; g++) {                                                                \
            acc = R_SUB_XDOT(acc, q[g], xl, g);                                                      \
            if (FIVE && R_SUB16) acc2 = R_SUB_XDOT(acc2, q[4 + g], xh, g);                           \
            else acc = R_SUB_XDOT(acc, q[4 + g], xh, g);                                             \
        }                                                                                            \
        if (FIVE && R_SUB16) dot[c] = R_ADD(R_SUB_TOTAL(o, acc), R_SUB_TOTAL(0, acc2));              \
        else dot[c] = R_SUB_TOTAL(o, acc);                                                           \
    }
#define RP_B32_SMALL_DOTS RP_B32_DOTS(a->o[c * K16 + 2 * ib], 0)
#define RP_NIBBLES(q)                                                                                \
    for (int g = 0; g < 4; g++) {                                                                    \
        const rvi raw = R_LOAD(blk + 64 * g + 4 * RP_W * h);                                         \
        q[g] = R_AND(raw, R_SET1B(0x0F)), q[4 + g] = R_AND(R_SRLI16(raw, 4), R_SET1B(0x0F));         \
    }
#define RP_Q4_0_BODY                                                                                 \
    rvi q[8];                                                                                        \
    RP_NIBBLES(q)                                                                                    \
    RP_B32_SMALL_DOTS
/* Q4_1, Q5_0, Q5_1: the nibbles, for Q5 each with its fifth bit from the chunk at 256 (RP_K5_BITS: chunk g's
 * low-nibble weights take bit g, its high ones bit 4 + g), then the dots from -16 (32-sum a) (Q5_0) or 0 */
#define RP_Q5_BITS(q)                                                                                \
    {                                                                                                \
        const rvi b4 = R_SET1B(0x10);                                                                \
        rvi th = R_LOAD(blk + 256 + 4 * RP_W * h), tl = R_SLLI16(th, 4);                             \
        for (int g = 0; g < 4; g++) RP_K5_BITS(q[g], q[4 + g], tl, th, b4);                          \
    }
#define RP_Q4_1_BODY                                                                                 \
    rvi q[8];                                                                                        \
    RP_NIBBLES(q)                                                                                    \
    RP_B32_DOTS(0, 0)
#define RP_Q5_0_BODY                                                                                 \
    rvi q[8];                                                                                        \
    RP_NIBBLES(q)                                                                                    \
    RP_Q5_BITS(q)                                                                                    \
    RP_B32_DOTS(a->o[c * K16 + 2 * ib], 1)
#define RP_Q5_1_BODY                                                                                 \
    rvi q[8];                                                                                        \
    RP_NIBBLES(q)                                                                                    \
    RP_Q5_BITS(q)                                                                                    \
    RP_B32_DOTS(0, 1)
/* Q3_0: groups 2c and 2c + 1 (four weights a lane each) are chunk c's low and high 3-bit fields, groups
 * 6 and 7 the spare bits 3 and 7 of the three chunks gathered into one byte's two fields */
#define RP_Q3_0_BODY                                                                                 \
    rvi q[8];                                                                                        \
    {                                                                                                \
        const rvi m7 = R_SET1B(0x07), m88 = R_SET1B((char)0x88);                                     \
        const rvi c0 = R_LOAD(blk + 4 * RP_W * h), c1 = R_LOAD(blk + 64 + 4 * RP_W * h);             \
        const rvi c2 = R_LOAD(blk + 128 + 4 * RP_W * h);                                             \
        q[0] = R_AND(c0, m7), q[1] = R_AND(R_SRLI16(c0, 4), m7);                                     \
        q[2] = R_AND(c1, m7), q[3] = R_AND(R_SRLI16(c1, 4), m7);                                     \
        q[4] = R_AND(c2, m7), q[5] = R_AND(R_SRLI16(c2, 4), m7);                                     \
        const rvi sp = R_OR(R_OR(R_SRLI16(R_AND(c0, m88), 3), R_SRLI16(R_AND(c1, m88), 2)),          \
                            R_SRLI16(R_AND(c2, m88), 1));                                            \
        q[6] = R_AND(sp, m7), q[7] = R_AND(R_SRLI16(sp, 4), m7);                                     \
    }                                                                                                \
    RP_B32_SMALL_DOTS
/* IQ4_NL: Q4_0_R16's nibbles, each the index of its int8 value in IQ4_VALUES, looked up (a byte shuffle) as
 * the value ^ RP_Q8_BIAS, the byte Q8_0_R16 holds: then Q8_0's dot products from its start value */
#define IQ4B(v) (uint8_t)((v) ^ RP_Q8_BIAS)
static const uint8_t RP_IQ4_TABLE[16] = {IQ4B(-127), IQ4B(-104), IQ4B(-83), IQ4B(-65), IQ4B(-49), IQ4B(-35), IQ4B(-22),
                                         IQ4B(-10), IQ4B(1), IQ4B(13), IQ4B(25), IQ4B(38), IQ4B(53), IQ4B(69), IQ4B(89),
                                         IQ4B(113)};
#define RP_IQ4_UNPACK(q, base)                                                                       \
    for (int g = 0; g < 4; g++) {                                                                    \
        const rvi raw = R_LOAD((base) + 64 * g + 4 * RP_W * h), tbl = R_TABLE16(RP_IQ4_TABLE);       \
        q[g] = R_LOOKUP(tbl, R_AND(raw, R_SET1B(0x0F)));                                             \
        q[4 + g] = R_LOOKUP(tbl, R_AND(R_SRLI16(raw, 4), R_SET1B(0x0F)));                            \
    }
/* a 32-weight group's dot products (weights 4g .. 4g + 3 in q[g], 16 + 4g .. in q[4 + g]) from start o */
#define RP_IQ4_DOT(dot, q, x, o)                                                                     \
    {                                                                                                \
        const rxv xl = R_XLOAD(x), xh = R_XLOAD((x) + 16);                                           \
        dot = R_Q8_START(o);                                                                         \
        for (int g = 0; g < 4; g++) dot = R_Q8_XDOT(dot, q[g], xl, g), dot = R_Q8_XDOT(dot, q[4 + g], xh, g); \
    }
#define RP_IQ4_NL_BODY                                                                               \
    rvi q[8];                                                                                        \
    RP_IQ4_UNPACK(q, blk)                                                                            \
    for (int c = 0; c < C; c++) RP_IQ4_DOT(dot[c], q, a->q + c * K + 32 * ib, a->o[c * K16 + 2 * ib])
/* IQ4_XS: per 256, eight such groups (their tiles' chunks 256 bytes apart), each group's integer dot times
 * its scale (ls - 32) into isum, then one FMA by d da a block */
#define DEFINE_RP_IQ4_XS(C)                                                                          \
    static void rp_iq4_xs_c##C(const uint8_t *w, const act *a, float *y, int64_t ldy) {             \
        const int64_t K = a->K, nb = K / 256, K16 = K / 16;                                          \
        RP_F_ZERO(f, C);                                                                             \
        for (int64_t ib = 0; ib < nb; ib++) {                                                        \
            for (int h = 0; h < RP_H; h++) {                                                         \
                const uint8_t *blk = w + ib * RP_IQ4_XS_TILE;                                        \
                rvi is[C];                                                                           \
                for (int c = 0; c < C; c++) is[c] = R_ZERO();                                        \
                for (int s = 0; s < 8; s++) {                                                        \
                    RP_PREFETCH(blk, 4 * s, 4, h);                                                   \
                    rvi q[8];                                                                        \
                    RP_IQ4_UNPACK(q, blk + 256 * s)                                                  \
                    const rvi sc = R_S8_32(blk + 2048 + 16 * s + RP_W * h);                          \
                    for (int c = 0; c < C; c++) {                                                    \
                        rvi dot;                                                                     \
                        RP_IQ4_DOT(dot, q, a->q + c * K + 256 * ib + 32 * s, a->o[c * K16 + 16 * ib + 2 * s]) \
                        is[c] = R_ADD(is[c], R_MULLO(dot, sc));                                      \
                    }                                                                                \
                }                                                                                    \
                const rvf dv = R_F16(blk + 2176 + 2 * RP_W * h);                                     \
                for (int c = 0; c < C; c++)                                                          \
                    f[h][c] = R_FMA(R_CVT(is[c]), R_FMUL(dv, R_FSET1(a->d[c * nb + ib])), f[h][c]);  \
            }                                                                                        \
        }                                                                                            \
        RP_F_STORE(f, C);                                                                            \
    }
/* the 32-weight kernels: one body, inlined into a function per C (a constant C keeps the rows' sums in registers) */
DEFINE_RP_B32(rp_q8_0_any, RP_Q8_0_TILE, 8, RP_Q8_0_BODY, 0)
DEFINE_RP_B32(rp_q4_0_any, RP_Q4_0_TILE, 4, RP_Q4_0_BODY, 0)
DEFINE_RP_B32(rp_q3_0_any, RP_Q3_0_TILE, 3, RP_Q3_0_BODY, 0)
DEFINE_RP_B32(rp_iq4_nl_any, RP_IQ4_NL_TILE, 4, RP_IQ4_NL_BODY, 0)
DEFINE_RP_B32(rp_q4_1_any, RP_Q4_1_TILE, 4, RP_Q4_1_BODY, 1)
DEFINE_RP_B32(rp_q5_0_any, RP_Q5_0_TILE, 5, RP_Q5_0_BODY, 0)
DEFINE_RP_B32(rp_q5_1_any, RP_Q5_1_TILE, 5, RP_Q5_1_BODY, 1)
#if SIMD_NEON && defined(__ARM_FEATURE_MATMUL_INT8)
#include "quant_rp_mm.h" /* two input rows at a time in smmla: rp_b32_mm */
#define RP_MM_rp_q8_0 0 /* rp_b32_mm's q4 */
#define RP_MM_rp_q4_0 1
#define DEFINE_RP_B32_C(f, C)                                                                        \
    static void f##_c##C(const uint8_t *w, const act *a, float *y, int64_t ldy) {                   \
        if (C >= 2) rp_b32_mm(w, a, y, ldy, C, RP_MM_##f);                                          \
        else f##_any(w, a, y, ldy, C);                                                               \
    }
#else
#define DEFINE_RP_B32_C(f, C) DEFINE_RP_B32_PLAIN_C(f, C)
#endif
#define DEFINE_RP_B32_PLAIN_C(f, C) /* Q3_0 everywhere: no smmla form */                            \
    static void f##_c##C(const uint8_t *w, const act *a, float *y, int64_t ldy) { f##_any(w, a, y, ldy, C); }

#define RP_ALL_C(X, f) X(f, 1) X(f, 2) X(f, 3) X(f, 4) X(f, 5) X(f, 6) X(f, 7) X(f, 8)
#define RP_DEF_Q4_K(f, C) DEFINE_RP_K4(rp_q4_k, RP_Q4_K_TILE, 0, C)
#define RP_DEF_Q5_K(f, C) DEFINE_RP_K4(rp_q5_k, RP_Q5_K_TILE, 1, C)
#define RP_DEF_Q6_K(f, C) DEFINE_RP_K6(rp_q6_k, RP_Q6_K_TILE, 6, C)
#define RP_DEF_Q3_K(f, C) DEFINE_RP_K6(rp_q3_k, RP_Q3_K_TILE, 3, C)
#define RP_DEF_Q2_K(f, C) DEFINE_RP_K6(rp_q2_k, RP_Q2_K_TILE, 2, C)
#define RP_FN_OF(f, C) f##_c##C,
RP_ALL_C(RP_DEF_Q4_K, 0)
RP_ALL_C(RP_DEF_Q5_K, 0)
RP_ALL_C(RP_DEF_Q6_K, 0)
RP_ALL_C(RP_DEF_Q3_K, 0)
RP_ALL_C(RP_DEF_Q2_K, 0)
RP_ALL_C(DEFINE_RP_B32_C, rp_q8_0)
RP_ALL_C(DEFINE_RP_B32_C, rp_q4_0)
RP_ALL_C(DEFINE_RP_B32_PLAIN_C, rp_q3_0)
RP_ALL_C(DEFINE_RP_B32_PLAIN_C, rp_iq4_nl)
RP_ALL_C(DEFINE_RP_B32_PLAIN_C, rp_q4_1)
RP_ALL_C(DEFINE_RP_B32_PLAIN_C, rp_q5_0)
RP_ALL_C(DEFINE_RP_B32_PLAIN_C, rp_q5_1)
#define RP_DEF_IQ4_XS(f, C) DEFINE_RP_IQ4_XS(C)
RP_ALL_C(RP_DEF_IQ4_XS, 0)

/* O_*: what act.o holds for a format */
enum { O_PAIRS32 = 1, O_NEG32_16 = 2, O_NEG128_32 = 3, O_NEG8_32 = 4, O_PAIRS16 = 5, O_NEG4_32 = 6, O_NEG4_16 = 7,
       O_PAIRS16_2 = 8, O_PAIRS16_1 = 9, O_NEG16_32 = 10 };
typedef struct {
    q8_fn fn[RP_MAXC + 1];
    int64_t qk, tile, act_block;
    int o_kind;
} rp_kernels;
static const rp_kernels RP_Q4_K = {{0, RP_ALL_C(RP_FN_OF, rp_q4_k)}, 256, RP_Q4_K_TILE, 256, O_PAIRS32};
static const rp_kernels RP_Q5_K = {{0, RP_ALL_C(RP_FN_OF, rp_q5_k)}, 256, RP_Q5_K_TILE, 256, O_PAIRS32};
static const rp_kernels RP_Q6_K = {{0, RP_ALL_C(RP_FN_OF, rp_q6_k)}, 256, RP_Q6_K_TILE, 256,
                                   R_SUB16 ? O_PAIRS16 : O_NEG32_16};
static const rp_kernels RP_Q3_K = {{0, RP_ALL_C(RP_FN_OF, rp_q3_k)}, 256, RP_Q3_K_TILE, 256,
                                   R_SUB16 ? O_PAIRS16_2 : O_NEG4_16};
static const rp_kernels RP_Q2_K = {{0, RP_ALL_C(RP_FN_OF, rp_q2_k)}, 256, RP_Q2_K_TILE, 256, O_PAIRS16_1};
static const rp_kernels RP_Q8_0 = {{0, RP_ALL_C(RP_FN_OF, rp_q8_0)}, 32, RP_Q8_0_TILE, 32, O_NEG128_32};
static const rp_kernels RP_Q4_0 = {{0, RP_ALL_C(RP_FN_OF, rp_q4_0)}, 32, RP_Q4_0_TILE, 32, O_NEG8_32};
static const rp_kernels RP_IQ4_NL = {{0, RP_ALL_C(RP_FN_OF, rp_iq4_nl)}, 32, RP_IQ4_NL_TILE, 32, O_NEG128_32};
static const rp_kernels RP_IQ4_XS = {{0, RP_ALL_C(RP_FN_OF, rp_iq4_xs)}, 256, RP_IQ4_XS_TILE, 256, O_NEG128_32};
static const rp_kernels RP_Q4_1 = {{0, RP_ALL_C(RP_FN_OF, rp_q4_1)}, 32, RP_Q4_1_TILE, 32, 0};
static const rp_kernels RP_Q5_0 = {{0, RP_ALL_C(RP_FN_OF, rp_q5_0)}, 32, RP_Q5_0_TILE, 32, O_NEG16_32};
static const rp_kernels RP_Q5_1 = {{0, RP_ALL_C(RP_FN_OF, rp_q5_1)}, 32, RP_Q5_1_TILE, 32, 0};
static const rp_kernels RP_Q3_0 = {{0, RP_ALL_C(RP_FN_OF, rp_q3_0)}, 32, RP_Q3_0_TILE, 32, O_NEG4_32};

static const rp_kernels *rp_kernels_of(int type) {
    switch (type) {
    case T_Q2_K_R16: return &RP_Q2_K;
    case T_Q3_K_R16: return &RP_Q3_K;
    case T_Q4_K_R16: return &RP_Q4_K;
    case T_Q5_K_R16: return &RP_Q5_K;
    case T_Q6_K_R16: return &RP_Q6_K;
    case T_Q8_0_R16: return &RP_Q8_0;
    case T_Q4_0_R16: return &RP_Q4_0;
    case T_Q4_1_R16: return &RP_Q4_1;
    case T_Q5_0_R16: return &RP_Q5_0;
    case T_Q5_1_R16: return &RP_Q5_1;
    case T_Q3_0_R16: return &RP_Q3_0;
    case T_IQ4_NL_R16: return &RP_IQ4_NL;
    case T_IQ4_XS_R16: return &RP_IQ4_XS;
    default: return 0;
    }
}

/* act.o of one activation row from its 16-sums s [K / 16] */
static void rp_offsets(int o_kind, const int16_t *s, int64_t K, int32_t *o) {
    const int64_t K16 = K / 16;
    if (o_kind == O_PAIRS32) { /* per 256: four int32 lanes, each two 32-sums as int16 */
        for (int64_t j = 0; j < K16 / 4; j++) {
            const int32_t lo = s[4 * j] + s[4 * j + 1], hi = s[4 * j + 2] + s[4 * j + 3];
            o[j] = (int32_t)((uint32_t)(uint16_t)(int16_t)lo | (uint32_t)(uint16_t)(int16_t)hi << 16);
        }
    } else if (o_kind == O_PAIRS16 || o_kind == O_PAIRS16_2 || o_kind == O_PAIRS16_1) { /* per 32: (-16 (-2, 1) x the two 16-sums) as int16 pairs */
        const int m = o_kind == O_PAIRS16 ? -16 : o_kind == O_PAIRS16_2 ? -2 : 1;
        for (int64_t j = 0; j < K16 / 2; j++)
            o[j] = (int32_t)((uint32_t)(uint16_t)(int16_t)(m * s[2 * j]) | (uint32_t)(uint16_t)(int16_t)(m * s[2 * j + 1]) << 16);
    } else if (o_kind == O_NEG32_16 || o_kind == O_NEG4_16) {
        const int m = o_kind == O_NEG32_16 ? -32 : -4;
        for (int64_t i = 0; i < K16; i++) o[i] = m * s[i];
    } else { /* per 32 at o[2b] */
        const int32_t off = o_kind == O_NEG128_32 ? 128 : o_kind == O_NEG4_32 ? 4 : o_kind == O_NEG16_32 ? 16 : 8;
        for (int64_t b = 0; b < K16 / 2; b++) o[2 * b] = -off * (s[2 * b] + s[2 * b + 1]);
    }
}

#endif
