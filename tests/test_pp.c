/* Pipeline parallelism: run directly (one stage) and under `mpirun -np 2/4` (tests/cli_mpi.sh).
 * Every rank also runs the single-process model and compares logits and greedy tokens. */
#include "test.h"

#include "core/status.h"
#include "core/threads.h"
#include "dist/dist.h"
#include "dist/pp.h"
#include "kv/kv_contig.h"

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

enum { NP = 40, NG = 6, V_MAX = 512 };
static float g_ref[NP + NG][V_MAX], g_got[NP + NG][V_MAX];

/* Prefill NP tokens (logits for all) in n_micro micro-batches, then NG-1 greedy decode steps. */
static void run(fl_model *m, fl_pp_model *pp, int32_t n_micro, float (*lg)[V_MAX], int32_t *toks) {
    const fl_hparams *hp = fl_model_hparams(m);
    fl_kv_contig_params kp = {hp->n_layer, hp->n_head, hp->n_head_kv, hp->head_dim, 64, 1, 0, FL_TYPE_F32};
    fl_kv_contig *kv;
    assert_int_equal(fl_kv_contig_new(&kp, &kv), FL_OK);
    const int32_t mb = (NP + n_micro - 1) / n_micro;
    assert_int_equal(fl_model_workspace_new(m, pp ? mb : NP, pp ? mb : NP), FL_OK);
    int32_t tok[NP], pos[NP], sid[NP] = {0};
    int8_t all[NP];
    for (int i = 0; i < NP; i++) tok[i] = i == 0 ? 1 : 3 + (i * 37) % 400, pos[i] = i, all[i] = 1;
    fl_batch b = {NP, tok, pos, sid, all};
    fl_status st = pp ? fl_pp_forward(pp, &b, n_micro, fl_kv_contig_iface(), kv, lg[0])
                      : fl_model_forward(m, &b, fl_kv_contig_iface(), kv, lg[0]);
    if (st) fail_msg("prefill: %s", fl_last_error());
    for (int g = 0; g < NG; g++) {
        const float *l = lg[NP - 1 + g];
        int32_t best = 0;
        for (int32_t v = 1; v < hp->n_vocab; v++)
            if (l[v] > l[best]) best = v;
        toks[g] = best;
        if (g == NG - 1) break;
        int32_t p1 = NP + g;
        fl_batch d = {1, &best, &p1, sid, NULL};
        st = pp ? fl_pp_forward(pp, &d, 1, fl_kv_contig_iface(), kv, lg[NP + g])
                : fl_model_forward(m, &d, fl_kv_contig_iface(), kv, lg[NP + g]);
        if (st) fail_msg("decode: %s", fl_last_error());
    }
    fl_model_workspace_free(m);
    fl_kv_contig_free(kv);
}

static void pp_case(const char *model, int32_t n_micro) {
    const int32_t N = fl_comm_size(g_comm), r = fl_comm_rank(g_comm);
    fl_model *m;
    if (fl_model_load(FL_SHARED_PATH(model), NULL, &m)) fail_msg("%s", fl_last_error());
    const int32_t V = fl_model_hparams(m)->n_vocab, L = fl_model_hparams(m)->n_layer;
    int32_t ref_tok[NG], got_tok[NG];
    run(m, NULL, 1, g_ref, ref_tok);
    fl_model_free(m);
    fl_pp_model *pp;
    fl_status st = fl_pp_load(FL_SHARED_PATH(model), g_comm, &pp);
    if (N > L) {
        assert_int_equal(st, FL_ERR_UNSUPPORTED);
        mem_zero_but_comm();
        return;
    }
    if (st) fail_msg("%s", fl_last_error());
    int32_t l0, l1;
    fl_pp_stage_layers(L, r, N, &l0, &l1);
    assert_int_equal(fl_model_hparams(fl_pp_model_get(pp))->n_layer, l1 - l0);
    run(fl_pp_model_get(pp), pp, n_micro, g_got, got_tok);
    fl_pp_free(pp);
    double maxd = 0;
    for (int i = 0; i < NP + NG - 1; i++) {
        double d = fl_test_max_abs_diff(g_ref[i], g_got[i], V);
        if (d > maxd) maxd = d;
    }
    fprintf(stderr, "stage %d/%d %s: layers [%d, %d), %d micro-batches, max |dlogit| %.3g\n", r, N, model, l0, l1, n_micro, maxd);
    assert_true(maxd < 1e-3);
    for (int g = 0; g < NG; g++) assert_int_equal(ref_tok[g], got_tok[g]);
    mem_zero_but_comm();
}

static void test_pp_stories(void **state) {
    (void)state;
    NEED_SHARED();
    pp_case("models/stories260K.gguf", 4);
    pp_case("models/stories260K-q8_0.gguf", 3);
}

static void test_pp_synth(void **state) {
    (void)state;
    NEED_SHARED();
    pp_case("models/synth256/synth256-Q4_K_M.gguf", 5); /* 2 layers: 4 stages are refused */
}

static void test_stage_layers(void **state) {
    (void)state;
    int32_t l0, l1, prev = 0;
    for (int r = 0; r < 4; r++) {
        fl_pp_stage_layers(5, r, 4, &l0, &l1);
        assert_int_equal(l0, prev);
        assert_int_equal(l1 - l0, r == 0 ? 2 : 1);
        prev = l1;
    }
    assert_int_equal(prev, 5);
}

int main(int argc, char **argv) {
    if (fl_comm_new(&argc, &argv, &g_comm) != FL_OK) {
        fprintf(stderr, "comm: %s\n", fl_last_error());
        return 1;
    }
    fl_threads_set(1);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_stage_layers), cmocka_unit_test(test_pp_stories),
                                       cmocka_unit_test(test_pp_synth)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fl_comm_free(g_comm);
    return rc;
}
