/* LoRA adapters applied at run time (see lora.h). */
#include "model/lora.h"
#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *const target_names[FL_LORA_TARGETS] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                                          "ffn_gate", "ffn_up", "ffn_down"};

/* Input (K) and output (N) widths of target k in the base model. */
static void target_shape(const fl_hparams *hp, int k, int64_t *K, int64_t *N) {
    const int64_t E = hp->n_embd, HQ = (int64_t)hp->n_head * hp->head_dim, HKV = (int64_t)hp->n_head_kv * hp->head_dim;
    const int64_t F = hp->n_ff;
    *K = k == FL_LORA_DOWN ? F : k == FL_LORA_O ? HQ : E;
    *N = k == FL_LORA_Q ? HQ : (k == FL_LORA_K || k == FL_LORA_V) ? HKV : (k == FL_LORA_GATE || k == FL_LORA_UP) ? F : E;
}

static bool usable_type(int32_t t) { return t == FL_TYPE_F32 || t == FL_TYPE_F16 || t == FL_TYPE_BF16; }

/* Fill slot s from A (r rows of K) at a and B (N rows of r) at b, both of type t. */
static fl_status set_slot(fl_lora *l, fl_lora_slot *s, int32_t t, int64_t K, int64_t N, int64_t r, const void *a,
                          const void *b, float scale, float unit, const char *name) {
    if (!usable_type(t))
        return fl_set_error(FL_ERR_UNSUPPORTED, "adapter tensor %s: type %s (F32, F16 or BF16 are applied)", name, fl_type_name(t));
    if (r < 1 || r > 4096) return fl_set_error(FL_ERR_FORMAT, "adapter tensor %s: rank %lld", name, (long long)r);
    const int64_t nea[2] = {K, r}, neb[2] = {r, N};
    if (!fl_tensor_init(&s->a, t, 2, nea, (void *)a) || !fl_tensor_init(&s->b, t, 2, neb, (void *)b))
        return fl_set_error(FL_ERR_FORMAT, "adapter tensor %s: bad shape", name);
    s->unit = unit;
    s->scale = scale * unit;
    if (r > l->rank_max) l->rank_max = (int32_t)r;
    if (N > l->n_max) l->n_max = N;
    l->n_pairs++;
    return FL_OK;
}

static bool shape_is(const fl_gguf_tensor *t, int n_dims, int64_t a, int64_t b, int64_t c) {
    return t->ne[0] == a && t->ne[1] == b && t->ne[2] == (n_dims > 2 ? c : 1) && t->ne[3] == 1;
}

/* The pair of tensors na / nb: *ta NULL when neither is there, an error naming the one alone. */
static fl_status find_pair(const fl_gguf *g, const char *na, const char *nb, const fl_gguf_tensor **ta, const fl_gguf_tensor **tb) {
    *ta = fl_gguf_find_tensor(g, na);
    *tb = fl_gguf_find_tensor(g, nb);
    if (!*ta != !*tb) return fl_set_error(FL_ERR_FORMAT, "adapter tensor %s has no %s", *ta ? na : nb, *ta ? nb : na);
    return FL_OK;
}

/* fitllm's file: lora.<name>.a [K, r, L], lora.<name>.b [r, N, L]. */
static fl_status read_fitllm(fl_lora *l, const fl_hparams *hp, float scale) {
    uint32_t rank = 0;
    float alpha = 0;
    if (fl_gguf_get_u32(l->g, "lora.rank", &rank) || rank < 1 || rank > 4096)
        return fl_set_error(FL_ERR_FORMAT, "lora.rank is missing or out of range");
    if (fl_gguf_find(l->g, "lora.alpha") && fl_gguf_get_f32(l->g, "lora.alpha", &alpha))
        return fl_set_error(FL_ERR_FORMAT, "lora.alpha is not a float");
    if (!isfinite(alpha)) return fl_set_error(FL_ERR_FORMAT, "lora.alpha %g is not finite", (double)alpha);
    const float unit = alpha != 0.0f ? alpha / (float)rank : 1.0f;
    int64_t n_known = 0;
    for (int k = 0; k < FL_LORA_TARGETS; k++) {
        char na[64], nb[64];
        snprintf(na, sizeof na, "lora.%s.a", target_names[k]);
        snprintf(nb, sizeof nb, "lora.%s.b", target_names[k]);
        const fl_gguf_tensor *ta, *tb;
        fl_status st = find_pair(l->g, na, nb, &ta, &tb);
        if (st) return st;
        if (!ta) continue;
        n_known += 2;
        int64_t K, N;
        target_shape(hp, k, &K, &N);
        if (!shape_is(ta, 3, K, rank, hp->n_layer) || !shape_is(tb, 3, rank, N, hp->n_layer) || ta->type != tb->type)
            return fl_set_error(FL_ERR_FORMAT,
                                "adapter tensors %s [%lld, %lld, %lld] / %s [%lld, %lld, %lld] do not fit the model: expected [%lld, %u, %d] / [%u, %lld, %d] of one type",
                                na, (long long)ta->ne[0], (long long)ta->ne[1], (long long)ta->ne[2], nb, (long long)tb->ne[0],
                                (long long)tb->ne[1], (long long)tb->ne[2], (long long)K, rank, hp->n_layer, rank, (long long)N,
                                hp->n_layer);
        const size_t esz = fl_type_row_size(ta->type, 1);
        for (int32_t il = 0; il < hp->n_layer; il++) {
            st = set_slot(l, &l->slots[(size_t)il * FL_LORA_TARGETS + (size_t)k], ta->type, K, N, rank,
                                    (const char *)ta->data + (size_t)il * (size_t)rank * (size_t)K * esz,
                                    (const char *)tb->data + (size_t)il * (size_t)rank * (size_t)N * esz, scale, unit, na);
            if (st) return st;
        }
    }
    if (n_known != fl_gguf_n_tensors(l->g))
        return fl_set_error(FL_ERR_FORMAT, "the adapter has %lld tensors, %lld of them adapters of q, k, v, o, gate, up or down",
                            (long long)fl_gguf_n_tensors(l->g), (long long)n_known);
    return FL_OK;
}

/* llama.cpp's file: blk.<i>.<name>.weight.lora_a [K, r] and .lora_b [r, N]. */
static fl_status read_llama_cpp(fl_lora *l, const fl_hparams *hp, float scale) {
    char ty[32] = "";
    if (fl_gguf_find(l->g, "adapter.type") && (fl_gguf_get_str(l->g, "adapter.type", ty, sizeof ty) || strcmp(ty, "lora")))
        return fl_set_error(FL_ERR_UNSUPPORTED, "adapter.type '%s' (only lora adapters are applied)", ty);
    float alpha = 0;
    if (fl_gguf_find(l->g, "adapter.lora.alpha") && fl_gguf_get_f32(l->g, "adapter.lora.alpha", &alpha))
        return fl_set_error(FL_ERR_FORMAT, "adapter.lora.alpha is not a float");
    if (!isfinite(alpha)) return fl_set_error(FL_ERR_FORMAT, "adapter.lora.alpha %g is not finite", (double)alpha);
    int64_t n_known = 0;
    for (int32_t il = 0; il < hp->n_layer; il++)
        for (int k = 0; k < FL_LORA_TARGETS; k++) {
            char na[96], nb[96];
            snprintf(na, sizeof na, "blk.%d.%s.weight.lora_a", il, target_names[k]);
            snprintf(nb, sizeof nb, "blk.%d.%s.weight.lora_b", il, target_names[k]);
            const fl_gguf_tensor *ta, *tb;
            fl_status st = find_pair(l->g, na, nb, &ta, &tb);
            if (st) return st;
            if (!ta) continue;
            n_known += 2;
            int64_t K, N;
            target_shape(hp, k, &K, &N);
            const int64_t r = ta->ne[1];
            if (!shape_is(ta, 2, K, r, 1) || !shape_is(tb, 2, r, N, 1) || ta->type != tb->type)
                return fl_set_error(FL_ERR_FORMAT, "adapter tensors %s [%lld, %lld] / %s [%lld, %lld] do not fit the model: expected [%lld, r] / [r, %lld] of one type",
                                    na, (long long)ta->ne[0], (long long)ta->ne[1], nb, (long long)tb->ne[0],
                                    (long long)tb->ne[1], (long long)K, (long long)N);
            const float unit = alpha != 0.0f && r > 0 ? alpha / (float)r : 1.0f;
            st = set_slot(l, &l->slots[(size_t)il * FL_LORA_TARGETS + (size_t)k], ta->type, K, N, r, ta->data, tb->data, scale, unit, na);
            if (st) return st;
        }
    if (n_known != fl_gguf_n_tensors(l->g))
        return fl_set_error(FL_ERR_FORMAT,
                            "the adapter has %lld tensors, %lld of them adapters of q, k, v, o, gate, up or down of the model's %d layers",
                            (long long)fl_gguf_n_tensors(l->g), (long long)n_known, hp->n_layer);
    return FL_OK;
}

fl_status fl_lora_open(const char *path, const fl_hparams *hp, float scale, bool no_mmap, fl_lora **out) {
    *out = NULL;
    if (!isfinite(scale) || scale < -1e6f || scale > 1e6f) return fl_set_error(FL_ERR_INVALID, "LoRA scale %g out of range", (double)scale);
    fl_lora *l = fl_calloc(FL_MEM_MISC, 1, sizeof *l);
    if (!l) return FL_ERR_NOMEM;
    l->n_layer = hp->n_layer;
    fl_status st = fl_gguf_open_ex(path, no_mmap, &l->g);
    if (st) goto fail;
    l->slots = fl_calloc(FL_MEM_MISC, (size_t)hp->n_layer * FL_LORA_TARGETS, sizeof *l->slots);
    if (!l->slots) {
        st = FL_ERR_NOMEM;
        goto fail;
    }
    char ty[32] = "";
    if (fl_gguf_find(l->g, "lora.rank")) st = read_fitllm(l, hp, scale);
    else if (fl_gguf_get_str(l->g, "general.type", ty, sizeof ty) == FL_OK && !strcmp(ty, "adapter")) st = read_llama_cpp(l, hp, scale);
    else st = fl_set_error(FL_ERR_FORMAT, "not a LoRA adapter: no lora.rank key, and general.type is not 'adapter'");
    if (!st && l->n_pairs == 0) st = fl_set_error(FL_ERR_FORMAT, "the adapter adapts no matrix");
    if (st) goto fail;
    *out = l;
    return FL_OK;
fail:
    fl_add_error_context("LoRA adapter %s", path);
    fl_lora_free(l);
    return st;
}

void fl_lora_free(fl_lora *l) {
    if (!l) return;
    if (l->slots) fl_free(FL_MEM_MISC, l->slots, (size_t)l->n_layer * FL_LORA_TARGETS * sizeof *l->slots);
    fl_gguf_free(l->g);
    fl_free(FL_MEM_MISC, l, sizeof *l);
}

static size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }

size_t fl_lora_workspace_bytes(int32_t rank_max, int64_t n_max, int32_t max_tokens) {
    if (rank_max <= 0 || max_tokens <= 0) return 0;
    return 2 * round64((size_t)max_tokens * (size_t)rank_max * sizeof(float)) + round64((size_t)max_tokens * (size_t)n_max * sizeof(float));
}

size_t fl_lora_table_bytes(int32_t n_layer) { return sizeof(fl_lora) + (size_t)n_layer * FL_LORA_TARGETS * sizeof(fl_lora_slot); }

int64_t fl_lora_n_bound(const fl_hparams *hp) {
    int64_t n = 0;
    for (int k = 0; k < FL_LORA_TARGETS; k++) {
        int64_t K, N;
        target_shape(hp, k, &K, &N);
        if (N > n) n = N;
    }
    return n;
}

size_t fl_lora_misc_bytes(const fl_lora *l) { return fl_lora_table_bytes(l->n_layer) + fl_gguf_index_bytes(l->g); }

void fl_lora_slot_caps(const fl_hparams *hp, int32_t rank, size_t *file_cap, size_t *misc_cap) {
    const int64_t n_t = 2 * FL_LORA_TARGETS * (int64_t)hp->n_layer; /* llama.cpp's files: A and B per layer and matrix */
    size_t data = 0;
    for (int k = 0; k < FL_LORA_TARGETS; k++) {
        int64_t K, N;
        target_shape(hp, k, &K, &N);
        data += (size_t)rank * (size_t)(K + N) * sizeof(float);
    }
    *file_cap = data * (size_t)hp->n_layer + FL_LORA_SLOT_HEADER + (size_t)n_t * FL_LORA_SLOT_PER_TENSOR;
    *misc_cap = fl_lora_table_bytes(hp->n_layer) + fl_gguf_index_bound(FL_LORA_SLOT_KEYS, n_t, FL_LORA_SLOT_ITEMS);
}
