// llama.cpp's own first-step logits and greedy continuation for given token
// ids, through its C API (scripts/compare-llama-cpp-logits builds and runs it):
//   llama-logits MODEL.gguf IDS(comma-separated) N_GREEDY OUT.f32
// Writes the logits after the last prompt token to OUT.f32 (little-endian
// f32) and prints the N_GREEDY greedy token ids as a JSON list on stdout.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static int argmax(const float *v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) {
        if (v[i] > v[best]) best = i;
    }
    return best;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s MODEL IDS N_GREEDY OUT\n", argv[0]);
        return 2;
    }
    llama_token ids[4096];
    int n = 0;
    for (char *s = strtok(argv[2], ","); s && n < 4096; s = strtok(NULL, ",")) ids[n++] = atoi(s);
    int n_gen = atoi(argv[3]);
    llama_backend_init();
    struct llama_model *model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) return 1;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 1024;
    cp.n_batch = 1024;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) return 1;
    int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    if (llama_decode(ctx, llama_batch_get_one(ids, n))) return 1;
    const float *logits = llama_get_logits_ith(ctx, -1);
    FILE *f = fopen(argv[4], "wb");
    if (!f || fwrite(logits, sizeof(float), n_vocab, f) != (size_t)n_vocab) return 1;
    fclose(f);
    printf("[");
    for (int i = 0; i < n_gen; i++) {
        llama_token t = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
        printf(i ? ",%d" : "%d", t);
        if (llama_decode(ctx, llama_batch_get_one(&t, 1))) return 1;
    }
    printf("]\n");
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
