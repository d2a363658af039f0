/* Would AMX pay for the verify pass and the prefill? The integer core of the repacked Q4_K kernel
 * (quant_rp.h: a tile of 16 weight rows, per 32-weight sub-block its four 64-byte chunks unpacked to
 * eight vectors of four consecutive weights of the 16 rows, met by C activation rows, each sub-block's
 * sums times its scale into a per-row int32 sum) two ways, with everything in cache, on one core:
 *   vnni: vpdpbusd against each row's four broadcast activation bytes (what the kernel does now);
 *   amx:  the eight unpacked vectors stored as an AMX B tile (8 rows of 64 bytes: K = 32, N = 16),
 *         the C rows' 32 activation bytes an A tile, one tdpbsud into a C x 16 int32 tile, stored
 *         and read back as C vectors (a row's 16 sums, one a weight row: the vnni accumulator's lanes).
 * Both give the same int32 sums (checked). ns per 256-weight block of the 16-row tile, best of 9.
 * Build (an x86 host with AMX; Linux asks for the tile state once per process):
 *   gcc -O3 -march=native -mamx-tile -mamx-int8 scripts/cmicro/amx_q4k_core.c -o /tmp/amx && /tmp/amx */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define K 1536
#define NB (K / 256)
#define TILES 64 /* 64 tiles of 16 rows: 1024 weight rows, 768 KB of nibbles (in L2) */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg;

static void vnni(const uint8_t *w, const int8_t *x, const uint8_t *sc, int C, int32_t *out) {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    __m512i is[16];
    for (int c = 0; c < C; c++) is[c] = _mm512_setzero_si512();
    for (int ib = 0; ib < NB; ib++, w += 2048)
        for (int s = 0; s < 8; s++) {
            __m512i u[8];
            for (int r = 0; r < 4; r++) {
                const __m512i raw = _mm512_loadu_si512(w + 64 * (4 * s + r));
                u[r] = _mm512_and_si512(raw, nib);
                u[4 + r] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nib);
            }
            const __m512i scale = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sc + 16 * s)));
            for (int c = 0; c < C; c++) {
                const int8_t *xa = x + (int64_t)c * K + 256 * ib + 32 * s;
                __m512i acc = _mm512_setzero_si512();
                for (int g = 0; g < 8; g++) {
                    int32_t b;
                    memcpy(&b, xa + 4 * g, 4);
                    acc = _mm512_dpbusd_epi32(acc, u[g], _mm512_set1_epi32(b));
                }
                is[c] = _mm512_add_epi32(is[c], _mm512_mullo_epi32(acc, scale));
            }
        }
    for (int c = 0; c < C; c++) _mm512_storeu_si512(out + 16 * c, is[c]);
}

/* a block at a time: its eight sub-blocks unpacked to eight B tiles' rows in memory, then eight
 * products (two tile sets alternating), then the eight C tiles read back with their scales */
static void amx(const uint8_t *w, const int8_t *x, const uint8_t *sc, int C, int32_t *out) {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    _Alignas(64) uint8_t b[8][512];
    _Alignas(64) int32_t cbuf[8][16 * 16];
    __m512i is[16];
    for (int c = 0; c < C; c++) is[c] = _mm512_setzero_si512();
    for (int ib = 0; ib < NB; ib++, w += 2048) {
        for (int s = 0; s < 8; s++)
            for (int r = 0; r < 4; r++) { /* B tile row g: weights 4g..4g+3 of the sub-block, 16 rows */
                const __m512i raw = _mm512_loadu_si512(w + 64 * (4 * s + r));
                _mm512_store_si512(b[s] + 64 * r, _mm512_and_si512(raw, nib));
                _mm512_store_si512(b[s] + 64 * (4 + r), _mm512_and_si512(_mm512_srli_epi16(raw, 4), nib));
            }
        const int8_t *xa = x + 256 * ib;
        for (int s = 0; s < 8; s += 2) {
            _tile_loadd(2, b[s], 64);
            _tile_loadd(1, xa + 32 * s, K);
            _tile_zero(0);
            _tile_dpbsud(0, 1, 2);
            _tile_loadd(4, b[s + 1], 64);
            _tile_loadd(5, xa + 32 * s + 32, K);
            _tile_zero(3);
            _tile_dpbsud(3, 5, 4);
            _tile_stored(0, cbuf[s], 64);
            _tile_stored(3, cbuf[s + 1], 64);
        }
        for (int s = 0; s < 8; s++) {
            const __m512i scale = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sc + 16 * s)));
            for (int c = 0; c < C; c++)
                is[c] = _mm512_add_epi32(is[c], _mm512_mullo_epi32(_mm512_load_si512(cbuf[s] + 16 * c), scale));
        }
    }
    for (int c = 0; c < C; c++) _mm512_storeu_si512(out + 16 * c, is[c]);
}

static void configure(int C) {
    tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 6; t++) {
        const int isA = t == 1 || t == 5, isB = t == 2 || t == 4;
        cfg.rows[t] = isB ? 8 : C;
        cfg.colsb[t] = isA ? 32 : 64;
    }
    _tile_loadconfig(&cfg);
}

int main(void) {
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */)) {
        perror("arch_prctl(ARCH_REQ_XCOMP_PERM)");
        return 1;
    }
    uint8_t *W = aligned_alloc(64, (size_t)TILES * NB * 2048);
    int8_t *X = aligned_alloc(64, 16 * K);
    uint8_t sc[128];
    int32_t o1[256], o2[256];
    srand(1);
    for (size_t i = 0; i < (size_t)TILES * NB * 2048; i++) W[i] = (uint8_t)rand();
    for (int i = 0; i < 16 * K; i++) X[i] = (int8_t)(rand() % 255 - 127);
    for (int i = 0; i < 128; i++) sc[i] = (uint8_t)(rand() % 64);
    const int Cs[] = {1, 2, 3, 4, 5, 6, 8, 9, 12, 16};
    printf("C   vnni ns/block  amx ns/block  vnni/amx\n");
    for (int ci = 0; ci < 10; ci++) {
        const int C = Cs[ci];
        configure(C);
        double best[2] = {1e9, 1e9};
        for (int rep = 0; rep < 9; rep++)
            for (int way = 0; way < 2; way++) {
                const int reps = 200;
                const double t0 = now();
                for (int it = 0; it < reps; it++)
                    for (int t = 0; t < TILES; t++)
                        (way ? amx : vnni)(W + (size_t)t * NB * 2048, X, sc, C, way ? o2 : o1);
                const double dt = (now() - t0) / reps / (TILES * NB);
                if (dt < best[way]) best[way] = dt;
            }
        for (int t = 0; t < TILES; t++) {
            vnni(W + (size_t)t * NB * 2048, X, sc, C, o1);
            amx(W + (size_t)t * NB * 2048, X, sc, C, o2);
            if (memcmp(o1, o2, 64 * C)) {
                printf("C=%d: the sums differ\n", C);
                return 1;
            }
        }
        printf("%2d  %8.1f      %8.1f     %5.2f\n", C, best[0] * 1e9, best[1] * 1e9, best[0] / best[1]);
    }
    _tile_release();
    return 0;
}
