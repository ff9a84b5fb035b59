/* Token documents, packing / bucketing batchers, evaluation, unigram baseline (see data.h). */
#include "train/data.h"

#include "core/alloc.h"
#include "core/status.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- documents */

static fl_status data_alloc(fl_train_data *d, int64_t n_ids, int64_t n_docs) {
    /* the counts first: fl_train_data_free frees each table by its count */
    d->n_ids = n_ids;
    d->n_docs = n_docs;
    d->ids = fl_alloc(FL_MEM_MISC, (size_t)(n_ids > 0 ? n_ids : 1) * sizeof(int32_t), 64);
    d->doc_off = fl_alloc(FL_MEM_MISC, (size_t)(n_docs + 1) * sizeof(int64_t), 64);
    if (!d->ids || !d->doc_off) {
        fl_train_data_free(d);
        return FL_ERR_NOMEM;
    }
    return FL_OK;
}

void fl_train_data_free(fl_train_data *d) {
    if (!d) return;
    if (d->ids) fl_free(FL_MEM_MISC, d->ids, (size_t)(d->n_ids > 0 ? d->n_ids : 1) * sizeof(int32_t));
    if (d->doc_off) fl_free(FL_MEM_MISC, d->doc_off, (size_t)(d->n_docs + 1) * sizeof(int64_t));
    d->ids = NULL;
    d->doc_off = NULL;
    d->n_ids = d->n_docs = 0;
}

/* Next document [*b, *e) starting at *p: skips blank separators; returns false at the end. */
static bool next_doc(const char *t, size_t len, size_t *p, size_t *b, size_t *e) {
    size_t i = *p;
    while (i < len && (t[i] == '\n' || t[i] == '\r')) i++;
    if (i >= len) return false;
    *b = i;
    for (; i < len; i++) {
        if (t[i] != '\n') continue;
        size_t j = i + 1;
        if (j < len && t[j] == '\r') j++;
        if (j < len && t[j] == '\n') break; /* blank line */
    }
    size_t end = i;
    while (end > *b && (t[end - 1] == '\r' || t[end - 1] == '\n')) end--;
    *e = end;
    *p = i;
    return true;
}

fl_status fl_train_data_from_text(const fl_tokenizer *tok, const char *text, size_t len, fl_train_data *out) {
    return fl_train_data_from_text_ex(tok, text, len, false, out);
}

fl_status fl_train_data_from_text_ex(const fl_tokenizer *tok, const char *text, size_t len, bool one_doc,
                                     fl_train_data *out) {
    memset(out, 0, sizeof *out);
    out->bos = fl_tokenizer_bos(tok);
    out->eos = fl_tokenizer_eos(tok);
    if (out->bos < 0 || out->eos < 0)
        return fl_set_error(FL_ERR_UNSUPPORTED, "%s: the tokenizer needs BOS and EOS tokens", __func__);
    /* pass 1: count documents; one token per byte + 2 (more: grown below) */
    size_t p = 0, b, e;
    int64_t n_docs = 0;
    while (next_doc(text, len, &p, &b, &e)) n_docs++;
    if (one_doc && n_docs > 0) n_docs = 1;
    if (n_docs == 0) return fl_set_error(FL_ERR_INVALID, "%s: no text", __func__);
    int64_t cap = (int64_t)len + 2 * n_docs + 1;
    fl_status st = data_alloc(out, cap, n_docs);
    if (st) return st;
    p = 0;
    int64_t n = 0, d = 0;
    while (d < n_docs && next_doc(text, len, &p, &b, &e)) {
        if (one_doc) e = len; /* the whole text, blank lines included */
        out->doc_off[d++] = n;
        out->ids[n++] = out->bos;
        int64_t got;
        st = fl_tokenize(tok, text + b, e - b, false, false, out->ids + n, cap - n - 1, &got);
        if (st) {
            fl_add_error_context("document %lld", (long long)d);
            goto fail;
        }
        if (got > cap - n - 1) { /* more ids than bytes (SPM's "▁" as 3 byte tokens, say): grow, then once more */
            const int64_t want = n + got + 1 + (int64_t)(len - e) + 2 * (n_docs - d) + 1, ncap = want > 2 * cap ? want : 2 * cap;
            int32_t *ids = fl_realloc(FL_MEM_MISC, out->ids, (size_t)cap * sizeof(int32_t), (size_t)ncap * sizeof(int32_t), 64);
            if (!ids) {
                st = FL_ERR_NOMEM;
                goto fail;
            }
            out->ids = ids;
            out->n_ids = cap = ncap;
            if ((st = fl_tokenize(tok, text + b, e - b, false, false, out->ids + n, cap - n - 1, &got))) goto fail;
            if (got > cap - n - 1) {
                st = fl_set_error(FL_ERR_INTERNAL, "%s: the tokenizer asked for %lld ids, then for more", __func__, (long long)got);
                goto fail;
            }
        }
        n += got;
        out->ids[n++] = out->eos;
    }
    out->doc_off[d] = n;
    /* shrink to the real size */
    int32_t *ids = fl_realloc(FL_MEM_MISC, out->ids, (size_t)cap * sizeof(int32_t), (size_t)n * sizeof(int32_t), 64);
    if (ids) {
        out->ids = ids;
        out->n_ids = n;
    } else {
        out->n_ids = cap; /* keep the size we hold; trailing ids unused */
        fl_clear_error();
        st = fl_set_error(FL_ERR_NOMEM, "%s: realloc", __func__);
        goto fail;
    }
    return FL_OK;
fail:
    fl_train_data_free(out);
    return st;
}

fl_status fl_train_data_from_ids(const int32_t *const *docs, const int64_t *lens, int64_t n_docs, int32_t bos,
                                 int32_t eos, fl_train_data *out) {
    memset(out, 0, sizeof *out);
    int64_t n = 0;
    for (int64_t i = 0; i < n_docs; i++) n += lens[i];
    fl_status st = data_alloc(out, n, n_docs);
    if (st) return st;
    out->bos = bos;
    out->eos = eos;
    n = 0;
    for (int64_t i = 0; i < n_docs; i++) {
        out->doc_off[i] = n;
        memcpy(out->ids + n, docs[i], (size_t)lens[i] * sizeof(int32_t));
        n += lens[i];
    }
    out->doc_off[n_docs] = n;
    return FL_OK;
}

fl_status fl_train_data_split(fl_train_data *d, double frac, fl_train_data *held) {
    memset(held, 0, sizeof *held);
    if (d->n_docs < 2) return fl_set_error(FL_ERR_INVALID, "%s: need at least 2 documents to hold one out", __func__);
    int64_t nh = (int64_t)(frac * (double)d->n_docs);
    if (nh < 1) nh = 1;
    if (nh >= d->n_docs) nh = d->n_docs - 1;
    const int64_t first = d->n_docs - nh, id0 = d->doc_off[first], nid = d->n_ids - id0;
    fl_status st = data_alloc(held, nid, nh);
    if (st) return st;
    held->bos = d->bos;
    held->eos = d->eos;
    memcpy(held->ids, d->ids + id0, (size_t)nid * sizeof(int32_t));
    for (int64_t i = 0; i <= nh; i++) held->doc_off[i] = d->doc_off[first + i] - id0;
    /* shrink d */
    int32_t *ids = fl_realloc(FL_MEM_MISC, d->ids, (size_t)d->n_ids * sizeof(int32_t), (size_t)id0 * sizeof(int32_t), 64);
    int64_t *off = fl_realloc(FL_MEM_MISC, d->doc_off, (size_t)(d->n_docs + 1) * sizeof(int64_t),
                              (size_t)(first + 1) * sizeof(int64_t), 64);
    if (!ids || !off) { /* cannot happen when shrinking, but keep sizes consistent */
        if (ids) d->ids = ids, d->n_ids = id0;
        if (off) d->doc_off = off, d->n_docs = first;
        fl_train_data_free(held);
        return FL_ERR_NOMEM;
    }
    d->ids = ids;
    d->n_ids = id0;
    d->doc_off = off;
    d->n_docs = first;
    return FL_OK;
}

int64_t fl_train_data_n_scored(const fl_train_data *d) {
    int64_t n = 0;
    for (int64_t i = 0; i + 1 < d->n_ids; i++) n += d->ids[i + 1] != d->bos;
    return n;
}

/* ---------------------------------------------------------------- batches */

/* Append the packed row ids[p .. p+len] (len inputs; indices modulo n when wrapping) to the
 * batch being built in b (n tokens, ns sequences so far). */
static void append_row(fl_batcher *b, const fl_train_data *d, int64_t p, int64_t len, int64_t *n, int32_t *ns) {
    const int64_t N = d->n_ids;
    int32_t posi = 0;
    for (int64_t i = 0; i < len; i++) {
        const int32_t x = d->ids[(p + i) % N], y = d->ids[(p + i + 1) % N];
        if (i == 0 || x == d->bos) {
            b->cu[(*ns)++] = (int32_t)*n;
            posi = 0;
        }
        b->tok[*n] = x;
        b->tgt[*n] = y == d->bos ? -1 : y;
        b->posv[*n] = posi++;
        (*n)++;
    }
}

static int cmp_len(const void *a, const void *b, void *ctx) {
    const int64_t *off = ctx, x = *(const int64_t *)a, y = *(const int64_t *)b;
    const int64_t lx = off[x + 1] - off[x], ly = off[y + 1] - off[y];
    if (lx != ly) return lx < ly ? -1 : 1;
    return (x > y) - (x < y);
}

static void shuffle(int64_t *v, int64_t n, fl_rng *r) {
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(fl_rng_u64(r) % (uint64_t)(i + 1)), t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

fl_status fl_batcher_init(fl_batcher *b, const fl_train_data *d, int mode, int64_t ctx, int64_t batch, uint64_t seed) {
    memset(b, 0, sizeof *b);
    if (ctx < 1 || batch < 1 || d->n_ids < 2 || (mode != FL_BATCH_PACK && mode != FL_BATCH_BUCKET))
        return fl_set_error(FL_ERR_INVALID, "%s: bad ctx %lld / batch %lld / data of %lld ids", __func__,
                            (long long)ctx, (long long)batch, (long long)d->n_ids);
    b->d = d;
    b->mode = mode;
    b->ctx = ctx;
    b->batch = batch;
    b->rng.s = seed;
    const int64_t nt = ctx * batch;
    b->cap_seq = nt + 1;
    b->tok = fl_alloc(FL_MEM_MISC, (size_t)nt * 4, 64);
    b->tgt = fl_alloc(FL_MEM_MISC, (size_t)nt * 4, 64);
    b->posv = fl_alloc(FL_MEM_MISC, (size_t)nt * 4, 64);
    b->cu = fl_alloc(FL_MEM_MISC, (size_t)b->cap_seq * 4, 64);
    if (!b->tok || !b->tgt || !b->posv || !b->cu) goto nomem;
    if (mode == FL_BATCH_BUCKET) {
        const int64_t nd = d->n_docs;
        b->order = fl_alloc(FL_MEM_MISC, (size_t)nd * 8, 64);
        b->bstart = fl_alloc(FL_MEM_MISC, (size_t)(nd + 1) * 8, 64);
        b->perm = fl_alloc(FL_MEM_MISC, (size_t)nd * 8, 64);
        if (!b->order || !b->bstart || !b->perm) goto nomem;
        for (int64_t i = 0; i < nd; i++) b->order[i] = i;
        qsort_r(b->order, (size_t)nd, sizeof(int64_t), cmp_len, d->doc_off);
        int64_t nbt = 0, tokens = 0, rows = 0;
        b->bstart[0] = 0;
        for (int64_t i = 0; i < nd; i++) {
            int64_t l = d->doc_off[b->order[i] + 1] - d->doc_off[b->order[i]] - 1; /* inputs */
            if (l > ctx) l = ctx;
            if (l < 1) l = 1;
            if (rows > 0 && (tokens + l > nt || rows + 1 > batch)) {
                b->bstart[++nbt] = i;
                tokens = rows = 0;
            }
            tokens += l;
            rows++;
        }
        b->bstart[++nbt] = nd;
        b->n_batches = nbt;
        for (int64_t i = 0; i < nbt; i++) b->perm[i] = i;
        shuffle(b->perm, nbt, &b->rng);
    }
    return FL_OK;
nomem:
    fl_batcher_deinit(b);
    return fl_set_error(FL_ERR_NOMEM, "%s: no memory for batch buffers", __func__);
}

void fl_batcher_deinit(fl_batcher *b) {
    const size_t nt = (size_t)(b->ctx * b->batch);
    fl_free(FL_MEM_MISC, b->tok, nt * 4);
    fl_free(FL_MEM_MISC, b->tgt, nt * 4);
    fl_free(FL_MEM_MISC, b->posv, nt * 4);
    fl_free(FL_MEM_MISC, b->cu, (size_t)b->cap_seq * 4);
    if (b->d) {
        const size_t nd = (size_t)b->d->n_docs;
        fl_free(FL_MEM_MISC, b->order, nd * 8);
        fl_free(FL_MEM_MISC, b->bstart, (nd + 1) * 8);
        fl_free(FL_MEM_MISC, b->perm, nd * 8);
    }
    memset(b, 0, sizeof *b);
}

void fl_batcher_next(fl_batcher *b, fl_train_batch *out) {
    const fl_train_data *d = b->d;
    int64_t n = 0;
    int32_t ns = 0;
    if (b->mode == FL_BATCH_PACK) {
        for (int64_t r = 0; r < b->batch; r++) {
            append_row(b, d, b->pos, b->ctx, &n, &ns);
            b->pos += b->ctx;
            if (b->pos >= d->n_ids) {
                b->pos -= d->n_ids;
                b->epoch++;
            }
        }
    } else {
        const int64_t bi = b->perm[b->pos];
        for (int64_t i = b->bstart[bi]; i < b->bstart[bi + 1]; i++) {
            const int64_t doc = b->order[i], off = d->doc_off[doc];
            int64_t l = d->doc_off[doc + 1] - off - 1;
            if (l > b->ctx) l = b->ctx;
            if (l < 1) l = 1;
            append_row(b, d, off, l, &n, &ns);
        }
        if (++b->pos >= b->n_batches) {
            b->pos = 0;
            b->epoch++;
            shuffle(b->perm, b->n_batches, &b->rng);
        }
    }
    b->cu[ns] = (int32_t)n;
    *out = (fl_train_batch){b->tok, b->tgt, b->posv, b->cu, n, ns};
}

int64_t fl_batch_n_scored(const fl_train_batch *b) {
    int64_t c = 0;
    for (int64_t i = 0; i < b->n_tokens; i++) c += b->targets[i] >= 0;
    return c;
}

/* ---------------------------------------------------------------- evaluation */

fl_status fl_train_eval(fl_train_model *m, const fl_train_data *d, int64_t ctx, int64_t batch, int64_t max_tokens,
                        double *mean_loss, int64_t *n_scored) {
    fl_batcher b;
    fl_status st = fl_batcher_init(&b, d, FL_BATCH_PACK, ctx, batch, 0);
    if (st) return st;
    double sum = 0.0;
    int64_t cnt = 0, p = 0, limit = d->n_ids - 1;
    if (max_tokens > 0 && max_tokens < limit) limit = max_tokens;
    while (p < limit && !st) {
        int64_t n = 0;
        int32_t ns = 0;
        for (int64_t r = 0; r < batch && p < limit; r++) {
            const int64_t len = limit - p < ctx ? limit - p : ctx;
            append_row(&b, d, p, len, &n, &ns);
            p += len;
        }
        b.cu[ns] = (int32_t)n;
        fl_train_batch fb = {b.tok, b.tgt, b.posv, b.cu, n, ns};
        double l;
        int64_t c;
        st = fl_train_model_forward(m, &fb, &l, &c);
        sum += l;
        cnt += c;
    }
    fl_batcher_deinit(&b);
    if (st) return st;
    *mean_loss = cnt ? sum / (double)cnt : 0.0;
    if (n_scored) *n_scored = cnt;
    return FL_OK;
}

double fl_train_unigram_loss(const fl_train_data *train, const fl_train_data *held, int32_t n_vocab, int64_t max_tokens) {
    double *cnt = fl_calloc(FL_MEM_MISC, (size_t)n_vocab, sizeof(double));
    if (!cnt) return NAN;
    double total = 0.0;
    for (int64_t i = 0; i + 1 < train->n_ids; i++) {
        const int32_t y = train->ids[i + 1];
        if (y != train->bos && y >= 0 && y < n_vocab) {
            cnt[y] += 1.0;
            total += 1.0;
        }
    }
    double nll = 0.0;
    int64_t n = 0;
    int64_t limit = held->n_ids - 1;
    if (max_tokens > 0 && max_tokens < limit) limit = max_tokens;
    for (int64_t i = 0; i < limit; i++) {
        const int32_t y = held->ids[i + 1];
        if (y == held->bos || y < 0 || y >= n_vocab) continue;
        nll -= log((cnt[y] + 1.0) / (total + n_vocab));
        n++;
    }
    fl_free(FL_MEM_MISC, cnt, (size_t)n_vocab * sizeof(double));
    return n ? nll / (double)n : NAN;
}
