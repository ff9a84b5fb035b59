/* Model shapes for the planner: built-in presets (public config.json numbers), Hugging Face
 * config.json files (cJSON) and GGUF headers (exact tensor bytes, no weights read). */
#include "plan/plan.h"
#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"
#include "formats/gguf.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct preset {
    const char *name;
    int64_t n_vocab, n_embd, n_ff, n_layer, n_head, n_head_kv, head_dim, n_expert, n_expert_used, window, n_ctx;
    bool tied, qkv_bias;
} preset;

/* From each model's published config.json. */
static const preset presets[] = {
    {"llama3-8b", 128256, 4096, 14336, 32, 32, 8, 128, 0, 0, 0, 8192, false, false},
    {"llama3-70b", 128256, 8192, 28672, 80, 64, 8, 128, 0, 0, 0, 8192, false, false},
    {"llama3.2-1b", 128256, 2048, 8192, 16, 32, 8, 64, 0, 0, 0, 131072, true, false},
    {"llama3.2-3b", 128256, 3072, 8192, 28, 24, 8, 128, 0, 0, 0, 131072, true, false},
    {"mistral-7b", 32000, 4096, 14336, 32, 32, 8, 128, 0, 0, 4096, 32768, false, false}, /* v0.1: 4K window */
    {"mixtral-8x7b", 32000, 4096, 14336, 32, 32, 8, 128, 8, 2, 0, 32768, false, false},
    {"qwen2.5-7b", 152064, 3584, 18944, 28, 28, 4, 128, 0, 0, 0, 32768, false, true},
    {"tinyllama-1.1b", 32000, 2048, 5632, 22, 32, 4, 64, 0, 0, 0, 2048, false, false},
};
#define N_PRESETS ((int32_t)(sizeof presets / sizeof presets[0]))

int32_t fl_plan_n_presets(void) { return N_PRESETS; }
const char *fl_plan_preset_name(int32_t i) { return i >= 0 && i < N_PRESETS ? presets[i].name : NULL; }

fl_status fl_plan_preset(const char *name, fl_model_shape *out) {
    for (int32_t i = 0; i < N_PRESETS; i++) {
        const preset *p = &presets[i];
        if (strcasecmp(p->name, name)) continue;
        memset(out, 0, sizeof *out);
        snprintf(out->name, sizeof out->name, "%s", p->name);
        out->n_vocab = p->n_vocab;
        out->n_embd = p->n_embd;
        out->n_ff = p->n_ff;
        out->n_layer = p->n_layer;
        out->n_head = p->n_head;
        out->n_head_kv = p->n_head_kv;
        out->head_dim = p->head_dim;
        out->n_expert = p->n_expert;
        out->n_expert_used = p->n_expert_used;
        out->sliding_window = p->window;
        out->n_ctx_train = p->n_ctx;
        out->tied_output = p->tied;
        out->qkv_bias = p->qkv_bias;
        out->file_type = -1;
        return FL_OK;
    }
    char list[512] = "";
    size_t k = 0;
    for (int32_t i = 0; i < N_PRESETS && k < sizeof list; i++)
        k += (size_t)snprintf(list + k, sizeof list - k, "%s%s", i ? ", " : "", presets[i].name);
    return fl_set_error(FL_ERR_INVALID, "unknown preset '%s' (known: %s)", name, list);
}

/* ---- config.json ---- */

static fl_status get_int(const cJSON *o, const char *key, bool required, int64_t dflt, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return fl_set_error(FL_ERR_FORMAT, "config.json: missing \"%s\"", key);
        *out = dflt;
        return FL_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e15 || v->valuedouble != (double)(int64_t)v->valuedouble)
        return fl_set_error(FL_ERR_FORMAT, "config.json: \"%s\" is not a non-negative integer", key);
    *out = (int64_t)v->valuedouble;
    return FL_OK;
}

static bool get_bool(const cJSON *o, const char *key, bool dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

fl_status fl_plan_shape_from_config_str(const char *json, fl_model_shape *out) {
    memset(out, 0, sizeof *out);
    out->file_type = -1;
    cJSON *o = cJSON_Parse(json);
    if (!o) return fl_set_error(FL_ERR_FORMAT, "config.json: not valid JSON (near '%.20s')", cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() : "");
    fl_status st = FL_OK;
    if (!cJSON_IsObject(o)) {
        st = fl_set_error(FL_ERR_FORMAT, "config.json: not a JSON object");
        goto done;
    }
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(o, "model_type");
    snprintf(out->name, sizeof out->name, "%s", cJSON_IsString(mt) ? mt->valuestring : "config");
    int64_t ctx, use_swa;
    if ((st = get_int(o, "vocab_size", true, 0, &out->n_vocab)) || (st = get_int(o, "hidden_size", true, 0, &out->n_embd)) ||
        (st = get_int(o, "intermediate_size", true, 0, &out->n_ff)) ||
        (st = get_int(o, "num_hidden_layers", true, 0, &out->n_layer)) ||
        (st = get_int(o, "num_attention_heads", true, 0, &out->n_head)) ||
        (st = get_int(o, "num_key_value_heads", false, out->n_head, &out->n_head_kv)) ||
        (st = get_int(o, "head_dim", false, out->n_head ? out->n_embd / out->n_head : 0, &out->head_dim)) ||
        (st = get_int(o, "num_local_experts", false, 0, &out->n_expert)) ||
        (st = get_int(o, "num_experts_per_tok", false, 0, &out->n_expert_used)) ||
        (st = get_int(o, "sliding_window", false, 0, &out->sliding_window)) ||
        (st = get_int(o, "max_position_embeddings", false, 0, &ctx)))
        goto done;
    if (out->n_head == 0 || out->n_embd == 0 || out->n_layer == 0) {
        st = fl_set_error(FL_ERR_FORMAT, "config.json: hidden_size, num_hidden_layers and num_attention_heads must be > 0");
        goto done;
    }
    out->n_ctx_train = ctx;
    /* Qwen2 configs carry a sliding_window that is off unless use_sliding_window is true */
    use_swa = get_bool(o, "use_sliding_window", true);
    if (!use_swa) out->sliding_window = 0;
    if (out->n_expert == 0) out->n_expert_used = 0;
    out->tied_output = get_bool(o, "tie_word_embeddings", false);
    out->qkv_bias = get_bool(o, "attention_bias", false) || (cJSON_IsString(mt) && !strcmp(mt->valuestring, "qwen2"));
done:
    cJSON_Delete(o);
    return st;
}

fl_status fl_plan_shape_from_config(const char *path, fl_model_shape *out) {
    FILE *f = fopen(path, "rb");
    if (!f) return fl_set_error(FL_ERR_IO, "cannot open '%s'", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (n < 0 || n > (64 << 20)) {
        fclose(f);
        return fl_set_error(FL_ERR_FORMAT, "'%s': not a config.json (size %ld)", path, n);
    }
    char *buf = fl_alloc(FL_MEM_MISC, (size_t)n + 1, 1);
    if (!buf) {
        fclose(f);
        return FL_ERR_NOMEM;
    }
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    buf[got] = 0;
    fl_status st = fl_plan_shape_from_config_str(buf, out);
    fl_free(FL_MEM_MISC, buf, (size_t)n + 1);
    if (st) fl_add_error_context("%s", path);
    return st;
}

/* ---- GGUF header ---- */

static int64_t gi(const fl_gguf *g, const char *arch, const char *suffix, int64_t dflt) {
    char key[256];
    int64_t v;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return fl_gguf_get_i64(g, key, &v) == FL_OK ? v : dflt;
}

fl_status fl_plan_shape_from_gguf(const char *path, fl_model_shape *out) {
    memset(out, 0, sizeof *out);
    fl_gguf *g;
    fl_status st = fl_gguf_open(path, &g);
    if (st) return st;
    char arch[64];
    if (fl_gguf_get_str(g, "general.architecture", arch, sizeof arch) != FL_OK) {
        fl_gguf_free(g);
        return fl_set_error(FL_ERR_FORMAT, "%s: no general.architecture", path);
    }
    const char *base = strrchr(path, '/');
    snprintf(out->name, sizeof out->name, "%s", base ? base + 1 : path);
    out->n_layer = gi(g, arch, "block_count", 0);
    out->n_embd = gi(g, arch, "embedding_length", 0);
    out->n_ff = gi(g, arch, "feed_forward_length", 0);
    out->n_head = gi(g, arch, "attention.head_count", 0);
    out->n_head_kv = gi(g, arch, "attention.head_count_kv", out->n_head);
    out->head_dim = gi(g, arch, "attention.key_length", out->n_head ? out->n_embd / out->n_head : 0);
    out->n_expert = gi(g, arch, "expert_count", 0);
    out->n_expert_used = gi(g, arch, "expert_used_count", 0);
    out->sliding_window = gi(g, arch, "attention.sliding_window", 0);
    out->n_ctx_train = gi(g, arch, "context_length", 0);
    const fl_gguf_value *toks = fl_gguf_get_arr(g, "tokenizer.ggml.tokens");
    out->n_vocab = toks ? (int64_t)toks->v.arr.n : gi(g, arch, "vocab_size", 0);
    const fl_gguf_tensor *te = fl_gguf_find_tensor(g, "token_embd.weight");
    if (!out->n_vocab && te && te->n_dims >= 2) out->n_vocab = te->ne[1];
    out->tied_output = te && !fl_gguf_find_tensor(g, "output.weight");
    out->qkv_bias = fl_gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL;
    fl_clear_error();
    if (out->n_layer < 0 || out->n_layer > FL_PLAN_MAX_LAYERS) {
        fl_gguf_free(g);
        return fl_set_error(FL_ERR_UNSUPPORTED, "%s: %lld layers (the planner handles up to %d)", path, (long long)out->n_layer, FL_PLAN_MAX_LAYERS);
    }
    /* exact bytes by part */
    uint64_t by_type[FL_TYPE_GGML_COUNT] = {0};
    out->has_weight_bytes = true;
    for (int64_t i = 0; i < fl_gguf_n_tensors(g); i++) {
        const fl_gguf_tensor *t = fl_gguf_tensor_at(g, i);
        out->n_params_file += t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        bool is_2d = t->n_dims >= 2 && t->ne[1] > 1;
        if (is_2d) by_type[t->type] += t->size;
        long l;
        int k = 0;
        char nm[32];
        snprintf(nm, sizeof nm, "%.*s", (int)(t->name.len < 31 ? t->name.len : 31), t->name.data);
        if (sscanf(nm, "blk.%ld.%n", &l, &k) == 1 && k > 0 && l >= 0 && l < out->n_layer) {
            if (is_2d) out->w_layer_split[l] += t->size;
            else out->w_layer_repl[l] += t->size;
            if (is_2d && (strstr(nm + k, "attn_k.") == nm + k || strstr(nm + k, "attn_v.") == nm + k)) out->w_layer_kv[l] += t->size;
        } else if (fl_gguf_str_eq(t->name, "token_embd.weight")) out->w_embd += t->size;
        else if (fl_gguf_str_eq(t->name, "output.weight")) out->w_output += t->size;
        else out->w_other += t->size;
    }
    out->file_type = -1;
    /* a header without tensors (vocab-only files) is planned from its hyperparameters */
    out->has_weight_bytes = fl_gguf_n_tensors(g) > 0;
    uint64_t most = 0;
    out->file_types = 0;
    for (int t = 0; t < FL_TYPE_GGML_COUNT; t++) {
        if (by_type[t] && t < 64) out->file_types |= 1ull << t;
        if (by_type[t] > most) {
            most = by_type[t];
            out->file_type = t;
        }
    }
    fl_gguf_free(g);
    return FL_OK;
}
