/* The kernel library's shared symbols, declared once: the type ids, the repacked tiles' sizes, the
 * structs of a layer-loop call, and every function one source defines and another source (or
 * cpu_kernels.py, through ctypes) calls. Each function is defined in exactly one .c file, named
 * above its group; every source includes this header, so the compiler checks each definition
 * against its declaration. Nothing here depends on the instruction set (simd.h holds that). */
#ifndef SPECDEC_KERNELS_H
#define SPECDEC_KERNELS_H
#include <stdint.h>

/* ggml's type ids (GGMLQuantizationType) */
enum { T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8, T_Q2_K = 10, T_Q3_K = 11, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_IQ4_NL = 20, T_IQ3_S = 21, T_IQ4_XS = 23 };

/* the repacked types (tiles of RP_ROWS output rows; the layouts: quant_rp.h) and a tile's bytes a block */
enum { T_Q4_0_R16 = 102, T_Q3_0_R16 = 103, T_Q4_1_R16 = 104, T_Q5_0_R16 = 106, T_Q5_1_R16 = 107, T_Q8_0_R16 = 108, T_Q2_K_R16 = 110, T_Q3_K_R16 = 111, T_Q4_K_R16 = 112, T_Q5_K_R16 = 113, T_Q6_K_R16 = 114,
       T_IQ4_NL_R16 = 120, T_IQ4_XS_R16 = 123 };
#define RP_ROWS 16
#define RP_Q2_K_TILE 1344
#define RP_Q3_K_TILE 1824
#define RP_Q4_K_TILE 2368
#define RP_Q5_K_TILE 2880 /* Q4_K_R16's tile, then the fifth bits: 8 chunks */
#define RP_Q6_K_TILE 3360
#define RP_Q8_0_TILE 544
#define RP_Q4_0_TILE 288
#define RP_Q4_1_TILE 320
#define RP_Q5_0_TILE 352
#define RP_Q5_1_TILE 384
#define RP_Q3_0_TILE 224
#define RP_IQ4_NL_TILE 288
#define RP_IQ4_XS_TILE 2208

/* quant_dequant.c: a row's bytes in any type (0: not supported, or K does not fit it); fp32 rows */
int64_t quant_row_bytes(int type, int64_t K);
void quant_dequantize(int type, const uint8_t *W, float *out, int64_t rows, int64_t K);

/* quant_repack.c: the repacking at load (the repacked type of a GGUF type, 0 if none; a repacked
 * row's bytes; GGUF rows -> tiles, and any format -> the 4-bit draft's Q4_0_R16 or the 3-bit draft's
 * Q3_0_R16: the type, or -1) */
int quant_repacked_type(int type);
int64_t quant_rp_row_bytes(int rtype, int64_t K);
int quant_repack(int type, const uint8_t *src, uint8_t *dst, int64_t rows, int64_t K, int nthreads);
int quant_requant_q4_0(int type, const uint8_t *src, uint8_t *dst, int64_t rows, int64_t K, int nthreads);
int quant_requant_q3_0(int type, const uint8_t *src, uint8_t *dst, int64_t rows, int64_t K, int nthreads);

/* quant_q8.c: the GEMM against 8-bit activations, raw blocks or repacked tiles */
const char *kernels_isa(void);
int quant_q8_supported(int type, int64_t K);
void quant_q8_activations(const float *x, int64_t K, int64_t B, int8_t *q, float *d, int16_t *s, float *sa);
int quant_gemm_q8(int type, const uint8_t *W, const float *X, const float *b, float *Y, int64_t N, int64_t K,
                  int64_t n, int64_t ldx, int64_t ldy, int nthreads);
/* Q4_K's repacked GEMM on AMX tiles from 9 rows (quant_rp_amx.h): asks the kernel for the tile state; 1 when
 * the build has AMX and the kernel grants it, else 0 (and off) */
int quant_amx_enable(int on);

/* fused_ops.c: the layers' other operations */
void rms_norm(const float *x, const float *w, float *out, int64_t n, int64_t dim, int64_t ldx, float eps);
void head_norm(float *y, const float *w, int64_t T, int64_t heads, int64_t hd, int64_t ldy, float eps);
void rope(float *x, const float *cos, const float *sin, int64_t B, int64_t T, int64_t heads, int64_t D,
          int64_t sxb, int64_t sxt, int64_t scb, int64_t sct);
const char *attention_precision(void);
void attend(const float *q, const float *k, const float *v, const int64_t *rows, const uint8_t *mask, float *out,
            int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, int64_t S, int64_t sqb, int64_t sqt,
            int64_t skr, int64_t skh, int64_t smb, int64_t smt, int64_t sob, int64_t sot, float scale,
            float softcap, int nthreads);
void silu_mul(const float *g, const float *u, float *out, int64_t n);
void silu_mul_scalar(const float *g, const float *u, float *out, int64_t n);
void gelu_mul(const float *g, const float *u, float *out, int64_t n);
void gate_mul(const float *g, const float *u, float *out, int64_t n, int act);
void gate_mul_rows(const float *gu, float *out, int64_t T, int64_t I, int act, int nthreads);
void silu_mul_rows(const float *gu, float *out, int64_t T, int64_t I, int nthreads);

/* cpu_forward.c: the layer loop in one call (cpu_forward.py builds these structs with ctypes) */
#define FW_MAX_PARTS 4
#define FW_MAX_T 16

typedef struct {
    int32_t type; /* ggml type id */
    const uint8_t *data; /* rows x row bytes */
    int64_t rows;
} fw_part;

typedef struct {
    const float *bias; /* N floats or NULL */
    int64_t n_parts, N, K;
    fw_part parts[FW_MAX_PARTS]; /* stacked along the N outputs */
} fw_linear;

/* a mixture-of-experts MLP (moe.py): the router's fp32 weights [E, D]; each token's k best experts by softmax
 * probability, their weights renormalised to sum to 1 where norm; expert e's gate/up and down GEMMs */
typedef struct {
    const float *router;
    int64_t E, k;
    int32_t norm;
    const fw_linear *gate_up, *down; /* [E] each */
} fw_moe;

typedef struct {
    const float *ln1, *ln2; /* the attention's and the MLP's input norm weights [D], or NULL (OLMo 2: none) */
    const float *attn_post, *mlp_post; /* norms of the attention's and the MLP's outputs [D], or NULL */
    const float *q_norm, *k_norm; /* norms of q and k per head [hd] (qk_whole: of all of each, [H hd] and [KV hd]) */
    int32_t local; /* a sliding-window layer: the local RoPE rows and mask */
    int32_t act; /* the gate's activation: 0 SiLU, 1 GELU-tanh */
    float softcap; /* > 0 (Gemma 2): the attention's scaled scores soft-capped (attend's softcap) */
    float residual; /* each branch's output times this before its residual add (Granite's; 1 elsewhere) */
    int32_t qk_whole; /* q_norm and k_norm each over all of q's / k's heads at once (OLMo 2) */
    fw_linear qkv, o, gate_up, down; /* gate_up and down unused where moe is set */
    const fw_moe *moe; /* the MLP a mixture of experts, or NULL */
} fw_layer;

int moe_rows(const fw_moe *m, const float *h, float *out, int64_t n, int64_t D, int act, int nthreads);

int64_t forward_scratch_floats(int64_t n, int64_t D, int64_t H, int64_t KV, int64_t hd, int64_t I);
int forward_rows(const fw_layer *layers, int64_t L, float *x, int64_t B, int64_t T, int64_t D, int64_t H, int64_t KV,
                 int64_t hd, int64_t I, float eps, float scale, const float *cos, const float *sin,
                 const float *lcos, const float *lsin, float *kc, float *vc, int64_t cap, int64_t layer_stride,
                 int64_t row_stride, int64_t n_rows, const int64_t *rows, const int64_t *slots, int64_t start,
                 int64_t S,
                 const uint8_t *mask, int64_t smb, int64_t smt, const uint8_t *lmask, int64_t lsmb, int64_t lsmt,
                 float *scratch, int nthreads);
int forward_layers(const fw_layer *layers, int64_t L, float *x, int64_t T, int64_t D, int64_t H, int64_t KV,
                   int64_t hd, int64_t I, float eps, float scale, const float *cos, const float *sin,
                   const float *lcos, const float *lsin, float *kc, float *vc, int64_t cap, int64_t layer_stride,
                   int64_t start, const uint8_t *mask, int64_t mask_stride, const uint8_t *lmask,
                   int64_t lmask_stride, float *scratch, int nthreads);

#endif
