// y = mul_mat(W, X) with ggml's CPU backend: W raw blocks (type, n_in, n_out), X f32 (rows, n_in)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ggml.h"
#include "ggml-cpu.h"
static void * slurp(const char * path, size_t * n) {
    FILE * f = fopen(path, "rb"); fseek(f, 0, SEEK_END); *n = ftell(f); fseek(f, 0, SEEK_SET);
    void * b = malloc(*n); fread(b, 1, *n, f); fclose(f); return b;
}
int main(int argc, char ** argv) {
    int type = atoi(argv[1]), n_in = atoi(argv[2]), n_out = atoi(argv[3]), rows = atoi(argv[4]);
    size_t nw, nx;
    void * wb = slurp(argv[5], &nw); void * xb = slurp(argv[6], &nx);
    ggml_cpu_init();
    struct ggml_init_params p = { (size_t)1 << 30, NULL, false };
    struct ggml_context * ctx = ggml_init(p);
    struct ggml_tensor * w = ggml_new_tensor_2d(ctx, (enum ggml_type)type, n_in, n_out);
    if (ggml_nbytes(w) != nw) { fprintf(stderr, "size %zu != %zu\n", ggml_nbytes(w), nw); return 1; }
    memcpy(w->data, wb, nw);
    struct ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_in, rows);
    memcpy(x->data, xb, nx);
    struct ggml_tensor * y = ggml_mul_mat(ctx, w, x);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    ggml_graph_compute_with_ctx(ctx, gf, 1);
    FILE * f = fopen(argv[7], "wb"); fwrite(y->data, 1, ggml_nbytes(y), f); fclose(f);
    return 0;
}
