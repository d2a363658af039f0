/* Runs the CPU kernels of specdec/model (quant_q8.c included, the other sources linked) on the inputs
 * tests/test_arm.py writes and writes every output, so that builds for different instruction sets
 * (x86-64-v3, aarch64 under qemu) can be compared bit for bit.
 *
 * Files: a sequence of named blobs, each u32 name length, the name, u64 byte count, the bytes.
 * Build: the compiler flags of the library, this file (which includes quant_q8.c) and the other sources.
 * Usage: kernel_harness IN OUT            the kernels on the inputs of IN
 *        kernel_harness --forward DIR OUT  forward_layers on a dumped call (fw_harness.h)
 *        kernel_harness --count IN decode|verify5|prefill128 REPS   a pass REPS times (fw_harness.h)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant_q8.c" /* in this unit: rsub_check below uses its R_* primitives */
/* the other sources' functions: kernels.h (quant_q8.c includes it) */

typedef struct {
    char name[64];
    uint64_t n;
    void *p;
} blob;
static blob blobs[512];
static int nblobs;
static FILE *out;

static void die(const char *what, const char *name) {
    fprintf(stderr, "kernel_harness: %s %s\n", what, name);
    exit(2);
}

static void read_blobs(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open", path);
    uint32_t len;
    while (fread(&len, 4, 1, f) == 1) {
        blob *b = &blobs[nblobs++];
        if (len >= sizeof b->name || nblobs > 512) die("bad blob in", path);
        if (fread(b->name, 1, len, f) != len || fread(&b->n, 8, 1, f) != 1) die("short file", path);
        b->name[len] = 0;
        b->p = malloc(b->n ? b->n : 1);
        if (!b->p || fread(b->p, 1, b->n, f) != b->n) die("short blob", b->name);
    }
    fclose(f);
}

static void *get(const char *name) {
    for (int i = 0; i < nblobs; i++)
        if (!strcmp(blobs[i].name, name)) return blobs[i].p;
    die("no input", name);
    return 0;
}

static void put(const char *name, const void *p, uint64_t n) {
    const uint32_t len = (uint32_t)strlen(name);
    fwrite(&len, 4, 1, out), fwrite(name, 1, len, out), fwrite(&n, 8, 1, out), fwrite(p, 1, n, out);
}

static void *alloc(size_t n) {
    void *p = calloc(n ? n : 1, 1);
    if (!p) die("out of memory", "");
    return p;
}

/* quant_gemm_q8 on W (N rows) against the first n rows of X for n = 1..16 (every kernel row count), and
 * 23 rows (a prefill's chunks: X's 16 rows, then its first 7 again) */
static void gemms(const char *tag, int type, const uint8_t *W, const float *X16, const float *bias, int64_t N, int64_t K) {
    float *Y = alloc(sizeof(float) * 23 * N), *X = alloc(sizeof(float) * 23 * K);
    memcpy(X, X16, sizeof(float) * 16 * K);
    memcpy(X + 16 * K, X16, sizeof(float) * 7 * K);
    char name[96];
    for (int n = 1; n <= 23; n += n == 16 ? 7 : 1) {
        memset(Y, 0, sizeof(float) * 23 * N);
        if (quant_gemm_q8(type, W, X, n & 1 ? bias : 0, Y, N, K, n, K, N, 2)) die("gemm refused", tag);
        snprintf(name, sizeof name, "%s_n%d", tag, n);
        put(name, Y, sizeof(float) * n * N);
    }
    free(Y), free(X);
}

/* The repacked tiles' per-sub-block primitives (R_SUB_*: a sub-block's products summed, then scaled,
 * at most R_SUB_CAP_* products a sum) give the integers the kernel bodies' R_DPBUSD and R_MULLO give,
 * on every quarter of one Q4_K_R16 and one Q6_K_R16 block against activations x; where the build
 * defines them. Exits on a difference. */
#if defined(R_SUB_ZERO)
static void same_ints(rvi a, rvi b, const char *what) {
    if (memcmp(&a, &b, sizeof a)) die("R_SUB_* differ from R_DPBUSD, R_MULLO on", what);
}
static void rsub_check(int type, const uint8_t *blk, const int8_t *x) {
    const rvi nib = R_SET1B(0x0F), m30 = R_SET1B(0x30);
    for (int h = 0; h < RP_H; h++) {
        rvi is = R_ZERO(), ref = R_ZERO();
        for (int s = 0; s < (type == 12 ? 8 : 16); s++) { /* Q4_K: sub-blocks of 32; Q6_K: of 16 */
            rsub acc = R_SUB_ZERO();
            rvi dot = R_ZERO(), q[8], xv[8];
            if (type == 12)
                for (int r = 0; r < 4; r++) {
                    const rvi raw = R_LOAD(blk + (4 * s + r) * 64 + 4 * RP_W * h);
                    q[2 * r] = R_AND(raw, nib), q[2 * r + 1] = R_AND(R_SRLI16(raw, 4), nib);
                    xv[2 * r] = R_SET1(ld32(x + 32 * s + 4 * r)), xv[2 * r + 1] = R_SET1(ld32(x + 32 * s + 16 + 4 * r));
                }
            else {
                const uint8_t *b = blk + 192 * s + 4 * RP_W * h;
                const rvi n0 = R_LOAD(b), n1 = R_LOAD(b + 64), hb = R_LOAD(b + 128);
                q[0] = R_OR(R_AND(n0, nib), R_AND(R_SLLI16(hb, 4), m30));
                q[1] = R_OR(R_AND(R_SRLI16(n0, 4), nib), R_AND(R_SLLI16(hb, 2), m30));
                q[2] = R_OR(R_AND(n1, nib), R_AND(hb, m30));
                q[3] = R_OR(R_AND(R_SRLI16(n1, 4), nib), R_AND(R_SRLI16(hb, 2), m30));
                for (int j = 0; j < 4; j++) xv[j] = R_SET1(ld32(x + 16 * s + 4 * j));
            }
            const int n = type == 12 ? 8 : 4, cap = type == 12 ? R_SUB_CAP_Q4 : R_SUB_CAP_Q6;
            const uint8_t *sp = type == 12 ? blk + 2048 + 16 * s + RP_W * h : blk + 3072 + 16 * s + RP_W * h;
            for (int j = 0; j < n; j++) {
                dot = R_DPBUSD(dot, q[j], xv[j]);
                acc = R_SUB_DOT(acc, q[j], xv[j]);
                if ((j + 1) % cap == 0 || j == n - 1) {
                    is = R_SUB_SCALE(is, acc, type == 12 ? R_SC_U8(sp) : R_SC_S8(sp));
                    acc = R_SUB_ZERO();
                }
            }
            ref = R_ADD(ref, R_MULLO(dot, type == 12 ? R_U8_32(sp) : R_S8_32(sp)));
        }
        same_ints(is, ref, type == 12 ? "Q4_K_R16" : "Q6_K_R16");
    }
}
#else
static void rsub_check(int type, const uint8_t *blk, const int8_t *x) { (void)type, (void)blk, (void)x; }
#endif

/* a draft's re-encoding of one format (Q4_0_R16 102, Q3_0_R16 103): its tiles and their GEMMs */
static void requanted(int type, const uint8_t *W, const float *X, const float *bias, int64_t N, int64_t Nv, int64_t K,
                      int rtype, int (*requant)(int, const uint8_t *, uint8_t *, int64_t, int64_t, int),
                      const char *tag, const char *fmt) {
    char name[64];
    uint8_t *R = alloc(N * quant_rp_row_bytes(rtype, K));
    if (requant(type, W, R, N, K, 2) != rtype) die("requant failed", tag);
    snprintf(name, sizeof name, "%s_%d", tag, type);
    put(name, R, N * quant_rp_row_bytes(rtype, K));
    snprintf(name, sizeof name, "gemm_%d_as_%s_r16", type, fmt);
    gemms(name, rtype, R, X, bias, Nv, K);
    free(R);
}

/* one GGUF format: its activations, dequantized weights, GEMMs on the blocks, the repacked tiles and
 * their GEMMs, and the draft's Q4_0 and Q3_0 re-encodings and their GEMMs */
static void format(int type) {
    char name[64];
    snprintf(name, sizeof name, "cfg_%d", type);
    const int64_t *cfg = get(name), N = cfg[0], K = cfg[1], B = cfg[2];
    snprintf(name, sizeof name, "w_%d", type);
    const uint8_t *W = get(name);
    snprintf(name, sizeof name, "x_%d", type);
    const float *X = get(name);
    snprintf(name, sizeof name, "b_%d", type);
    const float *bias = get(name);

    float *deq = alloc(sizeof(float) * N * K);
    quant_dequantize(type, W, deq, N, K);
    snprintf(name, sizeof name, "deq_%d", type);
    put(name, deq, sizeof(float) * N * K);
    free(deq);

    const size_t abytes = K + 4 * (K / B) + 2 * (K / 16) + 4 * (K / 32);
    uint8_t *acts = alloc(16 * abytes);
    for (int r = 0; r < 16; r++) {
        uint8_t *a = acts + r * abytes;
        quant_q8_activations(X + r * K, K, B, (int8_t *)a, (float *)(a + K), (int16_t *)(a + K + 4 * (K / B)),
                             (float *)(a + K + 4 * (K / B) + 2 * (K / 16)));
    }
    snprintf(name, sizeof name, "act_%d", type);
    put(name, acts, 16 * abytes);
    free(acts);

    snprintf(name, sizeof name, "gemm_%d", type);
    gemms(name, type, W, X, bias, N, K);
    const int64_t Nv = N - 12; /* a last tile of 4 valid rows */
    const int rtype = quant_repacked_type(type);
    if (rtype) {
        uint8_t *R = alloc(N * quant_rp_row_bytes(rtype, K));
        if (quant_repack(type, W, R, N, K, 2) != rtype) die("repack failed", "");
        snprintf(name, sizeof name, "repack_%d", type);
        uint8_t *P = alloc(N * quant_rp_row_bytes(rtype, K)); /* published in x86's layout: Q8_0's w + 128 */
        memcpy(P, R, N * quant_rp_row_bytes(rtype, K));
        if (type == T_Q8_0)
            for (int64_t t = 0; t < N * quant_rp_row_bytes(rtype, K) / RP_Q8_0_TILE; t++)
                for (int j = 0; j < 512; j++) P[t * RP_Q8_0_TILE + j] ^= 0x80 ^ RP_Q8_BIAS;
        put(name, P, N * quant_rp_row_bytes(rtype, K));
        free(P);
        if (type == T_Q4_K || type == T_Q6_K) {
            int8_t q[512];
            float d[16], sa[16];
            int16_t s16[32];
            for (int r = 0; r < 16; r++) { /* every input row against the first tile's first block */
                quant_q8_activations(X + r * K, K, B, q, d, s16, sa);
                rsub_check(type, R, q);
            }
        }
        snprintf(name, sizeof name, "gemm_%d_repacked", type);
        gemms(name, rtype, R, X, bias, Nv, K);
        free(R);
    }
    requanted(type, W, X, bias, N, Nv, K, 102, quant_requant_q4_0, "requant", "q4_0");
    requanted(type, W, X, bias, N, Nv, K, 103, quant_requant_q3_0, "requant3", "q3_0");
}

/* RMSNorm at several widths (whole 8s, a tail, under 8), the per-head norm, RoPE, attention (the
 * vector path and the plain one, masked and not), the gates */
static void fused(void) {
    const float *nx = get("nx"), *nw = get("nw"); /* [4, 600], [600] */
    static const int64_t dims[] = {576, 200, 37, 13, 8, 3};
    char name[64];
    float *o = alloc(sizeof(float) * 4 * 600);
    for (int i = 0; i < 6; i++) {
        rms_norm(nx, nw, o, 4, dims[i], 600, 1e-5f);
        snprintf(name, sizeof name, "rms_%d", (int)dims[i]);
        put(name, o, sizeof(float) * 4 * dims[i]);
    }
    memcpy(o, nx, sizeof(float) * 3 * 320);
    head_norm(o, nw, 3, 5, 64, 320, 1e-6f);
    put("head_norm", o, sizeof(float) * 3 * 320);
    free(o);

    for (int D = 16; D <= 64; D *= 4) { /* x [2, 3, 7 D], cos, sin [2, 3, D] */
        float *x = alloc(sizeof(float) * 2 * 3 * 7 * D);
        memcpy(x, get("rope_x"), sizeof(float) * 2 * 3 * 7 * D);
        rope(x, get("rope_c"), get("rope_s"), 2, 3, 5, D, 3 * 7 * D, 7 * D, 3 * D, D);
        snprintf(name, sizeof name, "rope_%d", D);
        put(name, x, sizeof(float) * 2 * 3 * 7 * D);
        free(x);
    }

    const int64_t B = 2, T = 5, H = 6, KV = 2, cap = 40, S = 29;
    for (int D = 32; D <= 64; D *= 2) { /* 64: the vector path; 32: the plain one */
        const float *q = get("att_q"), *k = get("att_k"), *v = get("att_v");
        const uint8_t *mask = get("att_mask"); /* [T, cap] */
        float *att = alloc(sizeof(float) * B * T * H * D);
        for (int m = 0; m < 2; m++) {
            attend(q, k, v, 0, m ? mask : 0, att, B, T, H, KV, D, S, T * (H + 2 * KV) * D, (H + 2 * KV) * D,
                   KV * cap * D, cap * D, 0, cap, T * H * D, H * D, 0.125f, 0.f, 2);
            snprintf(name, sizeof name, "attend_%d_%s", D, m ? "mask" : "all");
            put(name, att, sizeof(float) * B * T * H * D);
        }
        attend(q, k, v, 0, mask, att, B, T, H, KV, D, S, T * (H + 2 * KV) * D, (H + 2 * KV) * D, KV * cap * D,
               cap * D, 0, cap, T * H * D, H * D, 0.125f, 0.75f, 2); /* soft-capped scores (Gemma 2) */
        snprintf(name, sizeof name, "attend_%d_cap", D);
        put(name, att, sizeof(float) * B * T * H * D);
        for (int64_t t = 0; t < T; t++) /* each position alone: a query's bits whatever the blocking */
            attend(q + t * (H + 2 * KV) * D, k, v, 0, mask + t * cap, att + t * H * D, B, 1, H, KV, D, S,
                   T * (H + 2 * KV) * D, (H + 2 * KV) * D, KV * cap * D, cap * D, 0, cap, T * H * D, H * D, 0.125f, 0.f,
                   2);
        snprintf(name, sizeof name, "attend_%d_alone", D);
        put(name, att, sizeof(float) * B * T * H * D);
        free(att);
    }

    const int64_t n = 1003; /* whole vectors and a tail */
    const float *g = get("gate_g"), *u = get("gate_u");
    float *y = alloc(sizeof(float) * n);
    silu_mul(g, u, y, n);
    put("silu_mul", y, sizeof(float) * n);
    silu_mul_scalar(g, u, y, n);
    put("silu_mul_scalar", y, sizeof(float) * n);
    gelu_mul(g, u, y, n);
    put("gelu_mul", y, sizeof(float) * n);
    free(y);
}

#include "fw_harness.h"

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--forward")) return forward_main(argv[2], argv[3]);
    if (argc == 5 && !strcmp(argv[1], "--count")) return count_main(argv[2], argv[3], atoi(argv[4]));
    if ((argc == 7 || argc == 8) && !strcmp(argv[1], "--count-gemm"))
        return count_gemm_main(atoi(argv[2]), argc == 8 && !strcmp(argv[3], "R"), atoll(argv[argc - 4]),
                               atoll(argv[argc - 3]), atoll(argv[argc - 2]), atoi(argv[argc - 1]));
    if (argc != 3) {
        fprintf(stderr, "usage: kernel_harness IN OUT | kernel_harness --forward DIR OUT\n");
        return 2;
    }
    read_blobs(argv[1]);
    out = fopen(argv[2], "wb");
    if (!out) die("cannot write", argv[2]);
    const char *isa = kernels_isa();
    put("isa", isa, strlen(isa));
    static const int types[] = {2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 20, 21, 23};
    for (int i = 0; i < 13; i++) format(types[i]);
    fused();
    fclose(out);
    return 0;
}
