/*
 * attn_internal.h - what the attention files share but nobody else needs: the resolved form
 * of fl_attn_args (defaults filled in, checked) and K/V row access by type.
 */
#ifndef FL_ATTN_INTERNAL_H
#define FL_ATTN_INTERNAL_H

#include "kernels/attn.h"

typedef struct fl_attn_res {
    int64_t qs, ks, vs, os; /* token strides in elements */
    float scale;            /* resolved softmax scale */
    int32_t group;          /* n_head / n_head_kv */
    int64_t max_lq, max_lk; /* longest sequence on each side */
    size_t kv_elem;         /* bytes per K/V element */
} fl_attn_res;

/* fl_attn_check + the resolved values (r may be NULL). */
fl_status fl_attn_resolve(const fl_attn_args *a, fl_attn_res *r);

/* Token ranges of sequence s. */
static inline void fl_attn_seq(const fl_attn_args *a, int32_t s, int64_t *q0, int64_t *lq, int64_t *k0, int64_t *lk) {
    *q0 = a->cu_seqlens_q ? a->cu_seqlens_q[s] : 0;
    *lq = a->cu_seqlens_q ? a->cu_seqlens_q[s + 1] - *q0 : a->n_q;
    *k0 = a->cu_seqlens_k ? a->cu_seqlens_k[s] : 0;
    *lk = a->cu_seqlens_k ? a->cu_seqlens_k[s + 1] - *k0 : a->n_kv;
}

/* After a failed fl_alloc: FL_ERR_BUDGET or FL_ERR_NOMEM, message prefixed with fn. */
fl_status fl_attn_alloc_failed(const char *fn);

/* Element e of a K/V row of the given type, as f32. */
float fl_attn_kv_get(const void *row, int32_t type, int64_t e);

#endif
