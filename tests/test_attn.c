/* Tests for kernels/attn.h: flash (every ISA the CPU has) against the naive reference over many
 * shapes, masks, GQA ratios, packed batches and K/V types; micro-kernel parity; merge of
 * partials and the tile API in shuffled blocks; backward against finite differences in double
 * and against the naive backward; error reporting.  Errors are "max relative": max |got - ref|
 * over max |ref| of the whole output, < 1e-4 in f32. */
#include "test.h"

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"
#include "kernels/attn.h"
#include "kernels/dispatch.h"

#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}
static float rnd_f(void) { return (float)(rnd_u32() & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f; }

static float *tbuf(size_t n) { return fl_calloc(FL_MEM_MISC, n ? n : 1, sizeof(float)); }
static void tfree(float *p, size_t n) { fl_free(FL_MEM_MISC, p, (n ? n : 1) * sizeof(float)); }

static double max_rel(const float *ref, const float *got, int64_t n) {
    double m = 0, d = 0;
    for (int64_t i = 0; i < n; i++) {
        if (fabs(ref[i]) > m) m = fabs(ref[i]);
        double e = fabs((double)ref[i] - got[i]);
        if (e > d || isnan(e)) d = isnan(e) ? INFINITY : e;
    }
    return m > 0 ? d / m : d;
}

/* One test configuration. */
typedef struct tcase {
    int n_seq;
    int lq[16], lk[16];
    int n_head, n_head_kv, hd;
    bool causal;
    int window;
    int kv_type;
    int pad; /* extra elements per token row (strides) */
    float scale;
} tcase;

typedef struct tdata {
    fl_attn_args a;
    int32_t cuq[17], cuk[17];
    float *q, *out, *lse;
    void *k, *v;
    size_t nq_el, nkv_el, nout_el;
} tdata;

static void tdata_make(tdata *t, const tcase *c) {
    memset(t, 0, sizeof *t);
    t->cuq[0] = t->cuk[0] = 0;
    for (int s = 0; s < c->n_seq; s++) {
        t->cuq[s + 1] = t->cuq[s] + c->lq[s];
        t->cuk[s + 1] = t->cuk[s] + c->lk[s];
    }
    fl_attn_args *a = &t->a;
    a->n_seq = c->n_seq;
    a->cu_seqlens_q = c->n_seq > 1 ? t->cuq : NULL;
    a->cu_seqlens_k = c->n_seq > 1 ? t->cuk : NULL;
    a->n_q = t->cuq[c->n_seq];
    a->n_kv = t->cuk[c->n_seq];
    a->n_head = c->n_head, a->n_head_kv = c->n_head_kv, a->head_dim = c->hd;
    a->q_stride = (int64_t)c->n_head * c->hd + c->pad;
    a->out_stride = a->q_stride;
    a->k_stride = a->v_stride = (int64_t)c->n_head_kv * c->hd + c->pad;
    a->kv_type = c->kv_type;
    a->causal = c->causal, a->window = c->window, a->scale = c->scale;
    t->nq_el = (size_t)(a->n_q * a->q_stride);
    t->nkv_el = (size_t)(a->n_kv * a->k_stride);
    t->q = tbuf(t->nq_el);
    t->out = tbuf(t->nq_el);
    t->lse = tbuf((size_t)(a->n_q * c->n_head));
    const size_t esz = c->kv_type == FL_TYPE_F32 ? 4 : 2;
    t->k = fl_calloc(FL_MEM_MISC, t->nkv_el ? t->nkv_el : 1, esz);
    t->v = fl_calloc(FL_MEM_MISC, t->nkv_el ? t->nkv_el : 1, esz);
    for (size_t i = 0; i < t->nq_el; i++) t->q[i] = 2.0f * rnd_f();
    for (size_t i = 0; i < t->nkv_el; i++) {
        float kf = 2.0f * rnd_f(), vf = rnd_f();
        if (c->kv_type == FL_TYPE_F32) ((float *)t->k)[i] = kf, ((float *)t->v)[i] = vf;
        else if (c->kv_type == FL_TYPE_F16) ((uint16_t *)t->k)[i] = fl_f32_to_f16(kf), ((uint16_t *)t->v)[i] = fl_f32_to_f16(vf);
        else ((uint16_t *)t->k)[i] = fl_f32_to_bf16(kf), ((uint16_t *)t->v)[i] = fl_f32_to_bf16(vf);
    }
    a->q = t->q, a->k = t->k, a->v = t->v, a->out = t->out, a->lse = t->lse;
}

static void tdata_free(tdata *t, const tcase *c) {
    const size_t esz = c->kv_type == FL_TYPE_F32 ? 4 : 2;
    tfree(t->q, t->nq_el);
    tfree(t->out, t->nq_el);
    tfree(t->lse, (size_t)(t->a.n_q * c->n_head));
    fl_free(FL_MEM_MISC, t->k, (t->nkv_el ? t->nkv_el : 1) * esz);
    fl_free(FL_MEM_MISC, t->v, (t->nkv_el ? t->nkv_el : 1) * esz);
}

/* Naive vs flash on every ISA; the padding columns of out must stay untouched (sentinels). */
static void run_case(const tcase *c) {
    tdata t;
    tdata_make(&t, c);
    fl_attn_args a = t.a;
    const size_t nl = (size_t)(a.n_q * c->n_head);
    float *ref = tbuf(t.nq_el), *ref_lse = tbuf(nl);
    for (size_t i = 0; i < t.nq_el; i++) ref[i] = 12345.0f; /* sentinel in the row padding */
    a.out = ref, a.lse = ref_lse, a.impl = FL_ATTN_NAIVE;
    assert_int_equal(fl_attn_forward(&a), FL_OK);
    const fl_isa best = fl_isa_best();
    for (int isa = FL_ISA_REF; isa <= (int)best; isa++) {
        fl_isa_set((fl_isa)isa);
        for (size_t i = 0; i < t.nq_el; i++) t.out[i] = 12345.0f; /* sentinel */
        a.out = t.out, a.lse = t.lse, a.impl = FL_ATTN_AUTO;
        assert_int_equal(fl_attn_forward(&a), FL_OK);
        const double e = max_rel(ref, t.out, (int64_t)t.nq_el);
        double el = 0;
        for (size_t i = 0; i < nl; i++) {
            if (ref_lse[i] == -INFINITY || t.lse[i] == -INFINITY) {
                if (ref_lse[i] != t.lse[i]) el = INFINITY;
                continue;
            }
            double d = fabs((double)ref_lse[i] - t.lse[i]) / fmax(1.0, fabs(ref_lse[i]));
            if (d > el) el = d;
        }
        if (!(e < 1e-4) || !(el < 1e-4))
            fail_msg("isa %s seqs %d (lq0 %d lk0 %d) heads %d/%d hd %d causal %d window %d type %d: out err %.3g lse err %.3g",
                     fl_isa_name((fl_isa)isa), c->n_seq, c->lq[0], c->lk[0], c->n_head, c->n_head_kv, c->hd, c->causal,
                     c->window, c->kv_type, e, el);
        for (int64_t tk = 0; tk < a.n_q; tk++) /* padding of each row untouched */
            for (int p = 0; p < c->pad; p++) assert_true(t.out[tk * a.out_stride + (int64_t)c->n_head * c->hd + p] == 12345.0f);
    }
    fl_isa_set(best);
    tfree(ref, t.nq_el);
    tfree(ref_lse, nl);
    tdata_free(&t, c);
}

static void test_shapes_small(void **state) {
    (void)state;
    static const int lens[] = {1, 2, 7, 127};
    static const int hds[] = {8, 64, 80, 128};
    static const int groups[] = {1, 2, 4, 8};
    int n = 0;
    for (int li = 0; li < 4; li++)
        for (int hi = 0; hi < 4; hi++)
            for (int gi = 0; gi < 4; gi++, n++) {
                tcase c = {.n_seq = 1, .n_head_kv = 1 + (n % 3 == 0), .hd = hds[hi], .kv_type = FL_TYPE_F32};
                c.n_head = c.n_head_kv * groups[gi];
                c.lq[0] = c.lk[0] = lens[li];
                c.causal = n % 2 == 0;
                c.window = n % 5 == 1 ? 3 : 0;
                c.pad = n % 7 == 0 ? 8 : 0;
                run_case(&c);
            }
    fl_test_mem_zero();
}

static void test_shapes_long(void **state) {
    (void)state;
    tcase c1 = {.n_seq = 1, .lq = {1000}, .lk = {1000}, .n_head = 4, .n_head_kv = 1, .hd = 64, .causal = true};
    tcase c2 = {.n_seq = 1, .lq = {1000}, .lk = {1000}, .n_head = 2, .n_head_kv = 1, .hd = 80, .window = 100};
    tcase c3 = {.n_seq = 1, .lq = {1000}, .lk = {1000}, .n_head = 1, .n_head_kv = 1, .hd = 128, .causal = true, .window = 300};
    tcase c4 = {.n_seq = 1, .lq = {4096}, .lk = {4096}, .n_head = 1, .n_head_kv = 1, .hd = 64, .causal = true};
    tcase c5 = {.n_seq = 1, .lq = {4096}, .lk = {4096}, .n_head = 8, .n_head_kv = 1, .hd = 8, .causal = true, .window = 64};
    run_case(&c1);
    run_case(&c2);
    run_case(&c3);
    run_case(&c4);
    run_case(&c5);
    fl_test_mem_zero();
}

static void test_decode_and_chunks(void **state) {
    (void)state;
    /* decode (1 query against a long cache), a chunk of queries, more queries than keys */
    tcase c1 = {.n_seq = 1, .lq = {1}, .lk = {300}, .n_head = 8, .n_head_kv = 2, .hd = 64, .causal = true};
    tcase c2 = {.n_seq = 1, .lq = {17}, .lk = {100}, .n_head = 4, .n_head_kv = 4, .hd = 128, .causal = true, .window = 20};
    tcase c3 = {.n_seq = 1, .lq = {20}, .lk = {5}, .n_head = 2, .n_head_kv = 1, .hd = 16, .causal = true};
    tcase c4 = {.n_seq = 2, .lq = {3, 0}, .lk = {0, 9}, .n_head = 2, .n_head_kv = 1, .hd = 16}; /* empty pieces */
    run_case(&c1);
    run_case(&c2);
    run_case(&c3);
    run_case(&c4);
    /* rows that see nothing: out 0, lse -inf */
    tdata t;
    tdata_make(&t, &c3);
    assert_int_equal(fl_attn_forward(&t.a), FL_OK);
    for (int i = 0; i < 15; i++) {
        assert_true(t.lse[i * 2] == -INFINITY);
        assert_true(t.out[(int64_t)i * t.a.out_stride] == 0.0f);
    }
    assert_true(t.lse[15 * 2] > -INFINITY);
    tdata_free(&t, &c3);
    fl_test_mem_zero();
}

static void test_packed(void **state) {
    (void)state;
    tcase c = {.n_seq = 4, .lq = {37, 120, 8, 200}, .lk = {37, 120, 8, 200}, .n_head = 8, .n_head_kv = 2, .hd = 64,
               .causal = true};
    run_case(&c);
    c.causal = false;
    run_case(&c);
    for (int rep = 0; rep < 6; rep++) {
        tcase r = {.n_seq = 1 + (int)(rnd_u32() % 8), .n_head_kv = 1 + (int)(rnd_u32() % 2), .hd = 8 * (1 + (int)(rnd_u32() % 12))};
        r.n_head = r.n_head_kv * (1 << (rnd_u32() % 4));
        r.causal = rep % 2 == 0;
        r.window = rep % 3 == 0 ? 1 + (int)(rnd_u32() % 40) : 0;
        r.kv_type = rep == 4 ? FL_TYPE_F16 : rep == 5 ? FL_TYPE_BF16 : FL_TYPE_F32;
        r.pad = rep == 3 ? 16 : 0;
        for (int s = 0; s < r.n_seq; s++) {
            r.lk[s] = 1 + (int)(rnd_u32() % 150);
            r.lq[s] = rep % 2 ? r.lk[s] : 1 + (int)(rnd_u32() % (uint32_t)r.lk[s]);
        }
        run_case(&r);
    }
    /* no token attends across sequences: changing sequence 0's K/V leaves the others unchanged */
    tdata t;
    tdata_make(&t, &c);
    assert_int_equal(fl_attn_forward(&t.a), FL_OK);
    float *o1 = tbuf(t.nq_el);
    memcpy(o1, t.out, t.nq_el * sizeof(float));
    for (int64_t i = 0; i < 37 * t.a.k_stride; i++) ((float *)t.k)[i] += 1.0f, ((float *)t.v)[i] -= 1.0f;
    assert_int_equal(fl_attn_forward(&t.a), FL_OK);
    assert_true(memcmp(o1 + 37 * t.a.out_stride, t.out + 37 * t.a.out_stride, (t.nq_el - 37 * (size_t)t.a.out_stride) * 4) == 0);
    assert_true(memcmp(o1, t.out, 37 * (size_t)t.a.out_stride * 4) != 0);
    tfree(o1, t.nq_el);
    tdata_free(&t, &c);
    fl_test_mem_zero();
}

static void test_kv_types(void **state) {
    (void)state;
    for (int ty = 0; ty < 2; ty++) {
        tcase c = {.n_seq = 2, .lq = {50, 130}, .lk = {70, 130}, .n_head = 4, .n_head_kv = 2, .hd = 128, .causal = true,
                   .kv_type = ty ? FL_TYPE_BF16 : FL_TYPE_F16, .scale = 0.05f};
        run_case(&c);
        c.hd = 64, c.window = 33, c.pad = 8;
        run_case(&c);
    }
    fl_test_mem_zero();
}

/* Micro-kernels: each ISA against the scalar reference, with masked (-inf) scores. */
static void test_microkernels(void **state) {
    (void)state;
    const int hd = 80, nk = 45, nq = 48;
    float *qt = fl_alloc(FL_MEM_MISC, sizeof(float) * hd * FL_ATTN_TQ, 64);
    float *k = tbuf((size_t)nk * hd), *s0 = fl_alloc(FL_MEM_MISC, 4 * FL_ATTN_TK * FL_ATTN_TQ, 64);
    float *s1 = fl_alloc(FL_MEM_MISC, 4 * FL_ATTN_TK * FL_ATTN_TQ, 64);
    float *o0 = fl_alloc(FL_MEM_MISC, sizeof(float) * hd * FL_ATTN_TQ, 64);
    float *o1 = fl_alloc(FL_MEM_MISC, sizeof(float) * hd * FL_ATTN_TQ, 64);
    _Alignas(64) float m0[FL_ATTN_TQ], l0[FL_ATTN_TQ], a0[FL_ATTN_TQ], m1[FL_ATTN_TQ], l1[FL_ATTN_TQ], a1[FL_ATTN_TQ];
    for (int i = 0; i < hd * FL_ATTN_TQ; i++) qt[i] = rnd_f(), o0[i] = o1[i] = rnd_f();
    for (int i = 0; i < nk * hd; i++) k[i] = rnd_f();
    const fl_attn_kernels *ref = fl_attn_kernels_for(FL_ISA_REF);
    for (int isa = FL_ISA_AVX2; isa <= (int)fl_isa_best(); isa++) {
        const fl_attn_kernels *kk = fl_attn_kernels_for((fl_isa)isa);
        assert_non_null(kk);
        ref->qk(qt, nq, k, hd, nk, hd, s0);
        kk->qk(qt, nq, k, hd, nk, hd, s1);
        for (int j = 0; j < nk; j++)
            for (int i = 0; i < nq; i++) CHECK_NEAR(s0[j * FL_ATTN_TQ + i], s1[j * FL_ATTN_TQ + i], 1e-5);
        memcpy(s1, s0, 4 * FL_ATTN_TK * FL_ATTN_TQ); /* same scores into both softmaxes */
        for (int i = 0; i < nq; i++) {
            m0[i] = m1[i] = i % 4 == 0 ? -INFINITY : rnd_f();
            l0[i] = l1[i] = i % 4 == 0 ? 0.0f : 1.0f + rnd_f() * 0.5f;
            for (int j = 0; j < nk; j++)
                if ((i + j) % 3 == 0 || i % 8 == 1) s0[j * FL_ATTN_TQ + i] = s1[j * FL_ATTN_TQ + i] = -INFINITY;
        }
        ref->softmax(s0, nk, nq, m0, l0, a0);
        kk->softmax(s1, nk, nq, m1, l1, a1);
        for (int i = 0; i < nq; i++) {
            assert_true(m0[i] == m1[i]);
            CHECK_NEAR(a0[i], a1[i], 1e-6 * fmax(1, a0[i]));
            CHECK_NEAR(l0[i], l1[i], 1e-5 * fmax(1, l0[i]));
            for (int j = 0; j < nk; j++) CHECK_NEAR(s0[j * FL_ATTN_TQ + i], s1[j * FL_ATTN_TQ + i], 1e-6);
        }
        ref->pv(s0, nk, k, hd, hd, o0, nq, a0);
        kk->pv(s1, nk, k, hd, hd, o1, nq, a1);
        for (int d = 0; d < hd; d++)
            for (int i = 0; i < nq; i++) CHECK_NEAR(o0[d * FL_ATTN_TQ + i], o1[d * FL_ATTN_TQ + i], 1e-4);
    }
    fl_free(FL_MEM_MISC, qt, sizeof(float) * hd * FL_ATTN_TQ);
    tfree(k, (size_t)nk * hd);
    fl_free(FL_MEM_MISC, s0, 4 * FL_ATTN_TK * FL_ATTN_TQ);
    fl_free(FL_MEM_MISC, s1, 4 * FL_ATTN_TK * FL_ATTN_TQ);
    fl_free(FL_MEM_MISC, o0, sizeof(float) * hd * FL_ATTN_TQ);
    fl_free(FL_MEM_MISC, o1, sizeof(float) * hd * FL_ATTN_TQ);
    fl_test_mem_zero();
}

/* Split-K: two passes over disjoint key ranges merged == one pass over all keys. */
static void test_merge(void **state) {
    (void)state;
    tcase c = {.n_seq = 1, .lq = {33}, .lk = {257}, .n_head = 4, .n_head_kv = 2, .hd = 64};
    tdata t;
    tdata_make(&t, &c);
    assert_int_equal(fl_attn_forward(&t.a), FL_OK); /* full pass */
    const int64_t n = t.a.n_q * c.n_head, split = 100;
    float *oa = tbuf(t.nq_el), *ob = tbuf(t.nq_el), *la = tbuf((size_t)n), *lb = tbuf((size_t)n);
    fl_attn_args a = t.a;
    a.n_kv = split, a.out = oa, a.lse = la;
    assert_int_equal(fl_attn_forward(&a), FL_OK);
    a.n_kv = 257 - split, a.k = (const float *)t.k + split * a.k_stride, a.v = (const float *)t.v + split * a.v_stride;
    a.out = ob, a.lse = lb;
    assert_int_equal(fl_attn_forward(&a), FL_OK);
    fl_attn_merge(n, c.hd, oa, c.hd, la, ob, c.hd, lb, oa, c.hd, la); /* in place, rows of one head */
    assert_true(max_rel(t.out, oa, (int64_t)t.nq_el) < 1e-5);
    for (int64_t i = 0; i < n; i++) CHECK_NEAR(t.lse[i], la[i], 1e-5);
    /* merging with an empty partial (lse -inf) is the identity */
    for (int64_t i = 0; i < n; i++) lb[i] = -INFINITY;
    fl_attn_merge(n, c.hd, oa, c.hd, la, ob, c.hd, lb, ob, c.hd, lb);
    assert_true(max_rel(oa, ob, (int64_t)t.nq_el) < 1e-6);
    tfree(oa, t.nq_el), tfree(ob, t.nq_el), tfree(la, (size_t)n), tfree(lb, (size_t)n);
    tdata_free(&t, &c);
    fl_test_mem_zero();
}

/* The exposed tile API fed with shuffled blocks of 16 keys (as a paged kernel would) equals
 * the contiguous pass, causal + window. */
static void test_tile_blocks(void **state) {
    (void)state;
    const int lq = 40, lk = 200, hd = 64, bs = 16, nb = (lk + bs - 1) / bs;
    tcase c = {.n_seq = 1, .lq = {lq}, .lk = {lk}, .n_head = 1, .n_head_kv = 1, .hd = hd, .causal = true, .window = 90};
    tdata t;
    tdata_make(&t, &c);
    assert_int_equal(fl_attn_forward(&t.a), FL_OK);
    const size_t sb = fl_attn_tile_scratch_bytes(hd);
    void *scratch = fl_alloc(FL_MEM_SCRATCH, sb, 64);
    fl_attn_tile tile;
    fl_attn_tile_bind(&tile, scratch, hd);
    fl_attn_tile_reset(&tile, lq);
    for (int i = 0; i < lq; i++) {
        int64_t lo, hi;
        fl_attn_row_range(i, lq, lk, true, 90, &lo, &hi);
        fl_attn_tile_set_lane(&tile, i, t.q + i * hd, 1.0f / sqrtf((float)hd), lo, hi);
    }
    int order[16];
    for (int b = 0; b < nb; b++) order[b] = b;
    for (int b = nb - 1; b > 0; b--) {
        int x = (int)(rnd_u32() % (uint32_t)(b + 1)), tmp = order[b];
        order[b] = order[x], order[x] = tmp;
    }
    for (int b = 0; b < nb; b++) {
        const int j0 = order[b] * bs, n = lk - j0 < bs ? lk - j0 : bs;
        fl_attn_tile_update(&tile, (const float *)t.k + j0 * hd, hd, (const float *)t.v + j0 * hd, hd, FL_TYPE_F32, n, j0);
    }
    float row[64], l;
    for (int i = 0; i < lq; i++) {
        fl_attn_tile_get_lane(&tile, i, row, &l);
        CHECK_NEAR(l, t.lse[i], 1e-5);
        assert_true(max_rel(t.out + i * hd, row, hd) < 1e-4);
    }
    fl_free(FL_MEM_SCRATCH, scratch, sb);
    tdata_free(&t, &c);
    fl_test_mem_zero();
}

/* ---- backward ---- */

/* loss = sum(dout . attn(q, k, v)) in double, naive, same masks (for finite differences). */
static double loss_double(const fl_attn_args *a, const double *q, const double *k, const double *v, const float *dout) {
    const int nh = a->n_head, hd = a->head_dim, g = a->n_head / a->n_head_kv, nkv = a->n_head_kv;
    const double scale = 1.0 / sqrt((double)hd);
    double loss = 0, *sc = malloc(sizeof(double) * (size_t)(a->n_kv > 0 ? a->n_kv : 1));
    for (int s = 0; s < a->n_seq; s++) {
        const int q0 = a->cu_seqlens_q ? a->cu_seqlens_q[s] : 0, k0 = a->cu_seqlens_k ? a->cu_seqlens_k[s] : 0;
        const int lq = (a->cu_seqlens_q ? a->cu_seqlens_q[s + 1] : (int)a->n_q) - q0;
        const int lk = (a->cu_seqlens_k ? a->cu_seqlens_k[s + 1] : (int)a->n_kv) - k0;
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < lq; i++) {
                int64_t lo, hi;
                fl_attn_row_range(i, lq, lk, a->causal, a->window, &lo, &hi);
                double mx = -INFINITY, sum = 0;
                for (int64_t j = lo; j <= hi; j++) {
                    double d = 0;
                    for (int e = 0; e < hd; e++) d += q[((q0 + i) * nh + h) * hd + e] * k[((k0 + j) * nkv + h / g) * hd + e];
                    sc[j] = d * scale;
                    if (sc[j] > mx) mx = sc[j];
                }
                for (int64_t j = lo; j <= hi; j++) sum += exp(sc[j] - mx);
                for (int64_t j = lo; j <= hi; j++) {
                    const double p = exp(sc[j] - mx) / sum;
                    for (int e = 0; e < hd; e++)
                        loss += p * v[((k0 + j) * nkv + h / g) * hd + e] * dout[((q0 + i) * nh + h) * hd + e];
                }
            }
    }
    free(sc);
    return loss;
}

static void check_fd(const tcase *c) {
    tdata t;
    tdata_make(&t, c);
    fl_attn_args *a = &t.a;
    assert_int_equal(fl_attn_forward(a), FL_OK);
    const size_t nq = t.nq_el, nkv = t.nkv_el;
    float *dout = tbuf(nq), *dq = tbuf(nq), *dk = tbuf(nkv), *dv = tbuf(nkv);
    for (size_t i = 0; i < nq; i++) dout[i] = rnd_f();
    assert_int_equal(fl_attn_backward(a, dout, 0, dq, dk, dv), FL_OK);
    double *qd = malloc(sizeof(double) * nq), *kd = malloc(sizeof(double) * nkv), *vd = malloc(sizeof(double) * nkv);
    for (size_t i = 0; i < nq; i++) qd[i] = t.q[i];
    for (size_t i = 0; i < nkv; i++) kd[i] = ((float *)t.k)[i], vd[i] = ((float *)t.v)[i];
    const double h = 1e-5;
    double *xs[3] = {qd, kd, vd};
    const float *gs[3] = {dq, dk, dv};
    const size_t ns[3] = {nq, nkv, nkv};
    for (int w = 0; w < 3; w++) {
        double gmax = 0, emax = 0;
        for (size_t i = 0; i < ns[w]; i++) {
            const double x0 = xs[w][i];
            xs[w][i] = x0 + h;
            const double lp = loss_double(a, qd, kd, vd, dout);
            xs[w][i] = x0 - h;
            const double lm = loss_double(a, qd, kd, vd, dout);
            xs[w][i] = x0;
            const double fd = (lp - lm) / (2 * h);
            gmax = fmax(gmax, fabs(fd));
            emax = fmax(emax, fabs(fd - gs[w][i]));
        }
        if (!(emax <= 1e-4 * fmax(gmax, 1e-3))) fail_msg("grad %d: max err %.3g vs max |grad| %.3g", w, emax, gmax);
    }
    free(qd), free(kd), free(vd);
    tfree(dout, nq), tfree(dq, nq), tfree(dk, nkv), tfree(dv, nkv);
    tdata_free(&t, c);
}

static void test_backward_fd(void **state) {
    (void)state;
    tcase c1 = {.n_seq = 1, .lq = {5}, .lk = {7}, .n_head = 4, .n_head_kv = 2, .hd = 8, .causal = true};
    tcase c2 = {.n_seq = 2, .lq = {4, 6}, .lk = {4, 9}, .n_head = 2, .n_head_kv = 1, .hd = 16, .causal = true, .window = 3};
    tcase c3 = {.n_seq = 1, .lq = {6}, .lk = {6}, .n_head = 2, .n_head_kv = 2, .hd = 8};
    check_fd(&c1);
    check_fd(&c2);
    check_fd(&c3);
    fl_test_mem_zero();
}

static void test_backward_vs_naive(void **state) {
    (void)state;
    tcase cs[3] = {
        {.n_seq = 4, .lq = {37, 120, 8, 200}, .lk = {37, 120, 8, 200}, .n_head = 8, .n_head_kv = 2, .hd = 64, .causal = true},
        {.n_seq = 2, .lq = {30, 90}, .lk = {100, 90}, .n_head = 4, .n_head_kv = 1, .hd = 80, .causal = true, .window = 25},
        {.n_seq = 1, .lq = {70}, .lk = {130}, .n_head = 2, .n_head_kv = 2, .hd = 128},
    };
    for (int ci = 0; ci < 3; ci++) {
        tdata t;
        tdata_make(&t, &cs[ci]);
        assert_int_equal(fl_attn_forward(&t.a), FL_OK);
        const size_t nq = t.nq_el, nkv = t.nkv_el;
        float *dout = tbuf(nq), *g[6];
        for (int w = 0; w < 6; w++) g[w] = tbuf(w % 3 ? nkv : nq);
        for (size_t i = 0; i < nq; i++) dout[i] = rnd_f();
        assert_int_equal(fl_attn_backward(&t.a, dout, 0, g[0], g[1], g[2]), FL_OK);
        assert_int_equal(fl_attn_backward_naive(&t.a, dout, 0, g[3], g[4], g[5]), FL_OK);
        for (int w = 0; w < 3; w++) {
            double e = max_rel(g[w + 3], g[w], (int64_t)(w ? nkv : nq));
            if (!(e < 1e-4)) fail_msg("case %d grad %d: max rel err %.3g", ci, w, e);
        }
        tfree(dout, nq);
        for (int w = 0; w < 6; w++) tfree(g[w], w % 3 ? nkv : nq);
        tdata_free(&t, &cs[ci]);
    }
    fl_test_mem_zero();
}

static void test_errors(void **state) {
    (void)state;
    tcase c = {.n_seq = 2, .lq = {3, 4}, .lk = {3, 4}, .n_head = 4, .n_head_kv = 2, .hd = 16};
    tdata t;
    tdata_make(&t, &c);
    fl_attn_args a = t.a;
    assert_int_equal(fl_attn_forward(&a), FL_OK);
    a.n_head_kv = 3;
    assert_int_equal(fl_attn_forward(&a), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "multiple of n_head_kv"));
    a = t.a, a.head_dim = 12, a.q_stride = a.out_stride = 0, a.k_stride = a.v_stride = 0;
    assert_int_equal(fl_attn_forward(&a), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "head_dim"));
    int32_t bad[3] = {0, 5, 4};
    a = t.a, a.cu_seqlens_q = bad;
    assert_int_equal(fl_attn_forward(&a), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "not increasing"));
    int32_t bad2[3] = {0, 3, 6};
    a = t.a, a.cu_seqlens_k = bad2;
    assert_int_equal(fl_attn_forward(&a), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "ends at 6"));
    a = t.a, a.q_stride = 10;
    assert_int_equal(fl_attn_forward(&a), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "stride"));
    a = t.a, a.kv_type = FL_TYPE_Q8_0;
    assert_int_equal(fl_attn_forward(&a), FL_ERR_UNSUPPORTED);
    a = t.a, a.cu_seqlens_k = NULL;
    assert_int_equal(fl_attn_forward(&a), FL_ERR_INVALID);
    a = t.a;
    static float g[3][7 * 4 * 16];
    assert_int_equal(fl_attn_backward(&a, t.out, 0, g[0], g[1], g[2]), FL_OK);
    a.lse = NULL;
    assert_int_equal(fl_attn_backward(&a, t.out, 0, g[0], g[1], g[2]), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "lse"));
    /* scratch refused by a budget: clean error, nothing leaked */
    fl_mem_set_budget(FL_MEM_SCRATCH, 16);
    a = t.a;
    assert_int_equal(fl_attn_forward(&a), FL_ERR_BUDGET);
    a.impl = FL_ATTN_NAIVE;
    assert_int_equal(fl_attn_forward(&a), FL_ERR_BUDGET);
    fl_mem_set_budget(FL_MEM_SCRATCH, 0);
    tdata_free(&t, &c);
    fl_test_mem_zero();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_microkernels),   cmocka_unit_test(test_shapes_small),
        cmocka_unit_test(test_shapes_long),    cmocka_unit_test(test_decode_and_chunks),
        cmocka_unit_test(test_packed),         cmocka_unit_test(test_kv_types),
        cmocka_unit_test(test_merge),          cmocka_unit_test(test_tile_blocks),
        cmocka_unit_test(test_backward_fd),    cmocka_unit_test(test_backward_vs_naive),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
