/* A small random llama GGUF for the demo (see synth_tiny.h). */
#include "engine/synth_tiny.h"

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"
#include "formats/gguf.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void fl_synth_tiny_default(fl_synth_tiny_params *p) {
    memset(p, 0, sizeof *p);
    p->n_embd = 256;
    p->n_layer = 4;
    p->n_head = 8;
    p->n_head_kv = 4;
    p->n_ff = 768;
    p->n_ctx = 1024;
    p->seed = 42;
}

static uint64_t next_u64(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Approximately normal (sum of 4 uniforms, variance matched), times std. */
static void fill_random(float *x, int64_t n, float std, uint64_t *rng) {
    for (int64_t i = 0; i < n; i++) {
        double s = 0;
        for (int k = 0; k < 4; k++) s += (double)(next_u64(rng) >> 11) * (1.0 / 9007199254740992.0);
        x[i] = (float)((s - 2.0) * sqrt(3.0) * std);
    }
}

/* The byte-fallback vocabulary: <unk> <s> </s> ▁ <0x00>..<0xFF>. */
static fl_status write_byte_vocab(fl_gguf_writer *w, int32_t *n_vocab) {
    enum { NV = 4 + 256 };
    static char names[NV][8];
    const char *toks[NV];
    float scores[NV];
    int32_t types[NV];
    strcpy(names[0], "<unk>");
    strcpy(names[1], "<s>");
    strcpy(names[2], "</s>");
    strcpy(names[3], "\xE2\x96\x81");
    for (int i = 0; i < 256; i++) snprintf(names[4 + i], sizeof names[0], "<0x%02X>", i);
    for (int i = 0; i < NV; i++) {
        toks[i] = names[i];
        scores[i] = i < 4 ? 0.0f : -1.0f;
        types[i] = i == 0 ? 2 : i < 3 ? 3 : i == 3 ? 1 : 6; /* unknown, control, normal, byte */
    }
    fl_status st = fl_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    if (st == FL_OK) st = fl_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NV);
    if (st == FL_OK) st = fl_gguf_writer_set_arr(w, "tokenizer.ggml.scores", FL_GGUF_F32, scores, NV);
    if (st == FL_OK) st = fl_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", FL_GGUF_I32, types, NV);
    if (st == FL_OK) st = fl_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    if (st == FL_OK) st = fl_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    if (st == FL_OK) st = fl_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    *n_vocab = NV;
    return st;
}

/* Copy every tokenizer.* key of src; n_vocab from its token list. */
static fl_status copy_vocab(fl_gguf_writer *w, const char *src, int32_t *n_vocab) {
    fl_gguf *g;
    fl_status st = fl_gguf_open(src, &g);
    if (st != FL_OK) return st;
    const fl_gguf_value *toks = fl_gguf_get_arr(g, "tokenizer.ggml.tokens");
    if (!toks || toks->v.arr.n < 4 || toks->v.arr.n > 1000000) {
        fl_gguf_free(g);
        return fl_set_error(FL_ERR_FORMAT, "%s: %s has no usable tokenizer.ggml.tokens", __func__, src);
    }
    *n_vocab = (int32_t)toks->v.arr.n;
    for (int64_t i = 0; i < fl_gguf_n_kv(g) && st == FL_OK; i++) {
        const fl_gguf_kv *kv = fl_gguf_kv_at(g, i);
        if (kv->key.len > 10 && !memcmp(kv->key.data, "tokenizer.", 10)) st = fl_gguf_writer_copy_kv(w, kv);
    }
    fl_gguf_free(g);
    return st;
}

fl_status fl_synth_write_tiny(const char *path, const fl_synth_tiny_params *p) {
    if (p->n_embd < 8 || p->n_layer < 1 || p->n_head < 1 || p->n_head_kv < 1 || p->n_head % p->n_head_kv ||
        p->n_embd % p->n_head || (p->n_embd / p->n_head) % 2 || p->n_ff < 1 || p->n_ctx < 16)
        return fl_set_error(FL_ERR_INVALID, "%s: bad shape (n_embd %d, n_layer %d, n_head %d/%d, n_ff %d, n_ctx %d)",
                            __func__, p->n_embd, p->n_layer, p->n_head, p->n_head_kv, p->n_ff, p->n_ctx);
    fl_gguf_writer *w = fl_gguf_writer_new();
    if (!w) return FL_ERR_NOMEM;
    const int64_t E = p->n_embd, F = p->n_ff, hd = E / p->n_head, KV = hd * p->n_head_kv;
    int32_t n_vocab = 0;
    fl_status st = FL_OK;
    if (p->tokenizer_from) {
        st = copy_vocab(w, p->tokenizer_from, &n_vocab);
        if (st != FL_OK) { /* fall back to the generated vocabulary */
            fl_gguf_writer_free(w);
            w = fl_gguf_writer_new();
            if (!w) return FL_ERR_NOMEM;
            n_vocab = 0;
        }
    }
    st = n_vocab ? FL_OK : write_byte_vocab(w, &n_vocab);
    const int64_t V = n_vocab;
    if (st == FL_OK) st = fl_gguf_writer_set_str(w, "general.architecture", "llama");
    if (st == FL_OK) st = fl_gguf_writer_set_str(w, "general.name", "fitllm-demo-random");
    if (st == FL_OK) st = fl_gguf_writer_set_u32(w, "llama.context_length", (uint32_t)p->n_ctx);
    if (st == FL_OK) st = fl_gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)E);
    if (st == FL_OK) st = fl_gguf_writer_set_u32(w, "llama.feed_forward_length", (uint32_t)F);
    if (st == FL_OK) st = fl_gguf_writer_set_u32(w, "llama.block_count", (uint32_t)p->n_layer);
    if (st == FL_OK) st = fl_gguf_writer_set_u32(w, "llama.attention.head_count", (uint32_t)p->n_head);
    if (st == FL_OK) st = fl_gguf_writer_set_u32(w, "llama.attention.head_count_kv", (uint32_t)p->n_head_kv);
    if (st == FL_OK) st = fl_gguf_writer_set_u32(w, "llama.rope.dimension_count", (uint32_t)hd);
    if (st == FL_OK) st = fl_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    if (st == FL_OK) st = fl_gguf_writer_set_u32(w, "llama.vocab_size", (uint32_t)V);
    /* all tensors in one scratch buffer, borrowed by the writer until the file is written */
    const int64_t per_layer = E + E * E + 2 * E * KV + E * E + E + 3 * E * F;
    const int64_t total = 2 * V * E + E + per_layer * p->n_layer;
    const size_t bytes = (size_t)total * sizeof(float);
    float *buf = st == FL_OK ? fl_alloc(FL_MEM_SCRATCH, bytes, 64) : NULL;
    if (st == FL_OK && !buf) st = FL_ERR_NOMEM;
    uint64_t rng = p->seed;
    float *at = buf;
#define ADD(name, ne0, ne1, std)                                                                  \
    do {                                                                                          \
        int64_t ne_[2] = {(ne0), (ne1)};                                                          \
        if ((std) > 0) fill_random(at, ne_[0] * ne_[1], (float)(std), &rng);                      \
        else for (int64_t i_ = 0; i_ < ne_[0] * ne_[1]; i_++) at[i_] = 1.0f;                      \
        if (st == FL_OK) st = fl_gguf_writer_add_tensor(w, name, FL_TYPE_F32, (ne1) > 1 ? 2 : 1, ne_, at); \
        at += ne_[0] * ne_[1];                                                                    \
    } while (0)
    if (st == FL_OK) {
        ADD("token_embd.weight", E, V, 1.0);
        ADD("output_norm.weight", E, 1, 0);
        ADD("output.weight", E, V, 1.0 / sqrt((double)E));
        char name[64];
        for (int32_t il = 0; il < p->n_layer; il++) {
            const double se = 1.0 / sqrt((double)E), sf = 1.0 / sqrt((double)F);
            snprintf(name, sizeof name, "blk.%d.attn_norm.weight", il);   ADD(name, E, 1, 0);
            snprintf(name, sizeof name, "blk.%d.attn_q.weight", il);      ADD(name, E, E, se);
            snprintf(name, sizeof name, "blk.%d.attn_k.weight", il);      ADD(name, E, KV, se);
            snprintf(name, sizeof name, "blk.%d.attn_v.weight", il);      ADD(name, E, KV, se);
            snprintf(name, sizeof name, "blk.%d.attn_output.weight", il); ADD(name, E, E, se);
            snprintf(name, sizeof name, "blk.%d.ffn_norm.weight", il);    ADD(name, E, 1, 0);
            snprintf(name, sizeof name, "blk.%d.ffn_gate.weight", il);    ADD(name, E, F, se);
            snprintf(name, sizeof name, "blk.%d.ffn_up.weight", il);      ADD(name, E, F, se);
            snprintf(name, sizeof name, "blk.%d.ffn_down.weight", il);    ADD(name, F, E, sf);
        }
        FL_ASSERT(at == buf + total);
    }
#undef ADD
    if (st == FL_OK) st = fl_gguf_writer_write(w, path, NULL, NULL);
    fl_gguf_writer_free(w);
    if (buf) fl_free(FL_MEM_SCRATCH, buf, bytes);
    return st;
}
