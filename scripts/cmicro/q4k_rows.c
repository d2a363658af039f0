/* What one more input row costs the Q4_K kernel with everything in cache: quant_q8.c's q4_k_cC over
 * 128 weight rows of K = 1536 (110 KB, in L2) against C = 1, 2, 3, 4, 8, 16 quantized input rows, on one
 * core, best of 7 runs. The step from C to C + 1 is a verified row's multiply-adds (maddubs, madd by the
 * scales, the mins, the float steps); ns/block at C = 1 minus that step is the block's own unpacking.
 * Build (from the repository root):
 *   gcc -O3 -march=native -std=gnu11 -Ispecdec/model scripts/cmicro/q4k_rows.c specdec/model/quant_dequant.c \
 *       specdec/model/quant_repack.c -o q4k_rows -lm && ./q4k_rows */
#include <stdio.h>
#include <time.h>

#include "../../specdec/model/quant_q8.c"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(void) {
    const int64_t K = 1536, N = 128, rb = K / 256 * Q4_K_BYTES;
    uint8_t *W = malloc(N * rb);
    float *X = malloc(16 * K * sizeof(float)), *Y = malloc(16 * N * sizeof(float));
    srand(1);
    for (int64_t i = 0; i < N * rb; i++) W[i] = (uint8_t)rand();
    for (int64_t b = 0; b < N * K / 256; b++) { /* finite fp16 scales (0x2000: 2^-7) */
        const uint16_t h = 0x2000;
        memcpy(W + b * Q4_K_BYTES, &h, 2);
        memcpy(W + b * Q4_K_BYTES + 2, &h, 2);
    }
    for (int64_t i = 0; i < 16 * K; i++) X[i] = (float)(rand() % 2001 - 1000) / 1000.0f;
    act *a = act_buffer(T_Q4_K, 16, K);
    quantize_rows(a, X, K, 0, 16, 1);
    const int Cs[] = {1, 2, 3, 4, 8, 16};
    for (int ci = 0; ci < 6; ci++) {
        const int C = Cs[ci];
        double best = 1e9;
        for (int rep = 0; rep < 7; rep++) {
            const int reps = 20000 / C;
            const double t0 = now();
            for (int it = 0; it < reps; it++)
                for (int64_t r = 0; r < N; r++) K8_Q4_K.fn[C](W + r * rb, a, Y + r, N);
            const double dt = (now() - t0) / reps / (double)(N * (K / 256));
            if (dt < best) best = dt;
        }
        printf("C=%2d  %6.2f ns/block  %5.2f ns/row-block  %5.1f GMAC/s\n", C, best * 1e9, best * 1e9 / C,
               256.0 * C / best / 1e9);
    }
    free(W), free(X), free(Y);
    return 0;
}
