/* Trainable llama model: parameters, forward/backward with activation checkpointing. */
#include "train/model.h"

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"
#include "kernels/attn.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "kernels/sgemm.h"
#include "model/llama.h"
#include "train/layout.h"
#include "train/ops_train.h"
#include "train/rng.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *const k_names[FL_TP_COUNT] = {
    "token_embd", "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
    "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "output_norm", "output",
};

void fl_train_param_name(fl_train_param p, int layer, char *buf, size_t cap) {
    if (fl_train_param_per_layer(p)) snprintf(buf, cap, "blk.%d.%s.weight", layer, k_names[p]);
    else snprintf(buf, cap, "%s.weight", k_names[p]);
}

static int64_t tensor_off(const fl_train_model *m, fl_train_param p, int layer) {
    int64_t ne[2];
    fl_train_param_shape(&m->cfg, p, ne);
    return m->offset[p] + (fl_train_param_per_layer(p) ? (int64_t)layer * ne[0] * ne[1] : 0);
}

float *fl_train_model_tensor(const fl_train_model *m, float *buf, fl_train_param p, int layer) {
    return buf + tensor_off(m, p, layer);
}

/* ---------------------------------------------------------------- lifetime */

/* A model of cfg; without_matrices: params holds only the leading non-matrix tensors (the
 * matrices to be frozen elsewhere), n_full still counts them. */
static fl_status model_alloc(const fl_train_config *cfg, bool without_matrices, fl_train_model **out) {
    *out = NULL;
    fl_status st = fl_train_config_check(cfg);
    if (st) return st;
    fl_train_model *m = fl_calloc(FL_MEM_MISC, 1, sizeof *m);
    if (!m) return FL_ERR_NOMEM;
    m->cfg = *cfg;
    /* layout: the small/global tensors first, the per-layer matrices last (so a frozen
     * quantized base can drop them by shrinking the allocation, or never hold them) */
    int64_t off = 0, keep = -1;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) keep = off;
        for (int p = 0; p < FL_TP_COUNT; p++) {
            if (fl_train_param_is_matrix((fl_train_param)p) != (pass == 1)) continue;
            m->offset[p] = off;
            off += fl_train_param_numel(cfg, (fl_train_param)p);
        }
    }
    m->n_full = off;
    m->n_params = without_matrices ? keep : off;
    m->params = fl_calloc(FL_MEM_WEIGHTS, (size_t)m->n_params, sizeof(float));
    if (!m->params) {
        const long long n = (long long)m->n_params;
        fl_free(FL_MEM_MISC, m, sizeof *m);
        return fl_set_error(FL_ERR_NOMEM, "%s: no memory for %lld parameters", __func__, n);
    }
    *out = m;
    return FL_OK;
}

fl_status fl_train_model_new(const fl_train_config *cfg, fl_train_model **out) { return model_alloc(cfg, false, out); }

/* gradients are kept for the trainable buffer only */
static int64_t n_grads(const fl_train_model *m) { return m->lora_rank > 0 ? m->n_lora : m->n_params; }

/* ---------------------------------------------------------------- gradient buckets */

bool fl_train_grad_bucket_tensor(const fl_train_model *m, int bucket, int i, int64_t *off, int64_t *soff, int64_t *n) {
    const fl_train_param *k;
    if (i < 0 || i >= fl_train_grad_bucket_kinds(&m->cfg, bucket, &k)) return false;
    *soff = 0;
    for (int j = 0; j < i; j++) *soff += fl_train_layer_numel(&m->cfg, k[j]);
    *off = tensor_off(m, k[i], bucket < 0 ? 0 : bucket);
    *n = fl_train_layer_numel(&m->cfg, k[i]);
    return true;
}

void fl_train_model_set_grad_sink(fl_train_model *m, fl_train_grad_sink sink, void *ud) {
    m->gsink = sink;
    m->gsink_ud = ud;
}

/* Gradient of tensor p, layer l: in grads, or in the staging buffer of its bucket. */
static float *grad_of(const fl_train_model *m, fl_train_param p, int l) {
    if (!m->gstage) return fl_train_model_tensor(m, m->grads, p, l);
    const int b = p == FL_TP_OUT_NORM || p == FL_TP_OUTPUT ? FL_TRAIN_BUCKET_HEAD : p == FL_TP_TOK_EMBD ? m->cfg.n_layer : 0;
    const fl_train_param *k;
    const int nk = fl_train_grad_bucket_kinds(&m->cfg, b, &k);
    float *g = m->gstage;
    for (int i = 0; i < nk && k[i] != p; i++) g += fl_train_layer_numel(&m->cfg, k[i]);
    return g;
}

/* Start bucket b: its staging from zero (bucketed gradients only). */
static void bucket_start(const fl_train_model *m, int b) {
    if (m->gstage) memset(m->gstage, 0, (size_t)fl_train_grad_bucket_elems(&m->cfg, b) * sizeof(float));
}

/* Bucket b complete: to the sink. */
static fl_status bucket_done(const fl_train_model *m, int b) {
    if (!m->gstage) return FL_OK;
    return m->gsink ? m->gsink(m->gsink_ud, m, b, m->gstage)
                    : fl_set_error(FL_ERR_INVALID, "fl_train_model_backward: gradient buckets without a sink");
}

static void release_reserved(fl_train_model *m) {
    const size_t np = (size_t)m->n_params * sizeof(float);
    if (m->grads) fl_free(FL_MEM_GRAD, m->grads, (size_t)n_grads(m) * sizeof(float));
    if (m->gstage) fl_free(FL_MEM_GRAD, m->gstage, (size_t)fl_train_grad_bucket_max(&m->cfg) * sizeof(float));
    m->gstage = NULL;
    if (m->wcompute) fl_free(FL_MEM_WEIGHTS, m->wcompute, np);
    if (m->acts) fl_free(FL_MEM_ACT, m->acts, m->acts_bytes);
    if (m->bwd) fl_free(FL_MEM_SCRATCH, m->bwd, m->bwd_bytes);
    m->grads = m->wcompute = NULL;
    m->acts = m->bwd = NULL;
    m->acts_bytes = m->bwd_bytes = 0;
    m->priv = NULL;
    m->have_forward = false;
}

void fl_train_model_free(fl_train_model *m) {
    if (!m) return;
    release_reserved(m);
    if (m->lora) fl_free(FL_MEM_WEIGHTS, m->lora, (size_t)m->n_lora * sizeof(float));
    for (int p = 0; p < FL_TP_COUNT; p++)
        if (m->frozen[p]) fl_free(FL_MEM_WEIGHTS, m->frozen[p], m->frozen_bytes[p]);
    if (m->wscratch) fl_free(FL_MEM_SCRATCH, m->wscratch, m->wscratch_bytes);
    fl_free(FL_MEM_WEIGHTS, m->params, (size_t)m->n_params * sizeof(float));
    fl_free(FL_MEM_MISC, m, sizeof *m);
}

void fl_train_model_init_random(fl_train_model *m, uint64_t seed) {
    fl_rng r = {seed};
    const double std = 0.02, std_res = 0.02 / sqrt(2.0 * m->cfg.n_layer);
    for (int p = 0; p < FL_TP_COUNT; p++) {
        float *x = m->params + m->offset[p];
        const int64_t n = fl_train_param_numel(&m->cfg, (fl_train_param)p);
        if (p == FL_TP_ATTN_NORM || p == FL_TP_FFN_NORM || p == FL_TP_OUT_NORM) {
            for (int64_t i = 0; i < n; i++) x[i] = 1.0f;
            continue;
        }
        const double s = (p == FL_TP_WO || p == FL_TP_FFN_DOWN) ? std_res : std;
        for (int64_t i = 0; i < n; i++) x[i] = (float)(s * fl_rng_normal(&r));
    }
    fl_train_model_sync_compute(m);
}

/* ---------------------------------------------------------------- GGUF load */

static int64_t kv_int(const fl_gguf *g, const char *arch, const char *suffix, int64_t dflt) {
    char key[256];
    int64_t v;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (fl_gguf_get_i64(g, key, &v) == FL_OK) return v;
    fl_clear_error();
    return dflt;
}

fl_status fl_train_config_from_gguf(const fl_gguf *g, fl_train_config *cfg) {
    char arch[64];
    if (fl_gguf_get_str(g, "general.architecture", arch, sizeof arch) != FL_OK) return FL_ERR_INVALID;
    if (strcmp(arch, "llama"))
        return fl_set_error(FL_ERR_UNSUPPORTED, "%s: architecture '%s' (training supports llama)", __func__, arch);
    memset(cfg, 0, sizeof *cfg);
    cfg->n_embd = (int32_t)kv_int(g, arch, "embedding_length", 0);
    cfg->n_ff = (int32_t)kv_int(g, arch, "feed_forward_length", 0);
    cfg->n_layer = (int32_t)kv_int(g, arch, "block_count", 0);
    cfg->n_head = (int32_t)kv_int(g, arch, "attention.head_count", 0);
    cfg->n_head_kv = (int32_t)kv_int(g, arch, "attention.head_count_kv", cfg->n_head);
    cfg->n_ctx = (int32_t)kv_int(g, arch, "context_length", 2048);
    cfg->head_dim = cfg->n_head ? cfg->n_embd / cfg->n_head : 0;
    cfg->head_dim = (int32_t)kv_int(g, arch, "attention.key_length", cfg->head_dim);
    cfg->rope_dim = (int32_t)kv_int(g, arch, "rope.dimension_count", cfg->head_dim);
    char key[256];
    snprintf(key, sizeof key, "%s.rope.freq_base", arch);
    if (fl_gguf_get_f32(g, key, &cfg->rope_base) != FL_OK) cfg->rope_base = 10000.0f;
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    if (fl_gguf_get_f32(g, key, &cfg->rms_eps) != FL_OK) cfg->rms_eps = 1e-5f;
    fl_clear_error();
    const fl_gguf_tensor *te = fl_gguf_find_tensor(g, "token_embd.weight");
    const fl_gguf_value *toks = fl_gguf_get_arr(g, "tokenizer.ggml.tokens");
    cfg->n_vocab = te ? (int32_t)te->ne[1] : toks ? (int32_t)toks->v.arr.n : (int32_t)kv_int(g, arch, "vocab_size", 0);
    return fl_train_config_check(cfg);
}

/* Parameter p of layer l in g: its name, expected shape and tensor, checked for that shape.
 * *t is NULL (and FL_OK) for an absent output.weight: the embeddings are tied. */
static fl_status param_tensor(const fl_gguf *g, const fl_train_config *cfg, int p, int l, char name[96], int64_t ne[2],
                              const fl_gguf_tensor **t) {
    fl_train_param_shape(cfg, (fl_train_param)p, ne);
    fl_train_param_name((fl_train_param)p, l, name, 96);
    *t = fl_gguf_find_tensor(g, name);
    if (!*t && p == FL_TP_OUTPUT) return FL_OK;
    if (!*t) return fl_set_error(FL_ERR_FORMAT, "%s: tensor '%s' missing", __func__, name);
    if ((*t)->ne[0] != ne[0] || (*t)->ne[1] != ne[1] || (*t)->ne[2] != 1 || (*t)->ne[3] != 1)
        return fl_set_error(FL_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld], expected [%lld, %lld]", __func__, name,
                            (long long)(*t)->ne[0], (long long)(*t)->ne[1], (long long)ne[0], (long long)ne[1]);
    return FL_OK;
}

/* Dequantize tensor t (of shape ne, checked by param_tensor) into dst. */
static fl_status load_tensor(const fl_gguf_tensor *t, const char *name, const int64_t ne[2], float *dst) {
    if (fl_matmul_supported(t->type) != FL_OK) {
        fl_add_error_context("tensor '%s'", name);
        return FL_ERR_UNSUPPORTED;
    }
    const size_t rs = fl_type_row_size(t->type, ne[0]);
    if (rs == 0 || rs * (size_t)ne[1] > t->size)
        return fl_set_error(FL_ERR_FORMAT, "%s: tensor '%s' data too short", __func__, name);
    for (int64_t r = 0; r < ne[1]; r++) fl_dequant_row(t->type, (const char *)t->data + r * rs, dst + r * ne[0], ne[0]);
    return FL_OK;
}

static fl_status read_params(fl_train_model *m, const fl_gguf *g);
static fl_status frozen_alloc(fl_train_model *m);
static fl_status freeze_layer(fl_train_model *m, fl_train_param p, int l, const float *src);

static fl_status load_gguf(const fl_gguf *g, bool nf4, fl_train_model **out) {
    *out = NULL;
    fl_train_config cfg;
    fl_status st = fl_train_config_from_gguf(g, &cfg);
    if (st) return st;
    if ((st = fl_model_check_tensor_names(g, "llama", cfg.n_layer))) return st; /* (as fl_model_load) */
    /* every tensor's shape before the parameters are allocated: metadata that disagrees with the
     * tensors (a corrupt file) is reported as such, not as a failed allocation of its sizes */
    for (int p = 0; p < FL_TP_COUNT; p++)
        for (int l = 0; l < (fl_train_param_per_layer((fl_train_param)p) ? cfg.n_layer : 1); l++) {
            int64_t ne[2];
            char name[96];
            const fl_gguf_tensor *t;
            if ((st = param_tensor(g, &cfg, p, l, name, ne, &t))) return st;
        }
    fl_train_model *m;
    if ((st = model_alloc(&cfg, nf4, &m))) return st;
    if (nf4) st = frozen_alloc(m);
    if (!st) st = read_params(m, g);
    if (st) {
        fl_train_model_free(m);
        return st;
    }
    *out = m;
    return FL_OK;
}

fl_status fl_train_model_load_gguf(const fl_gguf *g, fl_train_model **out) { return load_gguf(g, false, out); }

fl_status fl_train_model_load_gguf_nf4(const fl_gguf *g, fl_train_model **out) { return load_gguf(g, true, out); }

/* Every parameter from g: into params, or a frozen matrix layer by layer through wscratch. */
static fl_status read_params(fl_train_model *m, const fl_gguf *g) {
    const fl_train_config cfg = m->cfg;
    fl_status st = FL_OK;
    char name[96];
    for (int p = 0; p < FL_TP_COUNT; p++) {
        int64_t ne[2];
        const int nl = fl_train_param_per_layer((fl_train_param)p) ? cfg.n_layer : 1;
        const bool frozen = m->frozen[p] != NULL;
        for (int l = 0; l < nl; l++) {
            const fl_gguf_tensor *t;
            if ((st = param_tensor(g, &cfg, p, l, name, ne, &t))) return st;
            float *dst = frozen ? m->wscratch : fl_train_model_tensor(m, m->params, (fl_train_param)p, l);
            if (!t) { /* tied embeddings */
                memcpy(dst, m->params + m->offset[FL_TP_TOK_EMBD], (size_t)(ne[0] * ne[1]) * sizeof(float));
                continue;
            }
            if ((st = load_tensor(t, name, ne, dst))) return st;
            if (frozen && (st = freeze_layer(m, (fl_train_param)p, l, dst))) return st;
        }
    }
    fl_train_model_sync_compute(m);
    return FL_OK;
}

fl_status fl_train_model_read_params(fl_train_model *m, const fl_gguf *g) {
    if (m->n_params < m->n_full) return fl_set_error(FL_ERR_INVALID, "%s: the base is frozen", __func__);
    return read_params(m, g);
}

/* ---------------------------------------------------------------- reserve */

fl_status fl_train_model_reserve(fl_train_model *m, int64_t max_tokens, int ckpt_every, int precision) {
    release_reserved(m);
    if (max_tokens <= 0 || ckpt_every < 0 || precision < FL_TRAIN_F32 || precision > FL_TRAIN_FP16)
        return fl_set_error(FL_ERR_INVALID, "%s: bad max_tokens %lld / ckpt_every %d / precision %d", __func__,
                            (long long)max_tokens, ckpt_every, precision);
    const size_t np = (size_t)m->n_params * sizeof(float);
    m->precision = precision;
    m->max_tokens = max_tokens;
    m->ckpt_every = ckpt_every;
    if (m->gsink && m->lora_rank <= 0) {
        m->gstage = fl_alloc(FL_MEM_GRAD, (size_t)fl_train_grad_bucket_max(&m->cfg) * sizeof(float), 64);
        if (!m->gstage) goto fail;
    } else if (!(m->grads = fl_calloc(FL_MEM_GRAD, (size_t)n_grads(m), sizeof(float)))) {
        goto fail;
    }
    if (precision != FL_TRAIN_F32) {
        m->wcompute = fl_alloc(FL_MEM_WEIGHTS, np, 64);
        if (!m->wcompute) goto fail;
    }
    const size_t meta = fl_train_act_table_bytes(&m->cfg, ckpt_every);
    const size_t data = fl_train_carve_acts(&m->cfg, max_tokens, ckpt_every, m->lora_rank, NULL, NULL);
    m->acts_bytes = data + meta;
    m->acts = fl_alloc(FL_MEM_ACT, m->acts_bytes, 64);
    if (!m->acts) goto fail;
    m->bwd_bytes = fl_train_carve_bwd(&m->cfg, max_tokens, m->lora_rank, NULL, NULL);
    m->bwd = fl_alloc(FL_MEM_SCRATCH, m->bwd_bytes, 64);
    if (!m->bwd) goto fail;
    /* metadata (slot table) lives at the end of the same allocation */
    act_layout *L = (act_layout *)(m->acts + data);
    memset(L, 0, meta);
    L->slots = (layer_acts *)(L + 1);
    L->ckpt = (float **)(L->slots + (ckpt_every == 0 ? m->cfg.n_layer
                                                       : (ckpt_every < m->cfg.n_layer ? ckpt_every : m->cfg.n_layer)));
    fl_train_carve_acts(&m->cfg, max_tokens, ckpt_every, m->lora_rank, m->acts, L);
    fl_train_carve_bwd(&m->cfg, max_tokens, m->lora_rank, m->bwd, L);
    m->priv = L;
    fl_train_model_sync_compute(m);
    return FL_OK;
fail:
    release_reserved(m);
    return fl_set_error(FL_ERR_NOMEM, "%s: no memory for gradients/activations (%lld tokens)", __func__,
                        (long long)max_tokens);
}

void fl_train_model_sync_compute(fl_train_model *m) {
    if (!m->wcompute) return;
    memcpy(m->wcompute, m->params, (size_t)m->n_params * sizeof(float));
    if (m->precision == FL_TRAIN_BF16) fl_train_round_bf16(m->wcompute, m->n_params);
    else fl_train_round_fp16(m->wcompute, m->n_params);
}

void fl_train_model_zero_grad(fl_train_model *m) {
    if (m->grads) memset(m->grads, 0, (size_t)n_grads(m) * sizeof(float));
}

const float *fl_train_model_logits(const fl_train_model *m) {
    return m->have_forward ? ((const act_layout *)m->priv)->logits : NULL;
}

/* ---------------------------------------------------------------- attention */

/* Flash attention (kernels/attn.h, varlen + lse + FlashAttention-2 backward) when the head size
 * suits its micro-kernels (multiple of 8), else the plain reference of ops_train.c.  Both are
 * deterministic (every output element owned by one work item). */
static fl_attn_args attn_args(const fl_train_model *m, const fl_train_batch *b, const float *q, const float *k,
                              const float *v, float *out, float *lse) {
    const fl_train_config *c = &m->cfg;
    return (fl_attn_args){.n_seq = b->n_seq, .cu_seqlens_q = b->cu_seqlens, .cu_seqlens_k = b->cu_seqlens,
                          .n_q = b->n_tokens, .n_kv = b->n_tokens, .n_head = c->n_head, .n_head_kv = c->n_head_kv,
                          .head_dim = c->head_dim, .q = q, .k = k, .v = v, .kv_type = FL_TYPE_F32, .out = out,
                          .lse = lse, .scale = 1.0f / sqrtf((float)c->head_dim), .causal = true,
                          .impl = FL_ATTN_FLASH};
}

static bool use_flash(const fl_train_model *m) { return m->cfg.head_dim % 8 == 0 && !m->ref_attn; }

static fl_status attention_forward(const fl_train_model *m, const fl_train_batch *b, layer_acts *a) {
    const fl_train_config *c = &m->cfg;
    if (use_flash(m)) {
        fl_attn_args fa = attn_args(m, b, a->q, a->k, a->v, a->att, a->lse);
        return fl_attn_forward(&fa);
    }
    return fl_train_attn_forward(a->att, a->lse, a->q, a->k, a->v, b->cu_seqlens, b->n_seq, c->n_head, c->n_head_kv,
                                 c->head_dim, 1.0f / sqrtf((float)c->head_dim));
}

static fl_status attention_backward(const fl_train_model *m, const fl_train_batch *b, const layer_acts *a,
                                    const float *datt, float *dq, float *dk, float *dv) {
    const fl_train_config *c = &m->cfg;
    if (use_flash(m)) {
        fl_attn_args fa = attn_args(m, b, a->q, a->k, a->v, a->att, a->lse);
        return fl_attn_backward(&fa, datt, 0, dq, dk, dv);
    }
    return fl_train_attn_backward(dq, dk, dv, datt, a->q, a->k, a->v, a->att, a->lse, b->cu_seqlens, b->n_seq,
                                  c->n_head, c->n_head_kv, c->head_dim, 1.0f / sqrtf((float)c->head_dim));
}

/* ---------------------------------------------------------------- forward */

static void round_compute(const fl_train_model *m, float *x, int64_t n) {
    if (m->precision == FL_TRAIN_BF16) fl_train_round_bf16(x, n);
    else if (m->precision == FL_TRAIN_FP16) fl_train_round_fp16(x, n);
}

/* The compute weights of matrix p, layer l: the (rounded) params, or a frozen base matrix
 * (F32 in place, NF4 dequantized into the one-matrix scratch: valid until the next call). */
static const float *W(const fl_train_model *m, fl_train_param p, int l) {
    if (m->frozen[p]) {
        int64_t ne[2];
        fl_train_param_shape(&m->cfg, p, ne);
        const size_t rs = fl_type_row_size(m->frozen_type[p], ne[0]);
        const char *src = (const char *)m->frozen[p] + (size_t)l * rs * (size_t)ne[1];
        if (m->frozen_type[p] == FL_TYPE_F32) return (const float *)src;
        for (int64_t r = 0; r < ne[1]; r++) fl_dequant_row(m->frozen_type[p], src + r * rs, m->wscratch + r * ne[0], ne[0]);
        if (m->precision == FL_TRAIN_BF16) fl_train_round_bf16(m->wscratch, ne[0] * ne[1]);
        else if (m->precision == FL_TRAIN_FP16) fl_train_round_fp16(m->wscratch, ne[0] * ne[1]);
        return m->wscratch;
    }
    return fl_train_model_tensor(m, m->wcompute ? m->wcompute : m->params, p, l);
}

static float *lora_A(const fl_train_model *m, float *buf, fl_train_param p, int l) {
    int64_t ne[2];
    fl_train_param_shape(&m->cfg, p, ne);
    return buf + m->lora_off[p][0] + (int64_t)l * m->lora_rank * ne[0];
}

static float *lora_B(const fl_train_model *m, float *buf, fl_train_param p, int l) {
    int64_t ne[2];
    fl_train_param_shape(&m->cfg, p, ne);
    return buf + m->lora_off[p][1] + (int64_t)l * m->lora_rank * ne[1];
}

/* out (N, O) = inp (N, I) . W^T  [+ xa . B^T with xa = (alpha/r) inp . A^T saved in a->xa[p]] */
static void linear_forward(const fl_train_model *m, fl_train_param p, int l, layer_acts *a, float *out,
                           const float *inp, int64_t N, int64_t I, int64_t O) {
    fl_train_matmul_forward(out, inp, W(m, p, l), N, I, O);
    if (m->lora_rank <= 0) return;
    const int64_t r = m->lora_rank;
    float *xa = a->xa[p];
    fl_train_matmul_forward(xa, inp, lora_A(m, m->lora, p, l), N, I, r);
    const float s = m->lora_alpha / (float)r;
    for (int64_t i = 0; i < N * r; i++) xa[i] *= s;
    fl_sgemm(FL_SGEMM_TB | FL_SGEMM_ACC, N, O, r, xa, r, lora_B(m, m->lora, p, l), r, out, O); /* out += xa B^T */
}

/* Backward of linear_forward: dinp += dout . W (+ LoRA path); dW (full training) or dA, dB. */
static void linear_backward(fl_train_model *m, fl_train_param p, int l, const layer_acts *a, act_layout *L,
                            float *dinp, const float *dout, const float *inp, int64_t N, int64_t I, int64_t O) {
    float *dw = m->lora_rank > 0 ? NULL : grad_of(m, p, l);
    fl_train_matmul_backward(dinp, dw, dout, inp, W(m, p, l), N, I, O);
    if (m->lora_rank <= 0) return;
    const int64_t r = m->lora_rank;
    memset(L->dlora, 0, (size_t)(N * r) * sizeof(float));
    fl_train_matmul_backward(L->dlora, lora_B(m, m->grads, p, l), dout, a->xa[p], lora_B(m, m->lora, p, l), N, r, O);
    const float s = m->lora_alpha / (float)r;
    for (int64_t i = 0; i < N * r; i++) L->dlora[i] *= s;
    fl_train_matmul_backward(dinp, lora_A(m, m->grads, p, l), L->dlora, inp, lora_A(m, m->lora, p, l), N, I, r);
}

/* gradient buffer of a frozen-or-trainable non-matrix tensor (NULL when frozen) */
static float *G(const fl_train_model *m, fl_train_param p, int l) {
    return m->lora_rank > 0 ? NULL : grad_of(m, p, l);
}

/* One transformer block: a->inp (N, C) -> out (N, C), filling a's activations. */
static fl_status layer_forward(const fl_train_model *m, int l, const fl_train_batch *b, layer_acts *a, float *out) {
    const fl_train_config *c = &m->cfg;
    const int64_t N = b->n_tokens, C = c->n_embd, F = c->n_ff;
    const int64_t Q = (int64_t)c->n_head * c->head_dim, KV = (int64_t)c->n_head_kv * c->head_dim;
    const float *normw = fl_train_model_tensor(m, m->params, FL_TP_ATTN_NORM, l);
    /* attention block */
    fl_train_rmsnorm_forward(a->ln1, a->rstd1, a->inp, normw, N, C, c->rms_eps); /* (N, C) */
    round_compute(m, a->ln1, N * C);
    linear_forward(m, FL_TP_WQ, l, a, a->q, a->ln1, N, C, Q);             /* (N, H*hd) */
    linear_forward(m, FL_TP_WK, l, a, a->k, a->ln1, N, C, KV);            /* (N, Hkv*hd) */
    linear_forward(m, FL_TP_WV, l, a, a->v, a->ln1, N, C, KV);
    fl_train_rope_forward(a->q, a->q, b->pos, N, c->n_head, c->head_dim, c->rope_dim, c->rope_base);
    fl_train_rope_forward(a->k, a->k, b->pos, N, c->n_head_kv, c->head_dim, c->rope_dim, c->rope_base);
    fl_status st = attention_forward(m, b, a);
    if (st) return st;
    round_compute(m, a->att, N * Q);
    linear_forward(m, FL_TP_WO, l, a, out, a->att, N, Q, C);              /* (N, C) */
    fl_train_residual_forward(a->mid, a->inp, out, N * C);
    /* feed-forward block */
    fl_train_rmsnorm_forward(a->ln2, a->rstd2, a->mid, fl_train_model_tensor(m, m->params, FL_TP_FFN_NORM, l), N, C,
                             c->rms_eps);
    round_compute(m, a->ln2, N * C);
    linear_forward(m, FL_TP_FFN_GATE, l, a, a->g, a->ln2, N, C, F);       /* (N, F) */
    linear_forward(m, FL_TP_FFN_UP, l, a, a->u, a->ln2, N, C, F);
    fl_train_swiglu_forward(a->h, a->g, a->u, N * F);
    round_compute(m, a->h, N * F);
    linear_forward(m, FL_TP_FFN_DOWN, l, a, out, a->h, N, F, C);          /* (N, C) */
    fl_train_residual_forward(out, a->mid, out, N * C);
    return FL_OK;
}

/* Where layer l reads its input and writes its output, for checkpoint interval k. */
static layer_acts *slot_of(act_layout *L, int k, int l) { return &L->slots[k == 0 ? l : l % k]; }

static float *layer_out_ptr(const fl_train_model *m, act_layout *L, int l) {
    const int k = m->ckpt_every, nl = m->cfg.n_layer;
    if (l + 1 == nl) return L->xL;
    if (k == 0) return L->slots[l + 1].inp;
    if ((l + 1) % k == 0) return L->ckpt[(l + 1) / k];
    return L->slots[(l + 1) % k].inp;
}

static fl_status check_batch(const fl_train_model *m, const fl_train_batch *b) {
    const fl_train_config *c = &m->cfg;
    if (b->n_tokens <= 0 || b->n_tokens > m->max_tokens)
        return fl_set_error(FL_ERR_INVALID, "%s: %lld tokens (reserved for %lld)", __func__, (long long)b->n_tokens,
                            (long long)m->max_tokens);
    if (b->n_seq <= 0 || b->cu_seqlens[0] != 0 || b->cu_seqlens[b->n_seq] != b->n_tokens)
        return fl_set_error(FL_ERR_INVALID, "%s: cu_seqlens must run from 0 to n_tokens", __func__);
    for (int s = 0; s < b->n_seq; s++)
        if (b->cu_seqlens[s + 1] <= b->cu_seqlens[s])
            return fl_set_error(FL_ERR_INVALID, "%s: empty or decreasing sequence %d", __func__, s);
    for (int64_t i = 0; i < b->n_tokens; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= c->n_vocab || b->targets[i] >= c->n_vocab)
            return fl_set_error(FL_ERR_INVALID, "%s: token/target %d/%d at %lld out of vocab %d", __func__,
                                b->tokens[i], b->targets[i], (long long)i, c->n_vocab);
        if (b->pos[i] < 0) return fl_set_error(FL_ERR_INVALID, "%s: negative position at %lld", __func__, (long long)i);
    }
    return FL_OK;
}

fl_status fl_train_model_forward(fl_train_model *m, const fl_train_batch *b, double *loss_sum, int64_t *n_scored) {
    if (!m->acts) return fl_set_error(FL_ERR_INVALID, "%s: call fl_train_model_reserve first", __func__);
    fl_status st = check_batch(m, b);
    if (st) return st;
    act_layout *L = m->priv;
    const fl_train_config *c = &m->cfg;
    const int64_t N = b->n_tokens, C = c->n_embd, V = c->n_vocab;
    const int k = m->ckpt_every;
    m->have_forward = false;
    m->n_tokens = N;
    /* embedding -> input of layer 0 */
    float *x0 = k == 0 ? L->slots[0].inp : L->ckpt[0];
    fl_train_embed_forward(x0, b->tokens, m->params + m->offset[FL_TP_TOK_EMBD], N, C);
    for (int l = 0; l < c->n_layer; l++) {
        layer_acts *a = slot_of(L, k, l);
        if (k > 0 && l % k == 0) a->inp = L->ckpt[l / k];
        if ((st = layer_forward(m, l, b, a, layer_out_ptr(m, L, l)))) return st;
    }
    /* final norm, logits, loss */
    fl_train_rmsnorm_forward(L->lnf, L->rstdf, L->xL, m->params + m->offset[FL_TP_OUT_NORM], N, C, c->rms_eps);
    round_compute(m, L->lnf, N * C);
    fl_train_matmul_forward(L->logits, L->lnf, W(m, FL_TP_OUTPUT, 0), N, C, V); /* (N, V) */
    fl_train_crossentropy_forward(L->losses, L->ce_lse, L->logits, b->targets, N, V);
    double sum = 0.0;
    int64_t cnt = 0;
    for (int64_t i = 0; i < N; i++)
        if (b->targets[i] >= 0) {
            sum += L->losses[i];
            cnt++;
        }
    if (loss_sum) *loss_sum = sum;
    if (n_scored) *n_scored = cnt;
    m->have_forward = true;
    return FL_OK;
}

/* ---------------------------------------------------------------- backward */

/* Backward through block l: L->dres holds d(out) on entry and d(inp) on exit. */
static fl_status layer_backward(fl_train_model *m, int l, const fl_train_batch *b, layer_acts *a, act_layout *L) {
    const fl_train_config *c = &m->cfg;
    const int64_t N = b->n_tokens, C = c->n_embd, F = c->n_ff;
    const int64_t Q = (int64_t)c->n_head * c->head_dim, KV = (int64_t)c->n_head_kv * c->head_dim;
    round_compute(m, L->dres, N * C);
    /* out = mid + h . w2^T */
    memset(L->dF1, 0, (size_t)(N * F) * sizeof(float));
    linear_backward(m, FL_TP_FFN_DOWN, l, a, L, L->dF1, L->dres, a->h, N, F, C);
    /* h = silu(g) * u  (dF1 <- dg, dF2 <- du) */
    fl_train_swiglu_backward(L->dF1, L->dF2, L->dF1, a->g, a->u, N * F);
    round_compute(m, L->dF1, N * F);
    round_compute(m, L->dF2, N * F);
    memset(L->dbuf, 0, (size_t)(N * C) * sizeof(float));
    linear_backward(m, FL_TP_FFN_GATE, l, a, L, L->dbuf, L->dF1, a->ln2, N, C, F);
    linear_backward(m, FL_TP_FFN_UP, l, a, L, L->dbuf, L->dF2, a->ln2, N, C, F);
    /* ln2 = rmsnorm(mid); dres += ... (mid's gradient = dres via the residual + this) */
    fl_train_rmsnorm_backward(L->dres, G(m, FL_TP_FFN_NORM, l), L->dbuf, a->mid,
                              fl_train_model_tensor(m, m->params, FL_TP_FFN_NORM, l), a->rstd2, N, C);
    round_compute(m, L->dres, N * C);
    /* mid = inp + att . wo^T */
    memset(L->dbuf, 0, (size_t)(N * Q) * sizeof(float));
    linear_backward(m, FL_TP_WO, l, a, L, L->dbuf, L->dres, a->att, N, Q, C);
    /* attention (dq, dk, dv overwritten), then RoPE back */
    fl_status st = attention_backward(m, b, a, L->dbuf, L->dq, L->dk, L->dv);
    if (st) return st;
    fl_train_rope_backward(L->dq, L->dq, b->pos, N, c->n_head, c->head_dim, c->rope_dim, c->rope_base);
    fl_train_rope_backward(L->dk, L->dk, b->pos, N, c->n_head_kv, c->head_dim, c->rope_dim, c->rope_base);
    round_compute(m, L->dq, N * Q);
    round_compute(m, L->dk, N * KV);
    round_compute(m, L->dv, N * KV);
    memset(L->dbuf, 0, (size_t)(N * C) * sizeof(float));
    linear_backward(m, FL_TP_WQ, l, a, L, L->dbuf, L->dq, a->ln1, N, C, Q);
    linear_backward(m, FL_TP_WK, l, a, L, L->dbuf, L->dk, a->ln1, N, C, KV);
    linear_backward(m, FL_TP_WV, l, a, L, L->dbuf, L->dv, a->ln1, N, C, KV);
    fl_train_rmsnorm_backward(L->dres, G(m, FL_TP_ATTN_NORM, l), L->dbuf, a->inp,
                              fl_train_model_tensor(m, m->params, FL_TP_ATTN_NORM, l), a->rstd1, N, C);
    return FL_OK;
}

fl_status fl_train_model_backward(fl_train_model *m, const fl_train_batch *b, float dloss) {
    if (!m->have_forward || b->n_tokens != m->n_tokens)
        return fl_set_error(FL_ERR_INVALID, "%s: needs a forward on the same batch first", __func__);
    act_layout *L = m->priv;
    const fl_train_config *c = &m->cfg;
    const int64_t N = b->n_tokens, C = c->n_embd, V = c->n_vocab;
    const int k = m->ckpt_every, nl = c->n_layer;
    m->have_forward = false; /* logits are overwritten below */
    for (int64_t i = 0; i < N; i++) L->dloss[i] = dloss;
    /* loss -> logits -> final norm */
    fl_train_crossentropy_backward(L->logits, L->dloss, L->logits, L->ce_lse, b->targets, N, V);
    round_compute(m, L->logits, N * V);
    memset(L->dbuf, 0, (size_t)(N * C) * sizeof(float));
    bucket_start(m, FL_TRAIN_BUCKET_HEAD);
    fl_train_matmul_backward(L->dbuf, G(m, FL_TP_OUTPUT, 0), L->logits, L->lnf, W(m, FL_TP_OUTPUT, 0), N, C, V);
    memset(L->dres, 0, (size_t)(N * C) * sizeof(float));
    fl_train_rmsnorm_backward(L->dres, G(m, FL_TP_OUT_NORM, 0), L->dbuf, L->xL,
                              m->params + m->offset[FL_TP_OUT_NORM], L->rstdf, N, C);
    fl_status st = bucket_done(m, FL_TRAIN_BUCKET_HEAD);
    if (st) return st;
    /* blocks, last to first; with checkpointing, recompute each segment before its backward */
    for (int l = nl - 1; l >= 0; l--) {
        if (k > 0 && (l + 1) % k == 0 && l + 1 < nl) {
            /* entering segment [l0, l]: its activations were overwritten, recompute them */
            const int l0 = l + 1 - k;
            for (int j = l0; j <= l; j++) {
                layer_acts *a = slot_of(L, k, j);
                if (j == l0) a->inp = L->ckpt[l0 / k];
                float *out = j == l ? L->dbuf : L->slots[(j + 1) % k].inp; /* last output: unused */
                if ((st = layer_forward(m, j, b, a, out))) return st;
            }
        }
        bucket_start(m, l);
        if ((st = layer_backward(m, l, b, slot_of(L, k, l), L)) || (st = bucket_done(m, l))) return st;
    }
    if (m->lora_rank > 0) return FL_OK;
    bucket_start(m, nl);
    fl_train_embed_backward(grad_of(m, FL_TP_TOK_EMBD, 0), L->dres, b->tokens, N, C);
    return bucket_done(m, nl);
}

/* ---------------------------------------------------------------- GGUF export */

fl_status fl_train_model_add_to_writer(const fl_train_model *m, fl_gguf_writer *w, const float *buf) {
    const fl_train_config *c = &m->cfg;
    fl_status st = FL_OK;
    st = st ? st : fl_gguf_writer_set_str(w, "general.architecture", "llama");
    st = st ? st : fl_gguf_writer_set_u32(w, "llama.context_length", (uint32_t)c->n_ctx);
    st = st ? st : fl_gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)c->n_embd);
    st = st ? st : fl_gguf_writer_set_u32(w, "llama.feed_forward_length", (uint32_t)c->n_ff);
    st = st ? st : fl_gguf_writer_set_u32(w, "llama.block_count", (uint32_t)c->n_layer);
    st = st ? st : fl_gguf_writer_set_u32(w, "llama.attention.head_count", (uint32_t)c->n_head);
    st = st ? st : fl_gguf_writer_set_u32(w, "llama.attention.head_count_kv", (uint32_t)c->n_head_kv);
    st = st ? st : fl_gguf_writer_set_u32(w, "llama.attention.key_length", (uint32_t)c->head_dim);
    st = st ? st : fl_gguf_writer_set_u32(w, "llama.attention.value_length", (uint32_t)c->head_dim);
    st = st ? st : fl_gguf_writer_set_u32(w, "llama.rope.dimension_count", (uint32_t)c->rope_dim);
    st = st ? st : fl_gguf_writer_set_f32(w, "llama.rope.freq_base", c->rope_base);
    st = st ? st : fl_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", c->rms_eps);
    st = st ? st : fl_gguf_writer_set_u32(w, "llama.vocab_size", (uint32_t)c->n_vocab);
    char name[96];
    for (int p = 0; p < FL_TP_COUNT && !st && buf; p++) {
        int64_t ne[2];
        const int nd = fl_train_param_shape(c, (fl_train_param)p, ne);
        const int nl = fl_train_param_per_layer((fl_train_param)p) ? c->n_layer : 1;
        for (int l = 0; l < nl && !st; l++) {
            fl_train_param_name((fl_train_param)p, l, name, sizeof name);
            st = fl_gguf_writer_add_tensor(w, name, FL_TYPE_F32, nd, ne,
                                           fl_train_model_tensor(m, (float *)buf, (fl_train_param)p, l));
        }
    }
    return st;
}

static void merged_layer(const fl_train_model *m, fl_train_param p, int l, float *w);

/* one merged matrix of the export, made as the writer reaches it */
typedef struct merged_ref {
    const fl_train_model *m;
    int p, l;
} merged_ref;

static fl_status fill_merged(void *ud, void *dst, size_t nbytes) {
    const merged_ref *r = ud;
    (void)nbytes;
    merged_layer(r->m, (fl_train_param)r->p, r->l, dst);
    return FL_OK;
}

fl_status fl_train_model_save_gguf(const fl_train_model *m, const char *path, const fl_gguf *tok_src) {
    fl_gguf_writer *w = fl_gguf_writer_new();
    if (!w) return FL_ERR_NOMEM;
    fl_status st = fl_gguf_writer_set_str(w, "general.name", "fitllm-trained");
    if (!st && tok_src)
        for (int64_t i = 0; i < fl_gguf_n_kv(tok_src) && !st; i++) {
            const fl_gguf_kv *kv = fl_gguf_kv_at(tok_src, i);
            if (kv->key.len > 10 && !memcmp(kv->key.data, "tokenizer.", 10)) st = fl_gguf_writer_copy_kv(w, kv);
        }
    const bool merge = m->lora_rank > 0 || m->n_params < m->n_full;
    if (!merge) {
        if (!st) st = fl_train_model_add_to_writer(m, w, m->params);
    } else if (!st) {
        /* adapters merged (and a frozen base dequantized) one matrix at a time as the file is
         * written, so the export never holds the f32 model whole */
        st = fl_train_model_add_to_writer(m, w, NULL); /* (the keys) */
    }
    merged_ref *refs = NULL;
    size_t n_refs = 0;
    if (merge && !st) {
        n_refs = (size_t)FL_TP_COUNT * (size_t)m->cfg.n_layer;
        refs = fl_alloc(FL_MEM_MISC, n_refs * sizeof *refs, 0);
        if (!refs) st = FL_ERR_NOMEM;
        char name[96];
        size_t k = 0;
        for (int p = 0; p < FL_TP_COUNT && !st; p++) {
            int64_t ne[2];
            const int nd = fl_train_param_shape(&m->cfg, (fl_train_param)p, ne);
            const bool mat = fl_train_param_is_matrix((fl_train_param)p);
            const int nl = fl_train_param_per_layer((fl_train_param)p) ? m->cfg.n_layer : 1;
            for (int l = 0; l < nl && !st; l++) {
                fl_train_param_name((fl_train_param)p, l, name, sizeof name);
                if (!mat) {
                    st = fl_gguf_writer_add_tensor(w, name, FL_TYPE_F32, nd, ne, fl_train_model_tensor(m, m->params, (fl_train_param)p, l));
                    continue;
                }
                refs[k] = (merged_ref){m, p, l};
                st = fl_gguf_writer_add_tensor_fn(w, name, FL_TYPE_F32, nd, ne, fill_merged, &refs[k++]);
            }
        }
    }
    if (!st) st = fl_gguf_writer_write(w, path, NULL, NULL);
    fl_gguf_writer_free(w);
    if (refs) fl_free(FL_MEM_MISC, refs, n_refs * sizeof *refs);
    return st;
}

/* ---------------------------------------------------------------- LoRA / QLoRA */

void fl_train_model_trainable(fl_train_model *m, float **params, float **grads, int64_t *n) {
    if (m->lora_rank > 0) {
        *params = m->lora;
        *n = m->n_lora;
    } else {
        *params = m->params;
        *n = m->n_params;
    }
    *grads = m->grads;
}

int fl_train_model_decay_ranges(const fl_train_model *m, int64_t *ranges, int max) {
    int n = 0;
    if (m->lora_rank > 0) { /* adapters: all decayed */
        ranges[0] = 0;
        ranges[1] = m->n_lora;
        return 1;
    }
    for (int p = 0; p < FL_TP_COUNT && n < max; p++) {
        if (p == FL_TP_ATTN_NORM || p == FL_TP_FFN_NORM || p == FL_TP_OUT_NORM) continue;
        ranges[2 * n] = m->offset[p];
        ranges[2 * n + 1] = m->offset[p] + fl_train_param_numel(&m->cfg, (fl_train_param)p);
        n++;
    }
    return n;
}

void fl_train_model_after_update(fl_train_model *m) {
    if (m->lora_rank <= 0) fl_train_model_sync_compute(m);
}

fl_status fl_train_model_enable_lora(fl_train_model *m, int32_t rank, float alpha, uint64_t seed) {
    if (rank <= 0 || rank > 4096 || !(alpha > 0) || !isfinite(alpha) || m->lora)
        return fl_set_error(FL_ERR_INVALID, "%s: bad LoRA rank %d / alpha %g (or already enabled)", __func__, rank,
                            (double)alpha);
    if (m->acts) return fl_set_error(FL_ERR_INVALID, "%s: enable LoRA before reserve", __func__);
    int64_t off = 0;
    for (int p = 0; p < FL_TP_COUNT; p++) {
        if (!fl_train_param_is_matrix((fl_train_param)p)) continue;
        int64_t ne[2];
        fl_train_param_shape(&m->cfg, (fl_train_param)p, ne);
        m->lora_off[p][0] = off;
        off += (int64_t)m->cfg.n_layer * rank * ne[0];
        m->lora_off[p][1] = off;
        off += (int64_t)m->cfg.n_layer * rank * ne[1];
    }
    m->lora = fl_calloc(FL_MEM_WEIGHTS, (size_t)off, sizeof(float));
    if (!m->lora) return FL_ERR_NOMEM;
    m->n_lora = off;
    m->lora_rank = rank;
    m->lora_alpha = alpha;
    fl_rng r = {seed};
    for (int p = 0; p < FL_TP_COUNT; p++) {
        if (!fl_train_param_is_matrix((fl_train_param)p)) continue;
        int64_t ne[2];
        fl_train_param_shape(&m->cfg, (fl_train_param)p, ne);
        const double bound = 1.0 / sqrt((double)ne[0]);
        float *A = m->lora + m->lora_off[p][0];
        for (int64_t i = 0; i < (int64_t)m->cfg.n_layer * rank * ne[0]; i++)
            A[i] = (float)(bound * (2.0 * fl_rng_uniform(&r) - 1.0));
    }
    return FL_OK;
}

/* The frozen copies of the base matrices (NF4, or F32 where a row is not a multiple of 64),
 * allocated, and the scratch one of them dequantizes into. */
static fl_status frozen_alloc(fl_train_model *m) {
    size_t max_mat = 0;
    for (int p = 0; p < FL_TP_COUNT; p++) {
        if (!fl_train_param_is_matrix((fl_train_param)p) || m->frozen[p]) continue;
        int64_t ne[2];
        fl_train_param_shape(&m->cfg, (fl_train_param)p, ne);
        const int32_t type = ne[0] % 64 == 0 ? FL_TYPE_NF4 : FL_TYPE_F32;
        const size_t rs = fl_type_row_size(type, ne[0]), bytes = rs * (size_t)ne[1] * (size_t)m->cfg.n_layer;
        if (!(m->frozen[p] = fl_alloc(FL_MEM_WEIGHTS, bytes, 64))) return FL_ERR_NOMEM;
        m->frozen_type[p] = type;
        m->frozen_bytes[p] = bytes;
        if ((size_t)(ne[0] * ne[1]) > max_mat) max_mat = (size_t)(ne[0] * ne[1]);
    }
    m->wscratch_bytes = max_mat * sizeof(float);
    m->wscratch = fl_alloc(FL_MEM_SCRATCH, m->wscratch_bytes, 64);
    return m->wscratch ? FL_OK : FL_ERR_NOMEM;
}

/* Layer l's rows of base matrix p, f32 at src, into its frozen copy. */
static fl_status freeze_layer(fl_train_model *m, fl_train_param p, int l, const float *src) {
    int64_t ne[2];
    fl_train_param_shape(&m->cfg, p, ne);
    const size_t rs = fl_type_row_size(m->frozen_type[p], ne[0]);
    char *dst = (char *)m->frozen[p] + (size_t)l * rs * (size_t)ne[1];
    if (m->frozen_type[p] == FL_TYPE_F32) {
        memcpy(dst, src, rs * (size_t)ne[1]);
        return FL_OK;
    }
    return fl_quantize_tensor(m->frozen_type[p], src, ne[1], ne[0], dst); /* (NF4's scales are per row) */
}

fl_status fl_train_model_quantize_base_nf4(fl_train_model *m) {
    if (m->lora_rank <= 0) return fl_set_error(FL_ERR_INVALID, "%s: NF4 base needs LoRA (the base is frozen)", __func__);
    if (m->acts) return fl_set_error(FL_ERR_INVALID, "%s: quantize before reserve", __func__);
    if (m->n_params < m->n_full) return fl_set_error(FL_ERR_INVALID, "%s: the base is already frozen", __func__);
    fl_status st = frozen_alloc(m);
    for (int p = 0; p < FL_TP_COUNT && !st; p++)
        for (int l = 0; fl_train_param_is_matrix((fl_train_param)p) && l < m->cfg.n_layer && !st; l++)
            st = freeze_layer(m, (fl_train_param)p, l, fl_train_model_tensor(m, m->params, (fl_train_param)p, l));
    if (st) return st;
    /* drop the f32 matrices: they are the tail of the layout */
    int64_t keep = m->n_params;
    for (int p = 0; p < FL_TP_COUNT; p++)
        if (fl_train_param_is_matrix((fl_train_param)p) && m->offset[p] < keep) keep = m->offset[p];
    float *np = fl_realloc(FL_MEM_WEIGHTS, m->params, (size_t)m->n_params * sizeof(float), (size_t)keep * sizeof(float), 64);
    if (!np) return FL_ERR_NOMEM;
    m->params = np;
    m->n_params = keep;
    return FL_OK;
}

/* base matrix p, layer l as f32 into dst (from params or the frozen copy) */
static void base_matrix(const fl_train_model *m, fl_train_param p, int l, float *dst) {
    int64_t ne[2];
    fl_train_param_shape(&m->cfg, p, ne);
    if (!m->frozen[p]) {
        memcpy(dst, fl_train_model_tensor(m, m->params, p, l), (size_t)(ne[0] * ne[1]) * sizeof(float));
        return;
    }
    const size_t rs = fl_type_row_size(m->frozen_type[p], ne[0]);
    const char *src = (const char *)m->frozen[p] + (size_t)l * rs * (size_t)ne[1];
    for (int64_t r = 0; r < ne[1]; r++) fl_dequant_row(m->frozen_type[p], src + r * rs, dst + r * ne[0], ne[0]);
}

/* Base matrix p of layer l with its adapter merged (W + (alpha/r) B A), f32 into w. */
static void merged_layer(const fl_train_model *m, fl_train_param p, int l, float *w) {
    int64_t ne[2];
    fl_train_param_shape(&m->cfg, p, ne);
    base_matrix(m, p, l, w);
    if (m->lora_rank <= 0) return;
    const int64_t r = m->lora_rank;
    const float s = m->lora_alpha / (float)r;
    const float *A = lora_A(m, m->lora, p, l), *B = lora_B(m, m->lora, p, l);
    for (int64_t o = 0; o < ne[1]; o++)
        for (int64_t j = 0; j < r; j++) {
            const float bj = s * B[o * r + j];
            if (bj != 0.0f)
                for (int64_t i = 0; i < ne[0]; i++) w[o * ne[0] + i] += bj * A[j * ne[0] + i];
        }
}

fl_status fl_train_model_merged(const fl_train_model *m, float **out, size_t *bytes) {
    *bytes = (size_t)m->n_full * sizeof(float);
    float *f = fl_alloc(FL_MEM_MISC, *bytes, 64);
    if (!f) return FL_ERR_NOMEM;
    for (int p = 0; p < FL_TP_COUNT; p++) {
        if (!fl_train_param_is_matrix((fl_train_param)p)) {
            memcpy(f + m->offset[p], m->params + m->offset[p], (size_t)fl_train_param_numel(&m->cfg, (fl_train_param)p) * sizeof(float));
            continue;
        }
        for (int l = 0; l < m->cfg.n_layer; l++) merged_layer(m, (fl_train_param)p, l, fl_train_model_tensor(m, f, (fl_train_param)p, l));
    }
    *out = f;
    return FL_OK;
}

fl_status fl_train_model_add_lora_to_writer(const fl_train_model *m, fl_gguf_writer *w) {
    fl_status st = fl_gguf_writer_set_u32(w, "lora.rank", (uint32_t)m->lora_rank);
    st = st ? st : fl_gguf_writer_set_f32(w, "lora.alpha", m->lora_alpha);
    char name[96];
    for (int p = 0; p < FL_TP_COUNT && !st; p++) {
        if (!fl_train_param_is_matrix((fl_train_param)p)) continue;
        int64_t ne[2];
        fl_train_param_shape(&m->cfg, (fl_train_param)p, ne);
        const int64_t nea[3] = {ne[0], m->lora_rank, m->cfg.n_layer}, neb[3] = {m->lora_rank, ne[1], m->cfg.n_layer};
        snprintf(name, sizeof name, "lora.%s.a", k_names[p]);
        st = fl_gguf_writer_add_tensor(w, name, FL_TYPE_F32, 3, nea, m->lora + m->lora_off[p][0]);
        snprintf(name, sizeof name, "lora.%s.b", k_names[p]);
        if (!st) st = fl_gguf_writer_add_tensor(w, name, FL_TYPE_F32, 3, neb, m->lora + m->lora_off[p][1]);
    }
    return st;
}

fl_status fl_train_model_read_lora(fl_train_model *m, const fl_gguf *g) {
    uint32_t rank;
    if (fl_gguf_get_u32(g, "lora.rank", &rank) || (int32_t)rank != m->lora_rank)
        return fl_set_error(FL_ERR_INVALID, "%s: adapter rank differs from %d", __func__, m->lora_rank);
    char name[96];
    for (int p = 0; p < FL_TP_COUNT; p++) {
        if (!fl_train_param_is_matrix((fl_train_param)p)) continue;
        int64_t ne[2];
        fl_train_param_shape(&m->cfg, (fl_train_param)p, ne);
        for (int ab = 0; ab < 2; ab++) {
            snprintf(name, sizeof name, "lora.%s.%s", k_names[p], ab ? "b" : "a");
            const fl_gguf_tensor *t = fl_gguf_find_tensor(g, name);
            const size_t want = (size_t)m->cfg.n_layer * (size_t)m->lora_rank * (size_t)ne[ab] * sizeof(float);
            if (!t || t->type != FL_TYPE_F32 || t->size != want)
                return fl_set_error(FL_ERR_FORMAT, "%s: adapter tensor '%s' missing or of the wrong shape", __func__, name);
            memcpy(m->lora + m->lora_off[p][ab], t->data, want);
        }
    }
    return FL_OK;
}

fl_status fl_train_model_save_lora(const fl_train_model *m, const char *path) {
    fl_gguf_writer *w = fl_gguf_writer_new();
    if (!w) return FL_ERR_NOMEM;
    fl_status st = fl_gguf_writer_set_str(w, "general.type", "adapter");
    st = st ? st : fl_gguf_writer_set_str(w, "adapter.type", "lora");
    st = st ? st : fl_train_model_add_to_writer(m, w, NULL);
    st = st ? st : fl_train_model_add_lora_to_writer(m, w);
    st = st ? st : fl_gguf_writer_write(w, path, NULL, NULL);
    fl_gguf_writer_free(w);
    return st;
}
