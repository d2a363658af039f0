/* Skinny fp32 GEMM for decode and verify on the CPU: Y[n, N] = X[n, K] . W[N, K]^T (+ b), n small.
 *
 * Decode reads every weight once per token, so a step is bound by memory. This kernel streams each
 * weight row from memory exactly once for all n input rows (kept in L1/L2), so small n costs
 * about the memory time of n = 1 until the arithmetic catches up (n of about 5 to 8 on a 2-core
 * CPU at about 80 GFLOP/s): a verify of k + 1 positions is nearly free.
 *
 * Numerics: every output Y[i, j] is one dot product accumulated in the same order whatever n is
 * (lane-wise over K in steps of VL, then a fixed horizontal reduction), so a verify pass gives
 * bit-identical projections to one-token steps.
 *
 * bf16 weights (skinny_gemm_bf16, --weight-dtype bfloat16): each weight is widened to fp32 in a
 * register (exact), then the same FMAs run in the same order, so the result is the fp32 path's
 * on the bf16 values, and a step streams half the bytes.
 *
 * Threads: OpenMP, the same runtime torch loaded (libgomp.so.1), rows of W split in contiguous
 * blocks so each thread streams its own region.
 *
 * Built by specdec/model/cpu_kernels.py with -O3 -march=native -fopenmp.
 */
#include <stdint.h>

#include "simd.h"

#ifndef PF_DIST
#define PF_DIST 256 /* software prefetch distance (weights) for multi-input blocks; 0 = hardware only */
#endif
/* One input row streams fastest on the hardware prefetcher alone; several inputs slow the
 * consumption of each row enough that prefetching 1 KB ahead pays (skinny-gemm.json). */

/* One block of R weight rows against C input rows; K % VL tail done in scalar, in a fixed order.
 * One input row prefetches nothing (PF 0), several prefetch PF_DIST elements ahead (one prefetch
 * per 64-byte line). T: the weights' type, LOADW: VL of them as fp32 lanes, W1: one as a float. */
#define DEFINE_BLOCK_T(NAME, T, LOADW, W1, R, C)                                                     \
    static inline void NAME##_##R##_##C(const void *wp, int64_t K, const float *x, int64_t ldx,     \
                                        float *y, int64_t ldy) {                                    \
        const T *w = (const T *)wp;                                                                 \
        const int PF = (C) == 1 ? 0 : PF_DIST;                                                      \
        const int64_t LINE = 64 / sizeof(T);                                                        \
        vec acc[R][C];                                                                              \
        for (int r = 0; r < R; r++)                                                                 \
            for (int c = 0; c < C; c++) acc[r][c] = VZERO();                                        \
        int64_t k = 0;                                                                              \
        for (; k + VL <= K; k += VL) {                                                              \
            vec wv[R];                                                                              \
            for (int r = 0; r < R; r++) {                                                           \
                if (PF && k % LINE == 0) _mm_prefetch((const char *)(w + r * K + k + PF), _MM_HINT_T0); \
                wv[r] = LOADW(w + r * K + k);                                                       \
            }                                                                                       \
            for (int c = 0; c < C; c++) {                                                           \
                vec xv = VLOAD(x + c * ldx + k);                                                    \
                for (int r = 0; r < R; r++) acc[r][c] = VFMA(wv[r], xv, acc[r][c]);                 \
            }                                                                                       \
        }                                                                                           \
        for (int r = 0; r < R; r++)                                                                 \
            for (int c = 0; c < C; c++) {                                                           \
                float s = vsum(acc[r][c]);                                                          \
                for (int64_t t = k; t < K; t++) s += W1(w[r * K + t]) * x[c * ldx + t];             \
                y[c * ldy + r] = s;                                                                 \
            }                                                                                       \
    }
#define F32_1(v) (v)
#define DEFINE_BLOCK(R, C) DEFINE_BLOCK_T(f32, float, VLOAD, F32_1, R, C)
/* bf16 weights (the top half of an fp32: widened by a 16-bit shift, exactly), fp32 inputs and
 * accumulation: half the bytes a step streams, and the same arithmetic as fp32 weights holding
 * those values. */
#define DEFINE_BLOCK_BF16(R, C) DEFINE_BLOCK_T(bf16, uint16_t, VLOAD_BF16, bf16_to_f32, R, C)

/* For C input rows (1..16) in one pass, (R, C): the widest block of weight rows whose R x C
 * accumulators, R weight vectors and one input vector fit the 32 vector registers. Every weight row
 * is read from memory once for all C inputs: a second pass, even from L2, would cost half a memory
 * pass. NARROW: one row against C inputs, for the rows a panel has left over (R = 1 blocks of WIDE
 * serve C = 15, 16). */
#define WIDE_BLOCKS(X) X(8, 1) X(4, 2) X(4, 3) X(4, 4) X(4, 5) X(4, 6) X(3, 7) X(3, 8) \
    X(2, 9) X(2, 10) X(2, 11) X(2, 12) X(2, 13) X(2, 14) X(1, 15) X(1, 16)
#define NARROW_BLOCKS(X) X(1, 1) X(1, 2) X(1, 3) X(1, 4) X(1, 5) X(1, 6) X(1, 7) X(1, 8) \
    X(1, 9) X(1, 10) X(1, 11) X(1, 12) X(1, 13) X(1, 14)
#define MAX_C 16

WIDE_BLOCKS(DEFINE_BLOCK)
NARROW_BLOCKS(DEFINE_BLOCK)
WIDE_BLOCKS(DEFINE_BLOCK_BF16)
NARROW_BLOCKS(DEFINE_BLOCK_BF16)

typedef void (*block_fn)(const void *, int64_t, const float *, int64_t, float *, int64_t);
typedef struct {
    block_fn wide[MAX_C + 1], narrow[MAX_C + 1];
    int wide_r[MAX_C + 1];
    int64_t esz; /* bytes per weight */
} kernel_set;
#define BLOCK_FN_F32(R, C) f32_##R##_##C,
#define BLOCK_FN_BF16(R, C) bf16_##R##_##C,
#define BLOCK_ROWS(R, C) R,
static const kernel_set F32 = {{0, WIDE_BLOCKS(BLOCK_FN_F32)}, {0, NARROW_BLOCKS(BLOCK_FN_F32) f32_1_15, f32_1_16},
                               {0, WIDE_BLOCKS(BLOCK_ROWS)}, sizeof(float)};
static const kernel_set BF16 = {{0, WIDE_BLOCKS(BLOCK_FN_BF16)},
                                {0, NARROW_BLOCKS(BLOCK_FN_BF16) bf16_1_15, bf16_1_16},
                                {0, WIDE_BLOCKS(BLOCK_ROWS)}, sizeof(uint16_t)};

#define PANEL 24 /* rows per panel: a multiple of every R above */

/* Rows [r0, r0 + rows) of W against all n inputs, in chunks of at most MAX_C inputs (callers keep
 * n <= MAX_C: a later chunk would find the panel's rows in L2, but re-reading them costs). */
static void panel(const kernel_set *ks, const char *W, const float *X, float *Y, int64_t r0, int64_t rows,
                  int64_t K, int64_t n, int64_t ldx, int64_t ldy) {
    const int64_t row_bytes = K * ks->esz;
    for (int64_t c = 0; c < n; c += MAX_C) {
        int C = (int)(n - c < MAX_C ? n - c : MAX_C);
        int R = ks->wide_r[C];
        int64_t r = r0;
        for (; r + R <= r0 + rows; r += R) ks->wide[C](W + r * row_bytes, K, X + c * ldx, ldx, Y + c * ldy + r, ldy);
        for (; r < r0 + rows; r++) ks->narrow[C](W + r * row_bytes, K, X + c * ldx, ldx, Y + c * ldy + r, ldy);
    }
}

static void finish(const float *b, float *Y, int64_t r0, int64_t r1, int64_t n, int64_t ldy) {
    if (b)
        for (int64_t c = 0; c < n; c++)
            for (int64_t r = r0; r < r1; r++) Y[c * ldy + r] += b[r];
}

static void gemm(const kernel_set *ks, const void *W, const float *X, const float *b, float *Y, int64_t N,
                 int64_t K, int64_t n, int64_t ldx, int64_t ldy, int nthreads) {
#pragma omp parallel num_threads(nthreads)
    {
        /* contiguous blocks of rows, whole panels each (threads taking chunks dynamically
         * instead was no faster: perf.md, session 9) */
        int64_t r0, r1;
        thread_rows(N, PANEL, &r0, &r1);
        if (r0 < r1) {
            for (int64_t r = r0; r < r1; r += PANEL)
                panel(ks, (const char *)W, X, Y, r, (r1 - r < PANEL ? r1 - r : PANEL), K, n, ldx, ldy);
            finish(b, Y, r0, r1, n, ldy);
        }
    }
}

/* Y[n, N] (row stride ldy) = X[n, K] (row stride ldx) . W[N, K]^T + b (b may be NULL). */
void skinny_gemm(const float *W, const float *X, const float *b, float *Y, int64_t N, int64_t K,
                 int64_t n, int64_t ldx, int64_t ldy, int nthreads) {
    gemm(&F32, W, X, b, Y, N, K, n, ldx, ldy, nthreads);
}

/* The same with bf16 weights W[N, K] (raw uint16 bits); X, b and Y fp32. */
void skinny_gemm_bf16(const uint16_t *W, const float *X, const float *b, float *Y, int64_t N, int64_t K,
                      int64_t n, int64_t ldx, int64_t ldy, int nthreads) {
    gemm(&BF16, W, X, b, Y, N, K, n, ldx, ldy, nthreads);
}
