/* What one more input row costs the repacked tile kernels (quant_rp.h) with the weights in cache: each
 * format's tiles for 128 output rows of K = 1536 (in L2) against C = 1 .. 8 quantized input rows, on
 * one core, best of 7 runs. GMAC/s is int8 multiply-adds a second (rows x weights x C / time), to hold
 * against the instruction sequence's own rate (int8_dot_throughput.c); v(C) is time(C) / time(1).
 * Build (from the repository root), for a named target as cpu_kernels.target_flags gives it:
 *   gcc -O3 -march=x86-64-v3 [-mavxvnni] -std=gnu11 -Ispecdec/model scripts/cmicro/rp_rows.c \
 *       specdec/model/quant_dequant.c specdec/model/quant_repack.c -o rp_rows -lm && ./rp_rows */
#include <stdio.h>
#include <time.h>

#include "../../specdec/model/quant_q8.c"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* random blocks of `type` with finite fp16 scales (0x2000: 2^-7) at the given byte offsets */
static void random_blocks(uint8_t *W, int64_t n, int64_t bytes, const int *hoff, int nh) {
    for (int64_t i = 0; i < n * bytes; i++) W[i] = (uint8_t)rand();
    const uint16_t h = 0x2000;
    for (int64_t b = 0; b < n; b++)
        for (int j = 0; j < nh; j++) memcpy(W + b * bytes + hoff[j], &h, 2);
}

static void run(const char *name, int type, int64_t bytes, int64_t qk, const int *hoff, int nh) {
    const int64_t K = 1536, N = 128, rb = K / qk * bytes;
    uint8_t *W = malloc(N * rb), *P = malloc(2 * N * rb); /* a tile row takes more than a GGUF row (Q4_K: 148 bytes, not 144) */
    float *X = malloc(RP_MAXC * K * sizeof(float)), *Y = malloc(RP_MAXC * N * sizeof(float));
    srand(1);
    random_blocks(W, N * K / qk, bytes, hoff, nh);
    for (int64_t i = 0; i < RP_MAXC * K; i++) X[i] = (float)(rand() % 2001 - 1000) / 1000.0f;
    const int rtype = type == T_Q4_0 ? quant_requant_q4_0(T_Q8_0, W, P, N, K, 1) : quant_repack(type, W, P, N, K, 1);
    const rp_kernels *rk = rp_kernels_of(rtype);
    act *a = act_buffer(rtype, RP_MAXC, K);
    quantize_rows(a, X, K, 0, RP_MAXC, 0);
    const int64_t prb = quant_rp_row_bytes(rtype, K);
    double t1 = 0;
    for (int C = 1; C <= RP_MAXC; C++) {
        double best = 1e9;
        for (int rep = 0; rep < 7; rep++) {
            const int reps = 4000 / C;
            const double t0 = now();
            for (int it = 0; it < reps; it++)
                for (int64_t r = 0; r < N; r += RP_ROWS) rk->fn[C](P + r * prb, a, Y + r, N);
            const double dt = (now() - t0) / reps;
            if (dt < best) best = dt;
        }
        if (C == 1) t1 = best;
        printf("%-5s C=%d  %7.2f us  v(C) %4.2f  %6.1f GMAC/s\n", name, C, best * 1e6, best / t1,
               (double)N * K * C / best / 1e9);
    }
    free(W), free(P), free(X), free(Y);
}

int main(void) {
    const int q4k[] = {0, 2}, q6k[] = {208}, q8[] = {0};
    run("Q4_K", T_Q4_K, Q4_K_BYTES, 256, q4k, 2);
    run("Q6_K", T_Q6_K, Q6_K_BYTES, 256, q6k, 1);
    run("Q8_0", T_Q8_0, Q8_0_BYTES, 32, q8, 1);
    run("Q4_0", T_Q4_0, Q8_0_BYTES, 32, q8, 1); /* Q8_0 blocks re-encoded as Q4_0 (the 4-bit draft's tiles) */
    return 0;
}
