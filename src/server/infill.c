/* llama.cpp's /infill: a fill-in-the-middle request's prompt, as token ids (see server_int.h). */
#include "server/server_int.h"

#include "core/alloc.h"
#include "core/status.h"

#include <cjson/cJSON.h>
#include <string.h>

typedef struct ivec {
    int32_t *v;
    int64_t n, cap;
} ivec;

static fl_status ivec_reserve(ivec *a, int64_t n) {
    if (n <= a->cap) return FL_OK;
    int64_t cap = a->cap ? a->cap : 64;
    while (cap < n) cap *= 2;
    int32_t *v = fl_realloc(FL_MEM_NET, a->v, (size_t)a->cap * sizeof *v, (size_t)cap * sizeof *v, 0);
    if (!v) return FL_ERR_NOMEM;
    a->v = v;
    a->cap = cap;
    return FL_OK;
}

static fl_status ivec_push(ivec *a, int32_t id) {
    fl_status st = ivec_reserve(a, a->n + 1);
    if (st == FL_OK) a->v[a->n++] = id;
    return st;
}

/* Append b's ids [from, from + n). */
static fl_status ivec_append(ivec *a, const ivec *b, int64_t from, int64_t n) {
    fl_status st = ivec_reserve(a, a->n + n);
    if (st != FL_OK) return st;
    if (n) memcpy(a->v + a->n, b->v + from, (size_t)n * sizeof *b->v);
    a->n += n;
    return FL_OK;
}

static void ivec_free(ivec *a) {
    fl_free(FL_MEM_NET, a->v, (size_t)a->cap * sizeof *a->v);
    memset(a, 0, sizeof *a);
}

/* Append text's tokens (no BOS; special-token texts as tokens only with parse_special). */
static fl_status add_text(fl_engine *e, ivec *a, const char *text, size_t len, bool parse_special) {
    fl_status st = ivec_reserve(a, a->n + (int64_t)len + 8); /* (a token covers at least a byte) */
    if (st != FL_OK) return st;
    int64_t n = 0;
    st = fl_engine_tokenize(e, text, len, parse_special ? FL_TOKENIZE_PARSE_SPECIAL : 0, a->v + a->n, a->cap - a->n, &n);
    if (st == FL_OK && n > a->cap - a->n) st = fl_set_error(FL_ERR_INTERNAL, "infill: more tokens than bytes");
    if (st == FL_OK) a->n += n;
    return st;
}

/* llama.cpp's tokenize_mixed: a string, or an array of strings and token ids. */
static fl_status add_mixed(fl_engine *e, ivec *a, const cJSON *v, const char *name, const char **err) {
    if (!v || cJSON_IsNull(v)) return FL_OK;
    if (cJSON_IsString(v)) return add_text(e, a, v->valuestring, strlen(v->valuestring), false);
    if (!cJSON_IsArray(v)) goto bad;
    const cJSON *x;
    const int32_t nv = fl_engine_n_vocab(e);
    cJSON_ArrayForEach(x, v) {
        fl_status st;
        if (cJSON_IsString(x)) st = add_text(e, a, x->valuestring, strlen(x->valuestring), false);
        else if (cJSON_IsNumber(x) && x->valuedouble >= 0 && x->valuedouble < nv && x->valuedouble == (double)(int32_t)x->valuedouble)
            st = ivec_push(a, (int32_t)x->valuedouble);
        else goto bad;
        if (st != FL_OK) return st;
    }
    return FL_OK;
bad:
    *err = !strcmp(name, "input_prefix") ? "'input_prefix' must be a string, or an array of strings and token ids"
                                         : "'input_suffix' must be a string, or an array of strings and token ids";
    return FL_ERR_INVALID;
}

fl_status srv_infill_prompt(fl_engine *e, const cJSON *j, int32_t n_batch, int64_t n_predict, bool spm, cJSON **ids_out,
                            const char **err) {
    *ids_out = NULL;
    *err = NULL;
    int32_t fim[FL_SPECIAL_FIM_SEP + 1];
    for (int w = 0; w <= FL_SPECIAL_FIM_SEP; w++) fim[w] = fl_engine_special_token(e, (fl_special_token)w);
    if (fim[FL_SPECIAL_FIM_PRE] < 0 || fim[FL_SPECIAL_FIM_SUF] < 0 || fim[FL_SPECIAL_FIM_MID] < 0) {
        *err = "infill is not supported by this model: its vocabulary has no fill-in-the-middle prefix, suffix and middle tokens";
        return FL_ERR_UNSUPPORTED;
    }
    const cJSON *extra = cJSON_GetObjectItemCaseSensitive(j, "input_extra"), *prompt = cJSON_GetObjectItemCaseSensitive(j, "prompt");
    if (extra && !cJSON_IsNull(extra) && !cJSON_IsArray(extra)) {
        *err = "'input_extra' must be an array of {\"filename\": string, \"text\": string}";
        return FL_ERR_INVALID;
    }
    if (prompt && !cJSON_IsNull(prompt) && !cJSON_IsString(prompt)) {
        *err = "/infill: 'prompt' must be a string (the text the middle starts with)";
        return FL_ERR_INVALID;
    }
    ivec pre = {0}, suf = {0}, pr = {0}, ext = {0}, out = {0};
    fl_status st = add_mixed(e, &pre, cJSON_GetObjectItemCaseSensitive(j, "input_prefix"), "input_prefix", err);
    if (!st) st = add_mixed(e, &suf, cJSON_GetObjectItemCaseSensitive(j, "input_suffix"), "input_suffix", err);
    if (!st && cJSON_IsString(prompt)) st = add_text(e, &pr, prompt->valuestring, strlen(prompt->valuestring), true);
    /* the repository-level pattern (Qwen2.5-Coder's): [REP]myproject\n, each extra chunk as
     * [SEP]filename\n + its text, then [SEP]filename\n for the file being edited; a vocabulary
     * without the separator gets the chunks after a plain "--- snippet ---" line */
    const int32_t rep = fim[FL_SPECIAL_FIM_REP], sep = fim[FL_SPECIAL_FIM_SEP];
    if (!st && rep >= 0 && !(st = ivec_push(&ext, rep))) st = add_text(e, &ext, "myproject\n", 10, false);
    const cJSON *ch, *chunks = cJSON_IsArray(extra) ? extra : NULL;
    cJSON_ArrayForEach(ch, chunks) {
        if (st) break;
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(ch, "text"), *fname = cJSON_GetObjectItemCaseSensitive(ch, "filename");
        if (!cJSON_IsObject(ch) || !cJSON_IsString(text) || (fname && !cJSON_IsNull(fname) && !cJSON_IsString(fname))) {
            *err = "each 'input_extra' chunk must be {\"filename\": string, \"text\": string}";
            st = FL_ERR_INVALID;
            break;
        }
        if (sep >= 0) {
            const char *f = cJSON_IsString(fname) ? fname->valuestring : "tmp";
            if (!(st = ivec_push(&ext, sep)) && !(st = add_text(e, &ext, f, strlen(f), false))) st = add_text(e, &ext, "\n", 1, false);
        } else {
            st = add_text(e, &ext, "\n\n--- snippet ---\n\n", 19, false);
        }
        if (!st) st = add_text(e, &ext, text->valuestring, strlen(text->valuestring), false);
    }
    if (!st && sep >= 0 && !(st = ivec_push(&ext, sep))) st = add_text(e, &ext, "filename\n", 9, false);
    if (st) goto done;
    /* what fits a batch: the prefix's end and the suffix's start, 3:1; the extra context's end in
     * what the context leaves besides the batch and twice the prediction */
    const int64_t n_ctx = fl_engine_n_ctx(e), quarter = n_batch / 4;
    const int64_t pre_take = pre.n < 3 * quarter ? pre.n : 3 * quarter;
    int64_t suf_take = quarter - (2 + pr.n);
    suf_take = suf_take < 0 ? 0 : suf_take < suf.n ? suf_take : suf.n;
    int64_t ext_take = n_ctx - n_batch - 2 * n_predict;
    ext_take = ext_take < 0 ? 0 : ext_take < ext.n ? ext_take : ext.n;
    /* [extra] [BOS] PRE prefix prompt SUF suffix MID, or with spm SUF suffix PRE prefix prompt MID */
    const int32_t bos = fl_engine_special_token(e, FL_SPECIAL_BOS);
    st = ivec_append(&out, &ext, ext.n - ext_take, ext_take);
    if (!st && fl_engine_special_token(e, FL_SPECIAL_ADD_BOS) && bos >= 0) st = ivec_push(&out, bos);
    for (int part = 0; part < 2 && !st; part++) {
        if ((part == 0) != spm) { /* the prefix part */
            if (!(st = ivec_push(&out, fim[FL_SPECIAL_FIM_PRE])) && !(st = ivec_append(&out, &pre, pre.n - pre_take, pre_take)))
                st = ivec_append(&out, &pr, 0, pr.n);
        } else if (!(st = ivec_push(&out, fim[FL_SPECIAL_FIM_SUF]))) {
            st = ivec_append(&out, &suf, 0, suf_take);
        }
    }
    if (!st) st = ivec_push(&out, fim[FL_SPECIAL_FIM_MID]);
    if (!st) {
        cJSON *a = cJSON_CreateArray();
        for (int64_t i = 0; a && i < out.n; i++) {
            cJSON *x = cJSON_CreateNumber(out.v[i]);
            if (!srv_push(a, x)) { /* (it frees x) */
                cJSON_Delete(a);
                a = NULL;
            }
        }
        if (!a) st = FL_ERR_NOMEM;
        *ids_out = a;
    }
done:
    if (st == FL_ERR_NOMEM && !*err) *err = "out of memory";
    else if (st && !*err) *err = fl_last_error();
    ivec_free(&pre);
    ivec_free(&suf);
    ivec_free(&pr);
    ivec_free(&ext);
    ivec_free(&out);
    return st;
}
