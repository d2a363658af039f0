/* Throughput of the integer multiply-add instructions quant_q8.c is built from, on one core: eight
 * independent accumulator chains per instruction, so the issue rate binds, not the latency.
 * Why a verified row costs what it does with 8-bit activations: its multiply-adds, at these rates.
 * Without VNNI (AVX2 only) the VNNI lines are left out.
 * Build: gcc -O2 -march=native int8_dot_throughput.c -o t && ./t */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define N 200000000L
#define RUN(NAME, MACS, OP)                                                                             \
    {                                                                                                  \
        __m256i a0 = _mm256_set1_epi8(1), a1 = _mm256_set1_epi8(2), a2 = _mm256_set1_epi8(3), a3 = _mm256_set1_epi8(4), \
                a4 = _mm256_set1_epi8(5), a5 = _mm256_set1_epi8(6), a6 = _mm256_set1_epi8(7), a7 = _mm256_set1_epi8(8); \
        __m256i x = _mm256_set1_epi8(3), y = _mm256_set1_epi8(5);                                      \
        __asm__ volatile("" : "+x"(x), "+x"(y)); /* opaque: no product folded at compile time */   \
        const double t0 = now();                                                                       \
        for (long i = 0; i < N / 8; i++) {                                                             \
            OP(a0); OP(a1); OP(a2); OP(a3); OP(a4); OP(a5); OP(a6); OP(a7);                            \
            __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6), "+x"(a7)); \
        }                                                                                              \
        const double ns = (now() - t0) / N * 1e9;                                                      \
        __m256i s = _mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3));              \
        s = _mm256_add_epi32(s, _mm256_add_epi32(_mm256_add_epi32(a4, a5), _mm256_add_epi32(a6, a7))); \
        printf("%-34s %.3f ns/instruction  %5.1f int8 multiply-adds/ns  (%d)\n", NAME, ns, MACS / ns,   \
               _mm256_extract_epi32(s, 0));                                                            \
    }
#define MADDUBS(a) a = _mm256_maddubs_epi16(a, y)
#define MADDUBS_MADD(a) a = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(x, a), y), a)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) || defined(__AVXVNNI__)
#define HAVE_VNNI 1
#define DPBUSD(a) a = _mm256_dpbusd_epi32(a, x, y)
#define DPWSSD(a) a = _mm256_dpwssd_epi32(a, x, y)
#define MADDUBS_DPWSSD(a) a = _mm256_dpwssd_epi32(a, _mm256_maddubs_epi16(x, a), y)
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
/* the pair kernels' register width: where the vector unit is 512 bits wide, twice the ymm rate */
static void run_zmm(void) {
    __m512i a0 = _mm512_set1_epi8(1), a1 = _mm512_set1_epi8(2), a2 = _mm512_set1_epi8(3), a3 = _mm512_set1_epi8(4),
            a4 = _mm512_set1_epi8(5), a5 = _mm512_set1_epi8(6), a6 = _mm512_set1_epi8(7), a7 = _mm512_set1_epi8(8);
    __m512i x = _mm512_set1_epi8(3), y = _mm512_set1_epi8(5);
    __asm__ volatile("" : "+v"(x), "+v"(y)); /* opaque: no product folded at compile time */
    const double t0 = now();
    for (long i = 0; i < N / 8; i++) {
#define ZOP(a) a = _mm512_dpbusd_epi32(a, x, y)
        ZOP(a0); ZOP(a1); ZOP(a2); ZOP(a3); ZOP(a4); ZOP(a5); ZOP(a6); ZOP(a7);
        __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7));
    }
    const double ns = (now() - t0) / N * 1e9;
    const __m512i s = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                                       _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7)));
    printf("%-34s %.3f ns/instruction  %5.1f int8 multiply-adds/ns  (%d)\n", "vpdpbusd zmm (64 u8*s8)", ns, 64 / ns,
           _mm_cvtsi128_si32(_mm512_castsi512_si128(s)));
}
#endif

int main(void) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    run_zmm();
#endif
#ifdef HAVE_VNNI
    RUN("vpdpbusd ymm (32 u8*s8)", 32, DPBUSD)
    RUN("vpdpwssd ymm (16 s16*s16)", 16, DPWSSD)
    RUN("vpmaddubsw + vpdpwssd (K-quants)", 32, MADDUBS_DPWSSD)
#endif
    RUN("vpmaddubsw ymm (32 u8*s8)", 32, MADDUBS)
    RUN("vpmaddubsw + vpmaddwd + vpaddd (K-quants, AVX2)", 32, MADDUBS_MADD)
    return 0;
}
