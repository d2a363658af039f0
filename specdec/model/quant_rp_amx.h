/* The repacked Q4_K kernel on AMX tiles, for 9-16 activation rows (included by quant_q8.c after
 * quant_rp.h, in an x86 build with AMX-INT8; cpu_kernels.py enables it at load where the kernel grants
 * the tile state).
 *
 * A Q4_K_R16 chunk, its nibbles split, is four consecutive weights of the tile's 16 rows: exactly a row
 * of an AMX B tile (K/4 rows of N = 16 four-byte groups). Per 256-weight block, the eight sub-blocks'
 * integers are unpacked to memory as eight B tiles of 8 rows (K = 32: each sub-block has its own scale per
 * weight row, so each is its own product); the C activation rows' 32 bytes of the sub-block are the A
 * tile (C rows at the activations' row stride); tdpbsud (signed activations, unsigned weights) gives a
 * C x 16 int32 tile whose row c is the sums vpdpbusd gives row c in quant_rp.h, lane i weight row i.
 * Read back, each row's sums meet the sub-block scales, the mins and the two float FMAs a block exactly
 * as rp_q4_k does: the same integers and the same float steps in the same order, so a row's bits are
 * the same whichever kernel and however many rows (tests/test_quant_q8.py compares them).
 *
 * Measured (scripts/cmicro/amx_q4k_core.c): the integer core costs about 95 ns a block whatever C plus
 * 5-6 a row, against vpdpbusd's 17 a row; a whole verify pass of the 1.5B target breaks even at 8 rows
 * and gains 7% at 9. So the GEMM takes AMX from RP_AMX_MIN_C rows, in calls of up to 16: the prefill's
 * chunks, and verify passes of 9 rows or more. */
#ifndef SPECDEC_QUANT_RP_AMX_H
#define SPECDEC_QUANT_RP_AMX_H

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && RP_W == 16
#include <sys/syscall.h>

long syscall(long number, ...); /* unistd.h's, which -std=c11 leaves undeclared */

#define RP_AMX 1
#define RP_AMX_MAXC 16
#ifndef RP_AMX_MIN_C
#define RP_AMX_MIN_C 9 /* fewer rows: vpdpbusd as fast or faster (its core breaks even at 6, a whole verify pass at 8) */
#endif

static int rp_amx_on; /* quant_amx_enable's answer */
/* the A and C tiles' rows this thread's tile configuration holds (0: unknown; rp_gemm resets it each call) */
static __thread int rp_amx_rows;

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} rp_tilecfg;

/* tiles 0, 3: C (C x 16 int32); 1, 5: A (C x 32 bytes); 2, 4: B (8 x 64 bytes) */
static void rp_amx_configure(int C) {
    if (rp_amx_rows == C) return;
    rp_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 6; t++) {
        const int a = t == 1 || t == 5, b = t == 2 || t == 4;
        cfg.rows[t] = (uint8_t)(b ? 8 : C);
        cfg.colsb[t] = (uint16_t)(a ? 32 : 64);
    }
    _tile_loadconfig(&cfg);
    rp_amx_rows = C;
}

int quant_amx_enable(int on) {
    rp_amx_on = 0;
    if (on && syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0)
        rp_amx_on = 1;
    return rp_amx_on;
}

/* whether rp_gemm takes AMX for n rows of this format, and its start on each thread */
static inline int rp_amx_takes(const rp_kernels *rk, int64_t n) { return rp_amx_on && rk == &RP_Q4_K && n >= RP_AMX_MIN_C; }
static inline void rp_amx_begin(void) { rp_amx_rows = 0; /* configure afresh: other code (oneDNN) may have used the tiles */ }

static void rp_q4_k_amx(const uint8_t *w, const act *a, float *y, int64_t ldy, int C) {
    const int64_t K = a->K, nb = K / 256, K16 = K / 16;
    const __m512i nib = _mm512_set1_epi8(0x0F);
    _Alignas(64) uint8_t bt[8][512];
    _Alignas(64) int32_t ct[8][RP_AMX_MAXC * 16];
    __m512 f[RP_AMX_MAXC];
    for (int c = 0; c < C; c++) f[c] = _mm512_setzero_ps();
    rp_amx_configure(C);
    for (int64_t ib = 0; ib < nb; ib++) {
        const uint8_t *blk = w + ib * RP_Q4_K_TILE;
        for (int s = 0; s < 8; s++) {
            RP_PREFETCH(blk, 5 * s, 5, 0);
            for (int r = 0; r < 4; r++) { /* B row r: weights 4r..4r+3 of the sub-block; row 4 + r: 16 + 4r.. */
                const __m512i raw = _mm512_loadu_si512((const void *)(blk + (4 * s + r) * 64));
                _mm512_store_si512((void *)(bt[s] + 64 * r), _mm512_and_si512(raw, nib));
                _mm512_store_si512((void *)(bt[s] + 64 * (4 + r)), _mm512_and_si512(_mm512_srli_epi16(raw, 4), nib));
            }
        }
        const int8_t *x = a->q + 256 * ib;
        for (int s = 0; s < 8; s += 2) {
            _tile_loadd(2, bt[s], 64);
            _tile_loadd(1, x + 32 * s, K);
            _tile_zero(0);
            _tile_dpbsud(0, 1, 2);
            _tile_loadd(4, bt[s + 1], 64);
            _tile_loadd(5, x + 32 * s + 32, K);
            _tile_zero(3);
            _tile_dpbsud(3, 5, 4);
            _tile_stored(0, ct[s], 64);
            _tile_stored(3, ct[s + 1], 64);
        }
        __m512i sc[8], mn[4];
        for (int s = 0; s < 8; s++) sc[s] = R_SC_U8(blk + 2048 + 16 * s);
        for (int p = 0; p < 4; p++) mn[p] = R_U8_16(blk + 2176 + 32 * p);
        const __m512 dv = R_F16(blk + 2304), ndv = R_FMUL(R_F16(blk + 2336), R_FSET1(-1.0f));
        for (int c = 0; c < C; c++) {
            __m512i is = R_ZERO();
            for (int s = 0; s < 8; s++) is = R_SUB_SCALE(is, _mm512_load_si512((const void *)(ct[s] + 16 * c)), sc[s]);
            const int32_t *o = a->o + c * K16 + 4 * ib;
            __m512i mt = R_DPWSSD(R_ZERO(), mn[0], R_SET1(o[0]));
            for (int p = 1; p < 4; p++) mt = R_DPWSSD(mt, mn[p], R_SET1(o[p]));
            const __m512 da = R_FSET1(a->d[c * nb + ib]);
            f[c] = R_FMA(R_CVT(is), R_FMUL(dv, da), f[c]);
            f[c] = R_FMA(R_CVT(mt), R_FMUL(ndv, da), f[c]);
        }
    }
    for (int c = 0; c < C; c++) R_STOREF(y + c * ldy, f[c]);
}
#else
#define RP_AMX 0
#define RP_AMX_MAXC RP_MAXC
static inline int rp_amx_takes(const rp_kernels *rk, int64_t n) {
    (void)rk, (void)n;
    return 0;
}
static inline void rp_amx_begin(void) {}
int quant_amx_enable(int on) {
    (void)on;
    return 0;
}
#endif

#endif
