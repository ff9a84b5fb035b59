/* Tensor-parallel load and forward (see tp.h). */
#include "dist/tp.h"

#include "core/alloc.h"
#include "core/status.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "model/llama_impl.h"

#include <string.h>

typedef struct owned_block {
    void *p;
    size_t bytes;
} owned_block;

struct fl_tp_model {
    fl_model *m;
    fl_comm *comm;
    fl_tp_shard sh;
    owned_block *blocks; /* FL_MEM_MISC, cap entries */
    int32_t n_blocks, cap;
    size_t weight_bytes;
    int32_t n_dequant;
    fl_status comm_st; /* first allreduce failure of the current forward */
    /* vocab parallel: rows [v0, v0 + nv) of token_embd / output; vmax = ceil(n_vocab / N) */
    int32_t v0, nv, vmax;
    float *lbuf;       /* FL_MEM_ACT [R][vmax] local logits */
    float *gbuf;       /* FL_MEM_COMM [N][R][vmax] gathered logits */
    int32_t buf_rows;
};

fl_status fl_tp_shard_compute(const fl_hparams *hp, int32_t ff_block, int32_t rank, int32_t size, fl_tp_shard *out) {
    memset(out, 0, sizeof *out);
    if (size < 1 || rank < 0 || rank >= size || ff_block < 1)
        return fl_set_error(FL_ERR_INVALID, "tp: bad rank %d of %d (ffn unit %d)", rank, size, ff_block);
    const int32_t H = hp->n_head, Hkv = hp->n_head_kv;
    if (H % size)
        return fl_set_error(FL_ERR_UNSUPPORTED, "--tp %d does not divide the %d attention heads", size, H);
    out->rank = rank;
    out->size = size;
    out->n_head = H / size;
    out->head0 = rank * out->n_head;
    if (Hkv % size == 0) {
        out->n_head_kv = Hkv / size;
        out->kv0 = rank * out->n_head_kv;
    } else if (size % Hkv == 0) {
        out->n_head_kv = 1; /* replicated on size / Hkv ranks */
        out->kv0 = out->head0 / (H / Hkv);
    } else {
        return fl_set_error(FL_ERR_UNSUPPORTED, "--tp %d and the %d kv heads: neither divides the other", size, Hkv);
    }
    if (hp->n_ff % ff_block) ff_block = 1;
    const int64_t units = hp->n_ff / ff_block;
    if (units < size)
        return fl_set_error(FL_ERR_UNSUPPORTED, "tp: n_ff %d has %lld units of %d for %d ranks", hp->n_ff,
                            (long long)units, ff_block, size);
    out->ff0 = (int32_t)(rank * units / size * ff_block);
    out->n_ff = (int32_t)((rank + 1) * units / size * ff_block) - out->ff0;
    return FL_OK;
}

static void *own(fl_tp_model *t, size_t bytes) {
    FL_ASSERT(t->n_blocks < t->cap);
    void *p = fl_alloc(FL_MEM_WEIGHTS, bytes ? bytes : 1, 64);
    if (!p) return NULL;
    t->blocks[t->n_blocks++] = (owned_block){p, bytes ? bytes : 1};
    t->weight_bytes += bytes;
    return p;
}

/* W <- rows [r0, r0 + nr) of W, copied. */
static fl_status slice_rows(fl_tp_model *t, fl_tensor *W, int64_t r0, int64_t nr) {
    const size_t rs = W->nb[1];
    void *p = own(t, rs * (size_t)nr);
    if (!p) return FL_ERR_NOMEM;
    memcpy(p, (const char *)W->data + rs * (size_t)r0, rs * (size_t)nr);
    const int64_t ne[2] = {W->ne[0], nr};
    FL_ASSERT(fl_tensor_init(W, W->type, 2, ne, p));
    return FL_OK;
}

/* W <- columns [k0, k0 + nk) of every row, copied (block aligned) or dequantized to f32. */
static fl_status slice_cols(fl_tp_model *t, fl_tensor *W, int64_t k0, int64_t nk) {
    const int64_t K = W->ne[0], N = W->ne[1];
    const int32_t bs = fl_type_get(W->type)->blck_size;
    const size_t rs = W->nb[1];
    if (k0 % bs == 0 && nk % bs == 0) {
        const size_t off = k0 ? fl_type_row_size(W->type, k0) : 0, nrs = fl_type_row_size(W->type, nk);
        char *p = own(t, nrs * (size_t)N);
        if (!p) return FL_ERR_NOMEM;
        for (int64_t n = 0; n < N; n++) memcpy(p + nrs * (size_t)n, (const char *)W->data + rs * (size_t)n + off, nrs);
        const int64_t ne[2] = {nk, N};
        FL_ASSERT(fl_tensor_init(W, W->type, 2, ne, p));
        return FL_OK;
    }
    float *p = own(t, sizeof(float) * (size_t)(nk * N));
    float *row = fl_alloc(FL_MEM_SCRATCH, sizeof(float) * (size_t)K, 64);
    if (!p || !row) {
        fl_free(FL_MEM_SCRATCH, row, sizeof(float) * (size_t)K);
        return FL_ERR_NOMEM;
    }
    for (int64_t n = 0; n < N; n++) {
        fl_dequant_row(W->type, (const char *)W->data + rs * (size_t)n, row, K);
        memcpy(p + n * nk, row + k0, sizeof(float) * (size_t)nk);
    }
    fl_free(FL_MEM_SCRATCH, row, sizeof(float) * (size_t)K);
    const int64_t ne[2] = {nk, N};
    FL_ASSERT(fl_tensor_init(W, FL_TYPE_F32, 2, ne, p));
    t->n_dequant++;
    return FL_OK;
}

/* Replicated tensor: a private copy. */
static fl_status copy_whole(fl_tp_model *t, fl_tensor *W) {
    const size_t bytes = fl_tensor_nbytes(W);
    void *p = own(t, bytes);
    if (!p) return FL_ERR_NOMEM;
    memcpy(p, W->data, bytes);
    W->data = p;
    return FL_OK;
}

static void tp_allreduce(void *ud, float *x, int64_t n) {
    fl_tp_model *t = ud;
    if (t->comm_st) return;
    t->comm_st = fl_comm_allreduce_sum_f32(t->comm, x, n);
}

/* Vocab-parallel embedding: rows this rank holds, zeros elsewhere, summed over the ranks. */
static void tp_embed(void *ud, const int32_t *tokens, int64_t n, float *x) {
    fl_tp_model *t = ud;
    const fl_model *m = t->m;
    const int64_t E = m->hp.n_embd;
    for (int64_t i = 0; i < n; i++) {
        const int32_t id = tokens[i] - t->v0;
        if (id >= 0 && id < t->nv) fl_embed_forward(x + i * E, &m->tok_embd, &id, 1);
        else memset(x + i * E, 0, (size_t)E * sizeof(float));
    }
    tp_allreduce(t, x, n * E);
}

static fl_status shard(fl_tp_model *t) {
    fl_model *m = t->m;
    fl_hparams *hp = &m->hp;
    const int32_t size = fl_comm_size(t->comm), rank = fl_comm_rank(t->comm);
    int32_t ffb = 1;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const int32_t bs = fl_type_get(m->layers[il].w2.type)->blck_size;
        if (bs > ffb) ffb = bs;
    }
    if (hp->n_ff % ffb || hp->n_ff / ffb < size) ffb = 1; /* w2 slices will be dequantized */
    fl_status st = fl_tp_shard_compute(hp, ffb, rank, size, &t->sh);
    if (st) return st;
    const fl_tp_shard *s = &t->sh;
    const int64_t D = hp->head_dim;
    t->cap = 3 + 9 * hp->n_layer;
    t->blocks = fl_calloc(FL_MEM_MISC, (size_t)t->cap, sizeof *t->blocks);
    if (!t->blocks) return FL_ERR_NOMEM;
    t->vmax = (hp->n_vocab + size - 1) / size;
    t->v0 = rank * t->vmax;
    t->nv = hp->n_vocab - t->v0 < t->vmax ? hp->n_vocab - t->v0 : t->vmax;
    if (t->nv < 1) return fl_set_error(FL_ERR_UNSUPPORTED, "tp: %d ranks for a vocabulary of %d", size, hp->n_vocab);
    if ((st = slice_rows(t, &m->tok_embd, t->v0, t->nv)) || (st = copy_whole(t, &m->output_norm))) return st;
    if (hp->tied_output) m->output = m->tok_embd;
    else if ((st = slice_rows(t, &m->output, t->v0, t->nv))) return st;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        fl_layer *L = &m->layers[il];
        if ((st = copy_whole(t, &L->attn_norm)) || (st = copy_whole(t, &L->ffn_norm)) ||
            (st = slice_rows(t, &L->wq, s->head0 * D, s->n_head * D)) ||
            (st = slice_rows(t, &L->wk, s->kv0 * D, s->n_head_kv * D)) ||
            (st = slice_rows(t, &L->wv, s->kv0 * D, s->n_head_kv * D)) ||
            (st = slice_cols(t, &L->wo, s->head0 * D, s->n_head * D)) ||
            (st = slice_rows(t, &L->w1, s->ff0, s->n_ff)) || (st = slice_rows(t, &L->w3, s->ff0, s->n_ff)) ||
            (st = slice_cols(t, &L->w2, s->ff0, s->n_ff)))
            return st;
    }
    hp->n_head_local = s->n_head;
    hp->n_head_kv_local = s->n_head_kv;
    hp->n_ff_local = s->n_ff;
    return FL_OK;
}

fl_status fl_tp_load(const char *path, fl_comm *comm, fl_tp_model **out) {
    *out = NULL;
    fl_tp_model *t = fl_calloc(FL_MEM_MISC, 1, sizeof *t);
    if (!t) return FL_ERR_NOMEM;
    t->comm = comm;
    fl_model_params p = fl_model_default_params();
    if (fl_comm_size(comm) > 1) {
        p.allreduce = tp_allreduce;
        p.allreduce_ud = t;
        p.embed = tp_embed;
        p.embed_ud = t;
    }
    fl_status st = fl_model_load(path, &p, &t->m);
    if (!st) st = shard(t);
    if (st) {
        if (st == FL_ERR_NOMEM && !fl_last_error()[0]) fl_set_error(st, "tp: out of memory copying weight slices");
        fl_tp_free(t);
        return st;
    }
    *out = t;
    return FL_OK;
}

void fl_tp_free(fl_tp_model *t) {
    if (!t) return;
    if (t->buf_rows) {
        fl_free(FL_MEM_ACT, t->lbuf, (size_t)t->buf_rows * (size_t)t->vmax * sizeof(float));
        fl_free(FL_MEM_COMM, t->gbuf, (size_t)t->sh.size * (size_t)t->buf_rows * (size_t)t->vmax * sizeof(float));
    }
    fl_model_free(t->m);
    for (int32_t i = 0; i < t->n_blocks; i++) fl_free(FL_MEM_WEIGHTS, t->blocks[i].p, t->blocks[i].bytes);
    fl_free(FL_MEM_MISC, t->blocks, (size_t)t->cap * sizeof *t->blocks);
    fl_free(FL_MEM_MISC, t, sizeof *t);
}

fl_model *fl_tp_model_get(fl_tp_model *t) { return t->m; }
const fl_tp_shard *fl_tp_shard_get(const fl_tp_model *t) { return &t->sh; }
size_t fl_tp_weight_bytes(const fl_tp_model *t) { return t->weight_bytes; }
int32_t fl_tp_n_dequantized(const fl_tp_model *t) { return t->n_dequant; }

fl_status fl_tp_forward(fl_tp_model *t, const fl_batch *b, const fl_kv_iface *kv, void *kv_ctx, float *logits) {
    t->comm_st = FL_OK;
    const int32_t N = t->sh.size;
    if (N == 1) return fl_model_forward(t->m, b, kv, kv_ctx, logits);
    const int32_t R = fl_batch_n_logits(b), vmax = t->vmax, V = t->m->hp.n_vocab;
    if (logits && R > t->buf_rows) {
        const size_t lo = (size_t)t->buf_rows * (size_t)vmax * sizeof(float), ln = (size_t)R * (size_t)vmax * sizeof(float);
        float *l = fl_alloc(FL_MEM_ACT, ln, 64), *g = fl_alloc(FL_MEM_COMM, ln * (size_t)N, 64);
        if (!l || !g) {
            fl_free(FL_MEM_ACT, l, ln);
            fl_free(FL_MEM_COMM, g, ln * (size_t)N);
            return FL_ERR_NOMEM;
        }
        if (t->buf_rows) {
            fl_free(FL_MEM_ACT, t->lbuf, lo);
            fl_free(FL_MEM_COMM, t->gbuf, lo * (size_t)N);
        }
        t->lbuf = l;
        t->gbuf = g;
        t->buf_rows = R;
    }
    fl_status st = fl_model_forward(t->m, b, kv, kv_ctx, logits ? t->lbuf : NULL);
    if (st) return st;
    if (t->comm_st) return t->comm_st;
    if (!logits || R == 0) return FL_OK;
    /* local logits [R][nv] -> rows of vmax (backwards: in place), gather, reassemble [R][V] */
    for (int32_t r = R - 1; r >= 0; r--) {
        memmove(t->lbuf + (size_t)r * vmax, t->lbuf + (size_t)r * t->nv, (size_t)t->nv * sizeof(float));
        memset(t->lbuf + (size_t)r * vmax + t->nv, 0, (size_t)(vmax - t->nv) * sizeof(float));
    }
    const size_t bytes = (size_t)R * (size_t)vmax * sizeof(float);
    if ((st = fl_comm_allgather(t->comm, t->lbuf, t->gbuf, bytes))) return st;
    for (int32_t k = 0; k < N; k++) {
        const int32_t v0 = k * vmax, nv = V - v0 < vmax ? V - v0 : vmax;
        for (int32_t r = 0; r < R; r++)
            memcpy(logits + (size_t)r * V + v0, t->gbuf + ((size_t)k * R + r) * vmax, (size_t)nv * sizeof(float));
    }
    return FL_OK;
}
