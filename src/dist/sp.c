/* Sequence parallelism: ring attention prefill and distributed-KV decode (see sp.h). */
#include "dist/sp.h"

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"
#include "kernels/attn.h"

#include <math.h>
#include <string.h>

typedef enum { SP_IDLE, SP_PREFILL, SP_DECODE } sp_mode;

struct fl_sp {
    fl_comm *comm;
    fl_sp_params p;
    int32_t rank, N;
    int64_t row;    /* n_head_kv * head_dim elements per token */
    size_t esz;     /* bytes per element of kv_type */
    int32_t cap;    /* tokens per rank and layer */
    unsigned char *kv; /* FL_MEM_KV: [n_layer][K, V][cap][row] */
    size_t kv_bytes;
    unsigned char *ring[2][2]; /* FL_MEM_COMM: [buffer][K, V] [cap][row] */
    size_t ring_bytes;         /* of one of the four */
    float *scratch;            /* FL_MEM_SCRATCH: part out, part lse, acc lse, gather */
    size_t scratch_bytes;
    int32_t n_local, n_total;
    /* current step */
    sp_mode mode;
    int32_t T;       /* prefill length */
    int32_t n_new;   /* tokens this rank stores in this step */
    fl_status st;
};

void fl_sp_chunk(int64_t T, int32_t n_chunks, int32_t c, int64_t *lo, int64_t *hi) {
    const int64_t q = T / n_chunks, rem = T % n_chunks;
    *lo = c * q + (c < rem ? c : rem);
    *hi = *lo + q + (c < rem ? 1 : 0);
}

int64_t fl_sp_local_tokens(int64_t T, int32_t n, int32_t r) {
    int64_t a0, a1, b0, b1;
    fl_sp_chunk(T, 2 * n, r, &a0, &a1);
    fl_sp_chunk(T, 2 * n, 2 * n - 1 - r, &b0, &b1);
    return (a1 - a0) + (b1 - b0);
}

static int32_t sp_cap(const fl_sp_params *p, int32_t n) { return (int32_t)((p->n_ctx + n - 1) / n) + 2; }

static size_t sp_esz(int32_t type) { return type == FL_TYPE_F16 ? 2 : 4; }

size_t fl_sp_kv_bytes(const fl_sp_params *p, int32_t n) {
    if (n < 1 || p->n_ctx < 1) return 0;
    return (size_t)p->n_layer * 2 * (size_t)sp_cap(p, n) * (size_t)p->n_head_kv * (size_t)p->head_dim * sp_esz(p->kv_type);
}

static unsigned char *kv_at(const fl_sp *s, int32_t il, int kv, int64_t slot) {
    return s->kv + (((size_t)il * 2 + (size_t)kv) * (size_t)s->cap + (size_t)slot) * (size_t)s->row * s->esz;
}

fl_status fl_sp_new(fl_comm *comm, const fl_sp_params *p, fl_sp **out) {
    *out = NULL;
    if (p->n_layer < 1 || p->n_head < 1 || p->n_head_kv < 1 || p->n_head % p->n_head_kv || p->head_dim < 1 ||
        p->n_ctx < 1 || (p->kv_type != FL_TYPE_F32 && p->kv_type != FL_TYPE_F16))
        return fl_set_error(FL_ERR_INVALID, "sp: bad params (layers %d heads %d/%d head_dim %d n_ctx %d type %s)",
                            p->n_layer, p->n_head, p->n_head_kv, p->head_dim, p->n_ctx, fl_type_name(p->kv_type));
    fl_sp *s = fl_calloc(FL_MEM_MISC, 1, sizeof *s);
    if (!s) return FL_ERR_NOMEM;
    s->comm = comm;
    s->p = *p;
    s->rank = fl_comm_rank(comm);
    s->N = fl_comm_size(comm);
    s->row = (int64_t)p->n_head_kv * p->head_dim;
    s->esz = sp_esz(p->kv_type);
    s->cap = sp_cap(p, s->N);
    s->kv_bytes = fl_sp_kv_bytes(p, s->N);
    s->kv = fl_alloc(FL_MEM_KV, s->kv_bytes, 64);
    if (!s->kv) goto fail;
    if (s->N > 1) {
        s->ring_bytes = (size_t)s->cap * (size_t)s->row * s->esz;
        for (int b = 0; b < 2; b++)
            for (int kv = 0; kv < 2; kv++)
                if (!(s->ring[b][kv] = fl_alloc(FL_MEM_COMM, s->ring_bytes, 64))) goto fail;
    }
    *out = s;
    return FL_OK;
fail:
    fl_sp_free(s);
    return fl_last_error()[0] ? FL_ERR_BUDGET : FL_ERR_NOMEM;
}

void fl_sp_free(fl_sp *s) {
    if (!s) return;
    fl_free(FL_MEM_KV, s->kv, s->kv_bytes);
    for (int b = 0; b < 2; b++)
        for (int kv = 0; kv < 2; kv++) fl_free(FL_MEM_COMM, s->ring[b][kv], s->ring_bytes);
    fl_free(FL_MEM_SCRATCH, s->scratch, s->scratch_bytes);
    fl_free(FL_MEM_MISC, s, sizeof *s);
}

void fl_sp_clear(fl_sp *s) { s->n_local = s->n_total = 0; }
int32_t fl_sp_n_local(const fl_sp *s) { return s->n_local; }
int32_t fl_sp_n_total(const fl_sp *s) { return s->n_total; }
fl_status fl_sp_status(const fl_sp *s) { return s->st; }

fl_status fl_sp_begin_prefill(fl_sp *s, int32_t T) {
    if (s->n_total) return fl_set_error(FL_ERR_INVALID, "sp: prefill needs an empty cache (%d tokens held)", s->n_total);
    if (T < 2 * s->N) return fl_set_error(FL_ERR_INVALID, "sp: prefill of %d tokens over %d ranks (need >= %d)", T, s->N, 2 * s->N);
    if (T > s->p.n_ctx) return fl_set_error(FL_NO_KV_SPACE, "sp: prefill of %d tokens > n_ctx %d", T, s->p.n_ctx);
    s->mode = SP_PREFILL;
    s->T = T;
    s->n_new = (int32_t)fl_sp_local_tokens(T, s->N, s->rank);
    s->st = FL_OK;
    return FL_OK;
}

fl_status fl_sp_begin_decode(fl_sp *s) {
    if (s->n_total >= s->p.n_ctx) return fl_set_error(FL_NO_KV_SPACE, "sp: sequence full (%d tokens)", s->n_total);
    s->mode = SP_DECODE;
    s->n_new = s->n_total % s->N == s->rank ? 1 : 0;
    if (s->n_local + s->n_new > s->cap) return fl_set_error(FL_NO_KV_SPACE, "sp: rank %d share is full", s->rank);
    s->st = FL_OK;
    return FL_OK;
}

void fl_sp_commit(fl_sp *s) {
    s->n_total += s->mode == SP_PREFILL ? s->T : 1;
    s->n_local += s->n_new;
    s->mode = SP_IDLE;
    s->n_new = 0;
}

static fl_status sp_prepare(void *ctx, const fl_batch *b) {
    fl_sp *s = ctx;
    if (s->mode == SP_IDLE) return fl_set_error(FL_ERR_INVALID, "sp: forward outside fl_sp_prefill/decode");
    const int32_t want = s->mode == SP_PREFILL ? s->n_new : 1;
    if (b->n_tokens != want)
        return fl_set_error(FL_ERR_INVALID, "sp: batch of %d tokens, expected %d", b->n_tokens, want);
    return FL_OK;
}

static void store_row(fl_sp *s, unsigned char *dst, const float *src) {
    if (s->p.kv_type == FL_TYPE_F32) memcpy(dst, src, (size_t)s->row * 4);
    else
        for (int64_t i = 0; i < s->row; i++) ((uint16_t *)dst)[i] = fl_f32_to_f16(src[i]);
}

static void sp_store(void *ctx, int32_t il, const fl_batch *b, const float *k, const float *v) {
    fl_sp *s = ctx;
    const int32_t n = s->mode == SP_PREFILL ? b->n_tokens : s->n_new; /* decode: only the owner keeps it */
    for (int32_t i = 0; i < n; i++) {
        store_row(s, kv_at(s, il, 0, s->n_local + i), k + (int64_t)i * s->row);
        store_row(s, kv_at(s, il, 1, s->n_local + i), v + (int64_t)i * s->row);
    }
}

static float *scratch(fl_sp *s, size_t floats) {
    const size_t bytes = floats * sizeof(float);
    if (bytes > s->scratch_bytes) {
        float *p = fl_alloc(FL_MEM_SCRATCH, bytes, 64);
        if (!p) return NULL;
        fl_free(FL_MEM_SCRATCH, s->scratch, s->scratch_bytes);
        s->scratch = p;
        s->scratch_bytes = bytes;
    }
    return s->scratch;
}

/* Partial attention of nq queries (rows at q) over nk keys (rows at k, v), merged into
 * out/lse_acc.  part/part_lse: scratch of nq rows. */
static void attend_merge(fl_sp *s, const float *q, int64_t nq, const void *k, const void *v, int64_t nk, bool causal,
                         float *out, float *lse_acc, float *part, float *part_lse) {
    if (nq <= 0 || nk <= 0 || s->st) return;
    const int32_t H = s->p.n_head, D = s->p.head_dim;
    fl_attn_args a = {.n_seq = 1, .n_q = nq, .n_kv = nk, .n_head = H, .n_head_kv = s->p.n_head_kv, .head_dim = D,
                      .q = q, .k = k, .v = v, .kv_type = s->p.kv_type, .out = part, .lse = part_lse,
                      .causal = causal, .impl = (fl_attn_impl)s->p.impl};
    fl_status st = fl_attn_forward(&a);
    if (st) {
        s->st = st;
        return;
    }
    fl_attn_merge(nq * H, D, part, D, part_lse, out, D, lse_acc, out, D, lse_acc);
}

static void attend_prefill(fl_sp *s, int32_t il, const float *q, float *out) {
    const int32_t H = s->p.n_head, D = s->p.head_dim, N = s->N, r = s->rank;
    const int64_t nq = s->n_new, qrow = (int64_t)H * D;
    float *sc = scratch(s, (size_t)(nq * qrow + 2 * nq * H));
    if (!sc) {
        s->st = FL_ERR_NOMEM;
        return;
    }
    float *part = sc, *part_lse = sc + nq * qrow, *lse_acc = part_lse + nq * H;
    memset(out, 0, (size_t)(nq * qrow) * sizeof(float));
    for (int64_t i = 0; i < nq * H; i++) lse_acc[i] = -INFINITY;
    /* my query chunks: rows [0, la) at positions [qa0, qa1), rows [la, nq) at [qb0, qb1) */
    int64_t qlo[2], qhi[2];
    fl_sp_chunk(s->T, 2 * N, r, &qlo[0], &qhi[0]);
    fl_sp_chunk(s->T, 2 * N, 2 * N - 1 - r, &qlo[1], &qhi[1]);
    const int64_t qrow0[2] = {0, qhi[0] - qlo[0]};
    const unsigned char *ck = kv_at(s, il, 0, s->n_local), *cv = kv_at(s, il, 1, s->n_local);
    int cur_buf = 0;
    for (int32_t step = 0; step < N; step++) {
        const int32_t owner = (r - step + N) % N;
        /* start passing the block on (send what I hold to r+1, receive owner-1's from r-1) and
         * attend to it meanwhile: communication overlaps the step's attention */
        const bool pass = step < N - 1;
        fl_comm_req rk, rv;
        unsigned char *nk = pass ? s->ring[cur_buf][0] : NULL, *nv = pass ? s->ring[cur_buf][1] : NULL;
        if (pass) {
            const int64_t n_send = fl_sp_local_tokens(s->T, N, owner);
            const int64_t n_recv = fl_sp_local_tokens(s->T, N, (owner - 1 + N) % N);
            const size_t sb = (size_t)n_send * (size_t)s->row * s->esz, rb = (size_t)n_recv * (size_t)s->row * s->esz;
            fl_status st = fl_comm_isendrecv(s->comm, ck, sb, (r + 1) % N, nk, rb, (r - 1 + N) % N, &rk);
            if (!st) st = fl_comm_isendrecv(s->comm, cv, sb, (r + 1) % N, nv, rb, (r - 1 + N) % N, &rv);
            if (st) {
                s->st = st;
                return;
            }
        }
        int64_t klo[2], khi[2];
        fl_sp_chunk(s->T, 2 * N, owner, &klo[0], &khi[0]);
        fl_sp_chunk(s->T, 2 * N, 2 * N - 1 - owner, &klo[1], &khi[1]);
        const int64_t krow0[2] = {0, khi[0] - klo[0]};
        for (int a = 0; a < 2; a++) {
            for (int c = 0; c < 2; c++) {
                const int64_t nqa = qhi[a] - qlo[a], nkc = khi[c] - klo[c];
                bool causal;
                if (khi[c] <= qlo[a]) causal = false;
                else if (klo[c] == qlo[a]) causal = true;
                else continue;
                attend_merge(s, q + qrow0[a] * qrow, nqa, ck + (size_t)krow0[c] * (size_t)s->row * s->esz,
                             cv + (size_t)krow0[c] * (size_t)s->row * s->esz, nkc, causal, out + qrow0[a] * qrow,
                             lse_acc + qrow0[a] * H, part, part_lse);
            }
        }
        if (!pass) break;
        fl_status st = fl_comm_wait(s->comm, &rk);
        fl_status st2 = fl_comm_wait(s->comm, &rv);
        if (st || st2) {
            s->st = st ? st : st2;
            return;
        }
        if (s->st) return;
        ck = nk;
        cv = nv;
        cur_buf ^= 1;
    }
}

static void attend_decode(fl_sp *s, int32_t il, const float *q, float *out) {
    const int32_t H = s->p.n_head, D = s->p.head_dim, N = s->N;
    const int64_t qrow = (int64_t)H * D, msg = qrow + H; /* out row + lse per head */
    float *sc = scratch(s, (size_t)(msg * (N + 1)));
    if (!sc) {
        s->st = FL_ERR_NOMEM;
        return;
    }
    float *mine = sc, *all = sc + msg;
    memset(mine, 0, (size_t)qrow * sizeof(float));
    for (int32_t h = 0; h < H; h++) mine[qrow + h] = -INFINITY;
    const int64_t nk = s->n_local + s->n_new;
    if (nk > 0) {
        fl_attn_args a = {.n_seq = 1, .n_q = 1, .n_kv = nk, .n_head = H, .n_head_kv = s->p.n_head_kv, .head_dim = D,
                          .q = q, .k = kv_at(s, il, 0, 0), .v = kv_at(s, il, 1, 0), .kv_type = s->p.kv_type,
                          .out = mine, .lse = mine + qrow, .causal = false, .impl = (fl_attn_impl)s->p.impl};
        fl_status st = fl_attn_forward(&a);
        if (st) {
            s->st = st;
            return;
        }
    }
    if (N == 1) {
        memcpy(out, mine, (size_t)qrow * sizeof(float));
        return;
    }
    fl_status st = fl_comm_allgather(s->comm, mine, all, (size_t)msg * sizeof(float));
    if (st) {
        s->st = st;
        return;
    }
    /* merge in rank order into mine (identical on every rank) */
    memcpy(mine, all, (size_t)msg * sizeof(float));
    for (int32_t k = 1; k < N; k++)
        fl_attn_merge(H, D, mine, D, mine + qrow, all + k * msg, D, all + k * msg + qrow, mine, D, mine + qrow);
    memcpy(out, mine, (size_t)qrow * sizeof(float));
}

static void sp_attend(void *ctx, int32_t il, const fl_batch *b, const float *q, float *out) {
    fl_sp *s = ctx;
    (void)b;
    if (s->mode == SP_PREFILL) attend_prefill(s, il, q, out);
    else attend_decode(s, il, q, out);
}

static const fl_kv_iface g_iface = {sp_prepare, sp_store, sp_attend};
const fl_kv_iface *fl_sp_iface(void) { return &g_iface; }

fl_status fl_sp_prefill(fl_sp *s, fl_model *m, const int32_t *tokens, int32_t T, float *logits) {
    fl_status st = fl_sp_begin_prefill(s, T);
    if (st) return st;
    const int32_t N = s->N, r = s->rank, n = s->n_new;
    int32_t *buf = fl_alloc(FL_MEM_SCRATCH, (size_t)n * 3 * sizeof(int32_t), 64);
    if (!buf) {
        s->mode = SP_IDLE;
        return FL_ERR_NOMEM;
    }
    int32_t *tok = buf, *pos = buf + n, *sid = buf + 2 * n;
    int32_t j = 0;
    for (int c = 0; c < 2; c++) {
        int64_t lo, hi;
        fl_sp_chunk(T, 2 * N, c == 0 ? r : 2 * N - 1 - r, &lo, &hi);
        for (int64_t i = lo; i < hi; i++, j++) {
            tok[j] = tokens[i];
            pos[j] = (int32_t)i;
            sid[j] = 0;
        }
    }
    fl_batch b = {n, tok, pos, sid, NULL};
    /* the last token of the sequence ends rank 0's batch (chunk 2N-1) */
    st = fl_model_forward(m, &b, &g_iface, s, r == 0 ? logits : NULL);
    fl_free(FL_MEM_SCRATCH, buf, (size_t)n * 3 * sizeof(int32_t));
    if (!st) st = s->st;
    if (!st && N > 1) st = fl_comm_bcast(s->comm, logits, (size_t)fl_model_hparams(m)->n_vocab * sizeof(float), 0);
    if (st) {
        s->mode = SP_IDLE;
        return st;
    }
    fl_sp_commit(s);
    return FL_OK;
}

fl_status fl_sp_decode(fl_sp *s, fl_model *m, int32_t token, float *logits) {
    fl_status st = fl_sp_begin_decode(s);
    if (st) return st;
    const int32_t pos = s->n_total, sid = 0;
    fl_batch b = {1, &token, &pos, &sid, NULL};
    st = fl_model_forward(m, &b, &g_iface, s, logits);
    if (!st) st = s->st;
    if (st) {
        s->mode = SP_IDLE;
        return st;
    }
    fl_sp_commit(s);
    return FL_OK;
}
