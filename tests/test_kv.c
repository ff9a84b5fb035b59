/* Tests for src/kv: block pool invariants, prefix caching + LRU, paged attention vs contiguous
 * attention, quantised KV, the prepare/store/attend path on a fake model, sliding window,
 * shift with RoPE re-rotation, swap, memory accounting. */
#include "test.h"

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"
#include "core/threads.h"
#include "kernels/convert.h"
#include "kernels/dispatch.h"
#include "kv/block_pool.h"
#include "kv/kv_cache.h"
#include "kv/kv_quant.h"
#include "kv/paged_attn.h"

#include <stdlib.h>
#include <string.h>

/* ---- helpers ---- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static void rng_seed(uint64_t s) { rng_state = s * 0x9E3779B97F4A7C15ull + 1; }
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}
static float rndf(void) { return (float)((double)rnd() / 4294967296.0 * 2.0 - 1.0); } /* [-1, 1] */
static void fill(float *x, size_t n, float amp) {
    for (size_t i = 0; i < n; i++) x[i] = amp * rndf();
}

static float *falloc(size_t n) { return fl_calloc(FL_MEM_MISC, n, sizeof(float)); }
static void ffree(float *p, size_t n) { fl_free(FL_MEM_MISC, p, n * sizeof(float)); }

/* Causal attention of one query row (n_head x hd) at position p over contiguous K/V
 * [n][n_head_kv][hd], in double: the oracle every paged path is compared with. */
static void attn_contig(const float *q, const float *K, const float *V, int32_t p, int32_t n_head, int32_t n_head_kv,
                        int32_t hd, int32_t window, float *out) {
    const int32_t g = n_head / n_head_kv, lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int32_t h = 0; h < n_head; h++) {
        const int32_t kh = h / g;
        double mx = -INFINITY, l = 0, acc[512] = {0};
        for (int32_t j = lo; j <= p; j++) {
            double s = 0;
            for (int32_t d = 0; d < hd; d++) s += (double)q[h * hd + d] * K[((size_t)j * n_head_kv + kh) * hd + d];
            if (s * scale > mx) mx = s * scale;
        }
        for (int32_t j = lo; j <= p; j++) {
            double s = 0;
            for (int32_t d = 0; d < hd; d++) s += (double)q[h * hd + d] * K[((size_t)j * n_head_kv + kh) * hd + d];
            const double e = exp(s * scale - mx);
            l += e;
            for (int32_t d = 0; d < hd; d++) acc[d] += e * V[((size_t)j * n_head_kv + kh) * hd + d];
        }
        for (int32_t d = 0; d < hd; d++) out[h * hd + d] = (float)(acc[d] / l);
    }
}

/* 'normal' RoPE of one row (all kv heads) at position p. */
static void rope_row(float *x, int32_t n_head_kv, int32_t hd, int32_t n_rot, float base, int32_t p) {
    for (int32_t h = 0; h < n_head_kv; h++)
        for (int32_t i = 0; i < n_rot / 2; i++) {
            const double th = p * pow(base, -2.0 * i / n_rot);
            float *e = x + h * hd + 2 * i;
            const float x0 = e[0], x1 = e[1], c = (float)cos(th), s = (float)sin(th);
            e[0] = x0 * c - x1 * s;
            e[1] = x0 * s + x1 * c;
        }
}

static fl_kv_config small_cfg(int32_t type, int32_t bs, int32_t n_blocks) {
    fl_kv_config c = {0};
    c.n_layer = 2;
    c.n_head = 4;
    c.n_head_kv = 2;
    c.head_dim = 16;
    c.type = type;
    c.block_size = bs;
    c.n_blocks = n_blocks;
    c.n_seq_max = 16;
    c.prefix_cache = true;
    return c;
}

/* ---- block pool ---- */

static void test_pool_random_ops(void **state) {
    (void)state;
    rng_seed(1);
    enum { NB = 48 };
    fl_kv_pool *p = fl_kv_pool_new(NB);
    assert_non_null(p);
    assert_null(fl_kv_pool_new(1));
    int32_t ref[NB] = {0};
    int32_t held[4096];
    int n_held = 0;
    for (int op = 0; op < 20000; op++) {
        const uint32_t r = rnd() % 10;
        if (r < 4) { /* alloc */
            const int32_t id = fl_kv_pool_alloc(p);
            if (id < 0) {
                assert_int_equal(fl_kv_pool_n_free(p), 0);
            } else {
                assert_true(id > 0 && id < NB);
                assert_int_equal(ref[id], 0);
                ref[id] = 1;
                held[n_held++] = id;
            }
        } else if (r < 6 && n_held) { /* fork: another reference */
            const int32_t id = held[rnd() % n_held];
            fl_kv_pool_ref(p, id);
            ref[id]++;
            if (n_held < 4096) held[n_held++] = id;
            else { fl_kv_pool_unref(p, id); ref[id]--; }
        } else if (r < 9 && n_held) { /* free */
            const int k = (int)(rnd() % n_held);
            const int32_t id = held[k];
            held[k] = held[--n_held];
            fl_kv_pool_unref(p, id);
            ref[id]--;
        } else if (n_held) { /* register a hash (prefix cache), sometimes a duplicate */
            const int32_t id = held[rnd() % n_held];
            fl_kv_hash h = {rnd() % 64, 7};
            const bool had = fl_kv_pool_has_hash(p, id);
            const int32_t other = fl_kv_pool_lookup(p, &h);
            const bool ok = fl_kv_pool_set_hash(p, id, &h);
            assert_int_equal(ok, !had && other < 0);
            if (ok) assert_int_equal(fl_kv_pool_lookup(p, &h), id);
        }
        if (op % 97 == 0 && n_held) { /* revive a free cached block, as a prefix hit does */
            for (int32_t id = 1; id < NB; id++)
                if (ref[id] == 0 && fl_kv_pool_has_hash(p, id)) {
                    fl_kv_pool_ref(p, id);
                    ref[id] = 1;
                    held[n_held++] = id;
                    break;
                }
        }
        assert_int_equal(fl_kv_pool_check(p), FL_OK);
        int32_t used = 0;
        for (int32_t id = 1; id < NB; id++) {
            assert_int_equal(fl_kv_pool_refcount(p, id), ref[id]);
            used += ref[id] > 0;
        }
        assert_int_equal(fl_kv_pool_n_used(p), used);
        assert_int_equal(fl_kv_pool_n_free(p) + fl_kv_pool_n_used(p), NB - 1);
    }
    assert_true(fl_kv_pool_evictions(p) > 0);
    while (n_held) fl_kv_pool_unref(p, held[--n_held]);
    assert_int_equal(fl_kv_pool_n_free(p), NB - 1);
    assert_int_equal(fl_kv_pool_check(p), FL_OK);
    fl_kv_pool_free(p);
    fl_test_mem_zero();
}

static void test_pool_lru_order(void **state) {
    (void)state;
    fl_kv_pool *p = fl_kv_pool_new(5); /* blocks 1..4 */
    int32_t a = fl_kv_pool_alloc(p), b = fl_kv_pool_alloc(p), c = fl_kv_pool_alloc(p), d = fl_kv_pool_alloc(p);
    assert_int_equal(fl_kv_pool_alloc(p), -1);
    fl_kv_hash ha = {1, 1}, hb = {2, 2};
    assert_true(fl_kv_pool_set_hash(p, a, &ha));
    assert_true(fl_kv_pool_set_hash(p, b, &hb));
    fl_kv_pool_unref(p, b); /* cached: tail */
    fl_kv_pool_unref(p, a); /* cached: tail, after b */
    fl_kv_pool_unref(p, c); /* uncached: head */
    /* uncached c first, then the least recently freed cached block b, then a */
    assert_int_equal(fl_kv_pool_alloc(p), c);
    assert_int_equal(fl_kv_pool_evictions(p), 0);
    assert_int_equal(fl_kv_pool_alloc(p), b);
    assert_int_equal(fl_kv_pool_evictions(p), 1);
    assert_int_equal(fl_kv_pool_lookup(p, &hb), -1);
    assert_int_equal(fl_kv_pool_lookup(p, &ha), a); /* still reusable */
    fl_kv_pool_ref(p, a);                           /* revived by a hit */
    assert_int_equal(fl_kv_pool_n_free(p), 0);
    assert_int_equal(fl_kv_pool_check(p), FL_OK);
    (void)d;
    fl_kv_pool_free(p);
    fl_test_mem_zero();
}

/* ---- paged kernel vs contiguous ---- */

/* Fill a paged layer from contiguous K/V [n][n_row] through a shuffled block table. */
typedef struct paged_fix {
    fl_paged_kv kv;
    uint8_t *k, *v;
    size_t bytes;
    int32_t *blocks;
    int32_t n_blocks;
} paged_fix;

static void paged_fix_init(paged_fix *f, const float *K, const float *V, int32_t n, int32_t bs, int32_t nkv, int32_t hd, int32_t pool_blocks) {
    memset(f, 0, sizeof *f);
    f->n_blocks = (n + bs - 1) / bs;
    assert_true(pool_blocks >= f->n_blocks);
    const size_t row = (size_t)nkv * hd * 4;
    f->kv = (fl_paged_kv){.type = FL_TYPE_F32, .block_size = bs, .n_head_kv = nkv, .head_dim = hd, .row_bytes = row, .block_bytes = row * bs};
    f->bytes = (size_t)pool_blocks * f->kv.block_bytes;
    f->k = fl_calloc(FL_MEM_MISC, f->bytes, 1);
    f->v = fl_calloc(FL_MEM_MISC, f->bytes, 1);
    f->blocks = fl_calloc(FL_MEM_MISC, (size_t)pool_blocks, sizeof(int32_t));
    /* a random permutation of ids 1..pool_blocks */
    int32_t perm[1024];
    for (int32_t i = 0; i < pool_blocks; i++) perm[i] = i + 1;
    for (int32_t i = pool_blocks - 1; i > 0; i--) {
        const int32_t j = (int32_t)(rnd() % (uint32_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int32_t b = 0; b < f->n_blocks; b++) f->blocks[b] = perm[b];
    for (int32_t j = 0; j < n; j++) {
        const size_t o = (size_t)(f->blocks[j / bs] - 1) * f->kv.block_bytes + (size_t)(j % bs) * row;
        memcpy(f->k + o, K + (size_t)j * nkv * hd, row);
        memcpy(f->v + o, V + (size_t)j * nkv * hd, row);
    }
    f->kv.k = f->k;
    f->kv.v = f->v;
}

static void paged_fix_deinit(paged_fix *f, int32_t pool_blocks) {
    fl_free(FL_MEM_MISC, f->k, f->bytes);
    fl_free(FL_MEM_MISC, f->v, f->bytes);
    fl_free(FL_MEM_MISC, f->blocks, sizeof(int32_t) * (size_t)pool_blocks);
}

static void check_paged_case(int32_t n, int32_t n_q, int32_t bs, int32_t n_head, int32_t nkv, int32_t hd, int32_t window, int32_t part_blocks) {
    const int32_t pool_blocks = (n + bs - 1) / bs + 3;
    const size_t nrow = (size_t)nkv * hd;
    float *K = falloc((size_t)n * nrow), *V = falloc((size_t)n * nrow);
    float *Q = falloc((size_t)n_q * n_head * hd), *O = falloc((size_t)n_q * n_head * hd + 16);
    for (int i = 0; i < 16; i++) O[(size_t)n_q * n_head * hd + i] = 12345.0f; /* sentinels */
    float *R = falloc((size_t)n_q * n_head * hd), *N = falloc((size_t)n_q * n_head * hd);
    fill(K, (size_t)n * nrow, 2.0f);
    fill(V, (size_t)n * nrow, 1.0f);
    fill(Q, (size_t)n_q * n_head * hd, 2.0f);
    paged_fix f;
    paged_fix_init(&f, K, V, n, bs, nkv, hd, pool_blocks);
    fl_paged_seq sq = {.q0 = 0, .n_q = n_q, .pos0 = n - n_q, .blocks = f.blocks};
    fl_paged_attn_params pp = {.n_head = n_head, .scale = 1.0f / sqrtf((float)hd), .window = window, .part_blocks = part_blocks};
    const size_t wsb = fl_paged_attn_ws_size(&f.kv, &sq, 1, &pp, fl_threads_get());
    void *ws = fl_alloc(FL_MEM_SCRATCH, wsb, 64);
    fl_paged_attn(&f.kv, &sq, 1, &pp, Q, O, ws);
    fl_paged_attn_naive(&f.kv, &sq, 1, &pp, Q, N);
    for (int32_t r = 0; r < n_q; r++)
        attn_contig(Q + (size_t)r * n_head * hd, K, V, n - n_q + r, n_head, nkv, hd, window, R + (size_t)r * n_head * hd);
    const double d1 = fl_test_max_abs_diff(R, O, (int64_t)n_q * n_head * hd);
    const double d2 = fl_test_max_abs_diff(R, N, (int64_t)n_q * n_head * hd);
    if (d1 > 1e-5 || d2 > 1e-5)
        fail_msg("n %d n_q %d bs %d heads %d/%d hd %d window %d parts %d: flash %.3g naive %.3g", n, n_q, bs, n_head, nkv, hd, window, part_blocks, d1, d2);
    for (int i = 0; i < 16; i++) assert_true(O[(size_t)n_q * n_head * hd + i] == 12345.0f);
    const int32_t g = n_head / nkv;
    if (g >= 2) { /* the heads of each KV group reversed: every head's output bits move with it
                   * (the AVX-512 path takes heads in pairs and an odd one alone) */
        float *Qp = falloc((size_t)n_q * n_head * hd), *Op = falloc((size_t)n_q * n_head * hd);
        for (int32_t r = 0; r < n_q; r++)
            for (int32_t h = 0; h < n_head; h++) {
                const int32_t hp = (h / g) * g + (g - 1 - h % g);
                memcpy(Qp + ((size_t)r * n_head + hp) * hd, Q + ((size_t)r * n_head + h) * hd, sizeof(float) * (size_t)hd);
            }
        fl_paged_attn(&f.kv, &sq, 1, &pp, Qp, Op, ws);
        for (int32_t r = 0; r < n_q; r++)
            for (int32_t h = 0; h < n_head; h++) {
                const int32_t hp = (h / g) * g + (g - 1 - h % g);
                if (memcmp(Op + ((size_t)r * n_head + hp) * hd, O + ((size_t)r * n_head + h) * hd, sizeof(float) * (size_t)hd))
                    fail_msg("n %d n_q %d bs %d heads %d/%d: row %d head %d differs when heads are reordered", n, n_q, bs, n_head, nkv, r, h);
            }
        ffree(Qp, (size_t)n_q * n_head * hd);
        ffree(Op, (size_t)n_q * n_head * hd);
    }
    fl_free(FL_MEM_SCRATCH, ws, wsb);
    paged_fix_deinit(&f, pool_blocks);
    ffree(K, (size_t)n * nrow);
    ffree(V, (size_t)n * nrow);
    const size_t qn = (size_t)n_q * n_head * hd;
    ffree(Q, qn);
    ffree(O, qn + 16);
    ffree(R, qn);
    ffree(N, qn);
}

/* Whether sequence `one`'s rows of a batch's output O are what it gets alone (into A). */
static bool same_alone(const fl_paged_kv *kv, const fl_paged_seq *one, const fl_paged_attn_params *pp, int nth, const float *Q, const float *O,
                       float *A, size_t qrow) {
    const size_t wb1 = fl_paged_attn_ws_size(kv, one, 1, pp, nth);
    void *w1 = fl_alloc(FL_MEM_SCRATCH, wb1, 64);
    fl_paged_attn(kv, one, 1, pp, Q, A, w1);
    fl_free(FL_MEM_SCRATCH, w1, wb1);
    return !memcmp(A + (size_t)one->q0 * qrow, O + (size_t)one->q0 * qrow, sizeof(float) * (size_t)one->n_q * qrow);
}

/* Several sequences of a few rows each at a long context (speculative drafts, the last tokens
 * of prompts): split-K's partial states stay within what n_seq decodes at that context take
 * (the planner's bound, plan_engine.c: max_seqs x the partitions of a whole context; before the
 * limit this batch took 3x it), each sequence's rows have the bits they get alone (where it
 * takes split-K) whichever path the batch gives it, and they match the naive reference. */
static void test_paged_split_budget(void **state) {
    (void)state;
    rng_seed(5);
    const int32_t n = 100, bs = 16, n_head = 8, nkv = 2, hd = 16, nb = (n + bs - 1) / bs + 3, ns = 4;
    const int32_t nq[4] = {4, 4, 1, 3};
    const size_t nrow = (size_t)nkv * hd, qrow = (size_t)n_head * hd;
    float *K = falloc((size_t)n * nrow), *V = falloc((size_t)n * nrow), *Q = falloc(12 * qrow), *O = falloc(12 * qrow),
          *A = falloc(12 * qrow), *N = falloc(12 * qrow);
    fill(K, (size_t)n * nrow, 2.0f);
    fill(V, (size_t)n * nrow, 1.0f);
    fill(Q, 12 * qrow, 2.0f);
    paged_fix f;
    paged_fix_init(&f, K, V, n, bs, nkv, hd, nb);
    fl_paged_attn_params pp = {.n_head = n_head, .scale = 0.25f, .part_blocks = 1}; /* 7 partitions */
    fl_paged_seq sq[4], dec[4];
    for (int32_t s = 0, q0 = 0; s < ns; q0 += nq[s], s++) {
        sq[s] = (fl_paged_seq){.q0 = q0, .n_q = nq[s], .pos0 = n - nq[s], .blocks = f.blocks};
        dec[s] = (fl_paged_seq){.q0 = s, .n_q = 1, .pos0 = n - 1, .blocks = f.blocks};
    }
    for (int nth = 1; nth <= 2; nth++) {
        fl_threads_set(nth);
        const size_t wsb = fl_paged_attn_ws_size(&f.kv, sq, ns, &pp, nth), bound = fl_paged_attn_ws_size(&f.kv, dec, ns, &pp, nth);
        if (wsb > bound) fail_msg("nth %d: workspace %zu > %zu, what %d decodes at this context take", nth, wsb, bound, ns);
        void *ws = fl_alloc(FL_MEM_SCRATCH, wsb, 64);
        fl_paged_attn(&f.kv, sq, ns, &pp, Q, O, ws);
        fl_paged_attn_naive(&f.kv, sq, ns, &pp, Q, N);
        const double d = fl_test_max_abs_diff(O, N, 12 * (int64_t)qrow);
        if (d > 1e-5) fail_msg("nth %d: against the naive reference %.3g", nth, d);
        for (int32_t s = 0; s < ns; s++) { /* alone (nq <= 4 and 7 partitions: split-K) */
            if (!same_alone(&f.kv, &sq[s], &pp, nth, Q, O, A, qrow)) fail_msg("nth %d: sequence %d's rows differ from its rows alone", nth, s);
        }
        fl_free(FL_MEM_SCRATCH, ws, wsb);
    }
    fl_threads_set(0);
    paged_fix_deinit(&f, nb);
    ffree(K, (size_t)n * nrow);
    ffree(V, (size_t)n * nrow);
    ffree(Q, 12 * qrow);
    ffree(O, 12 * qrow);
    ffree(A, 12 * qrow);
    ffree(N, 12 * qrow);
}

/* Decode rows of sequences at different lengths, K/V in f32 and f16 (the AVX-512 block loader
 * for 16-row blocks of 64 dims): a batch gives each row the bits it gets alone, whether the
 * call's work items take one kv head each (a sequence alone at a short context, or split in
 * fewer partitions than two per thread) or all four (the batch: each block's rows read whole),
 * on 1, 2 and 4 threads; and the naive reference agrees. */
static void test_paged_kv_heads_per_item(void **state) {
    (void)state;
    const int32_t bs = 16, nkv = 4, hd = 64, n_head = 16, n = 300, ns = 4, nb = (n + bs - 1) / bs + 3;
    const int32_t len[4] = {40, 23, 300, 71};
    const int32_t types[2] = {FL_TYPE_F32, FL_TYPE_F16};
    const size_t nrow = (size_t)nkv * hd, qrow = (size_t)n_head * hd;
    for (int t = 0; t < 2; t++) {
        rng_seed(31 + (uint32_t)t);
        float *K = falloc((size_t)n * nrow), *V = falloc((size_t)n * nrow), *Q = falloc(ns * qrow), *O = falloc(ns * qrow),
              *A = falloc(ns * qrow), *N = falloc(ns * qrow);
        fill(K, (size_t)n * nrow, 2.0f);
        fill(V, (size_t)n * nrow, 1.0f);
        fill(Q, ns * qrow, 2.0f);
        paged_fix f;
        paged_fix_init(&f, K, V, n, bs, nkv, hd, nb);
        if (types[t] == FL_TYPE_F16) { /* the same rows in f16, in place (the halves after the first are left as they were) */
            for (size_t i = 0; i < f.bytes / 4; i++) {
                float a, b;
                memcpy(&a, f.k + 4 * i, 4);
                memcpy(&b, f.v + 4 * i, 4);
                const uint16_t ha = fl_f32_to_f16(a), hb = fl_f32_to_f16(b);
                memcpy(f.k + 2 * i, &ha, 2);
                memcpy(f.v + 2 * i, &hb, 2);
            }
            f.kv.type = FL_TYPE_F16;
            f.kv.row_bytes = nrow * 2;
            f.kv.block_bytes = f.kv.row_bytes * (size_t)bs;
        }
        fl_paged_attn_params pp = {.n_head = n_head, .scale = 0.125f, .part_blocks = 4}; /* 300 tokens: 5 partitions */
        fl_paged_seq sq[4];
        for (int32_t s = 0; s < ns; s++) sq[s] = (fl_paged_seq){.q0 = s, .n_q = 1, .pos0 = len[s] - 1, .blocks = f.blocks};
        fl_paged_attn_naive(&f.kv, sq, ns, &pp, Q, N);
        for (int nth = 1; nth <= 4; nth *= 2) {
            fl_threads_set(nth);
            const size_t wsb = fl_paged_attn_ws_size(&f.kv, sq, ns, &pp, nth);
            void *ws = fl_alloc(FL_MEM_SCRATCH, wsb, 64);
            fl_paged_attn(&f.kv, sq, ns, &pp, Q, O, ws);
            const double d = fl_test_max_abs_diff(O, N, ns * (int64_t)qrow);
            if (d > 1e-5) fail_msg("%s nth %d: against the naive reference %.3g", fl_type_name(types[t]), nth, d);
            for (int32_t s = 0; s < ns; s++) {
                memset(A, 0, sizeof(float) * ns * qrow);
                if (!same_alone(&f.kv, &sq[s], &pp, nth, Q, O, A, qrow))
                    fail_msg("%s nth %d: sequence %d (%d tokens) differs from its row alone", fl_type_name(types[t]), nth, s, len[s]);
            }
            fl_free(FL_MEM_SCRATCH, ws, wsb);
        }
        fl_threads_set(0);
        paged_fix_deinit(&f, nb);
        ffree(K, (size_t)n * nrow);
        ffree(V, (size_t)n * nrow);
        ffree(Q, ns * qrow);
        ffree(O, ns * qrow);
        ffree(A, ns * qrow);
        ffree(N, ns * qrow);
    }
    fl_test_mem_zero();
}

static void test_paged_vs_contiguous(void **state) {
    (void)state;
    rng_seed(2);
    /* n, n_q, bs, n_head, n_head_kv, hd, window, part_blocks */
    for (int isa = FL_ISA_REF; isa <= (int)fl_isa_best(); isa++) /* every variant the CPU has */
    for (int nth = 1; nth <= 3; nth += 2) { /* 1 thread, and 3 threads on whatever cores */
    fl_isa_set((fl_isa)isa);
    fl_threads_set(nth);
    check_paged_case(1, 1, 16, 4, 2, 8, 0, 16);      /* single token */
    check_paged_case(37, 37, 16, 4, 2, 8, 0, 16);    /* whole prefill, partial last block */
    check_paged_case(100, 20, 16, 8, 2, 16, 0, 2);   /* chunk against cached blocks, several partitions */
    check_paged_case(100, 1, 16, 8, 2, 16, 0, 2);    /* decode, split-K */
    check_paged_case(129, 3, 8, 6, 3, 32, 0, 3);     /* split-K, 3 queries, odd partitions */
    check_paged_case(77, 5, 5, 4, 4, 12, 0, 1);      /* odd block size, MHA, one block per partition */
    check_paged_case(90, 30, 16, 4, 1, 64, 20, 2);   /* sliding window, MQA */
    check_paged_case(90, 1, 4, 4, 2, 16, 9, 2);      /* window in decode */
    check_paged_case(70, 40, 16, 6, 2, 64, 0, 16);   /* groups of 3 heads (a pair and one alone), hd 64 */
    check_paged_case(45, 3, 16, 14, 2, 64, 0, 1);    /* groups of 7 (four, a pair, one), split-K decode */
    }
    fl_threads_set(0);
    fl_isa_set(fl_isa_best());
    fl_test_mem_zero();
}

/* ---- the cache through its interface ---- */

/* Keeps the full f32 K/V history of each (sequence, layer) for the oracle. */
typedef struct history {
    float *k[16][4], *v[16][4];
    int32_t n[16];
    int32_t cap, n_row;
} history;

static void hist_init(history *h, int32_t cap, int32_t n_row, int32_t n_seq, int32_t n_layer) {
    memset(h, 0, sizeof *h);
    h->cap = cap;
    h->n_row = n_row;
    for (int32_t s = 0; s < n_seq; s++)
        for (int32_t l = 0; l < n_layer; l++) {
            h->k[s][l] = falloc((size_t)cap * n_row);
            h->v[s][l] = falloc((size_t)cap * n_row);
        }
}
static void hist_free(history *h) {
    for (int s = 0; s < 16; s++)
        for (int l = 0; l < 4; l++)
            if (h->k[s][l]) {
                ffree(h->k[s][l], (size_t)h->cap * h->n_row);
                ffree(h->v[s][l], (size_t)h->cap * h->n_row);
            }
}

/* One step of a fake model: for the batch (seq ids/positions given), random K/V/Q per layer,
 * store + attend, compare every row with attn_contig over the history.  Returns max diff. */
static double fake_step(fl_kv_cache *kv, history *H, int32_t n_tok, const int32_t *seq_id, const int32_t *tokens, int32_t window) {
    const fl_kv_config *c = fl_kv_config_get(kv);
    const int32_t nrow = c->n_head_kv * c->head_dim, qrow = c->n_head * c->head_dim;
    int32_t pos[256];
    for (int32_t i = 0; i < n_tok; i++) pos[i] = H->n[seq_id[i]] + (i > 0 && seq_id[i - 1] == seq_id[i] ? pos[i - 1] - H->n[seq_id[i]] + 1 : 0);
    fl_batch b = {.n_tokens = n_tok, .tokens = tokens, .pos = pos, .seq_id = seq_id};
    const fl_kv_iface iface = fl_kv_iface_get(); /* the way the model's forward calls it */
    fl_status st = iface.prepare(kv, &b);
    if (st != FL_OK) fail_msg("prepare: %s %s", fl_status_str(st), fl_last_error());
    float *k = falloc((size_t)n_tok * nrow), *v = falloc((size_t)n_tok * nrow);
    float *q = falloc((size_t)n_tok * qrow), *o = falloc((size_t)n_tok * qrow), *r = falloc((size_t)qrow);
    double md = 0;
    for (int32_t il = 0; il < c->n_layer; il++) {
        fill(k, (size_t)n_tok * nrow, 1.5f);
        fill(v, (size_t)n_tok * nrow, 1.0f);
        fill(q, (size_t)n_tok * qrow, 1.5f);
        for (int32_t i = 0; i < n_tok; i++) {
            memcpy(H->k[seq_id[i]][il] + (size_t)pos[i] * nrow, k + (size_t)i * nrow, sizeof(float) * nrow);
            memcpy(H->v[seq_id[i]][il] + (size_t)pos[i] * nrow, v + (size_t)i * nrow, sizeof(float) * nrow);
        }
        iface.store(kv, il, &b, k, v);
        iface.attend(kv, il, &b, q, o);
        for (int32_t i = 0; i < n_tok; i++) {
            attn_contig(q + (size_t)i * qrow, H->k[seq_id[i]][il], H->v[seq_id[i]][il], pos[i], c->n_head, c->n_head_kv, c->head_dim, window, r);
            const double d = fl_test_max_abs_diff(r, o + (size_t)i * qrow, qrow);
            if (d > md) md = d;
        }
    }
    for (int32_t i = 0; i < n_tok; i++)
        if (i + 1 == n_tok || seq_id[i + 1] != seq_id[i]) H->n[seq_id[i]] = pos[i] + 1;
    ffree(k, (size_t)n_tok * nrow);
    ffree(v, (size_t)n_tok * nrow);
    ffree(q, (size_t)n_tok * qrow);
    ffree(o, (size_t)n_tok * qrow);
    ffree(r, (size_t)qrow);
    return md;
}

static void copy_hist(history *H, int32_t dst, int32_t src, int32_t n_layer) {
    for (int32_t l = 0; l < n_layer; l++) {
        memcpy(H->k[dst][l], H->k[src][l], sizeof(float) * (size_t)H->n[src] * H->n_row);
        memcpy(H->v[dst][l], H->v[src][l], sizeof(float) * (size_t)H->n[src] * H->n_row);
    }
    H->n[dst] = H->n[src];
}

static void test_fake_model(void **state) {
    (void)state;
    rng_seed(3);
    fl_kv_config c = small_cfg(FL_TYPE_F32, 8, 64);
    c.part_tokens = 16; /* several partitions: split-K in decode */
    fl_kv_cache *kv = fl_kv_new(&c);
    assert_non_null(kv);
    history H;
    hist_init(&H, 256, c.n_head_kv * c.head_dim, 4, c.n_layer);
    int32_t sid[256], tok[256];
    for (int i = 0; i < 256; i++) tok[i] = (int32_t)(rnd() % 1000);
    for (int s = 0; s < 3; s++) assert_int_equal(fl_kv_seq_add(kv, s, tok, 0, NULL), FL_OK);
    /* prefill: seq 0 gets 21 tokens, seq 1 gets 9, seq 2 gets 3, one batch */
    int32_t n = 0;
    for (int i = 0; i < 21; i++) sid[n++] = 0;
    for (int i = 0; i < 9; i++) sid[n++] = 1;
    for (int i = 0; i < 3; i++) sid[n++] = 2;
    assert_true(fake_step(kv, &H, n, sid, tok, 0) < 1e-5);
    /* second prefill chunk for seq 2 + decode for 0 and 1 */
    n = 0;
    sid[n++] = 0;
    for (int i = 0; i < 30; i++) sid[n++] = 2;
    sid[n++] = 1;
    assert_true(fake_step(kv, &H, n, sid, tok, 0) < 1e-5);
    /* fork seq 1 (partial last block shared) into 3; both decode: copy-on-write */
    assert_int_equal(fl_kv_seq_fork(kv, 1, 3), FL_OK);
    copy_hist(&H, 3, 1, c.n_layer);
    for (int step = 0; step < 12; step++) {
        int32_t d[4] = {0, 1, 2, 3};
        assert_true(fake_step(kv, &H, 4, d, tok, 0) < 1e-5);
        assert_int_equal(fl_kv_check(kv), FL_OK);
    }
    fl_kv_stats st;
    fl_kv_stats_get(kv, &st);
    assert_true(st.cow_copies >= 1);
    for (int s = 0; s < 4; s++) assert_int_equal(fl_kv_seq_len(kv, s), H.n[s]);
    /* a batch that does not fit changes nothing */
    for (int s = 0; s < 4; s++) fl_kv_seq_free(kv, s);
    assert_int_equal(fl_kv_seq_add(kv, 0, tok, 0, NULL), FL_OK);
    int32_t big_sid[256], big_pos[256];
    for (int i = 0; i < 256; i++) big_sid[i] = 0, big_pos[i] = i;
    fl_batch bb = {.n_tokens = 256, .tokens = tok, .pos = big_pos, .seq_id = big_sid};
    c.n_blocks = 64;
    fl_kv_stats before, after;
    fl_kv_stats_get(kv, &before);
    bb.n_tokens = 63 * 8 + 1 > 256 ? 256 : 63 * 8 + 1; /* 256 tokens = 32 blocks: fits */
    assert_int_equal(fl_kv_prepare(kv, &bb), FL_OK);
    assert_int_equal(fl_kv_seq_add(kv, 1, tok, 0, NULL), FL_OK);
    for (int i = 0; i < 256; i++) big_sid[i] = 1;
    fl_kv_stats_get(kv, &before);
    /* seq 1 needs 32 more blocks, only 31 are left */
    assert_int_equal(fl_kv_prepare(kv, &bb), FL_NO_KV_SPACE);
    fl_kv_stats_get(kv, &after);
    assert_int_equal(before.n_blocks_used, after.n_blocks_used);
    assert_int_equal(fl_kv_seq_len(kv, 1), 0);
    /* bad batches are errors */
    big_pos[0] = 5;
    assert_int_equal(fl_kv_prepare(kv, &bb), FL_ERR_INVALID);
    assert_int_equal(fl_kv_check(kv), FL_OK);
    fl_kv_free(kv);
    hist_free(&H);
    fl_test_mem_zero();
}

/* Random sequence operations on the cache; invariants after each. */
static void test_kv_random_ops(void **state) {
    (void)state;
    rng_seed(4);
    fl_kv_config c = small_cfg(FL_TYPE_F16, 4, 40);
    c.n_layer = 1;
    fl_kv_cache *kv = fl_kv_new(&c);
    assert_non_null(kv);
    int32_t prompts[3][40];
    for (int p = 0; p < 3; p++)
        for (int i = 0; i < 40; i++) prompts[p][i] = p * 100 + i % 7;
    const int32_t nrow = c.n_head_kv * c.head_dim, qrow = c.n_head * c.head_dim;
    float *k = falloc(64 * (size_t)nrow), *v = falloc(64 * (size_t)nrow), *q = falloc(64 * (size_t)qrow), *o = falloc(64 * (size_t)qrow);
    fill(k, 64 * (size_t)nrow, 1);
    fill(v, 64 * (size_t)nrow, 1);
    fill(q, 64 * (size_t)qrow, 1);
    int n_ok = 0, n_full = 0;
    for (int op = 0; op < 3000; op++) {
        const int32_t s = (int32_t)(rnd() % c.n_seq_max);
        const uint32_t r = rnd() % 10;
        if (r < 2 && !fl_kv_seq_exists(kv, s)) {
            const int p = (int)(rnd() % 3);
            const int32_t n = 1 + (int32_t)(rnd() % 39);
            int32_t nc;
            assert_int_equal(fl_kv_seq_add(kv, s, prompts[p], n, &nc), FL_OK);
            assert_true(nc < n && nc % 4 == 0);
            /* prefill the rest */
            int32_t sid[64], pos[64];
            for (int32_t i = nc; i < n; i++) sid[i - nc] = s, pos[i - nc] = i;
            fl_batch b = {.n_tokens = n - nc, .tokens = prompts[p] + nc, .pos = pos, .seq_id = sid};
            const fl_status st = fl_kv_prepare(kv, &b);
            assert_true(st == FL_OK || st == FL_NO_KV_SPACE);
            if (st == FL_OK) {
                fl_kv_store(kv, 0, &b, k, v);
                fl_kv_attend(kv, 0, &b, q, o);
                n_ok++;
            } else {
                n_full++;
                fl_kv_seq_free(kv, s);
            }
        } else if (r < 5 && fl_kv_seq_exists(kv, s) && !fl_kv_seq_swapped(kv, s)) { /* decode a token */
            int32_t sid[1] = {s}, pos[1] = {fl_kv_seq_len(kv, s)}, t[1] = {(int32_t)(rnd() % 5)};
            fl_batch b = {.n_tokens = 1, .tokens = t, .pos = pos, .seq_id = sid};
            const fl_status st = fl_kv_prepare(kv, &b);
            assert_true(st == FL_OK || st == FL_NO_KV_SPACE);
            if (st == FL_OK) {
                fl_kv_store(kv, 0, &b, k, v);
                fl_kv_attend(kv, 0, &b, q, o);
            }
        } else if (r < 6 && fl_kv_seq_exists(kv, s)) {
            const int32_t d = (int32_t)(rnd() % c.n_seq_max);
            const fl_status st = fl_kv_seq_fork(kv, s, d);
            assert_true(st == FL_OK || fl_kv_seq_exists(kv, d) || fl_kv_seq_swapped(kv, s));
        } else if (r < 8) {
            fl_kv_seq_free(kv, s);
        } else if (r < 9 && fl_kv_seq_exists(kv, s)) {
            if (fl_kv_seq_swapped(kv, s)) {
                const fl_status st = fl_kv_seq_swap_in(kv, s);
                assert_true(st == FL_OK || st == FL_NO_KV_SPACE);
            } else {
                assert_int_equal(fl_kv_seq_swap_out(kv, s), FL_OK);
            }
        } else if (fl_kv_seq_exists(kv, s) && !fl_kv_seq_swapped(kv, s) && fl_kv_seq_len(kv, s) > 6) {
            const fl_status st = fl_kv_seq_shift(kv, s, 2, 3);
            assert_true(st == FL_OK || st == FL_NO_KV_SPACE);
        }
        const fl_status st = fl_kv_check(kv);
        if (st != FL_OK) fail_msg("op %d: %s", op, fl_last_error());
    }
    fl_kv_stats ks;
    fl_kv_stats_get(kv, &ks);
    assert_true(n_ok > 50);
    assert_true(ks.hit_tokens > 0 && ks.miss_tokens > 0);
    assert_true(ks.swap_outs > 0 && ks.swap_ins > 0 && ks.cow_copies > 0);
    for (int32_t s = 0; s < c.n_seq_max; s++) fl_kv_seq_free(kv, s);
    fl_kv_stats_get(kv, &ks);
    assert_int_equal(ks.n_blocks_used, 0);
    assert_int_equal(ks.n_blocks_free, ks.n_blocks_total);
    (void)n_full;
    ffree(k, 64 * (size_t)nrow);
    ffree(v, 64 * (size_t)nrow);
    ffree(q, 64 * (size_t)qrow);
    ffree(o, 64 * (size_t)qrow);
    fl_kv_free(kv);
    fl_test_mem_zero();
}

/* Prefill a sequence with tokens[0..n) (random K/V), return its block ids in ids. */
static void prefill(fl_kv_cache *kv, int32_t s, const int32_t *tokens, int32_t from, int32_t n) {
    const fl_kv_config *c = fl_kv_config_get(kv);
    const int32_t nrow = c->n_head_kv * c->head_dim;
    int32_t sid[512], pos[512];
    for (int32_t i = from; i < n; i++) sid[i - from] = s, pos[i - from] = i;
    fl_batch b = {.n_tokens = n - from, .tokens = tokens + from, .pos = pos, .seq_id = sid};
    assert_int_equal(fl_kv_prepare(kv, &b), FL_OK);
    float *k = falloc((size_t)(n - from) * nrow);
    for (int32_t il = 0; il < c->n_layer; il++) {
        for (int32_t i = 0; i < (n - from) * nrow; i++) k[i] = (float)tokens[from + i / nrow] * 0.01f + (float)(i % nrow) * 0.001f;
        fl_kv_store(kv, il, &b, k, k);
    }
    ffree(k, (size_t)(n - from) * nrow);
}

static void test_prefix_cache(void **state) {
    (void)state;
    fl_kv_config c = small_cfg(FL_TYPE_F32, 4, 13); /* 12 usable blocks */
    fl_kv_cache *kv = fl_kv_new(&c);
    assert_non_null(kv);
    int32_t A[16], B[16];
    for (int i = 0; i < 16; i++) A[i] = 10 + i, B[i] = 50 + i;
    int32_t nc;
    assert_int_equal(fl_kv_seq_add(kv, 0, A, 14, &nc), FL_OK);
    assert_int_equal(nc, 0);
    prefill(kv, 0, A, 0, 14); /* 3 full blocks + 2 tokens */
    int32_t nb;
    const int32_t *ids0 = fl_kv_seq_blocks(kv, 0, &nb);
    int32_t a_ids[4];
    memcpy(a_ids, ids0, sizeof a_ids);
    /* a second request with the same 14-token prompt shares the 3 full blocks */
    assert_int_equal(fl_kv_seq_add(kv, 1, A, 14, &nc), FL_OK);
    assert_int_equal(nc, 12);
    const int32_t *ids1 = fl_kv_seq_blocks(kv, 1, &nb);
    assert_int_equal(nb, 3);
    assert_memory_equal(ids1, a_ids, 3 * sizeof(int32_t));
    fl_kv_seq_stats ss;
    assert_int_equal(fl_kv_seq_stats_get(kv, 1, &ss), FL_OK);
    assert_int_equal(ss.bytes_shared, 3 * (int64_t)fl_kv_bytes_per_block(&c));
    assert_int_equal(fl_kv_prefix_probe(kv, A, 14, NULL, 0), 12);
    assert_int_equal(fl_kv_prefix_probe(kv, A, 14, "x", 1), 0);
    /* exactly 12 tokens: at least one must be computed, so only 2 blocks are reused */
    assert_int_equal(fl_kv_seq_add(kv, 2, A, 12, &nc), FL_OK);
    assert_int_equal(nc, 8);
    /* a different extra key (tenant salt) shares nothing */
    assert_int_equal(fl_kv_seq_add_keyed(kv, 3, A, 14, "tenant-b", 8, &nc), FL_OK);
    assert_int_equal(nc, 0);
    /* a different first block breaks the chain even if later blocks match */
    int32_t A2[16];
    memcpy(A2, A, sizeof A2);
    A2[0] = 999;
    assert_int_equal(fl_kv_seq_add(kv, 4, A2, 14, &nc), FL_OK);
    assert_int_equal(nc, 0);
    fl_kv_clear(kv);
    assert_false(fl_kv_seq_exists(kv, 0));
    /* freed cached blocks stay reusable */
    fl_kv_stats st;
    fl_kv_stats_get(kv, &st);
    assert_int_equal(st.n_blocks_used, 0);
    assert_int_equal(st.n_blocks_cached, 3);
    assert_int_equal(fl_kv_seq_add(kv, 5, A, 16, &nc), FL_OK);
    assert_int_equal(nc, 12);
    prefill(kv, 5, A, 12, 16); /* the 4th block becomes full and cached */
    fl_kv_seq_free(kv, 5);
    fl_kv_stats_get(kv, &st);
    assert_int_equal(st.n_blocks_cached, 4);
    assert_int_equal(st.evictions, 0);
    assert_int_equal(st.hit_tokens, 12 + 8 + 12);
    /* fill the pool with B: 4 blocks cached stay behind 8 uncached free ones */
    assert_int_equal(fl_kv_seq_add(kv, 6, B, 16, &nc), FL_OK);
    prefill(kv, 6, B, 0, 16);
    fl_kv_stats_get(kv, &st);
    assert_int_equal(st.evictions, 0);
    /* a long one needs all 12 blocks: evicts A's blocks (the tail of the chain first) */
    int32_t L[48];
    for (int i = 0; i < 48; i++) L[i] = 500 + i;
    fl_kv_seq_free(kv, 6);
    assert_int_equal(fl_kv_seq_add(kv, 7, L, 40, &nc), FL_OK);
    prefill(kv, 7, L, 0, 40); /* 10 blocks: the 8 uncached-or-B blocks then 2 of A's */
    fl_kv_stats_get(kv, &st);
    assert_true(st.evictions >= 2);
    fl_kv_seq_free(kv, 7);
    /* LRU: A (freed before B) went first; B's blocks were freed last-to-first, so the
     * head of its chain survived and still hits */
    assert_int_equal(fl_kv_seq_add(kv, 8, A, 16, &nc), FL_OK);
    assert_int_equal(nc, 0);
    assert_int_equal(fl_kv_seq_add(kv, 9, B, 16, &nc), FL_OK);
    assert_int_equal(nc, 8);
    fl_kv_seq_free(kv, 8);
    fl_kv_seq_free(kv, 9);
    /* a full block is offered to the cache only after the last layer's store */
    int32_t C[8] = {7, 7, 7, 7, 8, 8, 8, 8}, sidc[8] = {0}, posc[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    float kc[8 * 32] = {0};
    assert_int_equal(fl_kv_seq_add(kv, 10, C, 8, &nc), FL_OK);
    for (int i = 0; i < 8; i++) sidc[i] = 10;
    fl_batch bc = {.n_tokens = 8, .tokens = C, .pos = posc, .seq_id = sidc};
    assert_int_equal(fl_kv_prepare(kv, &bc), FL_OK);
    fl_kv_store(kv, 0, &bc, kc, kc);
    assert_int_equal(fl_kv_seq_add(kv, 11, C, 8, &nc), FL_OK);
    assert_int_equal(nc, 0); /* layer 1 not written yet */
    fl_kv_seq_free(kv, 11);
    fl_kv_store(kv, 1, &bc, kc, kc);
    assert_int_equal(fl_kv_seq_add(kv, 11, C, 8, &nc), FL_OK);
    assert_int_equal(nc, 4);
    fl_kv_seq_free(kv, 10);
    fl_kv_seq_free(kv, 11);
    assert_int_equal(fl_kv_check(kv), FL_OK);
    fl_kv_free(kv);
    fl_test_mem_zero();
}

/* Identical bits whatever the batching: whole prefill vs chunks vs token-by-token decode,
 * and a prefix-cache hit vs a cold run (what the end-to-end oracle needs), for T tokens. */
static void batching_case(fl_kv_config c, int32_t T) {
    const int32_t nrow = c.n_head_kv * c.head_dim, qrow = c.n_head * c.head_dim;
    float *K = falloc((size_t)T * nrow), *Q = falloc((size_t)T * qrow);
    float *o_ref = falloc((size_t)T * qrow), *o = falloc((size_t)T * qrow);
    rng_seed(5);
    fill(K, (size_t)T * nrow, 1);
    fill(Q, (size_t)T * qrow, 1);
    int32_t toks[128];
    assert_true(T <= 128);
    for (int i = 0; i < T; i++) toks[i] = i * 3;
    const int32_t cuts[4][8] = {{T}, {10, 17, 10}, {1, 1, 1, 30, 1, 1, 1, 1}, {12, 25}};
    const int32_t ncuts[4] = {1, 3, 8, 2};
    const int32_t cached = (T - 1) / c.block_size * c.block_size; /* the full blocks before the last token */
    for (int mode = 0; mode < 5; mode++) {
        fl_kv_cache *kv = fl_kv_new(&c);
        int32_t nc = 0, done = 0;
        if (mode == 4) { /* warm the prefix cache with another sequence, then hit it */
            assert_int_equal(fl_kv_seq_add(kv, 1, toks, T, &nc), FL_OK);
            int32_t sid[128], pos[128];
            for (int i = 0; i < T; i++) sid[i] = 1, pos[i] = i;
            fl_batch b = {.n_tokens = T, .tokens = toks, .pos = pos, .seq_id = sid};
            assert_int_equal(fl_kv_prepare(kv, &b), FL_OK);
            for (int32_t il = 0; il < c.n_layer; il++) fl_kv_store(kv, il, &b, K, K);
            fl_kv_seq_free(kv, 1);
        }
        assert_int_equal(fl_kv_seq_add(kv, 0, toks, T, &nc), FL_OK);
        if (mode == 4) assert_int_equal(nc, cached);
        done = nc;
        for (int ci = 0; done < T; ci++) {
            int32_t len = mode < 4 ? cuts[mode][ci % ncuts[mode]] : T - done;
            if (done + len > T) len = T - done;
            int32_t sid[128], pos[128];
            for (int i = 0; i < len; i++) sid[i] = 0, pos[i] = done + i;
            fl_batch b = {.n_tokens = len, .tokens = toks + done, .pos = pos, .seq_id = sid};
            assert_int_equal(fl_kv_prepare(kv, &b), FL_OK);
            for (int32_t il = 0; il < c.n_layer; il++) {
                fl_kv_store(kv, il, &b, K + (size_t)done * nrow, K + (size_t)done * nrow);
                fl_kv_attend(kv, il, &b, Q + (size_t)done * qrow, o + (size_t)done * qrow);
            }
            done += len;
        }
        if (mode == 0) memcpy(o_ref, o, sizeof(float) * (size_t)T * qrow);
        else if (mode < 4) assert_memory_equal(o_ref, o, sizeof(float) * (size_t)T * qrow);
        else assert_memory_equal(o_ref + (size_t)cached * qrow, o + (size_t)cached * qrow, sizeof(float) * (size_t)(T - cached) * qrow);
        fl_kv_free(kv);
    }
    uint64_t h = 1469598103934665603ull; /* FNV-1a of the outputs: the same on every build of one kernel */
    for (size_t i = 0; i < sizeof(float) * (size_t)T * qrow; i++) h = (h ^ ((const unsigned char *)o_ref)[i]) * 1099511628211ull;
    fprintf(stderr, "batching %s %s bs %d heads %d/%d hd %d: outputs %016llx\n", fl_isa_name(fl_isa_get()), fl_type_name(c.type), c.block_size, c.n_head,
            c.n_head_kv, c.head_dim, (unsigned long long)h);
    ffree(K, (size_t)T * nrow);
    ffree(Q, (size_t)T * qrow);
    ffree(o_ref, (size_t)T * qrow);
    ffree(o, (size_t)T * qrow);
}

/* Speculative tokens that were not accepted: truncation gives back the blocks past the kept
 * positions and unregisters what they filled, and the prefix chain goes on from what was kept. */
static void test_seq_truncate(void **state) {
    (void)state;
    fl_kv_config c = small_cfg(FL_TYPE_F32, 4, 13); /* 12 usable blocks */
    fl_kv_cache *kv = fl_kv_new(&c);
    assert_non_null(kv);
    int32_t A[16], B[16], AD[16], BD[16];
    for (int i = 0; i < 16; i++) A[i] = 10 + i, B[i] = 50 + i, AD[i] = i < 8 ? A[i] : 900 + i, BD[i] = i < 5 ? B[i] : 700 + i;
    int32_t nc;
    fl_kv_stats st;
    /* at a block boundary: 6 tokens, then 7 drafts of which the first 2 were right */
    assert_int_equal(fl_kv_seq_add(kv, 0, A, 16, &nc), FL_OK);
    prefill(kv, 0, A, 0, 6);
    prefill(kv, 0, AD, 6, 13);
    fl_kv_stats_get(kv, &st);
    assert_int_equal(st.n_blocks_used, 4);
    assert_int_equal(st.n_blocks_cached, 3);
    assert_int_equal(fl_kv_seq_truncate(kv, 0, 8), FL_OK);
    assert_int_equal(fl_kv_seq_len(kv, 0), 8);
    fl_kv_stats_get(kv, &st);
    assert_int_equal(st.n_blocks_used, 2);
    assert_int_equal(st.n_blocks_cached, 2); /* the two whole blocks kept stay registered */
    assert_int_equal(fl_kv_check(kv), FL_OK);
    prefill(kv, 0, A, 8, 16);
    assert_int_equal(fl_kv_prefix_probe(kv, A, 16, NULL, 0), 12);
    assert_int_equal(fl_kv_prefix_probe(kv, AD, 16, NULL, 0), 8);
    /* inside a block: 5 tokens, 6 wrong drafts filled block 1 and half of block 2 */
    assert_int_equal(fl_kv_seq_add(kv, 1, B, 16, &nc), FL_OK);
    prefill(kv, 1, B, 0, 5);
    prefill(kv, 1, BD, 5, 11);
    assert_int_equal(fl_kv_prefix_probe(kv, BD, 16, NULL, 0), 8);
    assert_int_equal(fl_kv_seq_truncate(kv, 1, 5), FL_OK);
    assert_int_equal(fl_kv_prefix_probe(kv, BD, 16, NULL, 0), 4); /* block 1 is no longer BD's */
    assert_int_equal(fl_kv_check(kv), FL_OK);
    prefill(kv, 1, B, 5, 16);
    assert_int_equal(fl_kv_prefix_probe(kv, B, 16, NULL, 0), 12); /* the chain went on from block 0 */
    float k[64];
    for (int32_t p = 0; p < 16; p++) { /* what was rewritten reads back as B */
        assert_int_equal(fl_kv_seq_read(kv, 1, 1, p, k, NULL), FL_OK);
        assert_float_equal(k[3], (float)B[p] * 0.01f + 3 * 0.001f, 1e-6);
    }
    /* a second sequence shares B's blocks; truncating one leaves the other's intact */
    assert_int_equal(fl_kv_seq_add(kv, 2, B, 16, &nc), FL_OK);
    assert_int_equal(nc, 12);
    prefill(kv, 2, B, 12, 16);
    assert_int_equal(fl_kv_seq_truncate(kv, 2, 6), FL_OK);
    assert_int_equal(fl_kv_prefix_probe(kv, B, 16, NULL, 0), 12);
    assert_int_equal(fl_kv_seq_read(kv, 2, 0, 6, k, NULL), FL_ERR_INVALID);
    assert_int_equal(fl_kv_check(kv), FL_OK);
    /* bad calls change nothing */
    assert_int_equal(fl_kv_seq_truncate(kv, 2, 7), FL_ERR_INVALID);
    assert_int_equal(fl_kv_seq_truncate(kv, 2, -1), FL_ERR_INVALID);
    assert_int_equal(fl_kv_seq_truncate(kv, 9, 0), FL_ERR_INVALID);
    assert_int_equal(fl_kv_seq_len(kv, 2), 6);
    assert_int_equal(fl_kv_seq_truncate(kv, 2, 0), FL_OK);
    fl_kv_stats_get(kv, &st);
    assert_int_equal(fl_kv_seq_len(kv, 2), 0);
    assert_int_equal(fl_kv_check(kv), FL_OK);
    fl_kv_free(kv);
}

static void test_batching_bitwise(void **state) {
    (void)state;
    fl_kv_config c = small_cfg(FL_TYPE_Q8_0, 4, 64);
    c.part_tokens = 8;
    c.n_head_kv = 2;
    c.head_dim = 16;
    batching_case(c, 37);
    /* 16-bit K/V in 16-token blocks (the AVX-512 block update, several query heads per KV head):
     * TinyLlama's group of 8 heads (eight at once), 3 (a pair and one) and 15 (an eight, a four,
     * a pair and one) */
    const int32_t heads[3] = {16, 6, 30};
    for (int isa = FL_ISA_REF; isa <= (int)fl_isa_best(); isa++) /* every variant the CPU has, 2 threads */
    for (int t = 0; t < 2; t++)
        for (int hi = 0; hi < 3; hi++) {
            fl_isa_set((fl_isa)isa);
            fl_threads_set(2);
            fl_kv_config d = small_cfg(t ? FL_TYPE_BF16 : FL_TYPE_F16, 16, 64);
            d.part_tokens = 32;
            d.n_head = heads[hi];
            d.n_head_kv = 2;
            d.head_dim = 64;
            batching_case(d, 90);
        }
    fl_threads_set(0);
    fl_isa_set(fl_isa_best());
    fl_test_mem_zero();
}

/* Each KV type against f32 attention on the same data, within a stated tolerance. */
static void test_quant_types(void **state) {
    (void)state;
    const struct { int32_t type; double nmse; } cases[] = {
        {FL_TYPE_F32, 1e-12}, {FL_TYPE_F16, 1e-6}, {FL_TYPE_BF16, 2e-5}, {FL_TYPE_Q8_0, 5e-5},
        {FL_TYPE_FP8_E4M3, 1.5e-2}, {FL_TYPE_FP8_E5M2, 5e-2}, {FL_TYPE_Q4_0, 1.5e-2},
    };
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        rng_seed(6);
        fl_kv_config c = small_cfg(cases[t].type, 16, 16);
        c.n_layer = 1;
        c.n_head_kv = 2;
        c.head_dim = 32;
        fl_kv_cache *kv = fl_kv_new(&c);
        assert_non_null(kv);
        history H;
        hist_init(&H, 128, c.n_head_kv * c.head_dim, 1, 1);
        int32_t sid[128], tok[128] = {0};
        for (int i = 0; i < 128; i++) sid[i] = 0;
        const int32_t qrow = c.n_head * c.head_dim, nrow = c.n_head_kv * c.head_dim, T = 70;
        int32_t pos[128];
        for (int i = 0; i < T; i++) pos[i] = i;
        fl_batch b = {.n_tokens = T, .tokens = tok, .pos = pos, .seq_id = sid};
        assert_int_equal(fl_kv_prepare(kv, &b), FL_OK);
        float *k = falloc((size_t)T * nrow), *v = falloc((size_t)T * nrow), *q = falloc((size_t)T * qrow);
        float *o = falloc((size_t)T * qrow), *r = falloc((size_t)T * qrow);
        /* growing magnitudes exercise the fp8 per-block rescale */
        for (int32_t i = 0; i < T * nrow; i++) k[i] = rndf() * (1.0f + (float)(i / nrow) * 0.05f), v[i] = rndf();
        fill(q, (size_t)T * qrow, 1.0f);
        fl_kv_store(kv, 0, &b, k, v);
        fl_kv_attend(kv, 0, &b, q, o);
        for (int32_t i = 0; i < T; i++) attn_contig(q + (size_t)i * qrow, k, v, i, c.n_head, c.n_head_kv, c.head_dim, 0, r + (size_t)i * qrow);
        /* exact part: attention over the decoded cache contents equals the kernel's output
         * (dequantisation on load reads the same values, scales of the right block and head) */
        float *kd = falloc((size_t)T * nrow), *vd = falloc((size_t)T * nrow), *rd = falloc((size_t)qrow);
        for (int32_t i = 0; i < T; i++) assert_int_equal(fl_kv_seq_read(kv, 0, 0, i, kd + (size_t)i * nrow, vd + (size_t)i * nrow), FL_OK);
        /* f16 K/V: the cache rounds the queries to f16 first (as llama.cpp and kv_contig do) */
        if (cases[t].type == FL_TYPE_F16)
            for (int32_t i = 0; i < T * qrow; i++) q[i] = fl_f16_to_f32(fl_f32_to_f16(q[i]));
        for (int32_t i = 0; i < T; i++) {
            attn_contig(q + (size_t)i * qrow, kd, vd, i, c.n_head, c.n_head_kv, c.head_dim, 0, rd);
            const double dd = fl_test_max_abs_diff(rd, o + (size_t)i * qrow, qrow);
            if (dd > 1e-5) fail_msg("%s: kernel vs decoded cache differ by %.3g at row %d", fl_type_name(cases[t].type), dd, i);
        }
        ffree(kd, (size_t)T * nrow);
        ffree(vd, (size_t)T * nrow);
        ffree(rd, (size_t)qrow);
        assert_int_equal(fl_kv_seq_read(kv, 0, 0, T, NULL, NULL), FL_ERR_INVALID);
        const double e = fl_test_nmse(r, o, (int64_t)T * qrow);
        if (!(e <= cases[t].nmse)) fail_msg("%s: NMSE %.3g > %.3g", fl_type_name(cases[t].type), e, cases[t].nmse);
        fprintf(stderr, "kv type %-9s attention NMSE vs f32 %.3g (limit %.3g), %zu bytes/token\n", fl_type_name(cases[t].type), e,
                cases[t].nmse, fl_kv_bytes_per_token(&c));
        ffree(k, (size_t)T * nrow);
        ffree(v, (size_t)T * nrow);
        ffree(q, (size_t)T * qrow);
        ffree(o, (size_t)T * qrow);
        ffree(r, (size_t)T * qrow);
        hist_free(&H);
        fl_kv_free(kv);
    }
    /* codec round trips */
    float x[64], y[64];
    uint8_t buf[256];
    rng_seed(7);
    fill(x, 64, 3.0f);
    fl_kv_quant(FL_TYPE_Q8_0, x, buf, 64, 1);
    fl_kv_dequant(FL_TYPE_Q8_0, buf, 0, 64, 1, y);
    for (int i = 0; i < 64; i++) CHECK_NEAR(x[i], y[i], 3.0 / 127 * 0.51 + 1e-3);
    { /* every ISA decodes q8_0 and q4_0 to the same bits (slices of whole 16s take the SIMD
       * path, from either half of a group; the others the scalar loops) */
        float z[64];
        for (int t = 0; t < 2; t++) {
            const int32_t type = t ? FL_TYPE_Q4_0 : FL_TYPE_Q8_0;
            fl_kv_quant(type, x, buf, 64, 1);
            for (int isa = FL_ISA_REF; isa <= (int)fl_isa_best(); isa++)
                for (int e0 = 0; e0 <= 48; e0 += 8)
                    for (int n = 8; e0 + n <= 64; n += 8) {
                        fl_isa_set((fl_isa)isa);
                        memset(z, 0x5A, sizeof z);
                        fl_kv_dequant(type, buf, e0, n, 1, z);
                        fl_isa_set(FL_ISA_REF);
                        memset(y, 0x5A, sizeof y);
                        fl_kv_dequant(type, buf, e0, n, 1, y);
                        if (memcmp(y, z, sizeof y)) fail_msg("%s isa %d [%d, %d): differs from the scalar decode", fl_type_name(type), isa, e0, e0 + n);
                    }
        }
        fl_isa_set(fl_isa_best());
        fl_kv_quant(FL_TYPE_Q8_0, x, buf, 64, 1);
    }
    fl_kv_dequant(FL_TYPE_Q8_0, buf, 40, 8, 1, y); /* a slice from inside a group */
    for (int i = 0; i < 8; i++) CHECK_NEAR(x[40 + i], y[i], 3.0 / 127 * 0.51 + 1e-3);
    fl_kv_quant(FL_TYPE_Q4_0, x, buf, 64, 1);
    fl_kv_dequant(FL_TYPE_Q4_0, buf, 0, 64, 1, y);
    for (int i = 0; i < 64; i++) CHECK_NEAR(x[i], y[i], 3.0 / 8 + 1e-2); /* range -8..7: the top end clamps by up to d */
    assert_int_equal(fl_kv_row_bytes(FL_TYPE_Q4_0, 30), 0);
    fl_kv_config bad = small_cfg(FL_TYPE_Q4_0, 16, 16);
    bad.head_dim = 5; /* row of 10 elements: not a multiple of 32 */
    assert_null(fl_kv_new(&bad));
    bad = small_cfg(FL_TYPE_Q4_K, 16, 16);
    assert_null(fl_kv_new(&bad));
    fl_test_mem_zero();
}

static void test_sliding_window(void **state) {
    (void)state;
    rng_seed(8);
    fl_kv_config c = small_cfg(FL_TYPE_F32, 4, 32);
    c.window = 10;
    fl_kv_cache *kv = fl_kv_new(&c);
    history H;
    hist_init(&H, 256, c.n_head_kv * c.head_dim, 2, c.n_layer);
    int32_t sid[64], tok[64] = {0};
    for (int i = 0; i < 64; i++) sid[i] = 0;
    assert_true(fake_step(kv, &H, 23, sid, tok, c.window) < 1e-5);
    for (int step = 0; step < 100; step++) {
        assert_true(fake_step(kv, &H, 1, sid, tok, c.window) < 1e-5);
        fl_kv_seq_stats ss;
        assert_int_equal(fl_kv_seq_stats_get(kv, 0, &ss), FL_OK);
        /* window 10 with 4-token blocks: at most 4 blocks (3 partly + the new one) */
        assert_true(ss.n_blocks <= 4);
    }
    assert_int_equal(fl_kv_seq_len(kv, 0), 123);
    assert_int_equal(fl_kv_check(kv), FL_OK);
    fl_kv_free(kv);
    hist_free(&H);
    fl_test_mem_zero();
}

/* The same in 16-bit K/V with 16-token blocks (the AVX-512 block loads, whose rows before the
 * window are masked off): against f32 attention over the f32 history, within the rounding of
 * the stored values. */
static void test_sliding_window_16bit(void **state) {
    (void)state;
    const struct { int32_t type; double tol; } cases[] = {{FL_TYPE_F16, 2e-3}, {FL_TYPE_BF16, 1e-2}};
    for (int t = 0; t < 2; t++) {
        rng_seed(18);
        fl_kv_config c = small_cfg(cases[t].type, 16, 32);
        c.window = 20;
        fl_kv_cache *kv = fl_kv_new(&c);
        assert_non_null(kv);
        history H;
        hist_init(&H, 256, c.n_head_kv * c.head_dim, 2, c.n_layer);
        int32_t sid[64], tok[64] = {0};
        for (int i = 0; i < 64; i++) sid[i] = 0;
        double md = fake_step(kv, &H, 23, sid, tok, c.window);
        for (int step = 0; step < 60; step++) {
            const double d = fake_step(kv, &H, 1, sid, tok, c.window);
            md = d > md ? d : md;
        }
        fprintf(stderr, "%s window: max diff %.3g\n", fl_type_name(cases[t].type), md);
        if (!(md < cases[t].tol)) fail_msg("%s window %d: max diff %.3g", fl_type_name(cases[t].type), c.window, md);
        assert_int_equal(fl_kv_check(kv), FL_OK);
        fl_kv_free(kv);
        hist_free(&H);
    }
    fl_test_mem_zero();
}

/* StreamingLLM shift: keep 4 sink tokens, drop 6, the rest move down and are re-roped;
 * attention afterwards equals attention over keys roped at the new positions. */
static void shift_case(int32_t type, double tol) {
    rng_seed(9);
    fl_kv_config c = small_cfg(type, 4, 40);
    c.n_layer = 1;
    c.head_dim = 16;
    c.n_rot = 12; /* partial rotary: the last 4 dims untouched */
    c.rope_base = 10000.0f;
    fl_kv_cache *kv = fl_kv_new(&c);
    const int32_t nkv = c.n_head_kv, hd = c.head_dim, nrow = nkv * hd, qrow = c.n_head * hd, T = 30, keep = 4, drop = 6;
    float *raw = falloc((size_t)T * nrow), *k = falloc((size_t)T * nrow), *v = falloc((size_t)T * nrow);
    float *K2 = falloc((size_t)T * nrow), *V2 = falloc((size_t)T * nrow);
    fill(raw, (size_t)T * nrow, 1);
    fill(v, (size_t)T * nrow, 1);
    memcpy(k, raw, sizeof(float) * (size_t)T * nrow);
    for (int32_t p = 0; p < T; p++) rope_row(k + (size_t)p * nrow, nkv, hd, c.n_rot, c.rope_base, p);
    int32_t sid[64], pos[64], tok[64];
    for (int i = 0; i < T; i++) sid[i] = 0, pos[i] = i, tok[i] = i;
    assert_int_equal(fl_kv_seq_add(kv, 0, tok, T, NULL), FL_OK);
    fl_batch b = {.n_tokens = T, .tokens = tok, .pos = pos, .seq_id = sid};
    assert_int_equal(fl_kv_prepare(kv, &b), FL_OK);
    fl_kv_store(kv, 0, &b, k, v);
    assert_int_equal(fl_kv_seq_fork(kv, 0, 1), FL_OK); /* the shift must not touch the fork */
    assert_int_equal(fl_kv_seq_shift(kv, 0, keep, drop), FL_OK);
    assert_int_equal(fl_kv_seq_len(kv, 0), T - drop);
    assert_int_equal(fl_kv_seq_len(kv, 1), T);
    /* expected history: sinks, then tokens keep+drop.. roped at their new positions */
    int32_t n2 = 0;
    for (int32_t p = 0; p < T; p++) {
        if (p >= keep && p < keep + drop) continue;
        memcpy(K2 + (size_t)n2 * nrow, raw + (size_t)p * nrow, sizeof(float) * nrow);
        rope_row(K2 + (size_t)n2 * nrow, nkv, hd, c.n_rot, c.rope_base, n2);
        memcpy(V2 + (size_t)n2 * nrow, v + (size_t)p * nrow, sizeof(float) * nrow);
        n2++;
    }
    /* the stored keys themselves equal RoPE recomputed at the new positions */
    for (int32_t p = 0; p < n2; p++) {
        float kr[64];
        assert_int_equal(fl_kv_seq_read(kv, 0, 0, p, kr, NULL), FL_OK);
        const double dk = fl_test_max_abs_diff(K2 + (size_t)p * nrow, kr, nrow);
        if (!(dk <= tol)) fail_msg("%s shift: key at new position %d off by %.3g", fl_type_name(type), p, dk);
    }
    /* a new token at the next position attends over the shifted cache */
    float kn[64], vn[64], q[64], o[64], r[64];
    fill(kn, (size_t)nrow, 1);
    fill(vn, (size_t)nrow, 1);
    fill(q, (size_t)qrow, 1);
    memcpy(K2 + (size_t)n2 * nrow, kn, sizeof(float) * nrow);
    memcpy(V2 + (size_t)n2 * nrow, vn, sizeof(float) * nrow);
    int32_t p1[1] = {n2}, s1[1] = {0}, t1[1] = {77};
    fl_batch b1 = {.n_tokens = 1, .tokens = t1, .pos = p1, .seq_id = s1};
    assert_int_equal(fl_kv_prepare(kv, &b1), FL_OK);
    fl_kv_store(kv, 0, &b1, kn, vn);
    fl_kv_attend(kv, 0, &b1, q, o);
    attn_contig(q, K2, V2, n2, c.n_head, nkv, hd, 0, r);
    const double d = fl_test_max_abs_diff(r, o, qrow);
    if (!(d <= tol)) fail_msg("%s shift: max diff %.3g > %.3g", fl_type_name(type), d, tol);
    /* the fork still sees the original positions */
    int32_t p2[1] = {T}, s2[1] = {1};
    fl_batch b2 = {.n_tokens = 1, .tokens = t1, .pos = p2, .seq_id = s2};
    assert_int_equal(fl_kv_prepare(kv, &b2), FL_OK);
    fl_kv_store(kv, 0, &b2, kn, vn);
    fl_kv_attend(kv, 0, &b2, q, o);
    float *K3 = falloc((size_t)(T + 1) * nrow), *V3 = falloc((size_t)(T + 1) * nrow);
    memcpy(K3, k, sizeof(float) * (size_t)T * nrow);
    memcpy(V3, v, sizeof(float) * (size_t)T * nrow);
    memcpy(K3 + (size_t)T * nrow, kn, sizeof(float) * nrow);
    memcpy(V3 + (size_t)T * nrow, vn, sizeof(float) * nrow);
    attn_contig(q, K3, V3, T, c.n_head, nkv, hd, 0, r);
    assert_true(fl_test_max_abs_diff(r, o, qrow) <= tol);
    assert_int_equal(fl_kv_check(kv), FL_OK);
    ffree(K3, (size_t)(T + 1) * nrow);
    ffree(V3, (size_t)(T + 1) * nrow);
    ffree(raw, (size_t)T * nrow);
    ffree(k, (size_t)T * nrow);
    ffree(v, (size_t)T * nrow);
    ffree(K2, (size_t)T * nrow);
    ffree(V2, (size_t)T * nrow);
    fl_kv_free(kv);
}

static void test_shift_rerope(void **state) {
    (void)state;
    shift_case(FL_TYPE_F32, 1e-5);
    shift_case(FL_TYPE_F16, 3e-3);
    shift_case(FL_TYPE_FP8_E4M3, 0.25); /* e4m3: 3 mantissa bits, encoded twice */
    fl_test_mem_zero();
}

/* Generate far past the context with sink + window shifting: never fails, stays bounded. */
static void test_streaming_past_context(void **state) {
    (void)state;
    rng_seed(10);
    fl_kv_config c = small_cfg(FL_TYPE_F16, 8, 12);
    c.n_ctx = 64;
    fl_kv_cache *kv = fl_kv_new(&c);
    history H; /* oracle not meaningful across shifts: check finiteness and bounds instead */
    const int32_t nrow = c.n_head_kv * c.head_dim, qrow = c.n_head * c.head_dim;
    float k[64], v[64], q[64], o[64];
    assert_int_equal(fl_kv_seq_add(kv, 0, NULL, 0, NULL), FL_OK);
    for (int step = 0; step < 500; step++) {
        if (fl_kv_seq_len(kv, 0) == c.n_ctx) { /* full: keep 4 sinks + the last 36 */
            assert_int_equal(fl_kv_seq_stream(kv, 0, 4, 36), FL_OK);
            assert_int_equal(fl_kv_seq_len(kv, 0), 40);
        }
        int32_t s[1] = {0}, p[1] = {fl_kv_seq_len(kv, 0)}, t[1] = {step};
        fl_batch b = {.n_tokens = 1, .tokens = t, .pos = p, .seq_id = s};
        assert_int_equal(fl_kv_prepare(kv, &b), FL_OK);
        for (int32_t il = 0; il < c.n_layer; il++) {
            fill(k, (size_t)nrow, 1);
            fill(v, (size_t)nrow, 1);
            fill(q, (size_t)qrow, 1);
            fl_kv_store(kv, il, &b, k, v);
            fl_kv_attend(kv, il, &b, q, o);
            for (int32_t i = 0; i < qrow; i++) assert_true(isfinite(o[i]) && fabsf(o[i]) <= 1.0f + 1e-3f);
        }
    }
    fl_kv_stats st;
    fl_kv_stats_get(kv, &st);
    assert_true(st.shifted_tokens > 0);
    assert_true(st.n_blocks_used <= 8);
    (void)H;
    fl_kv_free(kv);
    fl_test_mem_zero();
}

static void test_swap_roundtrip(void **state) {
    (void)state;
    rng_seed(11);
    fl_kv_config c = small_cfg(FL_TYPE_FP8_E4M3, 4, 16);
    fl_kv_cache *kv = fl_kv_new(&c);
    history H;
    hist_init(&H, 64, c.n_head_kv * c.head_dim, 2, c.n_layer);
    int32_t sid[64] = {0}, tok[64] = {0};
    fake_step(kv, &H, 30, sid, tok, 0); /* fp8 is lossy: only the swap is compared below */
    const int32_t qrow = c.n_head * c.head_dim;
    float q[64], o1[64], o2[64];
    fill(q, (size_t)qrow, 1);
    /* attend with a fresh decode token before and after a swap round trip */
    assert_int_equal(fl_kv_seq_fork(kv, 0, 1), FL_OK);
    assert_int_equal(fl_kv_seq_swap_out(kv, 0), FL_OK);
    fl_kv_stats st;
    fl_kv_stats_get(kv, &st);
    assert_int_equal(st.n_blocks_used, 8); /* the fork still holds them */
    fl_kv_seq_free(kv, 1);
    fl_kv_stats_get(kv, &st);
    assert_int_equal(st.n_blocks_used, 0);
    int32_t s0[1] = {0}, p0[1] = {30};
    fl_batch b = {.n_tokens = 1, .tokens = tok, .pos = p0, .seq_id = s0};
    assert_int_equal(fl_kv_prepare(kv, &b), FL_ERR_INVALID); /* swapped out */
    /* occupy blocks so the swap-in lands elsewhere */
    assert_int_equal(fl_kv_seq_add(kv, 2, NULL, 0, NULL), FL_OK);
    int32_t s2[8] = {2, 2, 2, 2, 2, 2, 2, 2}, p2[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    fl_batch b2 = {.n_tokens = 8, .tokens = tok, .pos = p2, .seq_id = s2};
    assert_int_equal(fl_kv_prepare(kv, &b2), FL_OK);
    assert_int_equal(fl_kv_seq_swap_in(kv, 0), FL_OK);
    float kn[64], vn[64];
    fill(kn, 64, 1);
    fill(vn, 64, 1);
    assert_int_equal(fl_kv_prepare(kv, &b), FL_OK);
    fl_kv_store(kv, 0, &b, kn, vn);
    fl_kv_attend(kv, 0, &b, q, o1);
    /* the same through a second cache that never swapped: replay the history exactly */
    fl_kv_cache *kv2 = fl_kv_new(&c);
    int32_t pos[64];
    for (int i = 0; i < 30; i++) pos[i] = i;
    fl_batch bh = {.n_tokens = 30, .tokens = tok, .pos = pos, .seq_id = sid};
    assert_int_equal(fl_kv_prepare(kv2, &bh), FL_OK);
    for (int32_t il = 0; il < c.n_layer; il++) fl_kv_store(kv2, il, &bh, H.k[0][il], H.v[0][il]);
    assert_int_equal(fl_kv_prepare(kv2, &b), FL_OK);
    fl_kv_store(kv2, 0, &b, kn, vn);
    fl_kv_attend(kv2, 0, &b, q, o2);
    assert_memory_equal(o1, o2, sizeof(float) * (size_t)qrow);
    assert_int_equal(fl_kv_check(kv), FL_OK);
    fl_kv_free(kv2);
    fl_kv_free(kv);
    hist_free(&H);
    fl_test_mem_zero();
}

static void test_memory_budget(void **state) {
    (void)state;
    fl_kv_config c = small_cfg(FL_TYPE_F16, 16, 0);
    const size_t bpb = fl_kv_bytes_per_block(&c);
    assert_int_equal(bpb, 2 * 2 * 16 * 2 * 16 * 2); /* layers x K/V x block x kv heads x dims x 2 B */
    assert_int_equal(fl_kv_bytes_per_token(&c), bpb / 16);
    c.mem_bytes = 10 * bpb + bpb / 2;
    fl_kv_cache *kv = fl_kv_new(&c);
    assert_non_null(kv);
    fl_kv_stats st;
    fl_kv_stats_get(kv, &st);
    assert_int_equal(st.n_blocks_total, 10);
    assert_int_equal(fl_mem_current(FL_MEM_KV), 10 * bpb);
    assert_true(st.bytes_total <= (int64_t)c.mem_bytes);
    /* per-request accounting: 20 tokens -> 2 blocks, slack 12 */
    assert_int_equal(fl_kv_seq_add(kv, 0, NULL, 0, NULL), FL_OK);
    int32_t sid[20] = {0}, pos[20], tok[20] = {0};
    for (int i = 0; i < 20; i++) pos[i] = i;
    fl_batch b = {.n_tokens = 20, .tokens = tok, .pos = pos, .seq_id = sid};
    assert_int_equal(fl_kv_prepare(kv, &b), FL_OK);
    fl_kv_seq_stats ss;
    assert_int_equal(fl_kv_seq_stats_get(kv, 0, &ss), FL_OK);
    assert_int_equal(ss.n_blocks, 2);
    assert_int_equal(ss.slack, 12);
    assert_int_equal(ss.n_tokens, 20);
    assert_int_equal(ss.bytes_held, 2 * (int64_t)bpb);
    /* a sequence created on the fly by a batch that does not fit leaves no trace */
    int32_t sid5[200], pos5[200], tok5[200] = {0};
    for (int i = 0; i < 200; i++) sid5[i] = 5, pos5[i] = i;
    fl_batch b5 = {.n_tokens = 200, .tokens = tok5, .pos = pos5, .seq_id = sid5};
    assert_int_equal(fl_kv_prepare(kv, &b5), FL_NO_KV_SPACE);
    assert_false(fl_kv_seq_exists(kv, 5));
    /* (its table buffers: a leak would show in fl_test_mem_zero at the end) */
    assert_int_equal(fl_kv_blocks_free(kv), 8);
    /* the same sequence twice in one batch, not contiguous: an error */
    int32_t sid6[3] = {6, 7, 6}, pos6[3] = {0, 0, 1};
    fl_batch b6 = {.n_tokens = 3, .tokens = tok5, .pos = pos6, .seq_id = sid6};
    assert_int_equal(fl_kv_prepare(kv, &b6), FL_ERR_INVALID);
    assert_false(fl_kv_seq_exists(kv, 6));
    assert_int_equal(fl_kv_seq_fork(kv, 0, 1), FL_OK);
    fl_kv_stats_get(kv, &st);
    assert_int_equal(st.tokens_live, 20);
    assert_int_equal(st.tokens_logical, 40);
    CHECK_NEAR(st.waste, 12.0 / 32.0, 1e-12);
    CHECK_NEAR(st.utilization, 0.2, 1e-12);
    fl_kv_free(kv);
    assert_int_equal(fl_mem_current(FL_MEM_KV), 0);
    /* a budget below one block is an error; so is a KV category budget that refuses it */
    c.mem_bytes = bpb - 1;
    assert_null(fl_kv_new(&c));
    assert_null(fl_kv_new(NULL));
    c.mem_bytes = 4 * bpb;
    fl_mem_set_budget(FL_MEM_KV, bpb);
    assert_null(fl_kv_new(&c));
    fl_mem_set_budget(FL_MEM_KV, 0);
    fl_test_mem_zero();
}

/* Allocation failure injected at every point of a scripted session: each call either works
 * or returns an error; invariants hold and nothing leaks. */
static void test_alloc_failures(void **state) {
    (void)state;
    float kv_rows[40 * 32], q[40 * 64], o[40 * 64];
    rng_seed(12);
    fill(kv_rows, 40 * 32, 1);
    fill(q, 40 * 64, 1);
    int32_t toks[40];
    for (int i = 0; i < 40; i++) toks[i] = i % 9;
    int n_fail_points = 0;
    for (long k = 0; k < 400; k++) {
        fl_kv_config c = small_cfg(FL_TYPE_FP8_E4M3, 4, 24);
        c.n_layer = 1;
        fl_mem_fail_after(k);
        fl_kv_cache *kv = fl_kv_new(&c);
        if (!kv) {
            fl_mem_fail_after(-1);
            n_fail_points++;
            fl_test_mem_zero();
            continue;
        }
        bool failed = false;
        for (int32_t s = 0; s < 3; s++) {
            int32_t nc = 0;
            if (fl_kv_seq_add(kv, s, toks, 20 + s * 7, &nc) != FL_OK) {
                failed = true;
                continue;
            }
            int32_t sid[40], pos[40];
            const int32_t n = 20 + s * 7 - nc;
            for (int32_t i = 0; i < n; i++) sid[i] = s, pos[i] = nc + i;
            fl_batch b = {.n_tokens = n, .tokens = toks + nc, .pos = pos, .seq_id = sid};
            if (fl_kv_prepare(kv, &b) != FL_OK) {
                failed = true;
                continue;
            }
            fl_kv_store(kv, 0, &b, kv_rows, kv_rows);
            fl_kv_attend(kv, 0, &b, q, o);
        }
        failed |= fl_kv_seq_fork(kv, 0, 5) != FL_OK;
        if (fl_kv_seq_exists(kv, 1)) {
            failed |= fl_kv_seq_swap_out(kv, 1) != FL_OK;
            if (fl_kv_seq_swapped(kv, 1)) failed |= fl_kv_seq_swap_in(kv, 1) != FL_OK;
        }
        if (fl_kv_seq_exists(kv, 2) && !fl_kv_seq_swapped(kv, 2)) failed |= fl_kv_seq_shift(kv, 2, 4, 5) != FL_OK;
        fl_mem_fail_after(-1);
        n_fail_points += failed;
        if (fl_kv_check(kv) != FL_OK) fail_msg("fail point %ld: %s", k, fl_last_error());
        fl_kv_free(kv);
        fl_test_mem_zero();
        if (!failed) break; /* the whole script ran: every earlier point has been tried */
    }
    assert_true(n_fail_points > 10);
}

/* The paged decode converts one head slice (often 8 or 16 elements) per call: every ISA's row
 * converters must match the scalar reference bit for bit on short rows and at odd offsets. */
/* Quantized K/V (fp8 e4m3 / e5m2 with a scale per block and kv head, q8_0, q4_0) give the bits
 * of the same values stored as f32 (each row decoded by fl_kv_dequant on the reference ISA): on
 * AVX-512 the quantized blocks go through the register loader (load_block16_avx512) and the f32
 * ones through the row copies and the scalar transpose, into the same block update.  Decode rows
 * of four sequences, then a 40-row prefill tile. */
static void test_paged_quant_as_f32(void **state) {
    (void)state;
    const int32_t bs = 16, nkv = 2, hd = 64, n_head = 8, n = 150, nb = (n + bs - 1) / bs + 3, nlb = (n + bs - 1) / bs;
    const size_t nrow = (size_t)nkv * hd, qrow = (size_t)n_head * hd;
    const int32_t types[4] = {FL_TYPE_FP8_E4M3, FL_TYPE_FP8_E5M2, FL_TYPE_Q8_0, FL_TYPE_Q4_0};
    const fl_isa best = fl_isa_best();
    for (int t = 0; t < 4; t++) {
        rng_seed(41 + (uint32_t)t);
        const bool fp8 = fl_kv_type_scaled(types[t]);
        const size_t row8 = fl_kv_row_bytes(types[t], (int64_t)nrow);
        uint8_t *codes[2];
        float *val[2], sc[2][16][2];
        for (int kv = 0; kv < 2; kv++) {
            codes[kv] = fl_calloc(FL_MEM_MISC, (size_t)n * row8, 1);
            val[kv] = falloc((size_t)n * nrow);
            fill(val[kv], (size_t)n * nrow, kv ? 1.0f : 2.0f);
            for (int32_t b = 0; b < nlb; b++)
                for (int32_t h = 0; h < nkv; h++) sc[kv][b][h] = 0.01f + (float)(rnd() % 1000) * 1e-5f;
            fl_isa_set(FL_ISA_REF);
            for (int32_t j = 0; j < n; j++) { /* quantize each row, then read it back as the reference does */
                float *x = val[kv] + (size_t)j * nrow;
                uint8_t *q = codes[kv] + (size_t)j * row8;
                if (fp8)
                    for (int32_t h = 0; h < nkv; h++) {
                        fl_kv_quant(types[t], x + (size_t)h * hd, q + (size_t)h * hd, hd, sc[kv][j / bs][h]);
                        fl_kv_dequant(types[t], q, (int64_t)h * hd, hd, sc[kv][j / bs][h], x + (size_t)h * hd);
                    }
                else {
                    fl_kv_quant(types[t], x, q, (int64_t)nrow, 0.0f);
                    fl_kv_dequant(types[t], q, 0, (int64_t)nrow, 0.0f, x);
                }
            }
            fl_isa_set(best);
        }
        paged_fix f; /* the values as f32, through a shuffled block table */
        paged_fix_init(&f, val[0], val[1], n, bs, nkv, hd, nb);
        fl_paged_kv kq = f.kv; /* the codes, at the same block ids */
        kq.type = types[t];
        kq.row_bytes = row8;
        kq.block_bytes = row8 * (size_t)bs;
        uint8_t *kc = fl_calloc(FL_MEM_MISC, (size_t)nb * kq.block_bytes, 1), *vc = fl_calloc(FL_MEM_MISC, (size_t)nb * kq.block_bytes, 1);
        float *ks = falloc((size_t)nb * nkv), *vs = falloc((size_t)nb * nkv);
        for (int32_t j = 0; j < n; j++) {
            const size_t o = (size_t)(f.blocks[j / bs] - 1) * kq.block_bytes + (size_t)(j % bs) * row8;
            memcpy(kc + o, codes[0] + (size_t)j * row8, row8);
            memcpy(vc + o, codes[1] + (size_t)j * row8, row8);
        }
        for (int32_t b = 0; b < nlb; b++)
            for (int32_t h = 0; h < nkv; h++) {
                ks[(size_t)(f.blocks[b] - 1) * nkv + h] = sc[0][b][h];
                vs[(size_t)(f.blocks[b] - 1) * nkv + h] = sc[1][b][h];
            }
        kq.k = kc;
        kq.v = vc;
        kq.k_scale = fp8 ? ks : NULL;
        kq.v_scale = fp8 ? vs : NULL;
        float *Q = falloc(40 * qrow), *O32 = falloc(40 * qrow), *Oq = falloc(40 * qrow);
        fill(Q, 40 * qrow, 2.0f);
        fl_paged_attn_params pp = {.n_head = n_head, .scale = 0.125f, .part_blocks = 4};
        const int32_t len[4] = {150, 17, 64, 99};
        fl_paged_seq dec[4], pre = {.q0 = 0, .n_q = 40, .pos0 = n - 40, .blocks = f.blocks};
        for (int32_t s = 0; s < 4; s++) dec[s] = (fl_paged_seq){.q0 = s, .n_q = 1, .pos0 = len[s] - 1, .blocks = f.blocks};
        for (int round = 0; round < 2; round++) {
            const fl_paged_seq *sq = round ? &pre : dec;
            const int32_t ns = round ? 1 : 4, rows = round ? 40 : 4;
            const size_t wsb = fl_paged_attn_ws_size(&f.kv, sq, ns, &pp, fl_threads_get());
            void *ws = fl_alloc(FL_MEM_SCRATCH, wsb, 64);
            fl_paged_attn(&f.kv, sq, ns, &pp, Q, O32, ws);
            fl_paged_attn(&kq, sq, ns, &pp, Q, Oq, ws);
            if (memcmp(O32, Oq, sizeof(float) * (size_t)rows * qrow))
                fail_msg("%s %s: differs from the same values as f32 (max %.3g)", fl_type_name(types[t]), round ? "prefill" : "decode",
                         fl_test_max_abs_diff(O32, Oq, (int64_t)rows * (int64_t)qrow));
            fl_free(FL_MEM_SCRATCH, ws, wsb);
        }
        fl_free(FL_MEM_MISC, kc, (size_t)nb * kq.block_bytes);
        fl_free(FL_MEM_MISC, vc, (size_t)nb * kq.block_bytes);
        ffree(ks, (size_t)nb * nkv);
        ffree(vs, (size_t)nb * nkv);
        ffree(Q, 40 * qrow);
        ffree(O32, 40 * qrow);
        ffree(Oq, 40 * qrow);
        paged_fix_deinit(&f, nb);
        for (int kv = 0; kv < 2; kv++) {
            fl_free(FL_MEM_MISC, codes[kv], (size_t)n * row8);
            ffree(val[kv], (size_t)n * nrow);
        }
    }
    fl_test_mem_zero();
}

/* The fp8 row decode on every ISA the CPU has (AVX-512: fl_fp8x16_to_f32, 16 codes at a time)
 * against the reference's table, bit for bit: every code (NaNs with their sign, e5m2's
 * infinities) at several scales, offsets and lengths (those not a multiple of 16 take the
 * table). */
static void test_fp8_dequant_variants(void **state) {
    (void)state;
    uint8_t codes[288];
    for (int i = 0; i < 288; i++) codes[i] = (uint8_t)(i * 37 + 11); /* (every byte in the first 256) */
    const float scales[] = {1.0f, 0.37f, 3.1e-3f, 6.5e4f, 1e-30f};
    const int32_t types[2] = {FL_TYPE_FP8_E4M3, FL_TYPE_FP8_E5M2};
    float ref[288], got[288];
    const fl_isa best = fl_isa_best();
    for (int t = 0; t < 2; t++)
        for (size_t k = 0; k < sizeof scales / sizeof scales[0]; k++)
            for (int e0 = 0; e0 <= 32; e0 += 16)
                for (int n = 16; n <= 256; n += n < 48 ? 8 : 208) {
                    fl_isa_set(FL_ISA_REF);
                    memset(ref, 0x5A, sizeof ref);
                    fl_kv_dequant(types[t], codes, e0, n, scales[k], ref);
                    for (int isa = FL_ISA_REF; isa <= (int)best; isa++) {
                        fl_isa_set((fl_isa)isa);
                        memset(got, 0x5A, sizeof got);
                        fl_kv_dequant(types[t], codes, e0, n, scales[k], got);
                        if (memcmp(ref, got, sizeof ref))
                            fail_msg("%s isa %d scale %g e0 %d n %d: differs from the table", fl_type_name(types[t]), isa, (double)scales[k], e0, n);
                    }
                }
    /* and the table is the scalar decoder's */
    fl_isa_set(best);
    fl_kv_dequant(FL_TYPE_FP8_E4M3, codes, 0, 256, 1.0f, got);
    for (int i = 0; i < 256; i++) {
        const float want = fl_fp8_e4m3_to_f32(codes[i]);
        if (memcmp(&want, &got[i], 4)) fail_msg("e4m3 code 0x%02x: %g, want %g", codes[i], (double)got[i], (double)want);
    }
    fl_kv_dequant(FL_TYPE_FP8_E5M2, codes, 0, 256, 1.0f, got);
    for (int i = 0; i < 256; i++) {
        const float want = fl_fp8_e5m2_to_f32(codes[i]);
        if (memcmp(&want, &got[i], 4)) fail_msg("e5m2 code 0x%02x: %g, want %g", codes[i], (double)got[i], (double)want);
    }
}

/* The fp8 row encode on every ISA the CPU has (AVX-512: fl_f32x16_to_fp8) against the scalar
 * encoders, byte for byte: a stride through all 2^32 float bit patterns (NaNs, infinities,
 * subnormals included), every value next to a midpoint of either grid, several scales. */
static void test_fp8_quant_variants(void **state) {
    (void)state;
    enum { N = 4096 };
    float *x = falloc(N);
    uint8_t ref[N], got[N];
    const fl_isa best = fl_isa_best();
    const int32_t types[2] = {FL_TYPE_FP8_E4M3, FL_TYPE_FP8_E5M2};
    int64_t count = 0;
    for (int pass = 0; pass < 2; pass++) {
        /* pass 0: the bit patterns k * 1048573 (a prime near 2^20) for k < 4096 x 1; pass 1: the
         * midpoints between neighbouring codes of both grids, and one float below and above */
        for (uint64_t k0 = 0; k0 < (pass ? 1 : 1024); k0++) {
            int32_t nx = 0;
            if (!pass)
                for (int i = 0; i < N; i++) {
                    const uint32_t b = (uint32_t)((k0 * N + (uint64_t)i) * 1048573u);
                    memcpy(&x[nx++], &b, 4);
                }
            else
                for (int t = 0; t < 2 && nx + 6 <= N; t++)
                    for (int c = 0; c < 0x7F && nx + 6 <= N; c++) {
                        const float a = t ? fl_fp8_e5m2_to_f32((uint8_t)c) : fl_fp8_e4m3_to_f32((uint8_t)c);
                        const float b = t ? fl_fp8_e5m2_to_f32((uint8_t)(c + 1)) : fl_fp8_e4m3_to_f32((uint8_t)(c + 1));
                        if (!isfinite(a) || !isfinite(b)) continue;
                        const float m = a + (b - a) * 0.5f;
                        x[nx++] = m, x[nx++] = nextafterf(m, 0.0f), x[nx++] = nextafterf(m, INFINITY);
                        x[nx++] = -m, x[nx++] = -nextafterf(m, 0.0f), x[nx++] = -nextafterf(m, INFINITY);
                    }
            nx -= nx % 16;
            for (int t = 0; t < 2; t++)
                for (int k = 0; k < (pass ? 3 : 1); k++) {
                    const float scale = k == 0 ? 1.0f : k == 1 ? 0.37f : 3.0e-3f;
                    fl_isa_set(FL_ISA_REF);
                    fl_kv_quant(types[t], x, ref, nx, scale);
                    for (int isa = FL_ISA_REF + 1; isa <= (int)best; isa++) {
                        fl_isa_set((fl_isa)isa);
                        fl_kv_quant(types[t], x, got, nx, scale);
                        for (int i = 0; i < nx; i++)
                            if (ref[i] != got[i]) {
                                uint32_t b;
                                memcpy(&b, &x[i], 4);
                                fail_msg("%s isa %d scale %g: 0x%08x -> 0x%02x, want 0x%02x", fl_type_name(types[t]), isa, (double)scale, b, got[i], ref[i]);
                            }
                    }
                    count += nx;
                }
        }
    }
    fl_isa_set(best);
    assert_true(count > 8000000);
    ffree(x, N);
}

/* The q8_0 / q4_0 row encoders on every ISA give the scalar loops' bytes: random rows at many
 * magnitudes, and groups made to hit the edges (all zero, one non-zero value, the largest
 * magnitude twice with both signs, code ties, infinities and NaNs among finite values). */
static void test_kv_q_quant_variants(void **state) {
    (void)state;
    enum { G = 512, N = G * 32 };
    float *x = falloc(N);
    uint8_t ref[G * 34], got[G * 34];
    const fl_isa best = fl_isa_best();
    srand(23);
    for (int round = 0; round < 8; round++) {
        for (int i = 0; i < N; i++) x[i] = ((float)rand() / (float)RAND_MAX - 0.5f) * ldexpf(1.0f, rand() % 40 - 20);
        for (int gi = 0; gi < G; gi++) {
            float *v = x + gi * 32;
            switch ((gi + round) % 12) {
            case 0: for (int j = 0; j < 32; j++) v[j] = 0.0f; break;
            case 1: for (int j = 0; j < 32; j++) v[j] = j == 7 ? -3.0f : 0.0f; break;
            case 2: v[3] = 5.0f, v[20] = -5.0f; for (int j = 0; j < 32; j++) if (j != 3 && j != 20) v[j] = fminf(fabsf(v[j]), 4.0f); break;
            case 3: v[3] = -5.0f, v[20] = 5.0f; for (int j = 0; j < 32; j++) if (j != 3 && j != 20) v[j] = fminf(fabsf(v[j]), 4.0f); break;
            case 4: for (int j = 0; j < 32; j++) v[j] = (float)(j - 16) * 0.5f; break; /* .5 ties of x / d */
            case 5: v[rand() % 32] = INFINITY; break;
            case 6: v[rand() % 32] = NAN; break;
            case 7: v[rand() % 32] = -INFINITY, v[rand() % 32] = NAN; break;
            case 8: for (int j = 0; j < 32; j++) v[j] *= 1e-30f; break; /* a subnormal f16 scale */
            default: break;
            }
        }
        for (int t = 0; t < 2; t++) {
            const int32_t type = t ? FL_TYPE_Q4_0 : FL_TYPE_Q8_0;
            const size_t rb = fl_kv_row_bytes(type, N);
            fl_isa_set(FL_ISA_REF);
            fl_kv_quant(type, x, ref, N, 0.0f);
            for (int isa = FL_ISA_REF + 1; isa <= (int)best; isa++) {
                fl_isa_set((fl_isa)isa);
                memset(got, 0xEE, sizeof got);
                fl_kv_quant(type, x, got, N, 0.0f);
                for (size_t i = 0; i < rb; i++)
                    if (ref[i] != got[i])
                        fail_msg("%s isa %d round %d: byte %zu (group %zu) 0x%02x, want 0x%02x", fl_type_name(type), isa, round, i,
                                 i / (rb / G), got[i], ref[i]);
            }
        }
    }
    fl_isa_set(best);
    ffree(x, N);
}

static void test_convert_short_rows(void **state) {
    (void)state;
    uint16_t h[80], h2[80], h3[80];
    float f[80], g[80];
    srand(11);
    const fl_isa best = fl_isa_best();
    for (int isa = FL_ISA_REF; isa <= (int)best; isa++) {
        fl_isa_set((fl_isa)isa);
        const fl_convert_kernels *k = fl_convert_kernels_get();
        for (int n = 0; n <= 40; n++)
            for (int off = 0; off < 3; off++) {
                for (int i = 0; i < 80; i++) {
                    h[i] = (uint16_t)(rand() & 0x7BFF); /* finite f16 of either sign */
                    h[i] |= (uint16_t)((rand() & 1) << 15);
                    f[i] = g[i] = -7.0f;
                    h2[i] = h3[i] = 0xABCD;
                }
                k->f16_to_f32(h + off, f + off, n);
                fl_f16_to_f32_row_ref(h + off, g + off, n);
                assert_memory_equal(f, g, sizeof f); /* outside [off, off + n) untouched too */
                for (int i = 0; i < 80; i++) f[i] = (float)(rand() - RAND_MAX / 2) / 3e4f;
                k->f32_to_f16(f + off, h2 + off, n);
                fl_f32_to_f16_row_ref(f + off, h3 + off, n);
                assert_memory_equal(h2, h3, sizeof h2);
                k->bf16_to_f32(h + off, f + off, n);
                fl_bf16_to_f32_row_ref(h + off, g + off, n);
                assert_memory_equal(f + off, g + off, (size_t)n * sizeof(float));
            }
    }
    fl_isa_set(best);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_random_ops),   cmocka_unit_test(test_pool_lru_order),
        cmocka_unit_test(test_paged_vs_contiguous), cmocka_unit_test(test_paged_split_budget), cmocka_unit_test(test_paged_kv_heads_per_item), cmocka_unit_test(test_fp8_dequant_variants), cmocka_unit_test(test_fp8_quant_variants),
        cmocka_unit_test(test_kv_q_quant_variants), cmocka_unit_test(test_paged_quant_as_f32), cmocka_unit_test(test_fake_model),
        cmocka_unit_test(test_kv_random_ops),     cmocka_unit_test(test_prefix_cache), cmocka_unit_test(test_seq_truncate),
        cmocka_unit_test(test_batching_bitwise),  cmocka_unit_test(test_quant_types),
        cmocka_unit_test(test_sliding_window), cmocka_unit_test(test_sliding_window_16bit),    cmocka_unit_test(test_shift_rerope),
        cmocka_unit_test(test_streaming_past_context), cmocka_unit_test(test_swap_roundtrip),
        cmocka_unit_test(test_memory_budget),     cmocka_unit_test(test_alloc_failures),
        cmocka_unit_test(test_convert_short_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
