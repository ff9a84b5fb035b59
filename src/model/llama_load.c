/* GGUF -> llama model: hyperparameters from metadata, weights as zero-copy views (llama.h). */
#include "core/alloc.h"
#include "core/status.h"
#include "kernels/matmul.h"
#include "model/arch.h"
#include "model/llama_impl.h"

#include <string.h>

fl_model_params fl_model_default_params(void) {
    fl_model_params p;
    memset(&p, 0, sizeof p);
    p.weights_type = -1;
    return p;
}

/* Integer hparam "<arch>.<suffix>": dflt when absent (dflt < 0: required). */
static fl_status get_int(const fl_gguf *g, const char *arch, const char *suffix, int64_t dflt, int32_t *out) {
    char key[128];
    fl_arch_key(key, sizeof key, arch, suffix);
    int64_t v;
    if (!fl_gguf_find(g, key)) {
        if (dflt < 0) return fl_set_error(FL_ERR_FORMAT, "missing metadata key %s", key);
        *out = (int32_t)dflt;
        return FL_OK;
    }
    if (fl_gguf_get_i64(g, key, &v) != FL_OK) return FL_ERR_FORMAT;
    if (v < 0 || v > INT32_MAX) return fl_set_error(FL_ERR_FORMAT, "metadata %s = %lld out of range", key, (long long)v);
    *out = (int32_t)v;
    return FL_OK;
}

static fl_status get_float(const fl_gguf *g, const char *arch, const char *suffix, float dflt, float *out) {
    char key[128];
    fl_arch_key(key, sizeof key, arch, suffix);
    if (!fl_gguf_find(g, key)) {
        *out = dflt;
        return FL_OK;
    }
    return fl_gguf_get_f32(g, key, out) == FL_OK ? FL_OK : FL_ERR_FORMAT;
}

fl_status fl_hparams_from_gguf(const fl_gguf *g, fl_hparams *hp) {
    memset(hp, 0, sizeof *hp);
    if (fl_gguf_get_str(g, "general.architecture", hp->arch, sizeof hp->arch) != FL_OK)
        return fl_set_error(FL_ERR_FORMAT, "missing or overlong general.architecture");
    if (!fl_arch_supported(hp->arch))
        return fl_set_error(FL_ERR_UNSUPPORTED, "unknown model architecture '%s' (supported: llama)", hp->arch);
    const char *a = hp->arch;
    fl_status st;
    if ((st = get_int(g, a, FL_KEY_EMBEDDING_LENGTH, -1, &hp->n_embd)) ||
        (st = get_int(g, a, FL_KEY_BLOCK_COUNT, -1, &hp->n_layer)) ||
        (st = get_int(g, a, FL_KEY_HEAD_COUNT, -1, &hp->n_head)) ||
        (st = get_int(g, a, FL_KEY_FEED_FORWARD_LENGTH, -1, &hp->n_ff)) ||
        (st = get_int(g, a, FL_KEY_CONTEXT_LENGTH, 0, &hp->n_ctx_train)) ||
        (st = get_int(g, a, FL_KEY_HEAD_COUNT_KV, hp->n_head, &hp->n_head_kv)) ||
        (st = get_int(g, a, FL_KEY_SLIDING_WINDOW, 0, &hp->n_swa)))
        return st;
    if (hp->n_embd < 1 || hp->n_layer < 1 || hp->n_head < 1 || hp->n_ff < 1 || hp->n_head_kv < 1 ||
        hp->n_head % hp->n_head_kv != 0)
        return fl_set_error(FL_ERR_FORMAT, "bad hparams: n_embd %d n_layer %d n_head %d n_head_kv %d n_ff %d",
                            hp->n_embd, hp->n_layer, hp->n_head, hp->n_head_kv, hp->n_ff);
    if ((st = get_int(g, a, FL_KEY_KEY_LENGTH, hp->n_embd / hp->n_head, &hp->head_dim))) return st;
    int32_t vlen;
    if ((st = get_int(g, a, FL_KEY_VALUE_LENGTH, hp->head_dim, &vlen))) return st;
    if (vlen != hp->head_dim || hp->head_dim < 1)
        return fl_set_error(FL_ERR_UNSUPPORTED, "key_length %d != value_length %d", hp->head_dim, vlen);
    if ((st = get_int(g, a, FL_KEY_ROPE_DIM, hp->head_dim, &hp->rope_dim))) return st;
    if (hp->rope_dim > hp->head_dim || hp->rope_dim % 2)
        return fl_set_error(FL_ERR_FORMAT, "rope dimension %d does not fit head_dim %d", hp->rope_dim, hp->head_dim);
    float scale = 1.0f;
    if ((st = get_float(g, a, FL_KEY_ROPE_FREQ_BASE, 10000.0f, &hp->rope_freq_base)) ||
        (st = get_float(g, a, FL_KEY_RMS_EPS, 1e-5f, &hp->rms_eps)) ||
        (st = get_float(g, a, FL_KEY_ROPE_SCALE_LINEAR, 1.0f, &scale)))
        return st;
    if (scale == 1.0f && (st = get_float(g, a, FL_KEY_ROPE_SCALING_FACTOR, 1.0f, &scale))) return st;
    hp->rope_freq_scale = scale > 0.0f ? 1.0f / scale : 1.0f;
    /* vocabulary: the tokenizer's token list, else <arch>.vocab_size, else token_embd rows */
    const fl_gguf_value *toks = fl_gguf_get_arr(g, "tokenizer.ggml.tokens");
    const fl_gguf_tensor *te = fl_gguf_find_tensor(g, FL_TN_TOKEN_EMBD);
    if (toks) hp->n_vocab = (int32_t)toks->v.arr.n;
    else if ((st = get_int(g, a, FL_KEY_VOCAB_SIZE, te ? te->ne[1] : 0, &hp->n_vocab))) return st;
    hp->tied_output = fl_gguf_find_tensor(g, FL_TN_OUTPUT) == NULL;
    hp->n_head_local = hp->n_head;
    hp->n_head_kv_local = hp->n_head_kv;
    hp->n_ff_local = hp->n_ff;
    fl_clear_error();
    return FL_OK;
}

/* Bind tensor `name` with expected shape [ne0, ne1] (ne1 == 0: 1-D) into t. */
static fl_status bind(const fl_gguf *g, const char *name, int64_t ne0, int64_t ne1, bool matmul, fl_tensor *t) {
    const fl_gguf_tensor *gt = fl_gguf_find_tensor(g, name);
    if (!gt) return fl_set_error(FL_ERR_FORMAT, "missing tensor %s", name);
    const int64_t want1 = ne1 ? ne1 : 1;
    if (gt->ne[0] != ne0 || gt->ne[1] != want1 || gt->ne[2] != 1 || gt->ne[3] != 1)
        return fl_set_error(FL_ERR_FORMAT, "tensor %s has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]", name,
                            (long long)gt->ne[0], (long long)gt->ne[1], (long long)gt->ne[2], (long long)gt->ne[3],
                            (long long)ne0, (long long)want1);
    if (matmul) {
        if (fl_matmul_supported(gt->type) != FL_OK)
            return fl_set_error(FL_ERR_UNSUPPORTED, "tensor %s: weight type %s is not supported", name,
                                fl_type_name(gt->type));
    } else if (gt->type != FL_TYPE_F32) {
        return fl_set_error(FL_ERR_UNSUPPORTED, "tensor %s: norm weights must be F32, got %s", name,
                            fl_type_name(gt->type));
    }
    if (!fl_tensor_init(t, gt->type, ne1 ? 2 : 1, gt->ne, (void *)gt->data))
        return fl_set_error(FL_ERR_FORMAT, "tensor %s: row of %lld is not a multiple of the %s block", name,
                            (long long)ne0, fl_type_name(gt->type));
    t->name = NULL; /* name is a caller's buffer; callers set a static name where they have one */
    return FL_OK;
}

/* Bind layer il's nine tensors with the shapes the hparams imply (per-layer names are formatted
 * into a local buffer, so layer descriptors carry no name). */
static fl_status bind_layer(const fl_gguf *g, const fl_hparams *hp, int il, fl_layer *L) {
    char n[96];
    const int64_t E = hp->n_embd, D = hp->head_dim, F = hp->n_ff;
    fl_status st;
#define B(tmpl, ne0, ne1, mm, field)                                                            \
    if ((st = bind(g, fl_arch_tensor_name(n, sizeof n, tmpl, il), ne0, ne1, mm, &L->field))) \
        return st;
    B(FL_TN_ATTN_NORM, E, 0, false, attn_norm);
    B(FL_TN_ATTN_Q, E, hp->n_head * D, true, wq);
    B(FL_TN_ATTN_K, E, hp->n_head_kv * D, true, wk);
    B(FL_TN_ATTN_V, E, hp->n_head_kv * D, true, wv);
    B(FL_TN_ATTN_OUT, hp->n_head * D, E, true, wo);
    B(FL_TN_FFN_NORM, E, 0, false, ffn_norm);
    B(FL_TN_FFN_GATE, E, F, true, w1);
    B(FL_TN_FFN_UP, E, F, true, w3);
    B(FL_TN_FFN_DOWN, F, E, true, w2);
#undef B
    return FL_OK;
}

fl_status fl_model_load(const char *path, const fl_model_params *params, fl_model **out) {
    *out = NULL;
    fl_model *m = fl_calloc(FL_MEM_MISC, 1, sizeof *m);
    if (!m) return FL_ERR_NOMEM;
    m->params = params ? *params : fl_model_default_params();
    fl_status st = fl_gguf_open(path, &m->g);
    if (st) goto fail;
    if ((st = fl_hparams_from_gguf(m->g, &m->hp))) goto fail_ctx;
    if (m->params.weights_type >= 0) {
        /* TODO(quant): load-time conversion with fl_quantize_tensor(), charged to FL_MEM_WEIGHTS. */
        st = fl_set_error(FL_ERR_UNSUPPORTED, "load-time weight conversion to %s is not available yet",
                          fl_type_name(m->params.weights_type));
        goto fail_ctx;
    }
    const fl_hparams *hp = &m->hp;
    if ((st = bind(m->g, FL_TN_TOKEN_EMBD, hp->n_embd, hp->n_vocab, true, &m->tok_embd))) goto fail_ctx;
    m->tok_embd.name = FL_TN_TOKEN_EMBD;
    if ((st = bind(m->g, FL_TN_OUTPUT_NORM, hp->n_embd, 0, false, &m->output_norm))) goto fail_ctx;
    m->output_norm.name = FL_TN_OUTPUT_NORM;
    if (hp->tied_output) {
        m->output = m->tok_embd;
    } else {
        if ((st = bind(m->g, FL_TN_OUTPUT, hp->n_embd, hp->n_vocab, true, &m->output))) goto fail_ctx;
        m->output.name = FL_TN_OUTPUT;
    }
    m->layers = fl_calloc(FL_MEM_MISC, (size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) {
        st = FL_ERR_NOMEM;
        goto fail;
    }
    for (int il = 0; il < hp->n_layer; il++)
        if ((st = bind_layer(m->g, hp, il, &m->layers[il]))) goto fail_ctx;
    *out = m;
    return FL_OK;
fail_ctx:
    fl_add_error_context("%s", path);
fail:
    fl_model_free(m);
    return st;
}

void fl_model_free(fl_model *m) {
    if (!m) return;
    fl_model_workspace_free(m);
    if (m->layers) fl_free(FL_MEM_MISC, m->layers, (size_t)m->hp.n_layer * sizeof *m->layers);
    fl_gguf_free(m->g);
    fl_free(FL_MEM_MISC, m, sizeof *m);
}

const fl_hparams *fl_model_hparams(const fl_model *m) { return &m->hp; }
const fl_gguf *fl_model_gguf(const fl_model *m) { return m->g; }
const fl_tensor *fl_model_tok_embd(const fl_model *m) { return &m->tok_embd; }
const fl_tensor *fl_model_output(const fl_model *m) { return &m->output; }
const fl_layer *fl_model_layer(const fl_model *m, int32_t il) { return &m->layers[il]; }
