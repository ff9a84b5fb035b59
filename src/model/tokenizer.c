/*
 * tokenizer.c - vocabulary loading (GGUF tokenizer.ggml.* or GPT-2 style files), special-token
 * handling, and the parts common to both tokenizer kinds: UTF-8 validation, splitting the text
 * around special tokens, token -> piece and detokenization.  The merge algorithms live in
 * tokenizer_spm.c and tokenizer_bpe.c.
 *
 * The behaviour follows llama.cpp's llama-vocab (the specification the test vectors in
 * shared/vocab were produced with):
 *   - special tokens (control, user-defined, unknown) are cut out of the text first, longest
 *     text first; with parse_special=false only user-defined ones are;
 *   - SPM prefixes a space to a raw fragment that follows a special token or starts the text;
 *   - pieces: control/unknown tokens render only when asked, user-defined ones always, SPM
 *     "▁" becomes a space, <0xXX> byte tokens give their byte, BPE undoes the GPT-2 byte map.
 */
#include "model/tokenizer_impl.h"
#include "core/log.h"
#include "core/utf8.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* ------------------------------------------------------------------------------------------ */
/* string table                                                                                */

fl_status fl_strtab_init(fl_strtab *t, uint64_t n_expected) {
    uint64_t cap = 16;
    while (cap < n_expected * 2 + 16) cap <<= 1; /* load factor <= 0.5 */
    t->slots = fl_calloc(FL_MEM_MISC, (size_t)cap, sizeof(uint64_t));
    if (!t->slots) return fl_set_error(FL_ERR_NOMEM, "%s: cannot allocate a table of %llu slots", __func__, (unsigned long long)cap);
    t->mask = cap - 1;
    return FL_OK;
}

void fl_strtab_deinit(fl_strtab *t) {
    if (t->slots) fl_free(FL_MEM_MISC, t->slots, (size_t)(t->mask + 1) * sizeof(uint64_t));
    t->slots = NULL;
    t->mask = 0;
}

uint64_t fl_strtab_hash(const void *s, size_t n) { return XXH3_64bits(s, n); }

uint64_t fl_strtab_hash2(const void *a, size_t na, const void *b, size_t nb) {
    return XXH3_64bits_withSeed(b, nb, XXH3_64bits(a, na));
}

void fl_strtab_put(fl_strtab *t, uint64_t h, uint32_t value, fl_strtab_eq eq, const void *ctx, const void *key) {
    const uint64_t tag = h >> 32 << 32;
    for (uint64_t i = h & t->mask;; i = (i + 1) & t->mask) {
        uint64_t s = t->slots[i];
        if (s == 0 || ((s & ~0xffffffffull) == tag && eq(ctx, (uint32_t)(s & 0xffffffffu) - 1, key))) {
            t->slots[i] = tag | ((uint64_t)value + 1);
            return;
        }
    }
}

int64_t fl_strtab_get(const fl_strtab *t, uint64_t h, fl_strtab_eq eq, const void *ctx, const void *key) {
    if (!t->slots) return -1;
    const uint64_t tag = h >> 32 << 32;
    for (uint64_t i = h & t->mask;; i = (i + 1) & t->mask) {
        uint64_t s = t->slots[i];
        if (s == 0) return -1;
        uint32_t v = (uint32_t)(s & 0xffffffffu) - 1;
        if ((s & ~0xffffffffull) == tag && eq(ctx, v, key)) return v;
    }
}

/* Key for vocab lookups: a byte string. */
typedef struct { const char *s; size_t n; } strkey;

static bool vocab_eq(const void *ctx, uint32_t id, const void *key) {
    const fl_tokenizer *t = ctx;
    const strkey *k = key;
    return t->tokens[id].len == k->n && memcmp(t->text + t->tokens[id].off, k->s, k->n) == 0;
}

int32_t fl_tok_find(const fl_tokenizer *t, const char *s, size_t n) {
    strkey k = {s, n};
    return (int32_t)fl_strtab_get(&t->vocab_map, fl_strtab_hash(s, n), vocab_eq, t, &k);
}

/* ------------------------------------------------------------------------------------------ */
/* id vector                                                                                   */

fl_status fl_idvec_push(fl_idvec *a, int32_t id) {
    if (a->n == a->cap) {
        int64_t nc = a->cap ? a->cap * 2 : 64;
        int32_t *nv = fl_realloc(FL_MEM_SCRATCH, a->v, (size_t)a->cap * sizeof(int32_t), (size_t)nc * sizeof(int32_t), 0);
        if (!nv) return fl_set_error(FL_ERR_NOMEM, "%s: cannot grow the token buffer to %lld ids", __func__, (long long)nc);
        a->v = nv;
        a->cap = nc;
    }
    a->v[a->n++] = id;
    return FL_OK;
}

void fl_idvec_free(fl_idvec *a) {
    if (a->v) fl_free(FL_MEM_SCRATCH, a->v, (size_t)a->cap * sizeof(int32_t));
    a->v = NULL;
    a->n = a->cap = 0;
}

size_t fl_utf8_complete_prefix(const char *s, size_t n) {
    /* look back at most 3 bytes for the start of the last sequence */
    for (size_t back = 1; back <= 4 && back <= n; back++) {
        unsigned char c = (unsigned char)s[n - back];
        if ((c & 0xc0) == 0x80) continue; /* continuation byte: keep looking */
        size_t need = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 1;
        return need > back ? n - back : n;
    }
    return n; /* only continuation bytes (or nothing): not a sequence we can complete */
}

/* ------------------------------------------------------------------------------------------ */
/* construction                                                                                */

static fl_tokenizer *tok_alloc(void) {
    fl_tokenizer *t = fl_calloc(FL_MEM_MISC, 1, sizeof *t);
    if (!t) return NULL;
    t->bos = t->eos = t->unk = t->eot = t->eom = t->pad = t->sep = t->nl = -1;
    for (int i = 0; i < FL_FIM_COUNT; i++) t->fim[i] = -1;
    for (int i = 0; i < 256; i++) t->byte_tok[i] = -1;
    return t;
}

void fl_tokenizer_free(fl_tokenizer *t) {
    if (!t) return;
    fl_bpe_free_pre(t);
    fl_strtab_deinit(&t->vocab_map);
    fl_strtab_deinit(&t->merge_map);
    if (t->tokens) fl_free(FL_MEM_MISC, t->tokens, (size_t)t->n_vocab * sizeof(fl_tok_entry));
    if (t->text) fl_free(FL_MEM_MISC, t->text, t->text_size);
    if (t->merges) fl_free(FL_MEM_MISC, t->merges, (size_t)t->n_merges * sizeof(fl_bpe_merge));
    if (t->merge_text) fl_free(FL_MEM_MISC, t->merge_text, t->merge_text_size);
    if (t->eog) fl_free(FL_MEM_MISC, t->eog, (size_t)t->n_eog * sizeof(int32_t));
    if (t->special) fl_free(FL_MEM_MISC, t->special, (size_t)t->n_special * sizeof(int32_t));
    if (t->sp_prefix2) fl_free(FL_MEM_MISC, t->sp_prefix2, 1024 * sizeof(uint64_t));
    if (t->sp_lens) fl_free(FL_MEM_MISC, t->sp_lens, (size_t)t->n_special * sizeof(uint32_t));
    fl_free(FL_MEM_MISC, t, sizeof *t);
}

/* Copy n token texts into one block, build the id table and the text -> id map.  Empty texts
 * become "[EMPTY_<id>]" as in llama.cpp, so every token has a non-empty text. */
static fl_status set_vocab(fl_tokenizer *t, int64_t n, const fl_gguf_str *texts) {
    if (n <= 0 || n > INT32_MAX / 2) return fl_set_error(FL_ERR_FORMAT, "tokenizer: vocabulary size %lld out of range", (long long)n);
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        if (texts[i].len > UINT32_MAX / 2) return fl_set_error(FL_ERR_FORMAT, "tokenizer: token %lld text too long", (long long)i);
        total += texts[i].len ? (size_t)texts[i].len : 24;
    }
    if (total > UINT32_MAX / 2) return fl_set_error(FL_ERR_FORMAT, "tokenizer: token texts too large (%zu bytes)", total);
    t->n_vocab = (int32_t)n;
    t->tokens = fl_calloc(FL_MEM_MISC, (size_t)n, sizeof(fl_tok_entry));
    t->text_size = total + 1;
    t->text = fl_alloc(FL_MEM_MISC, t->text_size, 0);
    if (!t->tokens || !t->text) return fl_set_error(FL_ERR_NOMEM, "tokenizer: cannot allocate the vocabulary (%lld tokens)", (long long)n);
    fl_status st = fl_strtab_init(&t->vocab_map, (uint64_t)n);
    if (st) return st;
    size_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        fl_tok_entry *e = &t->tokens[i];
        e->off = (uint32_t)off;
        if (texts[i].len) {
            memcpy(t->text + off, texts[i].data, (size_t)texts[i].len);
            e->len = (uint32_t)texts[i].len;
        } else {
            e->len = (uint32_t)snprintf(t->text + off, 24, "[EMPTY_%lld]", (long long)i);
        }
        off += e->len;
        e->attr = FL_TATTR_NORMAL;
        strkey k = {t->text + e->off, e->len};
        fl_strtab_put(&t->vocab_map, fl_strtab_hash(k.s, k.n), (uint32_t)i, vocab_eq, t, &k);
    }
    t->text[off] = 0;
    return FL_OK;
}

static uint32_t attr_of_type(int64_t type) {
    switch (type) {
    case 1: return FL_TATTR_NORMAL;
    case 2: return FL_TATTR_UNKNOWN;
    case 3: return FL_TATTR_CONTROL;
    case 4: return FL_TATTR_USER_DEFINED;
    case 5: return FL_TATTR_UNUSED;
    case 6: return FL_TATTR_BYTE;
    default: return FL_TATTR_UNDEFINED;
    }
}

static int cmp_special(const void *a, const void *b, void *ctx) {
    const fl_tokenizer *t = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (t->tokens[x].len != t->tokens[y].len) return t->tokens[x].len > t->tokens[y].len ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* After the vocabulary, types and special ids are known: end-of-generation set (eos, eot, eom
 * and the tokens llama.cpp recognizes by text, which become control tokens), the list of
 * special tokens for the text partition (longest first), and the SPM byte-fallback table. */
static fl_status finish_setup(fl_tokenizer *t) {
    static const char *const eog_texts[] = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
        "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
        "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>", /* DeepSeek */
    };
    const int n_texts = (int)(sizeof eog_texts / sizeof eog_texts[0]);
    int32_t found[16];
    int n_found = 0;
    for (int k = 0; k < n_texts; k++) {
        int32_t id = fl_tok_find(t, eog_texts[k], strlen(eog_texts[k]));
        if (id < 0) continue;
        if (t->eot < 0 && k != 5 && k != 8 && k != 9) t->eot = id; /* eom / end_of_text are not EOT */
        if (k == 5 && t->eom < 0) t->eom = id;
        t->tokens[id].attr = (t->tokens[id].attr & ~(uint32_t)(FL_TATTR_NORMAL | FL_TATTR_USER_DEFINED | FL_TATTR_UNDEFINED)) | FL_TATTR_CONTROL;
        found[n_found++] = id;
    }
    /* fill-in-the-middle tokens the keys did not name, by the texts model families use; like
     * llama.cpp, such a token becomes a control token */
    static const char *const fim_texts[FL_FIM_COUNT][8] = {
        {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>", "<PRE>", "\xe2\x96\x81<PRE>", "<|code_prefix|>"},
        {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "hole\xef\xbd\x9c>", "<SUF>", "\xe2\x96\x81<SUF>", "<|code_suffix|>"},
        {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>", "<MID>", "\xe2\x96\x81<MID>", "<|code_middle|>"},
        {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"},
        {"<|fim_repo|>", "<|repo_name|>", "<repo_name>", "<fim-repo>", "<fim_repo>", "<REPO>", "<reponame>"},
        {"<|file_sep|>", "<file_sep>", "<fim-sep>", "<fim_sep>"},
    };
    for (int w = 0; w < FL_FIM_COUNT; w++)
        for (int k = 0; t->fim[w] < 0 && k < 8 && fim_texts[w][k]; k++) {
            const int32_t id = fl_tok_find(t, fim_texts[w][k], strlen(fim_texts[w][k]));
            if (id < 0) continue;
            t->fim[w] = id;
            if (!(t->tokens[id].attr & FL_TATTR_CONTROL))
                t->tokens[id].attr = (t->tokens[id].attr & ~(uint32_t)(FL_TATTR_NORMAL | FL_TATTR_USER_DEFINED | FL_TATTR_UNDEFINED)) | FL_TATTR_CONTROL;
        }
    int32_t cand[3] = {t->eos, t->eot, t->eom};
    int32_t eog[19];
    int n_eog = 0;
    for (int k = 0; k < n_found + 3; k++) {
        int32_t id = k < 3 ? cand[k] : found[k - 3];
        if (id < 0) continue;
        bool dup = false;
        for (int j = 0; j < n_eog; j++) dup |= eog[j] == id;
        if (!dup) eog[n_eog++] = id;
    }
    if (n_eog) {
        t->eog = fl_alloc(FL_MEM_MISC, (size_t)n_eog * sizeof(int32_t), 0);
        if (!t->eog) return fl_set_error(FL_ERR_NOMEM, "tokenizer: out of memory");
        memcpy(t->eog, eog, (size_t)n_eog * sizeof(int32_t));
        t->n_eog = n_eog;
    }

    int32_t n_sp = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->tokens[i].attr & (FL_TATTR_CONTROL | FL_TATTR_USER_DEFINED | FL_TATTR_UNKNOWN)) n_sp++;
    if (n_sp) {
        t->special = fl_alloc(FL_MEM_MISC, (size_t)n_sp * sizeof(int32_t), 0);
        if (!t->special) return fl_set_error(FL_ERR_NOMEM, "tokenizer: out of memory");
        for (int32_t i = 0; i < t->n_vocab; i++)
            if (t->tokens[i].attr & (FL_TATTR_CONTROL | FL_TATTR_USER_DEFINED | FL_TATTR_UNKNOWN)) t->special[t->n_special++] = i;
        qsort_r(t->special, (size_t)t->n_special, sizeof(int32_t), cmp_special, t);
        /* pre-filter: first two bytes and distinct lengths (the list is longest first) */
        t->sp_prefix2 = fl_calloc(FL_MEM_MISC, 1024, sizeof(uint64_t));
        t->sp_lens = fl_alloc(FL_MEM_MISC, (size_t)t->n_special * sizeof(uint32_t), 0);
        if (!t->sp_prefix2 || !t->sp_lens) return fl_set_error(FL_ERR_NOMEM, "tokenizer: out of memory");
        int32_t n_lens = 0;
        for (int32_t k = 0; k < t->n_special; k++) {
            const fl_tok_entry *e = &t->tokens[t->special[k]];
            const unsigned char *x = (const unsigned char *)t->text + e->off;
            if (e->len == 1) t->sp_prefix1[x[0] >> 6] |= 1ull << (x[0] & 63);
            else {
                unsigned b = (unsigned)x[0] << 8 | x[1];
                t->sp_prefix2[b >> 6] |= 1ull << (b & 63);
            }
            if (n_lens == 0 || t->sp_lens[n_lens - 1] != e->len) t->sp_lens[n_lens++] = e->len;
        }
        t->n_sp_lens = n_lens; /* the block keeps n_special entries */
    }

    if (t->kind == FL_TOK_SPM) {
        for (int b = 0; b < 256; b++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            int32_t id = fl_tok_find(t, name, 6);
            if (id < 0) {
                char one = (char)b;
                id = fl_tok_find(t, &one, 1);
            }
            t->byte_tok[b] = id;
        }
        t->spm_split = fl_spm_can_split(t);
        char nl = '\n';
        t->nl = t->byte_tok['\n'] >= 0 ? t->byte_tok['\n'] : fl_tok_find(t, &nl, 1);
    }
    return FL_OK;
}

/* Read an optional token id key: absent keeps *id; out of range is ignored with the default. */
static void get_id(const fl_gguf *g, const char *key, int32_t n_vocab, int32_t *id) {
    int64_t v;
    if (!fl_gguf_find(g, key)) return;
    if (fl_gguf_get_i64(g, key, &v) != FL_OK) {
        FL_LOG_WARN("tokenizer: %s is not an integer: ignored", key);
    } else if (v >= 0 && v < n_vocab) {
        *id = (int32_t)v;
    } else if (v != 0xFFFFFFFFll && v != -1) { /* (the converters' "none") */
        FL_LOG_WARN("tokenizer: %s = %lld is not a token id (vocabulary of %d): ignored", key, (long long)v, n_vocab);
    }
    fl_clear_error();
}

static void get_flag(const fl_gguf *g, const char *key, bool *flag) {
    bool v;
    if (!fl_gguf_find(g, key)) return;
    if (fl_gguf_get_bool(g, key, &v) == FL_OK) *flag = v;
    fl_clear_error();
}

/* Lower-case ASCII copy of general.name ("" if absent). */
static void model_name(const fl_gguf *g, char *buf, size_t cap) {
    const fl_gguf_kv *kv = fl_gguf_find(g, "general.name");
    buf[0] = 0;
    if (!kv || kv->value.type != FL_GGUF_STRING) return;
    size_t n = kv->value.v.str.len < cap - 1 ? (size_t)kv->value.v.str.len : cap - 1;
    for (size_t i = 0; i < n; i++) {
        char c = kv->value.v.str.data[i];
        buf[i] = (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
    }
    buf[n] = 0;
}

fl_status fl_tokenizer_new(const fl_gguf *g, fl_tokenizer **out) {
    *out = NULL;
    char model[32];
    fl_status st = fl_gguf_get_str(g, "tokenizer.ggml.model", model, sizeof model);
    if (st) return fl_set_error(FL_ERR_FORMAT, "tokenizer: no usable tokenizer.ggml.model: %s", fl_last_error());
    const fl_gguf_value *toks = fl_gguf_get_arr(g, "tokenizer.ggml.tokens");
    if (!toks || toks->v.arr.type != FL_GGUF_STRING)
        return fl_set_error(FL_ERR_FORMAT, "tokenizer: tokenizer.ggml.tokens missing or not an array of strings");
    const int64_t n = (int64_t)toks->v.arr.n;
    fl_tokenizer *t = tok_alloc();
    if (!t) return fl_set_error(FL_ERR_NOMEM, "tokenizer: out of memory");
    if (strcmp(model, "llama") == 0) {
        t->kind = FL_TOK_SPM;
        t->bos = 1, t->eos = 2, t->unk = 0;
        t->add_bos = true, t->add_eos = false, t->add_space_prefix = true, t->clean_spaces = false;
    } else if (strcmp(model, "gpt2") == 0) {
        t->kind = FL_TOK_BPE;
        t->bos = 11, t->eos = 11;
        t->add_bos = false, t->add_eos = false, t->add_space_prefix = false, t->clean_spaces = true;
    } else {
        st = fl_set_error(FL_ERR_UNSUPPORTED, "tokenizer: tokenizer.ggml.model '%s' is not supported (llama, gpt2)", model);
        goto fail;
    }
    {
        fl_gguf_str *texts = fl_alloc(FL_MEM_SCRATCH, (size_t)(n > 0 ? n : 1) * sizeof(fl_gguf_str), 0);
        if (!texts) { st = fl_set_error(FL_ERR_NOMEM, "tokenizer: out of memory"); goto fail; }
        for (int64_t i = 0; i < n; i++) texts[i] = toks->v.arr.items[i].v.str;
        st = set_vocab(t, n, texts);
        fl_free(FL_MEM_SCRATCH, texts, (size_t)(n > 0 ? n : 1) * sizeof(fl_gguf_str));
        if (st) goto fail;
    }
    const fl_gguf_value *scores = fl_gguf_get_arr(g, "tokenizer.ggml.scores");
    if (scores) {
        if ((scores->v.arr.type != FL_GGUF_F32 && scores->v.arr.type != FL_GGUF_F64) || (int64_t)scores->v.arr.n != n) {
            st = fl_set_error(FL_ERR_FORMAT, "tokenizer: tokenizer.ggml.scores must be %lld floats", (long long)n);
            goto fail;
        }
        for (int64_t i = 0; i < n; i++) t->tokens[i].score = (float)fl_gguf_arr_f64(scores, (uint64_t)i);
    }
    const fl_gguf_value *types = fl_gguf_get_arr(g, "tokenizer.ggml.token_type");
    if (types) {
        int32_t et = types->v.arr.type;
        if (et == FL_GGUF_STRING || et == FL_GGUF_ARRAY || et == FL_GGUF_F32 || et == FL_GGUF_F64 || (int64_t)types->v.arr.n != n) {
            st = fl_set_error(FL_ERR_FORMAT, "tokenizer: tokenizer.ggml.token_type must be %lld integers", (long long)n);
            goto fail;
        }
        for (int64_t i = 0; i < n; i++) t->tokens[i].attr = attr_of_type(fl_gguf_arr_i64(types, (uint64_t)i));
    }
    if (t->kind == FL_TOK_BPE) {
        const fl_gguf_value *merges = fl_gguf_get_arr(g, "tokenizer.ggml.merges");
        if (!merges || merges->v.arr.type != FL_GGUF_STRING) {
            st = fl_set_error(FL_ERR_FORMAT, "tokenizer: gpt2 tokenizer without tokenizer.ggml.merges strings");
            goto fail;
        }
        int64_t nm = (int64_t)merges->v.arr.n;
        fl_gguf_str *lines = fl_alloc(FL_MEM_SCRATCH, (size_t)(nm > 0 ? nm : 1) * sizeof(fl_gguf_str), 0);
        if (!lines) { st = fl_set_error(FL_ERR_NOMEM, "tokenizer: out of memory"); goto fail; }
        for (int64_t i = 0; i < nm; i++) lines[i] = merges->v.arr.items[i].v.str;
        st = fl_bpe_set_merges(t, lines, nm);
        fl_free(FL_MEM_SCRATCH, lines, (size_t)(nm > 0 ? nm : 1) * sizeof(fl_gguf_str));
        if (st) goto fail;
        const fl_gguf_kv *pre = fl_gguf_find(g, "tokenizer.ggml.pre");
        if (pre && pre->value.type == FL_GGUF_STRING && pre->value.v.str.len < sizeof t->pre_name) {
            memcpy(t->pre_name, pre->value.v.str.data, (size_t)pre->value.v.str.len);
            t->pre_name[pre->value.v.str.len] = 0;
        } else {
            strcpy(t->pre_name, "default");
        }
        if ((st = fl_bpe_init_pre(t))) goto fail;
    }
    get_id(g, "tokenizer.ggml.bos_token_id", t->n_vocab, &t->bos);
    get_id(g, "tokenizer.ggml.eos_token_id", t->n_vocab, &t->eos);
    get_id(g, "tokenizer.ggml.unknown_token_id", t->n_vocab, &t->unk);
    get_id(g, "tokenizer.ggml.eot_token_id", t->n_vocab, &t->eot);
    get_id(g, "tokenizer.ggml.eom_token_id", t->n_vocab, &t->eom);
    get_id(g, "tokenizer.ggml.padding_token_id", t->n_vocab, &t->pad);
    get_id(g, "tokenizer.ggml.seperator_token_id", t->n_vocab, &t->sep);
    { /* fill-in-the-middle: the keys (the older names for the first three), else the texts */
        static const char *const KEY[FL_FIM_COUNT] = {"pre", "suf", "mid", "pad", "rep", "sep"};
        static const char *const OLD[3] = {"prefix", "suffix", "middle"};
        for (int i = 0; i < FL_FIM_COUNT; i++) {
            char key[64];
            snprintf(key, sizeof key, "tokenizer.ggml.fim_%s_token_id", KEY[i]);
            get_id(g, key, t->n_vocab, &t->fim[i]);
            if (t->fim[i] < 0 && i < 3) {
                snprintf(key, sizeof key, "tokenizer.ggml.%s_token_id", OLD[i]);
                get_id(g, key, t->n_vocab, &t->fim[i]);
            }
        }
    }
    get_flag(g, "tokenizer.ggml.add_bos_token", &t->add_bos);
    get_flag(g, "tokenizer.ggml.add_eos_token", &t->add_eos);
    get_flag(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix);
    if (t->bos >= t->n_vocab) t->bos = -1;
    if (t->eos >= t->n_vocab) t->eos = -1;
    if (t->unk >= t->n_vocab) t->unk = -1;
    if ((st = finish_setup(t))) goto fail;
    {
        /* Phi-3: special tokens swallow the whitespace to their right (llama.cpp sets RSTRIP by
         * model name), except <unk>, <s> and <|endoftext|>; </s> does too. */
        char name[128];
        model_name(g, name, sizeof name);
        if (strstr(name, "phi-3") || strstr(name, "phi3")) {
            for (int32_t k = 0; k < t->n_special; k++) t->tokens[t->special[k]].attr |= FL_TATTR_RSTRIP;
            int32_t id = fl_tok_find(t, "</s>", 4);
            if (id >= 0) t->tokens[id].attr |= FL_TATTR_RSTRIP;
            static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
            for (int k = 0; k < 3; k++) {
                id = fl_tok_find(t, keep[k], strlen(keep[k]));
                if (id >= 0) t->tokens[id].attr &= ~(uint32_t)FL_TATTR_RSTRIP;
            }
        }
    }
    *out = t;
    return FL_OK;
fail:
    fl_tokenizer_free(t);
    return st;
}

/* Read a whole file into a SCRATCH buffer (NUL-terminated). */
static fl_status read_file(const char *path, char **buf, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return fl_set_error(FL_ERR_IO, "cannot open '%s'", path);
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return fl_set_error(FL_ERR_IO, "cannot size '%s'", path);
    }
    char *b = fl_alloc(FL_MEM_SCRATCH, (size_t)n + 1, 0);
    if (!b) {
        fclose(f);
        return fl_set_error(FL_ERR_NOMEM, "cannot allocate %ld bytes for '%s'", n, path);
    }
    if (fread(b, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        fl_free(FL_MEM_SCRATCH, b, (size_t)n + 1);
        return fl_set_error(FL_ERR_IO, "cannot read '%s'", path);
    }
    fclose(f);
    b[n] = 0;
    *buf = b;
    *len = (size_t)n;
    return FL_OK;
}

fl_status fl_tokenizer_new_bpe_files(const char *encoder_json_path, const char *merges_path, const char *pre_kind,
                                     fl_tokenizer **out) {
    *out = NULL;
    char *js = NULL, *mt = NULL;
    size_t js_len = 0, mt_len = 0;
    cJSON *root = NULL;
    fl_gguf_str *texts = NULL, *lines = NULL;
    int64_t n = 0, nl = 0;
    fl_tokenizer *t = NULL;
    fl_status st = read_file(encoder_json_path, &js, &js_len);
    if (st) goto done;
    if ((st = read_file(merges_path, &mt, &mt_len))) goto done;
    root = cJSON_ParseWithLength(js, js_len);
    if (!root || !cJSON_IsObject(root)) {
        st = fl_set_error(FL_ERR_FORMAT, "%s: not a JSON object", encoder_json_path);
        goto done;
    }
    /* ids must be 0..n-1 without holes */
    for (cJSON *it = root->child; it; it = it->next) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= (double)INT32_MAX / 2) {
            st = fl_set_error(FL_ERR_FORMAT, "%s: entry '%s' is not a valid id", encoder_json_path, it->string ? it->string : "?");
            goto done;
        }
        if ((int64_t)it->valuedouble + 1 > n) n = (int64_t)it->valuedouble + 1;
    }
    texts = fl_calloc(FL_MEM_SCRATCH, (size_t)(n > 0 ? n : 1), sizeof(fl_gguf_str));
    if (!texts) { st = fl_set_error(FL_ERR_NOMEM, "%s: out of memory", __func__); goto done; }
    for (cJSON *it = root->child; it; it = it->next) {
        int64_t id = (int64_t)it->valuedouble;
        texts[id].data = it->string;
        texts[id].len = strlen(it->string);
    }
    for (int64_t i = 0; i < n; i++)
        if (!texts[i].data) {
            st = fl_set_error(FL_ERR_FORMAT, "%s: id %lld has no token", encoder_json_path, (long long)i);
            goto done;
        }
    /* merges: one "left right" per line; an optional "#version" first line */
    for (size_t i = 0; i < mt_len; i++) nl += mt[i] == '\n';
    lines = fl_calloc(FL_MEM_SCRATCH, (size_t)nl + 1, sizeof(fl_gguf_str));
    if (!lines) { st = fl_set_error(FL_ERR_NOMEM, "%s: out of memory", __func__); goto done; }
    int64_t nm = 0;
    for (size_t p = 0; p < mt_len;) {
        size_t e = p;
        while (e < mt_len && mt[e] != '\n') e++;
        size_t le = e;
        if (le > p && mt[le - 1] == '\r') le--;
        if (le > p && !(nm == 0 && le - p >= 8 && memcmp(mt + p, "#version", 8) == 0)) {
            lines[nm].data = mt + p;
            lines[nm].len = le - p;
            nm++;
        }
        p = e + 1;
    }
    if (!(t = tok_alloc())) { st = fl_set_error(FL_ERR_NOMEM, "%s: out of memory", __func__); goto done; }
    t->kind = FL_TOK_BPE;
    t->add_bos = false, t->add_eos = false, t->add_space_prefix = false, t->clean_spaces = true;
    if ((st = set_vocab(t, n, texts))) goto done;
    if ((st = fl_bpe_set_merges(t, lines, nm))) goto done;
    snprintf(t->pre_name, sizeof t->pre_name, "%s", pre_kind ? pre_kind : "default");
    if ((st = fl_bpe_init_pre(t))) goto done;
    if ((st = finish_setup(t))) goto done;
    *out = t;
    t = NULL;
done:
    fl_tokenizer_free(t);
    if (root) cJSON_Delete(root);
    if (texts) fl_free(FL_MEM_SCRATCH, texts, (size_t)(n > 0 ? n : 1) * sizeof(fl_gguf_str));
    if (lines) fl_free(FL_MEM_SCRATCH, lines, ((size_t)nl + 1) * sizeof(fl_gguf_str));
    if (js) fl_free(FL_MEM_SCRATCH, js, js_len + 1);
    if (mt) fl_free(FL_MEM_SCRATCH, mt, mt_len + 1);
    return st;
}

/* ------------------------------------------------------------------------------------------ */
/* accessors                                                                                   */

int32_t fl_tokenizer_n_vocab(const fl_tokenizer *t) { return t->n_vocab; }
int32_t fl_tokenizer_bos(const fl_tokenizer *t) { return t->bos; }
int32_t fl_tokenizer_eos(const fl_tokenizer *t) { return t->eos; }
int32_t fl_tokenizer_eot(const fl_tokenizer *t) { return t->eot; }
int32_t fl_tokenizer_fim(const fl_tokenizer *t, fl_fim_token which) { return which >= 0 && which < FL_FIM_COUNT ? t->fim[which] : -1; }
int32_t fl_tokenizer_unk(const fl_tokenizer *t) { return t->unk; }
bool fl_tokenizer_add_bos(const fl_tokenizer *t) { return t->add_bos && t->bos >= 0; }
bool fl_tokenizer_add_eos(const fl_tokenizer *t) { return t->add_eos && t->eos >= 0; }
const char *fl_tokenizer_kind(const fl_tokenizer *t) { return t->kind == FL_TOK_SPM ? "llama" : "gpt2"; }
const char *fl_tokenizer_pre(const fl_tokenizer *t) { return t->kind == FL_TOK_SPM ? "default" : t->pre_name; }

bool fl_tokenizer_is_eog(const fl_tokenizer *t, int32_t id) {
    for (int32_t i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return true;
    return false;
}

bool fl_tokenizer_is_control(const fl_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && (t->tokens[id].attr & FL_TATTR_CONTROL);
}

int32_t fl_tokenizer_token_text(const fl_tokenizer *t, int32_t id, const char **text) {
    if (id < 0 || id >= t->n_vocab) return -1;
    *text = fl_tok_text(t, id);
    return (int32_t)t->tokens[id].len;
}

float fl_tokenizer_score(const fl_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab ? t->tokens[id].score : 0.0f;
}

int32_t fl_tokenizer_find(const fl_tokenizer *t, const char *text, size_t len) { return fl_tok_find(t, text, len); }

/* ------------------------------------------------------------------------------------------ */
/* tokenize                                                                                    */

/* A piece of the input: raw text [off, off + len) or one special token. */
typedef struct frag {
    int64_t off, len;
    int32_t tok; /* -1: raw text */
} frag;

typedef struct fragvec {
    frag *v;
    int64_t n, cap;
} fragvec;

static fl_status frag_push(fragvec *a, int64_t off, int64_t len, int32_t tok) {
    if (a->n == a->cap) {
        int64_t nc = a->cap ? a->cap * 2 : 16;
        frag *nv = fl_realloc(FL_MEM_SCRATCH, a->v, (size_t)a->cap * sizeof(frag), (size_t)nc * sizeof(frag), 0);
        if (!nv) return fl_set_error(FL_ERR_NOMEM, "tokenizer: out of memory splitting special tokens");
        a->v = nv;
        a->cap = nc;
    }
    a->v[a->n++] = (frag){off, len, tok};
    return FL_OK;
}

static void frag_free(fragvec *a) {
    if (a->v) fl_free(FL_MEM_SCRATCH, a->v, (size_t)a->cap * sizeof(frag));
    a->v = NULL;
    a->n = a->cap = 0;
}

static bool is_space_byte(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

/* Split the text around special tokens, token by token in the order of t->special (longest
 * text first); every occurrence inside a raw fragment is cut out, leftmost first.  With
 * parse_special=false, control and unknown tokens are left in the text (user-defined ones are
 * still cut out, as llama.cpp does). */
static bool special_active(const fl_tok_entry *e, bool parse_special) {
    return parse_special || !(e->attr & (FL_TATTR_CONTROL | FL_TATTR_UNKNOWN));
}

/* One pass over the text: mark (in seen, a bitmap over ids) the vocabulary id of every
 * special-token text that occurs somewhere, using the two-byte prefix filter and a hash
 * lookup per distinct special length at the positions that pass it. */
static void mark_specials(const fl_tokenizer *t, const char *text, int64_t len, bool parse_special, uint64_t *seen) {
    const unsigned char *u = (const unsigned char *)text;
    for (int64_t i = 0; i < len; i++) {
        bool hit1 = (t->sp_prefix1[u[i] >> 6] >> (u[i] & 63)) & 1;
        bool hit2 = false;
        if (i + 1 < len) {
            unsigned b = (unsigned)u[i] << 8 | u[i + 1];
            hit2 = (t->sp_prefix2[b >> 6] >> (b & 63)) & 1;
        }
        if (!hit1 && !hit2) continue;
        for (int32_t k = 0; k < t->n_sp_lens; k++) {
            int64_t l = t->sp_lens[k];
            if (l > len - i || (l == 1 && !hit1) || (l > 1 && !hit2)) continue;
            int32_t id = fl_tok_find(t, text + i, (size_t)l);
            if (id >= 0 && (t->tokens[id].attr & (FL_TATTR_CONTROL | FL_TATTR_USER_DEFINED | FL_TATTR_UNKNOWN)) &&
                special_active(&t->tokens[id], parse_special))
                seen[id >> 6] |= 1ull << (id & 63);
        }
    }
}

static fl_status partition(const fl_tokenizer *t, const char *text, int64_t len, bool parse_special, fragvec *out) {
    fragvec cur = {0}, nxt = {0};
    fl_status st = frag_push(&cur, 0, len, -1);
    if (st || t->n_special == 0) goto finish;
    const size_t seen_size = ((size_t)t->n_vocab + 63) / 64 * sizeof(uint64_t);
    uint64_t *seen = fl_calloc(FL_MEM_SCRATCH, 1, seen_size);
    if (!seen) {
        st = fl_set_error(FL_ERR_NOMEM, "tokenizer: out of memory");
        goto finish;
    }
    mark_specials(t, text, len, parse_special, seen);
    for (int32_t k = 0; k < t->n_special && !st; k++) {
        const int32_t id = t->special[k];
        const fl_tok_entry *e = &t->tokens[id];
        if (!special_active(e, parse_special)) continue;
        const char *tt = t->text + e->off;
        const int32_t canon = fl_tok_find(t, tt, e->len); /* the id its text maps to */
        if (canon < 0 || !((seen[canon >> 6] >> (canon & 63)) & 1)) continue; /* not in the text */
        bool any = false;
        for (int64_t f = 0; f < cur.n && !any; f++)
            if (cur.v[f].tok < 0 && memmem(text + cur.v[f].off, (size_t)cur.v[f].len, tt, e->len)) any = true;
        if (!any) continue;
        nxt.n = 0;
        for (int64_t f = 0; f < cur.n && !st; f++) {
            frag fr = cur.v[f];
            if (fr.tok >= 0) { st = frag_push(&nxt, fr.off, fr.len, fr.tok); continue; }
            int64_t off = fr.off, left = fr.len;
            while (left > 0 && !st) {
                const char *m = memmem(text + off, (size_t)left, tt, e->len);
                if (!m) { st = frag_push(&nxt, off, left, -1); break; }
                int64_t pos = m - text, llen = pos - off;
                if (e->attr & FL_TATTR_LSTRIP)
                    while (llen > 0 && is_space_byte(text[off + llen - 1])) llen--;
                if (llen > 0 && (st = frag_push(&nxt, off, llen, -1))) break;
                if ((st = frag_push(&nxt, pos, e->len, id))) break;
                int64_t roff = pos + e->len, rlen = off + left - roff;
                if (e->attr & FL_TATTR_RSTRIP)
                    while (rlen > 0 && is_space_byte(text[roff])) roff++, rlen--;
                off = roff;
                left = rlen;
            }
        }
        fragvec tmp = cur;
        cur = nxt;
        nxt = tmp;
    }
    fl_free(FL_MEM_SCRATCH, seen, seen_size);
finish:
    frag_free(&nxt);
    if (st) {
        frag_free(&cur);
        return st;
    }
    *out = cur;
    return FL_OK;
}

fl_status fl_tokenize(const fl_tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                      int32_t *out, int64_t cap, int64_t *n_out) {
    *n_out = 0;
    if (!text && len) return fl_set_error(FL_ERR_INVALID, "fl_tokenize: NULL text with length %zu", len);
    if (len > (size_t)INT64_MAX / 8) return fl_set_error(FL_ERR_RANGE, "fl_tokenize: text of %zu bytes is too long", len);
    int64_t bad = fl_utf8_invalid_at(text, len);
    if (bad >= 0)
        return fl_set_error(FL_ERR_INVALID, "fl_tokenize: invalid UTF-8 at byte offset %lld (byte 0x%02x)", (long long)bad,
                            (unsigned)(unsigned char)text[bad]);
    fl_idvec ids = {0};
    fragvec frags = {0};
    fl_status st = FL_OK;
    if (len > 0 && (st = partition(t, text, (int64_t)len, parse_special, &frags))) return st;
    if (add_special && t->add_bos && t->bos >= 0) st = fl_idvec_push(&ids, t->bos);
    bool prev_special = true; /* SPM: the text start counts as "after a special token" */
    for (int64_t f = 0; f < frags.n && !st; f++) {
        const frag *fr = &frags.v[f];
        if (fr->tok >= 0) {
            st = fl_idvec_push(&ids, fr->tok);
            prev_special = true;
        } else if (t->kind == FL_TOK_SPM) {
            st = fl_spm_tokenize(t, text + fr->off, (size_t)fr->len, t->add_space_prefix && prev_special, &ids);
            prev_special = false;
        } else {
            st = fl_bpe_tokenize(t, text + fr->off, (size_t)fr->len, &ids);
        }
    }
    if (!st && add_special && t->add_eos && t->eos >= 0) st = fl_idvec_push(&ids, t->eos);
    if (!st) {
        int64_t m = ids.n < cap ? ids.n : cap;
        if (m > 0) memcpy(out, ids.v, (size_t)m * sizeof(int32_t));
        *n_out = ids.n;
    }
    frag_free(&frags);
    fl_idvec_free(&ids);
    return st;
}

/* ------------------------------------------------------------------------------------------ */
/* pieces                                                                                      */

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* Bytes of token id's piece written to buf (at most cap), after skipping up to `lstrip`
 * leading spaces; returns the full length of the piece (which may exceed cap), 0 for pieces
 * that render as nothing. */
static int64_t piece(const fl_tokenizer *t, int32_t id, bool render_special, int lstrip, char *buf, int64_t cap) {
    const fl_tok_entry *e = &t->tokens[id];
    const char *s = t->text + e->off;
    size_t n = e->len;
    char tmp[4];
    int64_t len = 0;
    if (!render_special && (e->attr & (FL_TATTR_UNKNOWN | FL_TATTR_CONTROL))) return 0;
    if (e->attr & (FL_TATTR_UNKNOWN | FL_TATTR_CONTROL | FL_TATTR_USER_DEFINED)) {
        /* verbatim */
    } else if (t->kind == FL_TOK_SPM && (e->attr & FL_TATTR_NORMAL)) {
        /* "▁" (U+2581) -> ' ' */
        int64_t k = 0;
        for (size_t i = 0; i < n;) {
            if (i + 3 <= n && (unsigned char)s[i] == 0xe2 && (unsigned char)s[i + 1] == 0x96 && (unsigned char)s[i + 2] == 0x81) {
                if (lstrip > 0 && k == 0) { lstrip--; i += 3; continue; }
                if (k < cap) buf[k] = ' ';
                k++;
                i += 3;
            } else {
                if (k < cap) buf[k] = s[i];
                k++;
                i++;
                lstrip = 0;
            }
        }
        return k;
    } else if (t->kind == FL_TOK_SPM && (e->attr & FL_TATTR_BYTE)) {
        int hi = n == 6 ? hexval(s[3]) : -1, lo = n == 6 ? hexval(s[4]) : -1;
        tmp[0] = hi >= 0 && lo >= 0 ? (char)(hi << 4 | lo) : s[0]; /* "<0xXX>" */
        s = tmp;
        n = 1;
    } else if (t->kind == FL_TOK_BPE && (e->attr & FL_TATTR_NORMAL)) {
        /* decode into buf, then strip */
        len = fl_bpe_decode_text(s, n, buf, cap);
        int64_t skip = 0;
        while (skip < lstrip && skip < len && skip < cap && buf[skip] == ' ') skip++;
        if (skip) {
            int64_t w = len < cap ? len : cap;
            memmove(buf, buf + skip, (size_t)(w - skip));
        }
        return len - skip;
    } else {
        return 0; /* unused / undefined tokens render as nothing */
    }
    while (lstrip > 0 && n > 0 && *s == ' ') s++, n--, lstrip--;
    if (cap > 0) memcpy(buf, s, (size_t)((int64_t)n < cap ? (int64_t)n : cap));
    return (int64_t)n;
}

int32_t fl_token_to_piece(const fl_tokenizer *t, int32_t id, char *buf, int32_t cap, bool render_special) {
    if (id < 0 || id >= t->n_vocab) return -1;
    if (cap <= 0) return 0;
    int64_t n = piece(t, id, render_special, 0, buf, cap - 1);
    if (n > cap - 1) n = cap - 1;
    buf[n] = 0;
    return (int32_t)n;
}

int32_t fl_tokenizer_max_piece(const fl_tokenizer *t) {
    uint32_t m = 1;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->tokens[i].len > m) m = t->tokens[i].len;
    return (int32_t)m; /* a piece is never longer than its token text */
}

/* llama.cpp's clean-up of tokenization spaces (BPE vocabs with clean_spaces): drop the space
 * before ? ! . , ; turn " ' " into "'"; join " 's", " 'm", " 're", " 've". In place. */
static int64_t clean_spaces(char *s, int64_t n) {
    int64_t w = n ? 1 : 0;
    for (int64_t i = 1; i < n; i++) {
        char x = s[i];
        if (s[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) w--;
        s[w++] = x;
    }
    n = w;
    w = n ? 1 : 0;
    for (int64_t i = 1; i < n; i++) {
        char x = s[i];
        if (x == '\'' && i + 1 < n && s[i - 1] == ' ' && s[i + 1] == ' ') {
            w--;
            s[++i] = 0;
        }
        s[w++] = x;
    }
    n = w;
    w = n ? 1 : 0;
    for (int64_t i = 1; i < n; i++) {
        char x = s[i];
        if (s[i - 1] == ' ' && x == '\'' && i + 1 < n) {
            char x1 = s[i + 1];
            if (x1 == 's' || x1 == 'm') w--;
            else if (i + 2 < n && ((x1 == 'r' && s[i + 2] == 'e') || (x1 == 'v' && s[i + 2] == 'e'))) w--;
        }
        s[w++] = x;
    }
    return w;
}

int64_t fl_detokenize(const fl_tokenizer *t, const int32_t *ids, int64_t n, char *buf, int64_t cap,
                      bool remove_leading_space, bool render_special) {
    int64_t total = 0;
    /* SPM: strip the one space the tokenizer prefixed to the first text token (a leading BOS
     * is passed over: it renders as usual and the token after it loses its space). */
    bool strip = remove_leading_space && t->add_space_prefix;
    for (int64_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_vocab) {
            fl_set_error(FL_ERR_INVALID, "fl_detokenize: token id %d out of range [0, %d)", id, t->n_vocab);
            return -1;
        }
        const bool lead_bos = i == 0 && id == t->bos;
        int64_t room = cap - total > 0 ? cap - total : 0;
        int64_t k = piece(t, id, render_special, strip && !lead_bos ? 1 : 0, buf + (room ? total : 0), room);
        if (!lead_bos) strip = false;
        total += k;
    }
    if (total >= cap) {
        fl_set_error(FL_ERR_RANGE, "fl_detokenize: %lld bytes do not fit in %lld", (long long)total + 1, (long long)cap);
        return -1;
    }
    if (t->clean_spaces) total = clean_spaces(buf, total);
    buf[total] = 0;
    return total;
}

bool fl_gguf_vocab_equal(const fl_gguf *a, const fl_gguf *b) {
    const fl_gguf_kv *ta = fl_gguf_find(a, "tokenizer.ggml.tokens"), *tb = fl_gguf_find(b, "tokenizer.ggml.tokens");
    if (!ta || !tb || ta->value.type != FL_GGUF_ARRAY || tb->value.type != FL_GGUF_ARRAY || ta->value.v.arr.n != tb->value.v.arr.n) return false;
    for (int64_t i = 0; i < (int64_t)ta->value.v.arr.n; i++) {
        const fl_gguf_str x = ta->value.v.arr.items[i].v.str, y = tb->value.v.arr.items[i].v.str;
        if (x.len != y.len || memcmp(x.data, y.data, (size_t)x.len)) return false;
    }
    return true;
}
