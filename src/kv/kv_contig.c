/* Contiguous KV cache (see kv_contig.h). */
#include "kv/kv_contig.h"
#include "core/alloc.h"
#include "core/status.h"
#include "core/threads.h"
#include "core/dtype.h"
#include "kernels/convert.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"


#include <math.h>
#include <string.h>

struct fl_kv_contig {
    fl_kv_contig_params p;
    unsigned char *k, *v; /* [n_layer][n_seq_max][n_ctx][n_head_kv * head_dim] each, inside block */
    size_t esize;         /* bytes per element: 2 (f16) or 4 (f32) */
    unsigned char *block;
    size_t bytes;
    int32_t *len;       /* [n_seq_max] */
};

size_t fl_kv_contig_bytes(const fl_kv_contig_params *p) {
    if (p->n_layer < 1 || p->n_head_kv < 1 || p->head_dim < 1 || p->n_ctx < 1 || p->n_seq_max < 1) return 0;
    if (p->type != FL_TYPE_F16 && p->type != FL_TYPE_F32) return 0;
    const size_t es = p->type == FL_TYPE_F16 ? 2 : 4;
    double d = 2.0 * p->n_layer * p->n_seq_max * (double)p->n_ctx * p->n_head_kv * p->head_dim * (double)es;
    if (d > (double)SIZE_MAX / 2) return 0;
    return 2 * (size_t)p->n_layer * (size_t)p->n_seq_max * (size_t)p->n_ctx * (size_t)p->n_head_kv *
           (size_t)p->head_dim * es;
}

fl_status fl_kv_contig_new(const fl_kv_contig_params *p, fl_kv_contig **out) {
    *out = NULL;
    const size_t bytes = fl_kv_contig_bytes(p);
    if (!bytes || p->n_head < p->n_head_kv || p->n_head % p->n_head_kv || p->n_swa < 0)
        return fl_set_error(FL_ERR_INVALID, "%s: bad parameters (n_ctx %d, n_seq_max %d, heads %d/%d)", __func__,
                            p->n_ctx, p->n_seq_max, p->n_head, p->n_head_kv);
    fl_kv_contig *kv = fl_calloc(FL_MEM_MISC, 1, sizeof *kv);
    if (!kv) return FL_ERR_NOMEM;
    kv->p = *p;
    kv->len = fl_calloc(FL_MEM_MISC, (size_t)p->n_seq_max, sizeof *kv->len);
    kv->block = fl_alloc(FL_MEM_KV, bytes, 64);
    if (!kv->len || !kv->block) {
        fl_status st = fl_last_error()[0] && strstr(fl_last_error(), "budget") ? FL_ERR_BUDGET : FL_ERR_NOMEM;
        fl_kv_contig_free(kv);
        return st;
    }
    memset(kv->block, 0, bytes); /* every page now, as llama.cpp clears its cache buffer (and as the engine's paged pool is) */
    kv->bytes = bytes;
    kv->esize = p->type == FL_TYPE_F16 ? 2 : 4;
    kv->k = kv->block;
    kv->v = kv->block + bytes / 2;
    *out = kv;
    return FL_OK;
}

void fl_kv_contig_free(fl_kv_contig *kv) {
    if (!kv) return;
    if (kv->block) fl_free(FL_MEM_KV, kv->block, kv->bytes);
    if (kv->len) fl_free(FL_MEM_MISC, kv->len, (size_t)kv->p.n_seq_max * sizeof *kv->len);
    fl_free(FL_MEM_MISC, kv, sizeof *kv);
}

void fl_kv_contig_seq_clear(fl_kv_contig *kv, int32_t seq) {
    if (seq >= 0 && seq < kv->p.n_seq_max) kv->len[seq] = 0;
}

void fl_kv_contig_clear(fl_kv_contig *kv) { memset(kv->len, 0, (size_t)kv->p.n_seq_max * sizeof *kv->len); }

int32_t fl_kv_contig_seq_len(const fl_kv_contig *kv, int32_t seq) {
    return seq >= 0 && seq < kv->p.n_seq_max ? kv->len[seq] : 0;
}

/* Element offset of (layer il, sequence s, kv head hk, position pos) in k or v: each head's
 * positions are contiguous, [head_dim] floats apart, so attention reads a tile of keys at once. */
static inline size_t slot(const fl_kv_contig *kv, int32_t il, int32_t s, int64_t hk, int32_t pos) {
    const fl_kv_contig_params *p = &kv->p;
    return ((((size_t)il * (size_t)p->n_seq_max + (size_t)s) * (size_t)p->n_head_kv + (size_t)hk) * (size_t)p->n_ctx +
            (size_t)pos) * (size_t)p->head_dim;
}

static fl_status kv_prepare(void *ctx, const fl_batch *b) {
    fl_kv_contig *kv = ctx;
    for (int32_t i = 0; i < b->n_tokens; i++) {
        const int32_t s = b->seq_id[i], pos = b->pos[i];
        if (s < 0 || s >= kv->p.n_seq_max)
            return fl_set_error(FL_ERR_INVALID, "kv_contig: sequence %d outside [0, %d)", s, kv->p.n_seq_max);
        if (pos >= kv->p.n_ctx)
            return fl_set_error(FL_NO_KV_SPACE, "kv_contig: position %d of sequence %d exceeds the context of %d", pos,
                                s, kv->p.n_ctx);
        const bool first = i == 0 || b->seq_id[i - 1] != s;
        if (first && pos > kv->len[s])
            return fl_set_error(FL_ERR_INVALID, "kv_contig: sequence %d has %d positions; batch starts at %d", s,
                                kv->len[s], pos);
        if (!first && pos != b->pos[i - 1] + 1)
            return fl_set_error(FL_ERR_INVALID, "kv_contig: sequence %d: position %d leaves a gap after %d", s, pos,
                                b->pos[i - 1]);
    }
    for (int32_t i = 0; i < b->n_tokens; i++)
        if (i == b->n_tokens - 1 || b->seq_id[i + 1] != b->seq_id[i]) kv->len[b->seq_id[i]] = b->pos[i] + 1;
    return FL_OK;
}

static void kv_store(void *ctx, int32_t il, const fl_batch *b, const float *k, const float *v) {
    fl_kv_contig *kv = ctx;
    const int64_t HKV = kv->p.n_head_kv, D = kv->p.head_dim;
    const fl_convert_kernels *cv = fl_convert_kernels_get();
    for (int32_t i = 0; i < b->n_tokens; i++)
        for (int64_t hk = 0; hk < HKV; hk++) {
            const size_t o = slot(kv, il, b->seq_id[i], hk, b->pos[i]) * kv->esize;
            const float *ks = k + ((size_t)i * (size_t)HKV + (size_t)hk) * (size_t)D;
            const float *vs = v + ((size_t)i * (size_t)HKV + (size_t)hk) * (size_t)D;
            if (kv->esize == 2) {
                cv->f32_to_f16(ks, (uint16_t *)(kv->k + o), D);
                cv->f32_to_f16(vs, (uint16_t *)(kv->v + o), D);
            } else {
                memcpy(kv->k + o, ks, (size_t)D * sizeof(float));
                memcpy(kv->v + o, vs, (size_t)D * sizeof(float));
            }
        }
}

typedef struct attend_task {
    const fl_kv_contig *kv;
    int32_t il;
    const fl_batch *b;
    const float *q;
    float *out;
} attend_task;

/* Keys/values [j0, j0 + n) of head hk as f32 rows of head_dim: the stored rows themselves
 * (f32) or expanded into buf (f16, one SIMD conversion for the whole tile). */
static inline const float *kv_tile(const fl_kv_contig *kv, const unsigned char *base, int32_t il, int32_t s, int64_t hk,
                                   int32_t j0, int32_t n, float *buf, const fl_convert_kernels *cv) {
    const size_t e = slot(kv, il, s, hk, j0) * kv->esize;
    if (kv->esize == 4) return (const float *)(base + e);
    cv->f16_to_f32((const uint16_t *)(base + e), buf, (int64_t)n * kv->p.head_dim);
    return buf;
}

/* Keys per tile: about 8 KiB of f32 per K and V tile on the stack. */
#define TILE_FLOATS 2048
/* Scores kept per query row on the stack by the f16 path; longer rows recompute them. */
#define SCORE_ROW 4096

/* f32 K/V: out[t][h] = sum_j softmax_j(q[t][h] . k[j][h/g] * scale) v[j][h/g], online (one
 * pass): running max mx, running denominator l, accumulator out rescaled when mx grows.  Keys
 * and values are read in tiles of TILE_FLOATS / head_dim positions. */
static void attend_f32(const attend_task *t, int64_t i, int64_t h, float *o, float *kb, float *vb) {
    const fl_kv_contig *kv = t->kv;
    const int64_t H = kv->p.n_head, D = kv->p.head_dim, hk = h / (H / kv->p.n_head_kv);
    const int32_t TK = D >= TILE_FLOATS ? 1 : (int32_t)(TILE_FLOATS / D);
    const int32_t s = t->b->seq_id[i], pos = t->b->pos[i];
    const int32_t start = kv->p.n_swa > 0 && pos - kv->p.n_swa + 1 > 0 ? pos - kv->p.n_swa + 1 : 0;
    const float scale = 1.0f / sqrtf((float)D);
    const fl_ops_kernels *ops = fl_ops_kernels_get();
    const fl_convert_kernels *cv = fl_convert_kernels_get();
    const float *q = t->q + (i * H + h) * D;
    memset(o, 0, (size_t)D * sizeof(float));
    float mx = -INFINITY, l = 0.0f;
    for (int32_t j0 = start; j0 <= pos; j0 += TK) {
        const int32_t n = pos + 1 - j0 < TK ? pos + 1 - j0 : TK;
        const float *kt = kv_tile(kv, kv->k, t->il, s, hk, j0, n, kb, cv);
        const float *vt = kv_tile(kv, kv->v, t->il, s, hk, j0, n, vb, cv);
        for (int32_t j = 0; j < n; j++) {
            const float sc = ops->dot(q, kt + (size_t)j * (size_t)D, D) * scale;
            if (sc > mx) {
                const float c = expf(mx - sc); /* 0 on the first key */
                l *= c;
                ops->scale(o, c, D);
                mx = sc;
            }
            const float e = expf(sc - mx);
            l += e;
            ops->axpy(o, e, vt + (size_t)j * (size_t)D, D);
        }
    }
    ops->scale(o, 1.0f / l, D);
}

/* Sum of 16 lanes in the order of _mm512_reduce_add_ps (halves, then quarters, ...). */
static inline float lane_sum16(const float *x) {
    float a[8];
    for (int l = 0; l < 8; l++) a[l] = x[l] + x[l + 8];
    for (int l = 0; l < 4; l++) a[l] = a[l] + a[l + 4];
    return (a[0] + a[2]) + (a[1] + a[3]);
}


/* f16 K/V: the arithmetic of llama.cpp's CPU attention without flash attention, so that the
 * contiguous f16 cache reproduces its logits:
 *   q rounded to f16 (its f16 K . q product); s_j = (q . k_j) * scale, the dot in its order
 *   (fl_mm_dot_f16vals); e_j = fl_expf_poly(s_j - max) (its 16-lane softmax exp over the
 *   16-aligned cache row); sum = the e_j of each 16-position group added in f32 lane order, the
 *   groups in double; p_j = e_j * (float)(1 / sum), rounded to f16 (its f16 V . p product);
 *   out = sum_j p_j v_j with one accumulator per position mod 16, reduced in lane order (its
 *   tinyBLAS GEMM).
 * Scores of rows up to SCORE_ROW keys are kept on the stack; longer rows recompute them per
 * pass.  acc: [16][head_dim] scratch. */
static void attend_f16(const attend_task *t, int64_t i, int64_t h, float *o, float *kb, float *vb, float *srow,
                       float *acc) {
    const fl_kv_contig *kv = t->kv;
    const int64_t H = kv->p.n_head, D = kv->p.head_dim, hk = h / (H / kv->p.n_head_kv);
    const int32_t TK = D >= TILE_FLOATS ? 1 : (int32_t)(TILE_FLOATS / D);
    const int32_t s = t->b->seq_id[i], pos = t->b->pos[i];
    const int32_t start = kv->p.n_swa > 0 && pos - kv->p.n_swa + 1 > 0 ? pos - kv->p.n_swa + 1 : 0;
    const int32_t n_all = pos + 1 - start;
    const bool keep = n_all <= SCORE_ROW;
    const float scale = 1.0f / sqrtf((float)D);
    const fl_ops_kernels *ops = fl_ops_kernels_get();
    const fl_convert_kernels *cv = fl_convert_kernels_get();
    float qb[D], lanes[16];
    uint16_t qh[D];
    cv->f32_to_f16(t->q + (i * H + h) * D, qh, D);
    cv->f16_to_f32(qh, qb, D);
    float mx = -INFINITY, inv = 0.0f;
    double sum = 0;
    memset(acc, 0, 16 * (size_t)D * sizeof(float));
    memset(lanes, 0, sizeof lanes);
    if (keep) {
        /* scores, their max; exponentials (one vector call); the sum by 16-position groups;
         * p rounded to f16 by row conversions; then p . V */
        for (int32_t j0 = start; j0 <= pos; j0 += TK) {
            const int32_t n = pos + 1 - j0 < TK ? pos + 1 - j0 : TK;
            const float *kt = kv_tile(kv, kv->k, t->il, s, hk, j0, n, kb, cv);
            for (int32_t j = 0; j < n; j++) {
                const float sc = fl_mm_dot_f16vals(qb, kt + (size_t)j * (size_t)D, D) * scale;
                srow[j0 - start + j] = sc;
                mx = sc > mx ? sc : mx;
            }
        }
        for (int32_t j = 0; j < n_all; j++) srow[j] -= mx;
        ops->expf_poly(srow, srow, n_all);
        for (int32_t j = 0; j < n_all; j++) {
            const int32_t lane = (start + j) % 16;
            lanes[lane] = srow[j];
            if (lane == 15 || j == n_all - 1) {
                sum += (double)lane_sum16(lanes);
                memset(lanes, 0, sizeof lanes);
            }
        }
        inv = (float)(1.0 / sum);
        ops->scale(srow, inv, n_all);
        fl_round_f16_row(srow, srow, n_all);
        for (int32_t j0 = start; j0 <= pos; j0 += TK) {
            const int32_t n = pos + 1 - j0 < TK ? pos + 1 - j0 : TK;
            const float *vt = kv_tile(kv, kv->v, t->il, s, hk, j0, n, vb, cv);
            for (int32_t j = 0; j < n; j++)
                ops->axpy(acc + (size_t)((j0 + j) % 16) * (size_t)D, srow[j0 - start + j], vt + (size_t)j * (size_t)D, D);
        }
    } else {
        /* long rows: three sweeps that recompute the scores (0: max, 1: sum, 2: p . V) */
        for (int pass = 0; pass < 3; pass++) {
            if (pass == 2) inv = (float)(1.0 / sum);
            for (int32_t j0 = start; j0 <= pos; j0 += TK) {
                const int32_t n = pos + 1 - j0 < TK ? pos + 1 - j0 : TK;
                const float *kt = kv_tile(kv, kv->k, t->il, s, hk, j0, n, kb, cv);
                const float *vt = pass == 2 ? kv_tile(kv, kv->v, t->il, s, hk, j0, n, vb, cv) : NULL;
                for (int32_t j = 0; j < n; j++) {
                    const int32_t jj = j0 + j, lane = jj % 16;
                    const float sc = fl_mm_dot_f16vals(qb, kt + (size_t)j * (size_t)D, D) * scale;
                    if (pass == 0) mx = sc > mx ? sc : mx;
                    else if (pass == 1) {
                        lanes[lane] = fl_expf_poly(sc - mx);
                        if (lane == 15 || jj == pos) {
                            sum += (double)lane_sum16(lanes);
                            memset(lanes, 0, sizeof lanes);
                        }
                    } else
                        ops->axpy(acc + (size_t)lane * (size_t)D, fl_f16_to_f32(fl_f32_to_f16(fl_expf_poly(sc - mx) * inv)),
                                  vt + (size_t)j * (size_t)D, D);
                }
            }
        }
    }
    for (int64_t d = 0; d < D; d++) {
        for (int l = 0; l < 16; l++) lanes[l] = acc[(size_t)l * (size_t)D + (size_t)d];
        o[d] = lane_sum16(lanes);
    }
}

static void attend_fn(void *p, int ith, int nth) {
    const attend_task *t = p;
    const fl_kv_contig *kv = t->kv;
    const int64_t H = kv->p.n_head, D = kv->p.head_dim;
    const int32_t TK = D >= TILE_FLOATS ? 1 : (int32_t)(TILE_FLOATS / D);
    const bool f16 = kv->esize == 2;
    float kb[(size_t)TK * (size_t)D], vb[(size_t)TK * (size_t)D], srow[f16 ? SCORE_ROW : 1], acc[f16 ? 16 * D : 1];
    int64_t lo, hi;
    fl_split_range((int64_t)t->b->n_tokens * H, ith, nth, &lo, &hi);
    for (int64_t u = lo; u < hi; u++) {
        float *o = t->out + u * D;
        if (f16) attend_f16(t, u / H, u % H, o, kb, vb, srow, acc);
        else attend_f32(t, u / H, u % H, o, kb, vb);
    }
}

static void kv_attend(void *ctx, int32_t il, const fl_batch *b, const float *q, float *out) {
    attend_task t = {ctx, il, b, q, out};
    const fl_kv_contig *kv = ctx;
    if ((int64_t)b->n_tokens * kv->p.n_head < 8) attend_fn(&t, 0, 1);
    else fl_parallel(attend_fn, &t);
}

static const fl_kv_iface contig_iface = {kv_prepare, kv_store, kv_attend};

const fl_kv_iface *fl_kv_contig_iface(void) { return &contig_iface; }
