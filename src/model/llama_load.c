/* GGUF -> llama model: hyperparameters from metadata, weights as zero-copy views (llama.h). */
#include "core/alloc.h"
#include "core/log.h"
#include "core/status.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "model/arch.h"
#include "model/llama_impl.h"

#include <math.h>
#include <stdio.h>
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
    if (hp->rope_dim < 2 || hp->rope_dim > hp->head_dim || hp->rope_dim % 2)
        return fl_set_error(FL_ERR_FORMAT, "rope dimension %d does not fit head_dim %d", hp->rope_dim, hp->head_dim);
    float scale = 1.0f;
    if ((st = get_float(g, a, FL_KEY_ROPE_FREQ_BASE, 10000.0f, &hp->rope_freq_base)) ||
        (st = get_float(g, a, FL_KEY_RMS_EPS, 1e-5f, &hp->rms_eps)) ||
        (st = get_float(g, a, FL_KEY_ROPE_SCALE_LINEAR, 1.0f, &scale)))
        return st;
    if (scale == 1.0f && (st = get_float(g, a, FL_KEY_ROPE_SCALING_FACTOR, 1.0f, &scale))) return st;
    /* values that would turn every activation into NaN or inf are refused here, not found later
     * in the logits (a scale of 0 means none, as in llama.cpp) */
    if (!isfinite(hp->rms_eps) || hp->rms_eps < 0.0f)
        return fl_set_error(FL_ERR_FORMAT, "%s.%s = %g: must be finite and >= 0", a, FL_KEY_RMS_EPS, (double)hp->rms_eps);
    if (!isfinite(hp->rope_freq_base) || hp->rope_freq_base <= 0.0f)
        return fl_set_error(FL_ERR_FORMAT, "%s.%s = %g: must be finite and > 0", a, FL_KEY_ROPE_FREQ_BASE, (double)hp->rope_freq_base);
    if (!isfinite(scale) || scale < 0.0f)
        return fl_set_error(FL_ERR_FORMAT, "rope scaling factor %g: must be finite and >= 0", (double)scale);
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

/* Every tensor of the file must be one the model binds, as llama.cpp requires: a tensor of a
 * layer past block_count, or one no layer has (a bias, say), means the metadata or the
 * architecture is not what it says, and ignoring it would give wrong outputs without a word.
 * rope_freqs.weight (Llama 3.1+ rope scaling factors) is the one exception: it is not applied,
 * and a warning says so. */
fl_status fl_model_check_tensor_names(const fl_gguf *g, const char *arch, int32_t n_layer) {
    static const char *const per_layer[] = {FL_TN_ATTN_NORM, FL_TN_ATTN_Q, FL_TN_ATTN_K,  FL_TN_ATTN_V,  FL_TN_ATTN_OUT,
                                            FL_TN_FFN_NORM,  FL_TN_FFN_GATE, FL_TN_FFN_UP, FL_TN_FFN_DOWN};
    for (int64_t i = 0; i < fl_gguf_n_tensors(g); i++) {
        const fl_gguf_tensor *t = fl_gguf_tensor_at(g, i);
        char name[256], want[96];
        if (t->name.len >= sizeof name) return fl_set_error(FL_ERR_FORMAT, "tensor %lld: name of %llu bytes is not part of a llama model",
                                                            (long long)i, (unsigned long long)t->name.len);
        memcpy(name, t->name.data, (size_t)t->name.len);
        name[t->name.len] = 0;
        bool used = !strcmp(name, FL_TN_TOKEN_EMBD) || !strcmp(name, FL_TN_OUTPUT_NORM) || !strcmp(name, FL_TN_OUTPUT);
        int il = -1, n = 0;
        if (!used && sscanf(name, "blk.%d.%n", &il, &n) == 1 && n > 0 && il >= 0 && il < n_layer)
            for (size_t k = 0; k < sizeof per_layer / sizeof per_layer[0] && !used; k++)
                used = !strcmp(name, fl_arch_tensor_name(want, sizeof want, per_layer[k], il));
        if (used) continue;
        if (!strcmp(name, "rope_freqs.weight")) {
            FL_LOG_WARN("rope_freqs.weight (Llama 3.1+ rope scaling factors) is not applied: outputs will differ from "
                        "llama.cpp's");
            continue;
        }
        if (il >= n_layer)
            return fl_set_error(FL_ERR_FORMAT, "tensor %s is past the model's %d layers (%s.block_count)", name, n_layer,
                                arch);
        return fl_set_error(FL_ERR_UNSUPPORTED, "tensor %s is not part of a %s model (fitllm would ignore it)", name, arch);
    }
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

/* ---- load-time conversion (params.weights_type) ---- */

static size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Does t get converted to type wt?  Matrices only, and only when rows fit wt's blocks. */
static bool converts(const fl_tensor *t, int32_t wt) {
    return t->type != wt && fl_quantize_size(wt, 1, t->ne[0]) > 0;
}

size_t fl_model_converted_bytes(int32_t wt, int32_t src_type, int64_t ne0, int64_t ne1) {
    if (wt < 0 || src_type == wt) return 0;
    const size_t row = fl_quantize_size(wt, 1, ne0);
    return row ? round64(fl_quantize_size(wt, ne1, ne0)) : 0;
}

#define CONV_ROWS 64 /* rows dequantized to f32 at a time (FL_MEM_SCRATCH) */

/* Quantize *t into dst (fl_quantize_size bytes) through an f32 buffer of CONV_ROWS rows. */
static fl_status convert_one(fl_tensor *t, int32_t wt, unsigned char *dst, float *buf) {
    const int64_t K = t->ne[0], N = t->ne[1];
    const size_t row_out = fl_quantize_size(wt, 1, K);
    for (int64_t r0 = 0; r0 < N; r0 += CONV_ROWS) {
        const int64_t nr = N - r0 < CONV_ROWS ? N - r0 : CONV_ROWS;
        for (int64_t r = 0; r < nr; r++)
            fl_dequant_row(t->type, (const char *)t->data + (size_t)(r0 + r) * t->nb[1], buf + r * K, K);
        fl_status st = fl_quantize_tensor(wt, buf, nr, K, dst + (size_t)r0 * row_out);
        if (st) return st;
    }
    int64_t ne[2] = {K, N};
    fl_tensor nt;
    if (!fl_tensor_init(&nt, wt, 2, ne, dst)) return fl_set_error(FL_ERR_INTERNAL, "converted tensor shape");
    nt.name = t->name;
    *t = nt;
    return FL_OK;
}

/* Convert every matrix to params.weights_type: one FL_MEM_WEIGHTS block, each tensor 64-aligned. */
static fl_status convert_weights(fl_model *m) {
    const int32_t wt = m->params.weights_type;
    const fl_hparams *hp = &m->hp;
    fl_tensor *all[2 + 7 * 1024];
    size_t n = 0;
    if (hp->n_layer > 1024) return fl_set_error(FL_ERR_UNSUPPORTED, "load-time conversion: more than 1024 layers");
    all[n++] = &m->tok_embd;
    if (!hp->tied_output) all[n++] = &m->output;
    for (int il = 0; il < hp->n_layer; il++) {
        fl_layer *L = &m->layers[il];
        fl_tensor *ts[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w1, &L->w3, &L->w2};
        for (size_t i = 0; i < 7; i++) all[n++] = ts[i];
    }
    size_t total = 0;
    int64_t kmax = 0;
    for (size_t i = 0; i < n; i++) {
        if (!converts(all[i], wt)) continue;
        total += fl_model_converted_bytes(wt, all[i]->type, all[i]->ne[0], all[i]->ne[1]);
        if (all[i]->ne[0] > kmax) kmax = all[i]->ne[0];
    }
    if (!total) return FL_OK;
    if (fl_matmul_supported(wt) != FL_OK)
        return fl_set_error(FL_ERR_UNSUPPORTED, "load-time conversion: matmul does not support %s weights", fl_type_name(wt));
    m->wconv = fl_alloc(FL_MEM_WEIGHTS, total, 64);
    if (!m->wconv) return FL_ERR_BUDGET;
    m->wconv_bytes = total;
    const size_t buf_bytes = (size_t)CONV_ROWS * (size_t)kmax * sizeof(float);
    float *buf = fl_alloc(FL_MEM_SCRATCH, buf_bytes, 64);
    if (!buf) return FL_ERR_NOMEM;
    unsigned char *p = m->wconv;
    fl_status st = FL_OK;
    const bool tied = hp->tied_output;
    for (size_t i = 0; i < n && !st; i++) {
        if (!converts(all[i], wt)) continue;
        const size_t b = fl_model_converted_bytes(wt, all[i]->type, all[i]->ne[0], all[i]->ne[1]);
        m->wconv_src_bytes += fl_tensor_nbytes(all[i]);
        m->wconv_elems += all[i]->ne[0] * all[i]->ne[1];
        st = convert_one(all[i], wt, p, buf);
        p += b;
    }
    fl_free(FL_MEM_SCRATCH, buf, buf_bytes);
    if (tied) m->output = m->tok_embd;
    if (!st)
        FL_LOG_INFO("weights converted to %s at load: %.2f MiB -> %.2f MiB (%.2f bits per weight, %.2f MiB saved)",
                    fl_type_name(wt), (double)m->wconv_src_bytes / 1048576.0, (double)m->wconv_bytes / 1048576.0,
                    8.0 * (double)m->wconv_bytes / (double)m->wconv_elems,
                    ((double)m->wconv_src_bytes - (double)m->wconv_bytes) / 1048576.0);
    return st;
}

/* ---- the Q4_0_R8 / Q8_0_R8 and R16 (Q4_K_R16 ... Q2_K_R16, Q4_1_R16 ... IQ4_NL_R16) repack (params.repack) ---- */

static bool repacks(const fl_tensor *t) {
    return fl_r8_load_type(t->type, t->ne[1], true) != t->type && t->n_dims == 2 && t->nb[1] == fl_type_row_size(t->type, t->ne[0]);
}

/* Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, Q3_K and Q2_K matrices (not the token embeddings, whose rows are looked up one at a time)
 * rewritten in place, a group of rows at a time: the same bytes, so no memory is added or planned; in a file mapping
 * the written pages become the process's own (private) pages, the file is never changed. */
static fl_status repack_weights(fl_model *m) {
    const fl_hparams *hp = &m->hp;
    if (hp->n_layer > 1024) return FL_OK;
    fl_tensor *all[1 + 7 * 1024];
    size_t n = 0;
    if (!hp->tied_output) all[n++] = &m->output;
    for (int il = 0; il < hp->n_layer; il++) {
        fl_layer *L = &m->layers[il];
        fl_tensor *ts[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w1, &L->w3, &L->w2};
        for (size_t i = 0; i < 7; i++) all[n++] = ts[i];
    }
    size_t tmp_bytes = 0, total = 0;
    bool mapped = false;
    for (size_t i = 0; i < n; i++) {
        if (!repacks(all[i])) continue;
        const size_t b = (size_t)fl_r8_group_rows(fl_r8_load_type(all[i]->type, all[i]->ne[1], true)) * all[i]->nb[1];
        if (b > tmp_bytes) tmp_bytes = b;
        const unsigned char *d = all[i]->data;
        if (!(m->wconv && d >= (const unsigned char *)m->wconv && d < (const unsigned char *)m->wconv + m->wconv_bytes)) mapped = true;
    }
    if (!tmp_bytes) return FL_OK;
    if (mapped && fl_gguf_set_writable(m->g, true)) { /* (a gguf from memory, or the kernel says no) */
        FL_LOG_INFO("weights not repacked: %s", fl_last_error());
        fl_clear_error();
        return FL_OK;
    }
    void *tmp = fl_alloc(FL_MEM_SCRATCH, tmp_bytes, 64);
    if (!tmp) { /* (a budget too tight for 8 rows): the file's layout, which every path reads */
        FL_LOG_INFO("weights not repacked: %s", fl_last_error());
        fl_clear_error();
    }
    int32_t count = 0;
    for (size_t i = 0; i < n && tmp; i++) {
        fl_tensor *t = all[i];
        if (!repacks(t)) continue;
        const int32_t rt = fl_r8_load_type(t->type, t->ne[1], true);
        for (int64_t r = 0; r < t->ne[1]; r += fl_r8_group_rows(rt)) fl_r8_repack(rt, (char *)t->data + (size_t)r * t->nb[1], t->nb[1], t->ne[0], tmp);
        t->type = rt;
        total += fl_tensor_nbytes(t);
        count++;
    }
    if (tmp) fl_free(FL_MEM_SCRATCH, tmp, tmp_bytes);
    const fl_status st = mapped ? fl_gguf_set_writable(m->g, false) : FL_OK;
    if (!st && count) FL_LOG_INFO("%d Q4_0 / Q8_0 / Q4_K / Q5_K / Q6_K / Q3_K / Q2_K / Q4_1 / Q5_0 / Q5_1 / IQ4_NL matrices (%.2f MiB) repacked in groups of rows (q4_0_r8 / q8_0_r8 / q4_K_r16 ... iq4_nl_r16)", count, (double)total / 1048576.0);
    return st;
}

/* The adapters of params.lora_paths (the caller's strings and scales are not kept), and the
 * empty slots after them. */
static fl_status open_loras(fl_model *m) {
    fl_model_params *p = &m->params;
    const int32_t n = p->n_loras + p->lora_slots;
    if (p->n_loras < 0 || p->lora_slots < 0 || n > FL_MAX_LORAS || (p->n_loras > 0 && !p->lora_paths) || p->lora_default < 0 ||
        p->lora_default > p->n_loras || (p->lora_slots > 0 && (p->lora_slot_rank < 1 || p->lora_slot_rank > 4096)))
        return fl_set_error(FL_ERR_INVALID, "%d LoRA adapters + %d slots of rank %d (at most %d in all, ranks 1..4096), default %d",
                            p->n_loras, p->lora_slots, p->lora_slot_rank, FL_MAX_LORAS, p->lora_default);
    if (n == 0) return FL_OK;
    m->loras = fl_calloc(FL_MEM_MISC, (size_t)n, sizeof *m->loras);
    if (!m->loras) return FL_ERR_NOMEM;
    const int32_t n_files = p->n_loras;
    p->n_loras = n; /* (fl_model_free frees every slot) */
    for (int32_t i = 0; i < n_files; i++) {
        fl_status st = fl_lora_open(p->lora_paths[i], &m->hp, p->lora_scales ? p->lora_scales[i] : 1.0f, p->no_mmap, &m->loras[i]);
        if (st) return st;
        if (m->loras[i]->rank_max > m->lora_rank_max) m->lora_rank_max = m->loras[i]->rank_max;
        if (m->loras[i]->n_max > m->lora_n_max) m->lora_n_max = m->loras[i]->n_max;
    }
    if (p->lora_slots > 0) { /* the workspace takes any adapter up to the slots' rank */
        if (p->lora_slot_rank > m->lora_rank_max) m->lora_rank_max = p->lora_slot_rank;
        m->lora_n_max = fl_lora_n_bound(&m->hp);
    }
    m->params.lora_paths = NULL;
    m->params.lora_scales = NULL;
    return FL_OK;
}

size_t fl_model_misc_bytes(const fl_hparams *hp) { return sizeof(fl_model) + sizeof(fl_layer) * (size_t)hp->n_layer; }

fl_status fl_model_load(const char *path, const fl_model_params *params, fl_model **out) {
    *out = NULL;
    fl_model *m = fl_calloc(FL_MEM_MISC, 1, sizeof *m);
    if (!m) return FL_ERR_NOMEM;
    m->params = params ? *params : fl_model_default_params();
    fl_status st = fl_gguf_open_ex(path, m->params.no_mmap, &m->g);
    if (st) goto fail;
    if ((st = fl_hparams_from_gguf(m->g, &m->hp))) goto fail_ctx;
    if (m->params.weights_type >= 0 && !fl_quantize_supported(m->params.weights_type)) {
        st = fl_set_error(FL_ERR_UNSUPPORTED, "load-time weight conversion to %s is not supported",
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
    if ((st = fl_model_check_tensor_names(m->g, hp->arch, hp->n_layer))) goto fail_ctx;
    if (m->params.weights_type >= 0 && (st = convert_weights(m))) goto fail_ctx;
    if (m->params.repack && (st = repack_weights(m))) goto fail_ctx;
    if ((st = open_loras(m))) goto fail;
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
    if (m->loras) {
        for (int32_t i = 0; i < m->params.n_loras; i++) fl_lora_free(m->loras[i]); /* (NULL: an empty slot) */
        fl_free(FL_MEM_MISC, m->loras, (size_t)m->params.n_loras * sizeof *m->loras);
    }
    if (m->wconv) fl_free(FL_MEM_WEIGHTS, m->wconv, m->wconv_bytes);
    if (m->layers) fl_free(FL_MEM_MISC, m->layers, (size_t)m->hp.n_layer * sizeof *m->layers);
    fl_gguf_free(m->g);
    fl_free(FL_MEM_MISC, m, sizeof *m);
}

size_t fl_model_converted(const fl_model *m, size_t *src_bytes, int64_t *n_elems) {
    if (src_bytes) *src_bytes = m->wconv_src_bytes;
    if (n_elems) *n_elems = m->wconv_elems;
    return m->wconv_bytes;
}

const fl_hparams *fl_model_hparams(const fl_model *m) { return &m->hp; }
const fl_gguf *fl_model_gguf(const fl_model *m) { return m->g; }
const fl_tensor *fl_model_tok_embd(const fl_model *m) { return &m->tok_embd; }
const fl_tensor *fl_model_output(const fl_model *m) { return &m->output; }
const fl_layer *fl_model_layer(const fl_model *m, int32_t il) { return &m->layers[il]; }

fl_status fl_model_lora_put(fl_model *m, int32_t k, fl_lora *l, fl_lora **old) {
    *old = NULL;
    if (k < 1 || k > m->params.n_loras)
        return fl_set_error(FL_ERR_INVALID, "%s: adapter slot %d (the model has %d)", __func__, k, m->params.n_loras);
    if (l && (l->rank_max > m->lora_rank_max || l->n_max > m->lora_n_max || l->n_layer != m->hp.n_layer))
        return fl_set_error(FL_ERR_INVALID, "adapter of rank %d: the slots take rank %d at most", l->rank_max, m->lora_rank_max);
    *old = m->loras[k - 1];
    m->loras[k - 1] = l;
    return FL_OK;
}
