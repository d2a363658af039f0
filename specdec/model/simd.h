/* Vector types and helpers shared by the kernels (fused_ops.c, quant_dequant.c, quant_q8.c): AVX-512 where the compiler
 * targets it (-march=native), else AVX2 + FMA. */
#ifndef SPECDEC_SIMD_H
#define SPECDEC_SIMD_H
#include <immintrin.h>

#if defined(__AVX512F__)
#define VL 16
typedef __m512 vec;
#define VZERO() _mm512_setzero_ps()
#define VLOAD(p) _mm512_loadu_ps(p)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
static inline float vsum(vec v) {
    /* fixed order: halves, then quarters, ... (same for every call) */
    __m256 lo = _mm512_castps512_ps256(v);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    __m256 s8 = _mm256_add_ps(lo, hi);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    return _mm_cvtss_f32(s1);
}
#elif defined(__AVX2__) && defined(__FMA__)
#define VL 8
typedef __m256 vec;
#define VZERO() _mm256_setzero_ps()
#define VLOAD(p) _mm256_loadu_ps(p)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
static inline float vsum(vec v) {
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    return _mm_cvtss_f32(s1);
}
#else
#error "specdec's CPU kernels need AVX2+FMA or AVX-512"
#endif

#if VL == 16
#define VSET1(x) _mm512_set1_ps(x)
#define VSTORE(p, v) _mm512_storeu_ps(p, v)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VADD(a, b) _mm512_add_ps(a, b)
#else
#define VSET1(x) _mm256_set1_ps(x)
#define VSTORE(p, v) _mm256_storeu_ps(p, v)
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VADD(a, b) _mm256_add_ps(a, b)
#endif

#include <stdint.h>
#include <string.h>

/* Inside an OpenMP parallel region: this thread's index *t of *T (0 of 1 without OpenMP). */
static inline void thread_index(int64_t *t, int64_t *T) {
#ifdef _OPENMP
    extern int omp_get_thread_num(void);
    extern int omp_get_num_threads(void);
    *t = omp_get_thread_num();
    *T = omp_get_num_threads();
#else
    *t = 0;
    *T = 1;
#endif
}

/* Inside an OpenMP parallel region: this thread's contiguous range [*r0, *r1) of N rows, in whole
 * panels of `panel` rows (each thread streams its own region of a weight). */
static inline void thread_rows(int64_t N, int64_t panel, int64_t *r0, int64_t *r1) {
    int64_t t, T;
    thread_index(&t, &T);
    const int64_t per = ((N + T - 1) / T + panel - 1) / panel * panel;
    *r0 = t * per;
    *r1 = *r0 + per < N ? *r0 + per : N;
}

/* an IEEE half (2 bytes, little-endian) -> float, exactly */
static inline float f16_to_f32(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000 | (man << 13);
    } else if (exp) {
        u = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man) { /* subnormal: normalize */
        int e = -1;
        do { e++; man <<= 1; } while (!(man & 0x400));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    } else {
        u = sign;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

/* Q4_K's 12 bytes of 6-bit scales and mins (at b + 4) -> u: bytes 0..7 the 8 scales, 8..15 the 8 mins */
static inline void q4_k_scale_bytes(const uint8_t *b, uint32_t u[4]) {
    memcpy(u, b + 4, 12);
    const uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
    u[3] = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
    const uint32_t mins03 = u[1] & k1;
    u[1] = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
    u[2] = mins03;
    u[0] &= k1;
}

#if defined(__AVX2__)
/* Q6_K (210-byte blocks of 256): the 6-bit values q (0..63, before the -32) of group s (weights
 * 32 s .. 32 s + 31) as 32 bytes: half h = s / 4, quarter t = s % 4 within it; low nibbles from ql,
 * two high bits from qh */
static inline __m256i q6_k_group(const uint8_t *b, int s) {
    const int h = s >> 2, t = s & 3;
    const __m256i ql = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32 * (t & 1)));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
    const __m256i lo = _mm256_and_si256((t >> 1) ? _mm256_srli_epi16(ql, 4) : ql, _mm256_set1_epi8(0x0F));
    /* ((qh >> 2t) & 3) << 4, bytewise: mask first, so the 16-bit shifts move no bit across bytes */
    const __m256i hm = _mm256_and_si256(qh, _mm256_set1_epi8((char)(3 << (2 * t))));
    const __m256i hi = t == 0 ? _mm256_slli_epi16(hm, 4) : t == 1 ? _mm256_slli_epi16(hm, 2)
                     : t == 2 ? hm : _mm256_srli_epi16(hm, 2);
    return _mm256_or_si256(lo, hi);
}
#endif

#endif
