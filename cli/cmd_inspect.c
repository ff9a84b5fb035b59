/* `fitllm inspect MODEL [--json] [-c CTX]`: metadata, tensors and memory needs of a GGUF file. */
#include "cli/cli.h"
#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"
#include "formats/gguf.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct hparams {
    char arch[64];
    int64_t n_vocab, n_ctx_train, n_embd, n_ff, n_layer, n_head, n_head_kv, rope_dim, head_dim;
    float rope_base, rms_eps;
    char tok_model[64];
} hparams;

static int64_t get_i(const fl_gguf *g, const char *arch, const char *suffix, int64_t dflt) {
    char key[256];
    int64_t v;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return fl_gguf_get_i64(g, key, &v) == FL_OK ? v : dflt;
}

static void read_hparams(const fl_gguf *g, hparams *h) {
    memset(h, 0, sizeof *h);
    if (fl_gguf_get_str(g, "general.architecture", h->arch, sizeof h->arch) != FL_OK) strcpy(h->arch, "?");
    h->n_ctx_train = get_i(g, h->arch, "context_length", 0);
    h->n_embd = get_i(g, h->arch, "embedding_length", 0);
    h->n_ff = get_i(g, h->arch, "feed_forward_length", 0);
    h->n_layer = get_i(g, h->arch, "block_count", 0);
    h->n_head = get_i(g, h->arch, "attention.head_count", 0);
    h->n_head_kv = get_i(g, h->arch, "attention.head_count_kv", h->n_head);
    h->head_dim = h->n_head ? h->n_embd / h->n_head : 0;
    h->head_dim = get_i(g, h->arch, "attention.key_length", h->head_dim);
    h->rope_dim = get_i(g, h->arch, "rope.dimension_count", h->head_dim);
    char key[256];
    snprintf(key, sizeof key, "%s.rope.freq_base", h->arch);
    if (fl_gguf_get_f32(g, key, &h->rope_base) != FL_OK) h->rope_base = 10000.0f;
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", h->arch);
    if (fl_gguf_get_f32(g, key, &h->rms_eps) != FL_OK) h->rms_eps = 1e-5f;
    if (fl_gguf_get_str(g, "tokenizer.ggml.model", h->tok_model, sizeof h->tok_model) != FL_OK) strcpy(h->tok_model, "none");
    const fl_gguf_value *toks = fl_gguf_get_arr(g, "tokenizer.ggml.tokens");
    h->n_vocab = toks ? (int64_t)toks->v.arr.n : get_i(g, h->arch, "vocab_size", 0);
    fl_clear_error();
}

static void human(char *buf, size_t n, double b) {
    if (b >= 1073741824.0) snprintf(buf, n, "%.2f GiB", b / 1073741824.0);
    else if (b >= 1048576.0) snprintf(buf, n, "%.2f MiB", b / 1048576.0);
    else if (b >= 1024.0) snprintf(buf, n, "%.2f KiB", b / 1024.0);
    else snprintf(buf, n, "%.0f B", b);
}

int fl_cmd_inspect(int argc, char **argv) {
    fl_opt opts[] = {
        {"json", 0, FL_OPT_FLAG, "print one JSON object instead of text"},
        {"ctx-size", 'c', FL_OPT_INT, "CTX  context length for the KV total (default: the model's)"},
        {"kv", 0, FL_OPT_FLAG, "also list every metadata key"},
        {0},
    };
    const char *pos[1];
    int n_pos;
    int r = fl_args_parse(argc, argv, opts, "fitllm inspect MODEL.gguf [--json] [-c CTX] [--kv]",
                          "Print a GGUF model's architecture, hyperparameters, tokenizer, tensors and the\n"
                          "memory it needs (weights by type, KV cache per token at f16, total for CTX).",
                          pos, 1, &n_pos);
    if (r) return r == 1 ? 0 : 2;
    if (n_pos != 1) {
        fprintf(stderr, "fitllm inspect: expected one MODEL argument (see --help)\n");
        return 2;
    }
    fl_gguf *g;
    if (fl_gguf_open(pos[0], &g) != FL_OK) {
        fprintf(stderr, "fitllm inspect: %s\n", fl_last_error());
        return 1;
    }
    hparams h;
    read_hparams(g, &h);
    int64_t ctx = opts[1].set ? opts[1].i : h.n_ctx_train;
    if (ctx < 0) ctx = 0;
    /* bytes per block type */
    uint64_t by_type[FL_TYPE_GGML_COUNT] = {0}, n_by_type[FL_TYPE_GGML_COUNT] = {0}, weights = 0, params = 0;
    for (int64_t i = 0; i < fl_gguf_n_tensors(g); i++) {
        const fl_gguf_tensor *t = fl_gguf_tensor_at(g, i);
        by_type[t->type] += t->size;
        n_by_type[t->type]++;
        weights += t->size;
        params += (uint64_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
    }
    /* KV per token at f16: K and V, per layer, per kv head, head_dim each */
    uint64_t kv_per_tok = 2ull * (uint64_t)h.n_layer * (uint64_t)h.n_head_kv * (uint64_t)h.head_dim * 2ull;
    uint64_t kv_total = kv_per_tok * (uint64_t)ctx;
    int json = opts[0].set;
    int rc = 0;
    if (json) {
        fl_mem_install_cjson_hooks();
        const size_t fail0 = fl_mem_thread_failures();
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "file", pos[0]);
        cJSON_AddNumberToObject(o, "gguf_version", fl_gguf_version(g));
        cJSON_AddStringToObject(o, "architecture", h.arch);
        cJSON_AddNumberToObject(o, "n_kv", (double)fl_gguf_n_kv(g));
        cJSON_AddNumberToObject(o, "n_tensors", (double)fl_gguf_n_tensors(g));
        cJSON *hp = cJSON_AddObjectToObject(o, "hparams");
        cJSON_AddNumberToObject(hp, "n_vocab", (double)h.n_vocab);
        cJSON_AddNumberToObject(hp, "n_ctx_train", (double)h.n_ctx_train);
        cJSON_AddNumberToObject(hp, "n_embd", (double)h.n_embd);
        cJSON_AddNumberToObject(hp, "n_ff", (double)h.n_ff);
        cJSON_AddNumberToObject(hp, "n_layer", (double)h.n_layer);
        cJSON_AddNumberToObject(hp, "n_head", (double)h.n_head);
        cJSON_AddNumberToObject(hp, "n_head_kv", (double)h.n_head_kv);
        cJSON_AddNumberToObject(hp, "head_dim", (double)h.head_dim);
        cJSON_AddNumberToObject(hp, "rope_dim", (double)h.rope_dim);
        cJSON_AddNumberToObject(hp, "rope_freq_base", h.rope_base);
        cJSON_AddNumberToObject(hp, "rms_eps", h.rms_eps);
        cJSON *tk = cJSON_AddObjectToObject(o, "tokenizer");
        cJSON_AddStringToObject(tk, "model", h.tok_model);
        cJSON_AddNumberToObject(tk, "vocab_size", (double)h.n_vocab);
        cJSON *ts = cJSON_AddArrayToObject(o, "tensors");
        for (int64_t i = 0; i < fl_gguf_n_tensors(g); i++) {
            const fl_gguf_tensor *t = fl_gguf_tensor_at(g, i);
            cJSON *e = cJSON_CreateObject();
            char name[512];
            snprintf(name, sizeof name, "%.*s", (int)(t->name.len > 500 ? 500 : t->name.len), t->name.data);
            cJSON_AddStringToObject(e, "name", name);
            cJSON_AddStringToObject(e, "type", fl_type_name(t->type));
            cJSON *sh = cJSON_AddArrayToObject(e, "shape");
            for (int d = 0; d < t->n_dims; d++) fl_cli_json_add(sh, NULL, cJSON_CreateNumber((double)t->ne[d]));
            cJSON_AddNumberToObject(e, "bytes", (double)t->size);
            fl_cli_json_add(ts, NULL, e);
        }
        cJSON *wb = cJSON_AddObjectToObject(o, "weights_bytes");
        for (int t = 0; t < FL_TYPE_GGML_COUNT; t++)
            if (n_by_type[t]) cJSON_AddNumberToObject(wb, fl_type_name(t), (double)by_type[t]);
        cJSON_AddNumberToObject(wb, "total", (double)weights);
        cJSON_AddNumberToObject(o, "n_params", (double)params);
        cJSON_AddNumberToObject(o, "kv_bytes_per_token", (double)kv_per_tok);
        cJSON_AddNumberToObject(o, "ctx", (double)ctx);
        cJSON_AddNumberToObject(o, "kv_bytes", (double)kv_total);
        cJSON_AddNumberToObject(o, "total_bytes", (double)(weights + kv_total));
        rc = fl_cli_print_json("inspect", o, true, fail0);
    } else {
        char a[32], b[32], c[32];
        printf("file:          %s (GGUF v%u, %zu bytes, alignment %u)\n", pos[0], fl_gguf_version(g), fl_gguf_file_size(g), fl_gguf_alignment(g));
        printf("architecture:  %s\n", h.arch);
        printf("hparams:       n_vocab %lld, n_ctx_train %lld, n_embd %lld, n_ff %lld, n_layer %lld\n", (long long)h.n_vocab,
               (long long)h.n_ctx_train, (long long)h.n_embd, (long long)h.n_ff, (long long)h.n_layer);
        printf("               n_head %lld, n_head_kv %lld, head_dim %lld, rope_dim %lld, rope_base %g, rms_eps %g\n",
               (long long)h.n_head, (long long)h.n_head_kv, (long long)h.head_dim, (long long)h.rope_dim, h.rope_base, h.rms_eps);
        printf("tokenizer:     %s, %lld tokens\n", h.tok_model, (long long)h.n_vocab);
        if (opts[2].set) {
            printf("\nmetadata (%lld keys):\n", (long long)fl_gguf_n_kv(g));
            for (int64_t i = 0; i < fl_gguf_n_kv(g); i++) {
                const fl_gguf_kv *kv = fl_gguf_kv_at(g, i);
                char v[128];
                fl_gguf_value_str(&kv->value, v, sizeof v);
                printf("  %-44.*s %s\n", (int)kv->key.len, kv->key.data, v);
            }
        }
        printf("\ntensors (%lld):\n  %-32s %-8s %-22s %12s\n", (long long)fl_gguf_n_tensors(g), "name", "type", "shape", "bytes");
        for (int64_t i = 0; i < fl_gguf_n_tensors(g); i++) {
            const fl_gguf_tensor *t = fl_gguf_tensor_at(g, i);
            char shape[64] = "";
            size_t k = 0;
            for (int d = 0; d < t->n_dims; d++) k += (size_t)snprintf(shape + k, sizeof shape - k, d ? " x %lld" : "%lld", (long long)t->ne[d]);
            printf("  %-32.*s %-8s %-22s %12llu\n", (int)t->name.len, t->name.data, fl_type_name(t->type), shape, (unsigned long long)t->size);
        }
        printf("\nweights by type:\n");
        for (int t = 0; t < FL_TYPE_GGML_COUNT; t++)
            if (n_by_type[t]) {
                human(a, sizeof a, (double)by_type[t]);
                printf("  %-8s %4llu tensors %12s\n", fl_type_name(t), (unsigned long long)n_by_type[t], a);
            }
        human(a, sizeof a, (double)weights);
        human(b, sizeof b, (double)kv_per_tok);
        human(c, sizeof c, (double)kv_total);
        printf("\nmemory:\n  weights        %12s (%llu params, %.3f bits/param)\n", a, (unsigned long long)params, params ? 8.0 * (double)weights / (double)params : 0.0);
        printf("  KV per token   %12s (f16: 2 x %lld layers x %lld kv heads x %lld dims x 2 B)\n", b, (long long)h.n_layer, (long long)h.n_head_kv, (long long)h.head_dim);
        printf("  KV at ctx %-5lld%12s\n", (long long)ctx, c);
        human(a, sizeof a, (double)(weights + kv_total));
        printf("  total          %12s (weights + KV; activations: see `fitllm plan`)\n", a);
    }
    fl_gguf_free(g);
    return rc;
}
