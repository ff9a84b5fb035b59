/*
 * attn.c - argument checks, the naive reference attention (the spec: materializes the score
 * matrix of each (sequence, head)), the merge of partial results and the FLOP count.
 */
#include "kernels/ref/attn_internal.h"

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/threads.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

float fl_attn_kv_get(const void *row, int32_t type, int64_t e) {
    switch (type) {
    case FL_TYPE_F16: return fl_f16_to_f32(((const uint16_t *)row)[e]);
    case FL_TYPE_BF16: return fl_bf16_to_f32(((const uint16_t *)row)[e]);
    default: return ((const float *)row)[e];
    }
}

static fl_status check_cu(const int32_t *cu, int32_t n_seq, int64_t total, const char *name) {
    if (cu[0] != 0) return fl_set_error(FL_ERR_INVALID, "fl_attn: %s[0] = %d, must be 0", name, cu[0]);
    for (int32_t s = 0; s < n_seq; s++)
        if (cu[s + 1] < cu[s])
            return fl_set_error(FL_ERR_INVALID, "fl_attn: %s is not increasing (%s[%d] = %d < %s[%d] = %d)",
                                name, name, s + 1, cu[s + 1], name, s, cu[s]);
    if (cu[n_seq] != total)
        return fl_set_error(FL_ERR_INVALID, "fl_attn: %s ends at %d but the tensor has %lld tokens", name,
                            cu[n_seq], (long long)total);
    return FL_OK;
}

fl_status fl_attn_resolve(const fl_attn_args *a, fl_attn_res *r) {
    fl_attn_res tmp;
    if (!r) r = &tmp;
    if (!a) return fl_set_error(FL_ERR_INVALID, "fl_attn: NULL args");
    if (a->n_head <= 0 || a->n_head_kv <= 0)
        return fl_set_error(FL_ERR_INVALID, "fl_attn: n_head = %d, n_head_kv = %d must be positive", a->n_head, a->n_head_kv);
    if (a->n_head % a->n_head_kv)
        return fl_set_error(FL_ERR_INVALID, "fl_attn: n_head = %d is not a multiple of n_head_kv = %d", a->n_head, a->n_head_kv);
    if (a->head_dim <= 0 || a->head_dim % 8)
        return fl_set_error(FL_ERR_INVALID, "fl_attn: head_dim = %d must be a positive multiple of 8", a->head_dim);
    if (a->n_q < 0 || a->n_kv < 0 || a->n_q > INT32_MAX || a->n_kv > INT32_MAX)
        return fl_set_error(FL_ERR_INVALID, "fl_attn: token counts n_q = %lld, n_kv = %lld out of range",
                            (long long)a->n_q, (long long)a->n_kv);
    if (a->kv_type != FL_TYPE_F32 && a->kv_type != FL_TYPE_F16 && a->kv_type != FL_TYPE_BF16)
        return fl_set_error(FL_ERR_UNSUPPORTED, "fl_attn: K/V type %s not supported (f32, f16, bf16)", fl_type_name(a->kv_type));
    if (a->window < 0) return fl_set_error(FL_ERR_INVALID, "fl_attn: window = %d is negative", a->window);
    if (!(a->scale >= 0.0f) || isinf(a->scale)) return fl_set_error(FL_ERR_INVALID, "fl_attn: bad scale %g", (double)a->scale);
    if (a->n_q > 0 && (!a->q || !a->out)) return fl_set_error(FL_ERR_INVALID, "fl_attn: NULL q or out");
    if (a->n_kv > 0 && (!a->k || !a->v)) return fl_set_error(FL_ERR_INVALID, "fl_attn: NULL k or v");
    const int64_t qrow = (int64_t)a->n_head * a->head_dim, krow = (int64_t)a->n_head_kv * a->head_dim;
    r->qs = a->q_stride ? a->q_stride : qrow;
    r->os = a->out_stride ? a->out_stride : qrow;
    r->ks = a->k_stride ? a->k_stride : krow;
    r->vs = a->v_stride ? a->v_stride : krow;
    if (r->qs < qrow || r->os < qrow)
        return fl_set_error(FL_ERR_INVALID, "fl_attn: q/out stride (%lld/%lld) below n_head * head_dim = %lld",
                            (long long)r->qs, (long long)r->os, (long long)qrow);
    if (r->ks < krow || r->vs < krow)
        return fl_set_error(FL_ERR_INVALID, "fl_attn: k/v stride (%lld/%lld) below n_head_kv * head_dim = %lld",
                            (long long)r->ks, (long long)r->vs, (long long)krow);
    if (a->n_seq < 1) return fl_set_error(FL_ERR_INVALID, "fl_attn: n_seq = %d must be >= 1", a->n_seq);
    if (a->n_seq > 1 && (!a->cu_seqlens_q || !a->cu_seqlens_k))
        return fl_set_error(FL_ERR_INVALID, "fl_attn: n_seq = %d needs both cu_seqlens_q and cu_seqlens_k", a->n_seq);
    fl_status st;
    if (a->cu_seqlens_q && (st = check_cu(a->cu_seqlens_q, a->n_seq, a->n_q, "cu_seqlens_q")) != FL_OK) return st;
    if (a->cu_seqlens_k && (st = check_cu(a->cu_seqlens_k, a->n_seq, a->n_kv, "cu_seqlens_k")) != FL_OK) return st;
    r->max_lq = r->max_lk = 0;
    for (int32_t s = 0; s < a->n_seq; s++) {
        int64_t q0, lq, k0, lk;
        fl_attn_seq(a, s, &q0, &lq, &k0, &lk);
        if (lq > r->max_lq) r->max_lq = lq;
        if (lk > r->max_lk) r->max_lk = lk;
    }
    r->scale = a->scale > 0.0f ? a->scale : 1.0f / sqrtf((float)a->head_dim);
    r->group = a->n_head / a->n_head_kv;
    r->kv_elem = a->kv_type == FL_TYPE_F32 ? 4 : 2;
    return FL_OK;
}

fl_status fl_attn_alloc_failed(const char *fn) {
    fl_status st = strstr(fl_last_error(), "budget") ? FL_ERR_BUDGET : FL_ERR_NOMEM;
    fl_add_error_context("%s: scratch", fn);
    return st;
}

fl_status fl_attn_check(const fl_attn_args *a) { return fl_attn_resolve(a, NULL); }

fl_status fl_attn_forward(const fl_attn_args *a) {
    fl_status st = fl_attn_check(a);
    if (st != FL_OK) return st;
    /* Every valid combination runs on the flash path; the naive one is the spec and the fallback
     * when asked for explicitly. */
    return a->impl == FL_ATTN_NAIVE ? fl_attn_forward_naive(a) : fl_attn_forward_flash(a);
}

/* ---- naive reference ---- */

typedef struct naive_ctx {
    const fl_attn_args *a;
    const fl_attn_res *r;
    float *scores;        /* [nth][max_lq * max_lk] */
    size_t per_thread;    /* floats per thread */
    atomic_long next;     /* next (seq, head) work item */
} naive_ctx;

/* One (sequence, head): S = scale Q K^T with the mask, softmax per row, O = P V. */
static void naive_one(const fl_attn_args *a, const fl_attn_res *r, int32_t s, int32_t h, float *S) {
    int64_t q0, lq, k0, lk;
    fl_attn_seq(a, s, &q0, &lq, &k0, &lk);
    const int32_t hd = a->head_dim, hk = h / r->group;
    for (int64_t i = 0; i < lq; i++) {
        const float *qi = a->q + (q0 + i) * r->qs + (int64_t)h * hd;
        float *Si = S + i * lk; /* (lk) */
        int64_t lo, hi;
        fl_attn_row_range(i, lq, lk, a->causal, a->window, &lo, &hi);
        float mx = -INFINITY;
        for (int64_t j = 0; j < lk; j++) {
            if (j < lo || j > hi) { Si[j] = -INFINITY; continue; }
            const char *kj = (const char *)a->k + ((k0 + j) * r->ks + (int64_t)hk * hd) * (int64_t)r->kv_elem;
            float dot = 0.0f;
            for (int32_t d = 0; d < hd; d++) dot += qi[d] * fl_attn_kv_get(kj, a->kv_type, d);
            Si[j] = dot * r->scale;
            if (Si[j] > mx) mx = Si[j];
        }
        float *oi = a->out + (q0 + i) * r->os + (int64_t)h * hd;
        memset(oi, 0, sizeof(float) * (size_t)hd);
        if (mx == -INFINITY) { /* sees no key */
            if (a->lse) a->lse[(q0 + i) * a->n_head + h] = -INFINITY;
            continue;
        }
        double sum = 0.0;
        for (int64_t j = 0; j < lk; j++) {
            Si[j] = expf(Si[j] - mx);
            sum += Si[j];
        }
        for (int64_t j = lo; j <= hi; j++) {
            const char *vj = (const char *)a->v + ((k0 + j) * r->vs + (int64_t)hk * hd) * (int64_t)r->kv_elem;
            float p = (float)(Si[j] / sum);
            for (int32_t d = 0; d < hd; d++) oi[d] += p * fl_attn_kv_get(vj, a->kv_type, d);
        }
        if (a->lse) a->lse[(q0 + i) * a->n_head + h] = mx + (float)log(sum);
    }
}

static void naive_task(void *p, int ith, int nth) {
    naive_ctx *c = p;
    (void)nth;
    float *S = c->scores + (size_t)ith * c->per_thread;
    const long n_items = (long)c->a->n_seq * c->a->n_head;
    for (long it; (it = atomic_fetch_add(&c->next, 1)) < n_items;)
        naive_one(c->a, c->r, (int32_t)(it / c->a->n_head), (int32_t)(it % c->a->n_head), S);
}

fl_status fl_attn_forward_naive(const fl_attn_args *a) {
    fl_attn_res r;
    fl_status st = fl_attn_resolve(a, &r);
    if (st != FL_OK) return st;
    if (a->n_q == 0) return FL_OK;
    const int nth = fl_threads_get();
    naive_ctx c = {.a = a, .r = &r, .per_thread = (size_t)(r.max_lq * (r.max_lk > 0 ? r.max_lk : 1))};
    atomic_init(&c.next, 0);
    const size_t bytes = c.per_thread * sizeof(float) * (size_t)nth;
    c.scores = fl_alloc(FL_MEM_SCRATCH, bytes, 64); /* the n x n score matrices, one per thread */
    if (!c.scores) return fl_attn_alloc_failed(__func__);
    fl_parallel_n(naive_task, &c, nth);
    fl_free(FL_MEM_SCRATCH, c.scores, bytes);
    return FL_OK;
}

/* ---- merge ---- */

void fl_attn_merge(int64_t n_rows, int32_t head_dim,
                   const float *out_a, int64_t stride_a, const float *lse_a,
                   const float *out_b, int64_t stride_b, const float *lse_b,
                   float *out, int64_t stride_out, float *lse) {
    for (int64_t i = 0; i < n_rows; i++) {
        const float la = lse_a[i], lb = lse_b[i];
        const float mx = la > lb ? la : lb;
        const float *oa = out_a + i * stride_a, *ob = out_b + i * stride_b;
        float *o = out + i * stride_out;
        if (mx == -INFINITY) {
            for (int32_t d = 0; d < head_dim; d++) o[d] = 0.0f;
            lse[i] = -INFINITY;
            continue;
        }
        const float wa = expf(la - mx), wb = expf(lb - mx), sum = wa + wb;
        const float ca = wa / sum, cb = wb / sum;
        for (int32_t d = 0; d < head_dim; d++) o[d] = ca * oa[d] + cb * ob[d];
        lse[i] = mx + logf(sum);
    }
}

double fl_attn_flops(const fl_attn_args *a) {
    double pairs = 0.0;
    for (int32_t s = 0; s < a->n_seq; s++) {
        int64_t q0, lq, k0, lk;
        fl_attn_seq(a, s, &q0, &lq, &k0, &lk);
        for (int64_t i = 0; i < lq; i++) {
            int64_t lo, hi;
            fl_attn_row_range(i, lq, lk, a->causal, a->window, &lo, &hi);
            if (hi >= lo) pairs += (double)(hi - lo + 1);
        }
    }
    return 4.0 * pairs * a->head_dim * a->n_head;
}
