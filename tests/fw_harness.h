/* kernel_harness.c's forward_layers check (filled in below) */
static int forward_main(const char *dir, const char *path) {
    (void)dir, (void)path;
    fprintf(stderr, "kernel_harness: --forward is not built in\n");
    return 2;
}
