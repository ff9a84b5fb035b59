/* Pipeline-parallel load and forward (see pp.h). */
#include "dist/pp.h"

#include "core/alloc.h"
#include "core/status.h"
#include "model/llama_impl.h"

#include <string.h>

struct fl_pp_model {
    fl_model *m;
    fl_comm *comm;
    int32_t rank, n, l0, l1;
    fl_layer *layers_full; /* restored before fl_model_free */
    int32_t n_layer_full;
    float *xbuf;           /* FL_MEM_COMM: residual stream received from the previous stage */
    size_t xbuf_bytes;
};

void fl_pp_stage_layers(int32_t n_layer, int32_t r, int32_t n, int32_t *l0, int32_t *l1) {
    const int32_t q = n_layer / n, rem = n_layer % n;
    *l0 = r * q + (r < rem ? r : rem);
    *l1 = *l0 + q + (r < rem ? 1 : 0);
}

/* Stages after the first: the "embedding" is the previous stage's output. */
static void pp_embed(void *ud, const int32_t *tokens, int64_t n, float *x) {
    const fl_pp_model *p = ud;
    (void)tokens;
    memcpy(x, p->xbuf, (size_t)n * (size_t)p->m->hp.n_embd * sizeof(float));
}

fl_status fl_pp_load(const char *path, fl_comm *comm, fl_pp_model **out) {
    *out = NULL;
    fl_pp_model *p = fl_calloc(FL_MEM_MISC, 1, sizeof *p);
    if (!p) return FL_ERR_NOMEM;
    p->comm = comm;
    p->rank = fl_comm_rank(comm);
    p->n = fl_comm_size(comm);
    fl_model_params mp = fl_model_default_params();
    if (p->rank > 0) {
        mp.embed = pp_embed;
        mp.embed_ud = p;
    }
    fl_status st = fl_model_load(path, &mp, &p->m);
    if (st) {
        fl_free(FL_MEM_MISC, p, sizeof *p);
        return st;
    }
    fl_model *m = p->m;
    if (p->n > m->hp.n_layer) {
        st = fl_set_error(FL_ERR_UNSUPPORTED, "--pp %d: more stages than the %d layers", p->n, m->hp.n_layer);
        fl_model_free(m);
        fl_free(FL_MEM_MISC, p, sizeof *p);
        return st;
    }
    fl_pp_stage_layers(m->hp.n_layer, p->rank, p->n, &p->l0, &p->l1);
    p->layers_full = m->layers;
    p->n_layer_full = m->hp.n_layer;
    m->layers += p->l0;
    m->hp.n_layer = p->l1 - p->l0;
    *out = p;
    return FL_OK;
}

void fl_pp_free(fl_pp_model *p) {
    if (!p) return;
    p->m->layers = p->layers_full;
    p->m->hp.n_layer = p->n_layer_full;
    fl_model_free(p->m);
    fl_free(FL_MEM_COMM, p->xbuf, p->xbuf_bytes);
    fl_free(FL_MEM_MISC, p, sizeof *p);
}

fl_model *fl_pp_model_get(fl_pp_model *p) { return p->m; }

fl_status fl_pp_forward(fl_pp_model *p, const fl_batch *b, int32_t n_micro, const fl_kv_iface *kv, void *kv_ctx,
                        float *logits) {
    fl_model *m = p->m;
    const int32_t T = b->n_tokens, V = m->hp.n_vocab, R = fl_batch_n_logits(b);
    const int64_t E = m->hp.n_embd;
    const bool last = p->rank == p->n - 1;
    if (T < 1) return fl_batch_validate(b, V);
    if (n_micro < 1) n_micro = 1;
    if (n_micro > T) n_micro = T;
    const int32_t max_mb = (T + n_micro - 1) / n_micro;
    const size_t xb = (size_t)max_mb * (size_t)E * sizeof(float);
    if (p->rank > 0 && xb > p->xbuf_bytes) {
        float *x = fl_alloc(FL_MEM_COMM, xb, 64);
        if (!x) return FL_ERR_NOMEM;
        fl_free(FL_MEM_COMM, p->xbuf, p->xbuf_bytes);
        p->xbuf = x;
        p->xbuf_bytes = xb;
    }
    int8_t *flags = NULL;
    if (!b->logits) { /* last token only: explicit flags so earlier micro-batches ask for none */
        if (!(flags = fl_calloc(FL_MEM_SCRATCH, (size_t)T, 1))) return FL_ERR_NOMEM;
        flags[T - 1] = 1;
    }
    const int8_t *lg = b->logits ? b->logits : flags;
    fl_status st = FL_OK;
    int32_t rows = 0;
    for (int32_t mb = 0; mb < n_micro && !st; mb++) {
        const int32_t i0 = (int32_t)((int64_t)mb * T / n_micro), i1 = (int32_t)((int64_t)(mb + 1) * T / n_micro);
        const int32_t n = i1 - i0;
        int32_t nr = 0;
        for (int32_t i = i0; i < i1; i++) nr += lg[i] != 0;
        fl_batch sub = {n, b->tokens + i0, b->pos + i0, b->seq_id + i0, lg + i0};
        if (p->rank > 0 &&
            (st = fl_comm_sendrecv(p->comm, NULL, 0, -1, p->xbuf, (size_t)n * (size_t)E * sizeof(float), p->rank - 1)))
            break;
        if ((st = fl_model_forward(m, &sub, kv, kv_ctx, last && nr && logits ? logits + (size_t)rows * V : NULL))) break;
        if (!last)
            st = fl_comm_sendrecv(p->comm, m->ws.x, (size_t)n * (size_t)E * sizeof(float), p->rank + 1, NULL, 0, -1);
        rows += nr;
    }
    fl_free(FL_MEM_SCRATCH, flags, (size_t)T);
    if (!st && logits && p->n > 1) st = fl_comm_bcast(p->comm, logits, (size_t)R * (size_t)V * sizeof(float), p->n - 1);
    return st;
}
