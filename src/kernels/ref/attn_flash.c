/*
 * attn_flash.c - flash attention: the tile state machine (fl_attn_tile_*), the scalar
 * micro-kernels that specify the SIMD ones, the per-ISA table and the threaded driver.
 *
 * A tile keeps FL_ATTN_TQ query lanes transposed (qt[d][lane]) so every SIMD lane holds a
 * different query: the row max, the exponentials and the rescale of the online softmax are
 * then plain element-wise vector operations, and K/V rows are read straight from memory as
 * broadcasts (no per-tile transpose of K).
 */
#include "kernels/ref/attn_internal.h"

#include "core/alloc.h"
#include "core/cpu.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/threads.h"
#include "kernels/convert.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#define LOG2E 1.44269504088896340736f
#define LN2 0.69314718055994530942f

/* ---- scalar micro-kernels (the spec of the SIMD ones) ---- */

void fl_attn_qk_ref(const float *qt, int32_t nq, const float *k, int64_t k_stride, int32_t nk, int32_t hd, float *s) {
    for (int32_t j = 0; j < nk; j++) {
        float *sj = s + (int64_t)j * FL_ATTN_TQ;
        for (int32_t i = 0; i < nq; i++) sj[i] = 0.0f;
        for (int32_t d = 0; d < hd; d++) {
            const float kd = k[j * k_stride + d];
            const float *qd = qt + (int64_t)d * FL_ATTN_TQ;
            for (int32_t i = 0; i < nq; i++) sj[i] += kd * qd[i];
        }
    }
}

void fl_attn_softmax_ref(float *s, int32_t nk, int32_t nq, float *m, float *l, float *alpha) {
    for (int32_t i = 0; i < nq; i++) {
        float mt = -INFINITY;
        for (int32_t j = 0; j < nk; j++) mt = fmaxf(mt, s[(int64_t)j * FL_ATTN_TQ + i]);
        const float mn = fmaxf(m[i], mt);
        const float mu = mn == -INFINITY ? 0.0f : mn; /* nothing seen yet: keep exp2 finite */
        alpha[i] = exp2f(m[i] - mu);
        float sum = 0.0f;
        for (int32_t j = 0; j < nk; j++) {
            float *p = &s[(int64_t)j * FL_ATTN_TQ + i];
            *p = exp2f(*p - mu);
            sum += *p;
        }
        l[i] = l[i] * alpha[i] + sum;
        m[i] = mn;
    }
}

void fl_attn_pv_ref(const float *s, int32_t nk, const float *v, int64_t v_stride, int32_t hd, float *ot,
                    int32_t nq, const float *alpha) {
    for (int32_t d = 0; d < hd; d++) {
        float *od = ot + (int64_t)d * FL_ATTN_TQ;
        for (int32_t i = 0; i < nq; i++) od[i] *= alpha[i];
        for (int32_t j = 0; j < nk; j++) {
            const float vd = v[j * v_stride + d];
            const float *sj = s + (int64_t)j * FL_ATTN_TQ;
            for (int32_t i = 0; i < nq; i++) od[i] += vd * sj[i];
        }
    }
}

static const fl_attn_kernels k_ref = {fl_attn_qk_ref, fl_attn_softmax_ref, fl_attn_pv_ref};
static const fl_attn_kernels k_avx2 = {fl_attn_qk_avx2, fl_attn_softmax_avx2, fl_attn_pv_avx2};
static const fl_attn_kernels k_avx512 = {fl_attn_qk_avx512, fl_attn_softmax_avx512, fl_attn_pv_avx512};

const fl_attn_kernels *fl_attn_kernels_for(fl_isa isa) {
    if (isa > fl_isa_best()) return NULL;
    switch (isa) {
    case FL_ISA_AVX512: return &k_avx512;
    case FL_ISA_AVX2: return &k_avx2;
    default: return &k_ref;
    }
}

const fl_attn_kernels *fl_attn_kernels_get(void) { return fl_attn_kernels_for(fl_isa_get()); }

/* ---- the tile ---- */

static size_t up64(size_t n) { return (n + 63) & ~(size_t)63; }

size_t fl_attn_tile_scratch_bytes(int32_t head_dim) {
    const size_t hd = (size_t)head_dim;
    return 2 * up64(hd * FL_ATTN_TQ * sizeof(float))      /* qt, ot */
         + 3 * up64(FL_ATTN_TQ * sizeof(float))           /* m, l, alpha */
         + 2 * up64(FL_ATTN_TQ * sizeof(int64_t))         /* lo, hi */
         + up64((size_t)FL_ATTN_TK * FL_ATTN_TQ * sizeof(float)) /* s */
         + 2 * up64((size_t)FL_ATTN_TK * hd * sizeof(float));    /* kbuf, vbuf */
}

void fl_attn_tile_bind(fl_attn_tile *t, void *scratch, int32_t head_dim) {
    char *p = scratch;
    const size_t hd = (size_t)head_dim;
    FL_ASSERT(head_dim > 0 && head_dim % 8 == 0);
    memset(t, 0, sizeof *t);
    t->head_dim = head_dim;
#define CARVE(field, type, n) (t->field = (type *)(void *)p, p += up64((n) * sizeof(type)))
    CARVE(qt, float, hd * FL_ATTN_TQ);
    CARVE(ot, float, hd * FL_ATTN_TQ);
    CARVE(m, float, FL_ATTN_TQ);
    CARVE(l, float, FL_ATTN_TQ);
    CARVE(alpha, float, FL_ATTN_TQ);
    CARVE(lo, int64_t, FL_ATTN_TQ);
    CARVE(hi, int64_t, FL_ATTN_TQ);
    CARVE(s, float, (size_t)FL_ATTN_TK * FL_ATTN_TQ);
    CARVE(kbuf, float, (size_t)FL_ATTN_TK * hd);
    CARVE(vbuf, float, (size_t)FL_ATTN_TK * hd);
#undef CARVE
    FL_ASSERT((size_t)(p - (char *)scratch) == fl_attn_tile_scratch_bytes(head_dim));
}

void fl_attn_tile_reset(fl_attn_tile *t, int32_t n_lanes) {
    FL_ASSERT(n_lanes >= 1 && n_lanes <= FL_ATTN_TQ);
    t->n_lanes = n_lanes;
    t->n_padded = (n_lanes + 15) & ~15;
    for (int32_t i = 0; i < FL_ATTN_TQ; i++) {
        t->m[i] = -INFINITY;
        t->l[i] = 0.0f;
    }
    memset(t->ot, 0, sizeof(float) * (size_t)t->head_dim * FL_ATTN_TQ);
}

void fl_attn_tile_set_lane(fl_attn_tile *t, int32_t lane, const float *q, float scale, int64_t lo, int64_t hi) {
    FL_DASSERT(lane >= 0 && lane < t->n_lanes);
    const float sc = scale * LOG2E; /* scores in log2 units: exp(x) = exp2(x log2 e) */
    /* the last lane is mirrored into the padding lanes so they never widen the key range */
    const int32_t end = lane == t->n_lanes - 1 ? t->n_padded : lane + 1;
    for (int32_t i = lane; i < end; i++) {
        for (int32_t d = 0; d < t->head_dim; d++) t->qt[(int64_t)d * FL_ATTN_TQ + i] = q[d] * sc;
        t->lo[i] = lo;
        t->hi[i] = hi;
    }
}

void fl_attn_tile_update(fl_attn_tile *t, const void *k, int64_t k_stride, const void *v, int64_t v_stride,
                         int32_t kv_type, int64_t n_keys, int64_t key_pos0) {
    const fl_attn_kernels *kk = fl_attn_kernels_get();
    const fl_convert_kernels *cv = fl_convert_kernels_get();
    const int32_t nq = t->n_padded, hd = t->head_dim;
    int64_t lo_min = INT64_MAX, hi_max = INT64_MIN;
    for (int32_t i = 0; i < nq; i++) {
        if (t->lo[i] > t->hi[i]) continue; /* a lane that sees nothing */
        if (t->lo[i] < lo_min) lo_min = t->lo[i];
        if (t->hi[i] > hi_max) hi_max = t->hi[i];
    }
    if (lo_min > hi_max || n_keys <= 0) return; /* no lane sees anything */
    /* keys j in [jb, je) of this run are visible to some lane */
    int64_t jb = lo_min - key_pos0, je = hi_max - key_pos0 + 1;
    if (jb < 0) jb = 0;
    if (je > n_keys) je = n_keys;
    const size_t esz = kv_type == FL_TYPE_F32 ? 4 : 2;
    for (int64_t j0 = jb; j0 < je; j0 += FL_ATTN_TK) {
        const int32_t nk = (int32_t)(je - j0 < FL_ATTN_TK ? je - j0 : FL_ATTN_TK);
        const int64_t p0 = key_pos0 + j0, p1 = p0 + nk - 1; /* key positions of this step */
        const float *kf, *vf;
        int64_t ks, vs;
        const char *kr = (const char *)k + (size_t)(j0 * k_stride) * esz;
        const char *vr = (const char *)v + (size_t)(j0 * v_stride) * esz;
        if (kv_type == FL_TYPE_F32) {
            kf = (const float *)(const void *)kr, ks = k_stride;
            vf = (const float *)(const void *)vr, vs = v_stride;
        } else {
            void (*conv)(const uint16_t *, float *, int64_t) = kv_type == FL_TYPE_F16 ? cv->f16_to_f32 : cv->bf16_to_f32;
            for (int32_t j = 0; j < nk; j++) {
                conv((const uint16_t *)(const void *)(kr + (size_t)(j * k_stride) * esz), t->kbuf + (int64_t)j * hd, hd);
                conv((const uint16_t *)(const void *)(vr + (size_t)(j * v_stride) * esz), t->vbuf + (int64_t)j * hd, hd);
            }
            kf = t->kbuf, ks = hd, vf = t->vbuf, vs = hd;
        }
        kk->qk(t->qt, nq, kf, ks, nk, hd, t->s);
        bool full = true; /* every lane sees every key of this step: no mask needed */
        for (int32_t i = 0; i < nq && full; i++) full = t->lo[i] <= p0 && p1 <= t->hi[i];
        if (!full) {
            for (int32_t j = 0; j < nk; j++) {
                float *sj = t->s + (int64_t)j * FL_ATTN_TQ;
                for (int32_t i = 0; i < nq; i++)
                    if (p0 + j < t->lo[i] || p0 + j > t->hi[i]) sj[i] = -INFINITY;
            }
        }
        kk->softmax(t->s, nk, nq, t->m, t->l, t->alpha);
        kk->pv(t->s, nk, vf, vs, hd, t->ot, nq, t->alpha);
    }
}

void fl_attn_tile_get_lane(const fl_attn_tile *t, int32_t lane, float *out, float *lse) {
    const float l = t->l[lane];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int32_t d = 0; d < t->head_dim; d++) out[d] = t->ot[(int64_t)d * FL_ATTN_TQ + lane] * inv;
    if (lse) *lse = l > 0.0f ? (t->m[lane] + log2f(l)) * LN2 : -INFINITY;
}

/* ---- the driver ---- */

typedef struct flash_ctx {
    const fl_attn_args *a;
    const fl_attn_res *r;
    char *scratch;        /* [nth][tile_bytes] */
    size_t tile_bytes;
    int64_t *item_off;    /* [n_seq + 1] first work item of each sequence */
    atomic_long next;
} flash_ctx;

/* Work item it of sequence s: kv head hk and TQ consecutive (token, head-in-group) rows. */
static void flash_item(const flash_ctx *c, fl_attn_tile *t, int32_t s, int64_t it) {
    const fl_attn_args *a = c->a;
    const fl_attn_res *r = c->r;
    int64_t q0, lq, k0, lk;
    fl_attn_seq(a, s, &q0, &lq, &k0, &lk);
    const int64_t rows = lq * r->group, tiles = (rows + FL_ATTN_TQ - 1) / FL_ATTN_TQ;
    const int32_t hk = (int32_t)(it / tiles), hd = a->head_dim;
    const int64_t r0 = (it % tiles) * FL_ATTN_TQ;
    const int32_t n = (int32_t)(rows - r0 < FL_ATTN_TQ ? rows - r0 : FL_ATTN_TQ);
    fl_attn_tile_reset(t, n);
    for (int32_t lane = 0; lane < n; lane++) {
        const int64_t i = (r0 + lane) / r->group, h = (int64_t)hk * r->group + (r0 + lane) % r->group;
        int64_t lo, hi;
        fl_attn_row_range(i, lq, lk, a->causal, a->window, &lo, &hi);
        fl_attn_tile_set_lane(t, lane, a->q + (q0 + i) * r->qs + h * hd, r->scale, lo, hi);
    }
    if (lk > 0) {
        const size_t off = (size_t)(k0 * r->ks + (int64_t)hk * hd) * r->kv_elem;
        const size_t offv = (size_t)(k0 * r->vs + (int64_t)hk * hd) * r->kv_elem;
        fl_attn_tile_update(t, (const char *)a->k + off, r->ks, (const char *)a->v + offv, r->vs, a->kv_type, lk, 0);
    }
    for (int32_t lane = 0; lane < n; lane++) {
        const int64_t i = (r0 + lane) / r->group, h = (int64_t)hk * r->group + (r0 + lane) % r->group;
        fl_attn_tile_get_lane(t, lane, a->out + (q0 + i) * r->os + h * hd,
                              a->lse ? &a->lse[(q0 + i) * a->n_head + h] : NULL);
    }
}

static void flash_task(void *p, int ith, int nth) {
    flash_ctx *c = p;
    (void)nth;
    fl_attn_tile t;
    fl_attn_tile_bind(&t, c->scratch + (size_t)ith * c->tile_bytes, c->a->head_dim);
    const int64_t n_items = c->item_off[c->a->n_seq];
    int32_t s = 0;
    for (long it; (it = atomic_fetch_add(&c->next, 1)) < n_items;) {
        while (c->item_off[s + 1] <= it) s++; /* items are handed out in increasing order */
        flash_item(c, &t, s, it - c->item_off[s]);
    }
}

size_t fl_attn_flash_workspace_bytes(int32_t n_seq, int32_t head_dim, int nth) {
    if (n_seq < 1 || head_dim <= 0 || head_dim % 8 || nth < 1) return 0;
    return up64(sizeof(int64_t) * (size_t)(n_seq + 1)) + fl_attn_tile_scratch_bytes(head_dim) * (size_t)nth;
}

size_t fl_attn_workspace_bytes(const fl_attn_args *a) { return fl_attn_flash_workspace_bytes(a->n_seq, a->head_dim, fl_threads_get()); }

fl_status fl_attn_forward_flash(const fl_attn_args *a) {
    fl_attn_res r;
    fl_status st = fl_attn_resolve(a, &r);
    if (st != FL_OK) return st;
    if (a->head_dim % 8)
        return fl_set_error(FL_ERR_UNSUPPORTED, "fl_attn_forward_flash: head_dim = %d is not a multiple of 8 "
                            "(fl_attn_forward falls back to the naive path)", a->head_dim);
    if (a->n_q == 0) return FL_OK;
    const int nth = fl_threads_get();
    flash_ctx c = {.a = a, .r = &r, .tile_bytes = fl_attn_tile_scratch_bytes(a->head_dim)};
    atomic_init(&c.next, 0);
    const size_t off_bytes = up64(sizeof(int64_t) * (size_t)(a->n_seq + 1));
    const size_t bytes = off_bytes + c.tile_bytes * (size_t)nth;
    char *work = a->work;
    if (work) { /* caller's workspace: no allocation */
        if (a->work_size < bytes || ((uintptr_t)work & 63))
            return fl_set_error(FL_ERR_INVALID, "fl_attn_forward_flash: workspace of %zu bytes at %p: need %zu bytes, "
                                "64-byte aligned (fl_attn_workspace_bytes)", a->work_size, (void *)work, bytes);
    } else if (!(work = fl_alloc(FL_MEM_SCRATCH, bytes, 64))) {
        return fl_attn_alloc_failed(__func__);
    }
    c.item_off = (int64_t *)(void *)work;
    c.scratch = work + off_bytes;
    c.item_off[0] = 0;
    for (int32_t s = 0; s < a->n_seq; s++) {
        int64_t q0, lq, k0, lk;
        fl_attn_seq(a, s, &q0, &lq, &k0, &lk);
        const int64_t tiles = (lq * r.group + FL_ATTN_TQ - 1) / FL_ATTN_TQ;
        c.item_off[s + 1] = c.item_off[s] + tiles * a->n_head_kv;
    }
    fl_parallel_n(flash_task, &c, nth);
    if (!a->work) fl_free(FL_MEM_SCRATCH, work, bytes);
    return FL_OK;
}
