/* Sequence parallelism (ring attention): run directly (one rank) and under `mpirun -np 2/4`
 * (tests/cli_mpi.sh).  Every rank also computes the single-process result and compares. */
#include "test.h"

#include "core/dtype.h"
#include "core/status.h"
#include "core/threads.h"
#include "dist/dist.h"
#include "dist/sp.h"
#include "kernels/attn.h"
#include "kv/kv_contig.h"

#include <stdlib.h>
#include <string.h>

static fl_comm *g_comm;

static void mem_zero_but_comm(void) {
    for (int c = 0; c < FL_MEM_COUNT; c++) {
        if (c == FL_MEM_COMM) continue;
        if (fl_mem_current((fl_mem_cat)c)) {
            fl_mem_report(stderr);
            fail_msg("memory category %s not back at zero", fl_mem_cat_name((fl_mem_cat)c));
        }
    }
}

static float lcg(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return ((float)(*s >> 8) / 16777216.0f) * 2.0f - 1.0f;
}

enum { T = 37, H = 4, HKV = 2, D = 16 };

/* Ring attention over the chunks of this rank == causal attention over the whole sequence, then
 * one decode step (distributed keys, merged partials) == the last row of attention over T+1. */
static void ring_case(int32_t kv_type, fl_attn_impl impl) {
    const int32_t N = fl_comm_size(g_comm), r = fl_comm_rank(g_comm);
    static float q[T + 1][H * D], k[T + 1][HKV * D], v[T + 1][HKV * D], ref[T + 1][H * D];
    static uint16_t k16[T + 1][HKV * D], v16[T + 1][HKV * D];
    uint32_t seed = 1234;
    for (int t = 0; t <= T; t++) {
        for (int i = 0; i < H * D; i++) q[t][i] = lcg(&seed);
        for (int i = 0; i < HKV * D; i++) {
            k[t][i] = lcg(&seed);
            v[t][i] = lcg(&seed);
            k16[t][i] = fl_f32_to_f16(k[t][i]);
            v16[t][i] = fl_f32_to_f16(v[t][i]);
        }
    }
    const bool f16 = kv_type == FL_TYPE_F16;
    fl_attn_args a = {.n_seq = 1, .n_q = T, .n_kv = T, .n_head = H, .n_head_kv = HKV, .head_dim = D, .q = q[0],
                      .k = f16 ? (const void *)k16 : (const void *)k, .v = f16 ? (const void *)v16 : (const void *)v,
                      .kv_type = kv_type, .out = ref[0], .causal = true, .impl = FL_ATTN_NAIVE};
    assert_int_equal(fl_attn_forward(&a), FL_OK);
    fl_sp_params p = {1, H, HKV, D, 64, kv_type, impl};
    fl_sp *s;
    assert_int_equal(fl_sp_new(g_comm, &p, &s), FL_OK);
    assert_int_equal(fl_mem_current(FL_MEM_KV), fl_sp_kv_bytes(&p, N));
    assert_int_equal(fl_sp_begin_prefill(s, T), FL_OK);
    const int64_t n = fl_sp_local_tokens(T, N, r);
    static float lq[T][H * D], lk[T][HKV * D], lv[T][HKV * D], lo[T][H * D];
    int32_t pos[T];
    int64_t j = 0;
    for (int c = 0; c < 2; c++) {
        int64_t c0, c1;
        fl_sp_chunk(T, 2 * N, c ? 2 * N - 1 - r : r, &c0, &c1);
        for (int64_t t = c0; t < c1; t++, j++) {
            memcpy(lq[j], q[t], sizeof lq[j]);
            memcpy(lk[j], k[t], sizeof lk[j]);
            memcpy(lv[j], v[t], sizeof lv[j]);
            pos[j] = (int32_t)t;
        }
    }
    assert_int_equal(j, n);
    int32_t tok[T] = {0}, sid[T] = {0};
    fl_batch b = {(int32_t)n, tok, pos, sid, NULL};
    const fl_kv_iface *kif = fl_sp_iface();
    assert_int_equal(kif->prepare(s, &b), FL_OK);
    kif->store(s, 0, &b, lk[0], lv[0]);
    kif->attend(s, 0, &b, lq[0], lo[0]);
    assert_int_equal(fl_sp_status(s), FL_OK);
    fl_sp_commit(s);
    double maxd = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fl_test_max_abs_diff(ref[pos[i]], lo[i], H * D);
        if (d > maxd) maxd = d;
    }
    assert_int_equal(fl_sp_n_local(s), n);
    /* decode the token at position T */
    a.n_q = T + 1;
    a.n_kv = T + 1;
    assert_int_equal(fl_attn_forward(&a), FL_OK);
    assert_int_equal(fl_sp_begin_decode(s), FL_OK);
    int32_t dpos = T;
    fl_batch d = {1, tok, &dpos, sid, NULL};
    assert_int_equal(kif->prepare(s, &d), FL_OK);
    kif->store(s, 0, &d, k[T], v[T]);
    kif->attend(s, 0, &d, q[T], lo[0]);
    assert_int_equal(fl_sp_status(s), FL_OK);
    fl_sp_commit(s);
    double dd = fl_test_max_abs_diff(ref[T], lo[0], H * D);
    fprintf(stderr, "rank %d/%d ring attention %s %s: %lld local tokens, max |d| prefill %.3g decode %.3g\n", r, N,
            fl_type_name(kv_type), impl == FL_ATTN_NAIVE ? "naive" : "flash", (long long)n, maxd, dd);
    assert_true(maxd < 1e-5);
    assert_true(dd < 1e-5);
    assert_int_equal(fl_sp_n_total(s), T + 1);
    fl_sp_free(s);
    mem_zero_but_comm();
}

static void test_ring_attention(void **state) {
    (void)state;
    ring_case(FL_TYPE_F32, FL_ATTN_AUTO);
    ring_case(FL_TYPE_F16, FL_ATTN_AUTO);
    ring_case(FL_TYPE_F32, FL_ATTN_NAIVE);
}

static void test_chunks(void **state) {
    (void)state;
    /* 2N chunks cover [0, T) in order; every rank gets about T/N tokens */
    for (int32_t n = 1; n <= 8; n++) {
        int64_t prev = 0, sum = 0;
        for (int32_t c = 0; c < 2 * n; c++) {
            int64_t lo, hi;
            fl_sp_chunk(1001, 2 * n, c, &lo, &hi);
            assert_int_equal(lo, prev);
            prev = hi;
        }
        assert_int_equal(prev, 1001);
        for (int32_t r = 0; r < n; r++) {
            int64_t l = fl_sp_local_tokens(1001, n, r);
            assert_true(l >= 1001 / n - 1 && l <= 1001 / n + 2);
            sum += l;
        }
        assert_int_equal(sum, 1001);
    }
    fl_sp_params p = {1, H, HKV, D, 64, FL_TYPE_F32, FL_ATTN_AUTO};
    fl_sp *s;
    assert_int_equal(fl_sp_new(g_comm, &p, &s), FL_OK);
    assert_int_equal(fl_sp_begin_prefill(s, 2 * fl_comm_size(g_comm) - 1), FL_ERR_INVALID);
    assert_int_equal(fl_sp_begin_prefill(s, 65), FL_NO_KV_SPACE);
    fl_sp_free(s);
    p.kv_type = FL_TYPE_Q8_0;
    assert_int_equal(fl_sp_new(g_comm, &p, &s), FL_ERR_INVALID);
    mem_zero_but_comm();
}

/* stories260K: prefill with --sp == one process (logits of the last prompt token), then greedy. */
static void test_stories_prefill(void **state) {
    (void)state;
    NEED_SHARED();
    enum { NP = 45, NG = 8 };
    const int32_t N = fl_comm_size(g_comm), r = fl_comm_rank(g_comm);
    fl_model *m;
    if (fl_model_load(FL_SHARED_PATH("models/stories260K.gguf"), NULL, &m)) fail_msg("%s", fl_last_error());
    const fl_hparams *hp = fl_model_hparams(m);
    const int32_t V = hp->n_vocab;
    int32_t prompt[NP];
    uint32_t seed = 7;
    prompt[0] = 1;
    for (int i = 1; i < NP; i++) prompt[i] = 3 + (int32_t)((lcg(&seed) + 1.0f) * 200.0f);
    /* reference */
    static float ref[NG][512], got[NG][512];
    int32_t ref_tok[NG], got_tok[NG];
    {
        fl_kv_contig_params kp = {hp->n_layer, hp->n_head, hp->n_head_kv, hp->head_dim, 64, 1, 0, FL_TYPE_F32};
        fl_kv_contig *kv;
        assert_int_equal(fl_kv_contig_new(&kp, &kv), FL_OK);
        assert_int_equal(fl_model_workspace_new(m, NP, 1), FL_OK);
        int32_t pos[NP], sid[NP] = {0};
        for (int i = 0; i < NP; i++) pos[i] = i;
        fl_batch b = {NP, prompt, pos, sid, NULL};
        assert_int_equal(fl_model_forward(m, &b, fl_kv_contig_iface(), kv, ref[0]), FL_OK);
        for (int g = 0; g < NG; g++) {
            int32_t best = 0;
            for (int32_t t = 1; t < V; t++)
                if (ref[g][t] > ref[g][best]) best = t;
            ref_tok[g] = best;
            if (g == NG - 1) break;
            int32_t p1 = NP + g;
            fl_batch d = {1, &best, &p1, sid, NULL};
            assert_int_equal(fl_model_forward(m, &d, fl_kv_contig_iface(), kv, ref[g + 1]), FL_OK);
        }
        fl_kv_contig_free(kv);
    }
    /* sequence parallel */
    fl_sp_params p = {hp->n_layer, hp->n_head, hp->n_head_kv, hp->head_dim, 64, FL_TYPE_F32, FL_ATTN_AUTO};
    fl_sp *s;
    assert_int_equal(fl_sp_new(g_comm, &p, &s), FL_OK);
    assert_int_equal(fl_model_workspace_new(m, (int32_t)fl_sp_local_tokens(NP, N, r), 1), FL_OK);
    if (fl_sp_prefill(s, m, prompt, NP, got[0])) fail_msg("sp prefill: %s", fl_last_error());
    for (int g = 0; g < NG; g++) {
        int32_t best = 0;
        for (int32_t t = 1; t < V; t++)
            if (got[g][t] > got[g][best]) best = t;
        got_tok[g] = best;
        if (g == NG - 1) break;
        if (fl_sp_decode(s, m, best, got[g + 1])) fail_msg("sp decode: %s", fl_last_error());
    }
    double maxd = 0;
    for (int g = 0; g < NG; g++) {
        double d = fl_test_max_abs_diff(ref[g], got[g], V);
        if (d > maxd) maxd = d;
    }
    fprintf(stderr, "rank %d/%d stories260K sp prefill %d + %d decode: %d local tokens, KV %zu bytes, max |dlogit| %.3g\n",
            r, N, NP, NG - 1, fl_sp_n_local(s), fl_mem_current(FL_MEM_KV), maxd);
    fl_sp_free(s);
    fl_model_free(m);
    assert_true(maxd < 1e-3);
    for (int g = 0; g < NG; g++) assert_int_equal(ref_tok[g], got_tok[g]);
    mem_zero_but_comm();
}

int main(int argc, char **argv) {
    if (fl_comm_new(&argc, &argv, &g_comm) != FL_OK) {
        fprintf(stderr, "comm: %s\n", fl_last_error());
        return 1;
    }
    fl_threads_set(1); /* ranks share 2 cores */
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_chunks), cmocka_unit_test(test_ring_attention),
                                       cmocka_unit_test(test_stories_prefill)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fl_comm_free(g_comm);
    return rc;
}
