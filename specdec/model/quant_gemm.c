/* Skinny GEMM on GGUF-quantized weights, exact to the fp32 path: Y[n, N] = X[n, K] . deq(W)[N, K]^T (+ b).
 *
 * The checkpoints are GGUF files whose linear weights are stored in llama.cpp's block formats
 * (Q4_K, Q6_K, Q8_0, Q5_0, Q4_0, Q4_1: 4.5 to 8.5 bits a weight). The fp32 path dequantizes
 * them once at conversion (gguf-py, in fp32) and streams 32 bits a weight every step. This kernel
 * streams the blocks themselves and widens each group of 32 weights to fp32 lanes in registers just
 * before its FMAs: 4-7x fewer bytes per step. quant_dequantize writes out the same values.
 *
 * Exact: every dequantized weight is the same fp32 value gguf-py computes (the same operations in
 * the same order: the block scale d (fp16, widened exactly) times the sub-block scale is exact in
 * fp32; then one multiply, or a multiply-add whose product is exact), and the FMAs run in
 * skinny_gemm.c's order (lane-wise over K in steps of VL, one accumulator per output, the same
 * horizontal sum). So Y is bit for bit what skinny_gemm gives on the converted fp32 weights, for
 * every row count: a quantized model decodes exactly the tokens the fp32 model does.
 *
 * Threads: OpenMP, rows of W split in contiguous blocks, as in skinny_gemm.c.
 */
#include <stdint.h>
#include <string.h>

#include "simd.h"

/* ggml's type ids (GGMLQuantizationType) */
enum { T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q8_0 = 8, T_Q4_K = 12, T_Q6_K = 14 };

#define QMAX_C 16

/* The GEMM's inner loop works on 32 weights of a row at a time (one "group"): per format, `prep`
 * decodes a block's scales once (into pre[], L1), and `g32` gives group s of the block as 32/VL
 * fp32 vectors, in order of K, from the packed bits in registers (no buffer). The values are
 * dq_<fmt>'s (checked bit for bit by the tests). */
#define NV (32 / VL)
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
#define NIB _mm256_set1_epi8(0x0F)
static inline void g32_q4_k(const uint8_t *b, int s, const float *pre, vec *w) {
    const __m256i raw = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * (s >> 1)));
    const __m256i q = _mm256_and_si256((s & 1) ? _mm256_srli_epi16(raw, 4) : raw, NIB);
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
static inline void g32_q5_0(const uint8_t *b, int s, const float *pre, vec *w) {
    (void)s;
    uint32_t qh;
    memcpy(&qh, pre + 1, 4);
    for (int v = 0; v < NV; v++) {
        const int k0 = VL * v; /* weights k0 .. k0 + VL */
        veci q = nib16(b + 6, k0);
#if VL == 16
        const veci bits = _mm512_srlv_epi32(_mm512_set1_epi32((int)(qh >> k0)),
                                            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
#else
        const veci bits = _mm256_srlv_epi32(_mm256_set1_epi32((int)(qh >> k0)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
#endif
        q = ISUB(IOR(q, ISLL(IAND(bits, 1), 4)), 16);
        w[v] = VMUL(VBCAST(pre), I2F(q));
    }
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

#ifndef QPF_BLOCKS
#define QPF_BLOCKS 8
#endif /* software prefetch: this many blocks' bytes ahead in each row */

/* R rows of W (format F) against C inputs: per block, the scales of each row (prep), then per group
 * of 32 weights each row's vectors (g32) and the FMAs in skinny_gemm.c's order. */
#define DEFINE_QBLOCK_AS(NAME, F, f, R, C)                                                           \
    static void NAME(const uint8_t *w, int64_t rb, int64_t K, const float *x, int64_t ldx, \
                              float *y, int64_t ldy) {                                              \
        float pre[R][F##_PRE];                                                                      \
        vec acc[R][C];                                                                              \
        for (int r = 0; r < R; r++)                                                                 \
            for (int c = 0; c < C; c++) acc[r][c] = VZERO();                                        \
        const int64_t nb = K / F##_QK;                                                              \
        for (int64_t ib = 0; ib < nb; ib++) {                                                       \
            const uint8_t *blk = w + ib * F##_BYTES;                                                \
            for (int r = 0; r < R; r++) {                                                           \
                const uint8_t *bp = blk + r * rb;                                                   \
                for (int p = 0; p < F##_BYTES; p += 64)                                             \
                    _mm_prefetch((const char *)(bp + QPF_BLOCKS * F##_BYTES + p), _MM_HINT_T0);      \
                prep_##f(bp, pre[r]);                                                               \
            }                                                                                       \
            for (int s = 0; s < F##_QK / 32; s++) {                                                 \
                vec wv[R][NV];                                                                      \
                for (int r = 0; r < R; r++) g32_##f(blk + r * rb, s, pre[r], wv[r]);                 \
                const float *xk = x + ib * F##_QK + 32 * s;                                         \
                for (int v = 0; v < NV; v++)                                                        \
                    for (int c = 0; c < C; c++) {                                                   \
                        const vec xv = VLOAD(xk + c * ldx + VL * v);                                \
                        for (int r = 0; r < R; r++) acc[r][c] = VFMA(wv[r][v], xv, acc[r][c]);      \
                    }                                                                               \
            }                                                                                       \
        }                                                                                           \
        for (int r = 0; r < R; r++)                                                                 \
            for (int c = 0; c < C; c++) y[c * ldy + r] = vsum(acc[r][c]);                           \
    }

#define DEFINE_WIDE(F, f, R, C) DEFINE_QBLOCK_AS(f##_w##C, F, f, R, C)
#define DEFINE_NARROW(F, f, R, C) DEFINE_QBLOCK_AS(f##_n##C, F, f, 1, C)

/* (R, C) per input count C: R x C accumulators and R x 32 / VL weight vectors within the registers.
 * Narrow: one row against C inputs, for the rows a thread's range has left over. */
/* One row at a time up to 5 inputs (more rows per block were slower: the dequantization, not the
 * loads, binds), two from 6 to 13 (AVX-512; AVX2 has half the registers: one). */
#if VL == 16
#define Q_R6 2
#else
#define Q_R6 1
#endif
#define Q_WIDE(X, F, f) X(F, f, 1, 1) X(F, f, 1, 2) X(F, f, 1, 3) X(F, f, 1, 4) X(F, f, 1, 5) \
    X(F, f, Q_R6, 6) X(F, f, Q_R6, 7) X(F, f, Q_R6, 8) X(F, f, Q_R6, 9) X(F, f, Q_R6, 10) X(F, f, Q_R6, 11) \
    X(F, f, Q_R6, 12) X(F, f, Q_R6, 13) X(F, f, 1, 14) X(F, f, 1, 15) X(F, f, 1, 16)
#define Q_FN_W(F, f, R, C) f##_w##C,
#define Q_FN_N(F, f, R, C) f##_n##C,
#define Q_ROWS(F, f, R, C) R,

typedef void (*qblock_fn)(const uint8_t *, int64_t, int64_t, const float *, int64_t, float *, int64_t);
typedef struct {
    qblock_fn wide[QMAX_C + 1], narrow[QMAX_C + 1];
    int wide_r[QMAX_C + 1];
    int qk, bytes;
    void (*deq)(const uint8_t *, float *); /* one block -> its qk fp32 weights */
} qkernels;

/* One block -> its QK fp32 weights: the values the GEMM multiplies (prep, then g32 per group). */
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
    Q_WIDE(DEFINE_WIDE, F, f)                                                                        \
    Q_WIDE(DEFINE_NARROW, F, f)                                                                      \
    DEFINE_DEQ(F, f)                                                                                 \
    static const qkernels K_##F = {{0, Q_WIDE(Q_FN_W, F, f)}, {0, Q_WIDE(Q_FN_N, F, f)},             \
                                   {0, Q_WIDE(Q_ROWS, F, f)}, F##_QK, F##_BYTES, f##_deq};
Q_FORMAT(Q4_K, q4_k)
Q_FORMAT(Q6_K, q6_k)
Q_FORMAT(Q8_0, q8_0)
Q_FORMAT(Q5_0, q5_0)
Q_FORMAT(Q4_0, q4_0)
Q_FORMAT(Q4_1, q4_1)

static const qkernels *kernels_of(int type) {
    switch (type) {
    case T_Q4_K: return &K_Q4_K;
    case T_Q6_K: return &K_Q6_K;
    case T_Q8_0: return &K_Q8_0;
    case T_Q5_0: return &K_Q5_0;
    case T_Q4_0: return &K_Q4_0;
    case T_Q4_1: return &K_Q4_1;
    default: return 0;
    }
}

/* Bytes of one row of K weights in `type`, or 0 if the type is not supported or K does not fit it. */
int64_t quant_row_bytes(int type, int64_t K) {
    const qkernels *ks = kernels_of(type);
    return ks && K % ks->qk == 0 ? K / ks->qk * ks->bytes : 0;
}

/* Dequantize `rows` rows of K weights into out [rows, K] (tests; the load-time check of a mapping). */
void quant_dequantize(int type, const uint8_t *W, float *out, int64_t rows, int64_t K) {
    const qkernels *ks = kernels_of(type);
    if (!ks || K % ks->qk) return;
    const int64_t nb = K / ks->qk, rb = nb * ks->bytes;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < nb; i++) ks->deq(W + r * rb + i * ks->bytes, out + r * K + i * ks->qk);
}

#define QPANEL 24 /* rows per thread range: a multiple of every R above */

/* Y[n, N] (row stride ldy) = X[n, K] (row stride ldx) . deq(W)[N, K]^T + b (b may be NULL), n <= 16.
 * W: N rows of quant_row_bytes(type, K) bytes. Returns 0, or -1 for a type, K or n it cannot take. */
int quant_gemm(int type, const uint8_t *W, const float *X, const float *b, float *Y, int64_t N, int64_t K,
               int64_t n, int64_t ldx, int64_t ldy, int nthreads) {
    const qkernels *ks = kernels_of(type);
    if (!ks || K % ks->qk || K % 32 || n < 1 || n > QMAX_C) return -1;
    const int64_t rb = K / ks->qk * ks->bytes;
    const int C = (int)n, R = ks->wide_r[C];
#pragma omp parallel num_threads(nthreads)
    {
        int64_t r0, r1;
        thread_rows(N, QPANEL, &r0, &r1);
        int64_t r = r0;
        for (; r + R <= r1; r += R) ks->wide[C](W + r * rb, rb, K, X, ldx, Y + r, ldy);
        for (; r < r1; r++) ks->narrow[C](W + r * rb, rb, K, X, ldx, Y + r, ldy);
        if (b && r0 < r1)
            for (int64_t c = 0; c < n; c++)
                for (int64_t i = r0; i < r1; i++) Y[c * ldy + i] += b[i];
    }
    return 0;
}
