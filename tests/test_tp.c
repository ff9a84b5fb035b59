/* Tensor parallelism: run directly (tp = 1) and under `mpirun -np 2/4` (tests/cli_mpi.sh).
 * Every rank also runs the plain single-process model and compares greedy tokens and logits. */
#include "test.h"

#include "core/status.h"
#include "core/threads.h"
#include "dist/dist.h"
#include "dist/tp.h"
#include "kernels/matmul.h"
#include "kv/kv_cache.h"
#include "kv/kv_contig.h"
#include "plan/plan.h"

#include <string.h>

static fl_comm *g_comm;

/* Every category back at zero except the communicator itself (FL_MEM_COMM). */
static void mem_zero_but_comm(void) {
    for (int c = 0; c < FL_MEM_COUNT; c++) {
        if (c == FL_MEM_COMM) continue;
        if (fl_mem_current((fl_mem_cat)c)) {
            fl_mem_report(stderr);
            fail_msg("memory category %s not back at zero", fl_mem_cat_name((fl_mem_cat)c));
        }
    }
}

#define N_PROMPT 7
#define N_GEN 8
#define MAX_T 32

typedef struct run_out {
    float logits[N_PROMPT + N_GEN][512];
    int32_t tokens[N_GEN];
} run_out;

/* Prefill the prompt with logits for every prompt token, then N_GEN greedy decode steps. */
static void run(fl_model *m, fl_tp_model *tp, bool paged, run_out *o) {
    const fl_hparams *hp = fl_model_hparams(m);
    assert_true(hp->n_vocab <= 512);
    fl_kv_contig *kc = NULL;
    fl_kv_cache *kp = NULL;
    fl_kv_iface pif;
    const fl_kv_iface *kif;
    void *kctx;
    if (paged) {
        fl_kv_config cfg = {.n_layer = hp->n_layer, .n_head = hp->n_head_local, .n_head_kv = hp->n_head_kv_local,
                            .head_dim = hp->head_dim, .type = FL_TYPE_F32, .block_size = 16, .n_blocks = 8,
                            .n_seq_max = 1};
        kp = fl_kv_new(&cfg);
        assert_non_null(kp);
        pif = fl_kv_iface_get();
        kif = &pif;
        kctx = kp;
    } else {
        fl_kv_contig_params kpar = {hp->n_layer, hp->n_head_local, hp->n_head_kv_local, hp->head_dim, 64, 1, hp->n_swa,
                                    FL_TYPE_F32};
        assert_int_equal(fl_kv_contig_new(&kpar, &kc), FL_OK);
        kif = fl_kv_contig_iface();
        kctx = kc;
    }
    assert_int_equal(fl_model_workspace_new(m, MAX_T, MAX_T), FL_OK);
    int32_t tok[MAX_T], pos[MAX_T], sid[MAX_T];
    int8_t lg[MAX_T];
    const int32_t prompt[N_PROMPT] = {1, 403, 407, 261, 378, 275, 500};
    for (int i = 0; i < N_PROMPT; i++) {
        tok[i] = prompt[i] % hp->n_vocab;
        pos[i] = i;
        sid[i] = 0;
        lg[i] = 1;
    }
    fl_batch b = {N_PROMPT, tok, pos, sid, lg};
    fl_status st = tp ? fl_tp_forward(tp, &b, kif, kctx, o->logits[0]) : fl_model_forward(m, &b, kif, kctx, o->logits[0]);
    if (st) fail_msg("prefill: %s", fl_last_error());
    for (int g = 0; g < N_GEN; g++) {
        const float *l = o->logits[N_PROMPT - 1 + g];
        int32_t best = 0;
        for (int32_t v = 1; v < hp->n_vocab; v++)
            if (l[v] > l[best]) best = v;
        o->tokens[g] = best;
        if (g == N_GEN - 1) break;
        tok[0] = best;
        pos[0] = N_PROMPT + g;
        fl_batch d = {1, tok, pos, sid, NULL};
        st = tp ? fl_tp_forward(tp, &d, kif, kctx, o->logits[N_PROMPT + g]) : fl_model_forward(m, &d, kif, kctx, o->logits[N_PROMPT + g]);
        if (st) fail_msg("decode: %s", fl_last_error());
    }
    fl_kv_contig_free(kc);
    fl_kv_free(kp);
    fl_model_workspace_free(m);
}

static run_out g_ref, g_got;

static void compare(const char *model, bool paged, bool f32act, double tol) {
    if (!fl_test_have_shared()) {
        fprintf(stderr, "SKIP: no shared data\n");
        return;
    }
    const bool prev = fl_matmul_f32_act();
    fl_matmul_set_f32_act(f32act);
    fl_model *m;
    if (fl_model_load(FL_SHARED_PATH(model), NULL, &m)) fail_msg("load %s: %s", model, fl_last_error());
    run(m, NULL, paged, &g_ref);
    const int32_t V = fl_model_hparams(m)->n_vocab;
    fl_model_free(m);
    fl_tp_model *tp;
    if (fl_tp_load(FL_SHARED_PATH(model), g_comm, &tp)) fail_msg("tp load %s: %s", model, fl_last_error());
    const fl_tp_shard *s = fl_tp_shard_get(tp);
    run(fl_tp_model_get(tp), tp, paged, &g_got);
    double maxd = 0;
    for (int r = 0; r < N_PROMPT + N_GEN - 1; r++) {
        double d = fl_test_max_abs_diff(g_ref.logits[r], g_got.logits[r], V);
        if (d > maxd) maxd = d;
    }
    fprintf(stderr, "rank %d/%d %s%s: heads %d+%d kv %d+%d ff %d+%d, %d f32 slices, %zu weight bytes, max |dlogit| %.3g\n",
            s->rank, s->size, model, paged ? " (paged)" : "", s->head0, s->n_head, s->kv0, s->n_head_kv, s->ff0, s->n_ff,
            fl_tp_n_dequantized(tp), fl_tp_weight_bytes(tp), maxd);
    fl_tp_free(tp);
    fl_matmul_set_f32_act(prev);
    if (maxd > tol) fail_msg("%s: logits differ by %.3g > %.3g", model, maxd, tol);
    for (int g = 0; g < N_GEN; g++) assert_int_equal(g_ref.tokens[g], g_got.tokens[g]);
    mem_zero_but_comm();
}

static void test_stories_f32(void **state) {
    (void)state;
    compare("models/stories260K.gguf", false, false, 1e-3);
}
static void test_stories_f32_paged(void **state) {
    (void)state;
    compare("models/stories260K.gguf", true, false, 1e-3);
}
static void test_stories_quant(void **state) {
    (void)state;
    compare("models/stories260K-q8_0.gguf", false, true, 1e-3);
    compare("models/stories260K-q4_0.gguf", true, true, 1e-3);
    compare("models/stories260K-f16.gguf", false, true, 1e-3);
}
static void test_synth(void **state) {
    (void)state;
    /* every block type (4 ranks: q4_K/q6_K/q5_K/q3_K/q2_K w2 slices are dequantized, 768 = 3
     * super-blocks; 32-element types split on block boundaries) */
    static const char *types[] = {"F32", "Q8_0", "Q4_K_M", "Q5_1", "Q6_K", "IQ4_NL", "F16", "BF16", "Q4_0", "Q4_1",
                                  "Q5_0", "Q2_K", "Q3_K_M", "Q5_K_M"};
    const size_t n = sizeof types / sizeof *types;
    for (size_t i = 0; i < n; i++) {
        char path[128];
        snprintf(path, sizeof path, "models/synth256/synth256-%s.gguf", types[i]);
        compare(path, i % 2 == 1, true, 1e-3);
    }
}
/* The quantized-activation path (the default) also agrees: q8_0 weights, tokens equal. */
static void test_synth_q8_act(void **state) {
    (void)state;
    compare("models/synth256/synth256-Q8_0.gguf", false, false, 2e-2);
}

static void test_shard_compute(void **state) {
    (void)state;
    fl_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.n_head = 8;
    hp.n_head_kv = 4;
    hp.n_ff = 172;
    fl_tp_shard s;
    int32_t total = 0;
    for (int r = 0; r < 4; r++) {
        assert_int_equal(fl_tp_shard_compute(&hp, 1, r, 4, &s), FL_OK);
        assert_int_equal(s.n_head, 2);
        assert_int_equal(s.head0, 2 * r);
        assert_int_equal(s.kv0, r);
        assert_int_equal(s.n_head_kv, 1);
        assert_int_equal(s.ff0, total);
        total += s.n_ff;
    }
    assert_int_equal(total, 172);
    /* 4 heads, 2 kv heads, 4 ranks: kv replicated on 2 ranks each */
    hp.n_head = 4;
    hp.n_head_kv = 2;
    hp.n_ff = 768;
    for (int r = 0; r < 4; r++) {
        assert_int_equal(fl_tp_shard_compute(&hp, 256, r, 4, &s), FL_ERR_UNSUPPORTED); /* 3 blocks, 4 ranks */
        assert_int_equal(fl_tp_shard_compute(&hp, 32, r, 4, &s), FL_OK);
        assert_int_equal(s.kv0, r / 2);
        assert_int_equal(s.n_head_kv, 1);
        assert_int_equal(s.n_ff, 192);
    }
    assert_int_equal(fl_tp_shard_compute(&hp, 1, 0, 3, &s), FL_ERR_UNSUPPORTED);
    hp.n_head = 12;
    hp.n_head_kv = 4;
    assert_int_equal(fl_tp_shard_compute(&hp, 1, 0, 6, &s), FL_ERR_UNSUPPORTED); /* 4 kv heads over 6 */
    mem_zero_but_comm();
}

/* Per-rank peak memory of a TP run (prefill + decode with the paged cache) vs the planner. */
static void plan_case(const char *model, int32_t kv_type, int64_t n_ctx, int64_t T) {
    const int32_t N = fl_comm_size(g_comm), rank = fl_comm_rank(g_comm);
    fl_model_shape shape;
    if (fl_plan_shape_from_gguf(FL_SHARED_PATH(model), &shape)) fail_msg("%s", fl_last_error());
    fl_plan_input in;
    fl_plan_input_default(&in, &shape);
    in.tp = N;
    in.kv_type = kv_type;
    in.n_ctx = n_ctx;
    in.n_prefill = T;
    in.kv_block = 16;
    in.n_threads = 1;
    fl_plan_result pr;
    if (fl_plan_compute(&shape, &in, &pr)) fail_msg("plan: %s", fl_last_error());
    fl_mem_reset_peaks();
    fl_tp_model *tp;
    if (fl_tp_load(FL_SHARED_PATH(model), g_comm, &tp)) fail_msg("%s", fl_last_error());
    fl_model *m = fl_tp_model_get(tp);
    const fl_hparams *hp = fl_model_hparams(m);
    fl_kv_config cfg = {.n_layer = hp->n_layer, .n_head = hp->n_head_local, .n_head_kv = hp->n_head_kv_local,
                        .head_dim = hp->head_dim, .type = kv_type, .block_size = 16,
                        .n_blocks = (int32_t)((n_ctx + 15) / 16 + 1), .n_seq_max = 1};
    fl_kv_cache *kv = fl_kv_new(&cfg);
    assert_non_null(kv);
    assert_int_equal(fl_model_workspace_new(m, (int32_t)T, 1), FL_OK);
    const size_t lb = (size_t)hp->n_vocab * sizeof(float);
    float *logits = fl_alloc(FL_MEM_ACT, lb, 64);
    int32_t tok[512], pos[512], sid[512] = {0};
    assert_true(T <= 512 && n_ctx <= 512);
    const fl_kv_iface kif = fl_kv_iface_get();
    for (int64_t p0 = 0; p0 < n_ctx; p0 += T) {
        const int32_t n = (int32_t)(n_ctx - p0 < T ? n_ctx - p0 : T);
        for (int32_t i = 0; i < n; i++) tok[i] = (int32_t)((p0 + i) * 7 % hp->n_vocab), pos[i] = (int32_t)(p0 + i);
        fl_batch b = {n, tok, pos, sid, NULL};
        if (fl_tp_forward(tp, &b, &kif, kv, logits)) fail_msg("%s", fl_last_error());
    }
    /* WEIGHTS, KV, ACT and SCRATCH (matmul workspaces, the paged kernel's workspace): each rank's
     * peaks against the plan for that rank; every category and their sum within 5% */
    static const fl_mem_cat cats[] = {FL_MEM_WEIGHTS, FL_MEM_KV, FL_MEM_ACT, FL_MEM_SCRATCH};
    double meas = 0, plan = 0;
    char line[512];
    int o = snprintf(line, sizeof line, "rank %d/%d %s kv %s ctx %lld T %lld:", rank, N, model, fl_type_name(kv_type),
                     (long long)n_ctx, (long long)T);
    for (size_t i = 0; i < sizeof cats / sizeof *cats; i++) {
        meas += (double)fl_mem_peak(cats[i]);
        plan += (double)pr.dev[0].bytes[cats[i]];
        CHECK_NEAR((double)fl_mem_peak(cats[i]), (double)pr.dev[0].bytes[cats[i]], 0.05 * (double)pr.dev[0].bytes[cats[i]]);
        o += snprintf(line + o, sizeof line - (size_t)o, " %s %zu/%llu", fl_mem_cat_name(cats[i]), fl_mem_peak(cats[i]),
                      (unsigned long long)pr.dev[0].bytes[cats[i]]);
    }
    fprintf(stderr, "%s (measured/plan); weights+kv+act+scratch measured %.0f plan %.0f (%+.2f%%)\n", line, meas, plan,
            100.0 * (meas - plan) / plan);
    assert_int_equal(fl_mem_peak(FL_MEM_KV), pr.dev[0].bytes[FL_MEM_KV]);
    CHECK_NEAR(fl_mem_peak(FL_MEM_WEIGHTS), (double)pr.dev[0].bytes[FL_MEM_WEIGHTS], 0.02 * pr.dev[0].bytes[FL_MEM_WEIGHTS]);
    CHECK_NEAR(meas, plan, 0.05 * plan);
    fl_free(FL_MEM_ACT, logits, lb);
    fl_kv_free(kv);
    fl_tp_free(tp);
    mem_zero_but_comm();
}

static void test_memory_vs_plan(void **state) {
    (void)state;
    NEED_SHARED();
    plan_case("models/stories260K.gguf", FL_TYPE_F16, 512, 64);
    /* synth256 has 2 kv heads: with 4 ranks each holds one replicated kv head (1/2 of wk, wv) */
    plan_case("models/synth256/synth256-Q8_0.gguf", FL_TYPE_F16, 512, 64);
}

int main(int argc, char **argv) {
    if (fl_comm_new(&argc, &argv, &g_comm) != FL_OK) {
        fprintf(stderr, "comm: %s\n", fl_last_error());
        return 1;
    }
    fl_threads_set(1); /* ranks share 2 cores: one thread each (OMP_NUM_THREADS does not reach fl_parallel) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shard_compute), cmocka_unit_test(test_stories_f32), cmocka_unit_test(test_stories_f32_paged),
        cmocka_unit_test(test_stories_quant), cmocka_unit_test(test_synth),       cmocka_unit_test(test_synth_q8_act),
        cmocka_unit_test(test_memory_vs_plan),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fl_comm_free(g_comm);
    return rc;
}
