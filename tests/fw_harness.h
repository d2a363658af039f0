/* kernel_harness.c's forward_layers check: the structs of one call rebuilt from a dump (tests/test_arm.py
 * writes it from the Python loader's CpuForward), then forward_layers for T = 5 positions at slot 0
 * (causal mask) and T = 1 at slot 5 (every slot), then forward_rows on a ragged batch of two rows (each
 * its own cache row, slots and mask), writing x after each call and the caches.
 * --count runs one of a decode step, a 5-row verify pass or a 128-token prefill (16 rows a call) REPS
 * times on one thread, with the LM head's GEMM where the dump has it (all rows of a verify pass, the
 * last of a prefill), for instruction counts under qemu (scripts/arm_counts.py): the count of REPS 2
 * less that of REPS 1 is one pass, the loading left out.
 * --count-gemm TYPE N K C REPS runs quant_gemm_q8 REPS times on one thread, N rows of K weights in GGUF
 * TYPE (with R appended, its repacked type, or else the draft's Q4_0_R16 of it) against C activation rows: the
 * instructions per 256 weights of each kernel's inner loop (arm_counts.py --per-weights). The weights
 * are fixed bytes with every scale 1.0 (no kernel branches on the weights' values). */

/* fw_part, fw_linear, fw_layer, forward_layers, forward_scratch_floats: kernels.h */

static const void *get_opt(const char *name) {
    for (int i = 0; i < nblobs; i++)
        if (!strcmp(blobs[i].name, name)) return blobs[i].p;
    return 0;
}

static void fw_linear_of(int l, const char *what, fw_linear *li) {
    char name[64];
    snprintf(name, sizeof name, "l%d_%s_meta", l, what); /* n_parts, N, K, has bias, (type, rows) per part */
    const int64_t *m = get(name);
    li->n_parts = m[0], li->N = m[1], li->K = m[2];
    snprintf(name, sizeof name, "l%d_%s_bias", l, what);
    li->bias = m[3] ? get(name) : 0;
    for (int64_t p = 0; p < li->n_parts; p++) {
        snprintf(name, sizeof name, "l%d_%s_p%d", l, what, (int)p);
        li->parts[p].type = (int32_t)m[4 + 2 * p], li->parts[p].rows = m[5 + 2 * p], li->parts[p].data = get(name);
    }
}

static fw_layer *layers_of(int64_t L) {
    fw_layer *layers = alloc(sizeof(fw_layer) * L);
    char name[64];
    static const char *norms[] = {"ln1", "ln2", "attn_post", "mlp_post", "q_norm", "k_norm"};
    for (int l = 0; l < L; l++) {
        const float **ptr[] = {&layers[l].ln1, &layers[l].ln2, &layers[l].attn_post, &layers[l].mlp_post,
                               &layers[l].q_norm, &layers[l].k_norm};
        for (int i = 0; i < 6; i++) {
            snprintf(name, sizeof name, "l%d_%s", l, norms[i]);
            *ptr[i] = get_opt(name);
        }
        snprintf(name, sizeof name, "l%d_flags", l);
        const int32_t *flags = get(name);
        layers[l].local = flags[0], layers[l].act = flags[1], layers[l].residual = 1.0f;
        fw_linear_of(l, "qkv", &layers[l].qkv);
        fw_linear_of(l, "o", &layers[l].o);
        fw_linear_of(l, "gate_up", &layers[l].gate_up);
        fw_linear_of(l, "down", &layers[l].down);
    }
    return layers;
}

static int count_main(const char *in, const char *what, int reps) {
    read_blobs(in);
    const int64_t *dims = get("dims"); /* L, D, H, KV, hd, I */
    const int64_t L = dims[0], D = dims[1], H = dims[2], KV = dims[3], hd = dims[4], I = dims[5], cap = 144;
    const float *es = get("eps_scale"), *x0 = get("x"), *cos = get("cos"), *sin = get("sin");
    const int64_t *head = get_opt("head_meta"); /* type, rows (the vocabulary) */
    const int64_t n = !strcmp(what, "prefill128") ? 128 : !strcmp(what, "verify5") ? 5 : 1;
    const int64_t chunk = n < 16 ? n : 16, logits = n == 5 ? 5 : 1;
    fw_layer *layers = layers_of(L);
    float *kc = alloc(sizeof(float) * L * KV * cap * hd), *vc = alloc(sizeof(float) * L * KV * cap * hd);
    float *scratch = alloc(sizeof(float) * forward_scratch_floats(16, D, H, KV, hd, I));
    float *x = alloc(sizeof(float) * n * D), *y = head ? alloc(sizeof(float) * logits * head[1]) : 0;
    uint8_t *mask = alloc(16 * cap);
    for (int rep = 0; rep < reps; rep++) {
        memcpy(x, x0, sizeof(float) * n * D);
        for (int64_t s0 = 0; s0 < n; s0 += chunk) { /* causal: position s0 + t sees slots 0 .. s0 + t */
            memset(mask, 0, 16 * cap);
            for (int64_t t = 0; t < chunk; t++)
                for (int64_t s = 0; s <= s0 + t; s++) mask[cap * t + s] = 1;
            if (forward_layers(layers, L, x + s0 * D, chunk, D, H, KV, hd, I, es[0], es[1], cos + s0 * hd,
                               sin + s0 * hd, cos + s0 * hd, sin + s0 * hd, kc, vc, cap, KV * cap * hd, s0, mask,
                               cap, mask, cap, scratch, 1))
                die("forward_layers refused", what);
        }
        if (head && quant_gemm_q8((int)head[0], get("head"), x + (n - logits) * D, 0, y, head[1], D, logits, D,
                                  head[1], 1))
            die("the head's GEMM refused", what);
    }
    printf("%s x %d: x[0] %g\n", what, reps, (double)x[(n - 1) * D]);
    return 0;
}

static int count_gemm_main(int type, int repack, int64_t N, int64_t K, int64_t C, int reps) {
    const int64_t rb = quant_row_bytes(type, K);
    if (!rb || N % 16 || C < 1 || C > 16) die("bad --count-gemm arguments", "");
    uint8_t *W = alloc(N * rb);
    uint32_t r = 12345;
    for (int64_t i = 0; i < N * rb; i++) r = r * 1103515245u + 12345u, W[i] = (uint8_t)(r >> 16);
    const int64_t bb = rb / (K / ((type >= 10 && type <= 14) || type == 21 || type == 23 ? 256 : 32)); /* a block's bytes */
    const int d_at = type == 14 ? 208 : type == 11 ? 108 : type == 10 ? 80 : 0;
    const int two = type == 3 || type == 7 || type == 12 || type == 13 || type == 10; /* Q4_1, Q5_1, Q4_K, Q5_K, Q2_K: a second f16 (m / dmin) after d */
    for (int64_t b = 0; b < N * rb / bb; b++) {
        W[b * bb + d_at] = 0x00, W[b * bb + d_at + 1] = 0x3C; /* 1.0 */
        if (two) W[b * bb + d_at + 2] = 0x00, W[b * bb + d_at + 3] = 0x3C;
    }
    int t = type;
    uint8_t *R = W;
    if (repack) {
        t = quant_repacked_type(type) ? quant_repacked_type(type) : 102; /* else the draft's Q4_0_R16 */
        R = alloc(N * quant_rp_row_bytes(t, K));
        if ((t == 102 ? quant_requant_q4_0(type, W, R, N, K, 1) : quant_repack(type, W, R, N, K, 1)) != t)
            die("cannot repack", "");
    }
    float *X = alloc(sizeof(float) * C * K), *Y = alloc(sizeof(float) * C * N);
    for (int64_t i = 0; i < C * K; i++) r = r * 1103515245u + 12345u, X[i] = (float)((int)(r >> 16 & 1023) - 512) / 256.0f;
    for (int rep = 0; rep < reps; rep++)
        if (quant_gemm_q8(t, R, X, 0, Y, N, K, C, K, N, 1)) die("quant_gemm_q8 refused", "");
    printf("gemm %d x %d: y[0] %g\n", t, reps, (double)Y[0]);
    return 0;
}

static int forward_main(const char *in, const char *path) {
    read_blobs(in);
    const int64_t *dims = get("dims"); /* L, D, H, KV, hd, I */
    const int64_t L = dims[0], D = dims[1], H = dims[2], KV = dims[3], hd = dims[4], I = dims[5], cap = 16;
    const float *es = get("eps_scale"), *x0 = get("x"), *cos = get("cos"), *sin = get("sin");
    fw_layer *layers = layers_of(L);
    float *kc = alloc(sizeof(float) * L * KV * cap * hd), *vc = alloc(sizeof(float) * L * KV * cap * hd);
    float *scratch = alloc(sizeof(float) * forward_scratch_floats(16, D, H, KV, hd, I));
    float *x = alloc(sizeof(float) * 6 * D);
    memcpy(x, x0, sizeof(float) * 6 * D);
    uint8_t mask[5 * 16] = {0}; /* causal: position t sees slots 0..t */
    for (int t = 0; t < 5; t++)
        for (int s = 0; s <= t; s++) mask[16 * t + s] = 1;
    out = fopen(path, "wb");
    if (!out) die("cannot write", path);
    if (forward_layers(layers, L, x, 5, D, H, KV, hd, I, es[0], es[1], cos, sin, cos, sin, kc, vc, cap, KV * cap * hd,
                       0, mask, 16, mask, 16, scratch, 2))
        die("forward_layers refused", "T = 5");
    put("forward_T5", x, sizeof(float) * 5 * D);
    if (forward_layers(layers, L, x + 5 * D, 1, D, H, KV, hd, I, es[0], es[1], cos + 5 * hd, sin + 5 * hd,
                       cos + 5 * hd, sin + 5 * hd, kc, vc, cap, KV * cap * hd, 5, 0, 0, 0, 0, scratch, 2))
        die("forward_layers refused", "T = 1");
    put("forward_T1", x + 5 * D, sizeof(float) * D);
    put("forward_k", kc, sizeof(float) * L * KV * cap * hd);
    put("forward_v", vc, sizeof(float) * L * KV * cap * hd);
    /* a ragged batch (forward_rows): batch row 0 is cache row 1 at slots 2, 3, batch row 1 cache row 0 at
     * slots 0, 1, each under its own causal mask over S = 4 slots */
    const int64_t rows[2] = {1, 0}, slots[4] = {2, 3, 0, 1}, S = 4;
    float *kr = alloc(sizeof(float) * L * 2 * KV * cap * hd), *vr = alloc(sizeof(float) * L * 2 * KV * cap * hd);
    float *xr = alloc(sizeof(float) * 4 * D), *cr = alloc(sizeof(float) * 4 * hd), *sr = alloc(sizeof(float) * 4 * hd);
    memcpy(xr, x0, sizeof(float) * 4 * D);
    uint8_t rmask[2 * 2 * 4] = {0};
    for (int i = 0; i < 4; i++) {
        memcpy(cr + i * hd, cos + slots[i] * hd, sizeof(float) * hd);
        memcpy(sr + i * hd, sin + slots[i] * hd, sizeof(float) * hd);
        for (int s = 0; s <= slots[i]; s++) rmask[S * i + s] = 1;
    }
    if (forward_rows(layers, L, xr, 2, 2, D, H, KV, hd, I, es[0], es[1], cr, sr, cr, sr, kr, vr, cap,
                     2 * KV * cap * hd, KV * cap * hd, 2, rows, slots, 0, S, rmask, 2 * S, S, rmask, 2 * S, S,
                     scratch, 2))
        die("forward_rows refused", "a ragged batch");
    put("forward_ragged", xr, sizeof(float) * 4 * D);
    put("forward_ragged_k", kr, sizeof(float) * L * 2 * KV * cap * hd);
    fclose(out);
    return 0;
}
