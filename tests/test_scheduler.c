/* Tests for src/engine/scheduler: replay fixed request lists against a fake KV that only counts
 * blocks, check the invariants after every step, a hand-derived trace, preemption by recompute
 * and by swap, static batching, and that every block comes back. */
#include "test.h"

#include "core/status.h"
#include "engine/scheduler.h"

#include <string.h>

/* ---- fake KV: block accounting only ---- */
#define MAX_REQ 64
typedef struct fake_kv {
    int32_t bs;              /* tokens per block */
    int64_t total, used;     /* blocks */
    int64_t held[MAX_REQ];   /* blocks held per request id */
    int64_t swapped[MAX_REQ];/* blocks in the swap tier per request id */
    int32_t cached[MAX_REQ]; /* prefix-cache hit to report at seq_begin, per request id */
    int64_t swap_used;
    int slot_mode;           /* contiguous: one block (slot) per sequence whatever its length */
    int32_t slot_tokens;
} fake_kv;

static int64_t blocks_for(const fake_kv *f, int32_t n) {
    if (f->slot_mode) return n > 0 ? 1 : 0;
    return (n + f->bs - 1) / f->bs;
}
static int64_t fk_n_free(void *ctx) {
    fake_kv *f = ctx;
    return f->total - f->used;
}
static fl_status fk_seq_begin(void *ctx, fl_request *r, int32_t *n_cached) {
    fake_kv *f = ctx;
    assert_int_equal(f->held[r->id], 0);
    int32_t c = f->cached[r->id];
    if (c >= r->n_tokens) c = ((r->n_tokens - 1) / f->bs) * f->bs;
    *n_cached = c;
    f->held[r->id] = blocks_for(f, c);
    f->used += f->held[r->id];
    return FL_OK;
}
static int64_t fk_n_needed(void *ctx, const fl_request *r, int32_t n_total) {
    fake_kv *f = ctx;
    int64_t need = blocks_for(f, n_total) - f->held[r->id];
    return need > 0 ? need : 0;
}
static fl_status fk_reserve(void *ctx, fl_request *r, int32_t n_total) {
    fake_kv *f = ctx;
    if (f->slot_mode && n_total > f->slot_tokens) return FL_NO_KV_SPACE;
    int64_t need = fk_n_needed(ctx, r, n_total);
    if (need > f->total - f->used) return FL_NO_KV_SPACE;
    f->held[r->id] += need;
    f->used += need;
    return FL_OK;
}
static void fk_seq_end(void *ctx, fl_request *r) {
    fake_kv *f = ctx;
    f->used -= f->held[r->id];
    f->held[r->id] = 0;
    f->swap_used -= f->swapped[r->id];
    f->swapped[r->id] = 0;
}
static fl_status fk_swap_out(void *ctx, fl_request *r) {
    fake_kv *f = ctx;
    f->swapped[r->id] = f->held[r->id];
    f->swap_used += f->held[r->id];
    f->used -= f->held[r->id];
    f->held[r->id] = 0;
    return FL_OK;
}
static fl_status fk_swap_in(void *ctx, fl_request *r) {
    fake_kv *f = ctx;
    if (f->swapped[r->id] > f->total - f->used) return FL_NO_KV_SPACE;
    f->held[r->id] = f->swapped[r->id];
    f->used += f->held[r->id];
    f->swap_used -= f->swapped[r->id];
    f->swapped[r->id] = 0;
    return FL_OK;
}

static fl_sched_kv fake_iface(fake_kv *f, int with_swap) {
    fl_sched_kv kv = {f, fk_n_free, fk_seq_begin, fk_n_needed, fk_reserve, fk_seq_end,
                      with_swap ? fk_swap_out : NULL, with_swap ? fk_swap_in : NULL, NULL};
    return kv;
}

/* ---- a fixed workload and a driver that replays it ---- */
typedef struct workload {
    int n;
    int32_t prompt[MAX_REQ], gen[MAX_REQ];
    int32_t prio[MAX_REQ]; /* FL_SCHED_PRIORITY runs */
} workload;

typedef struct run_result {
    int64_t steps, preemptions, swaps_out, swaps_in;
    int32_t max_running, max_step_tokens;
    int32_t generated[MAX_REQ];
    int64_t decodes_skipped; /* a decode-ready running request left out of a step without preemption */
} run_result;

static void run_workload(const workload *w, const fl_sched_params *sp, fake_kv *f, int with_swap, run_result *res) {
    memset(res, 0, sizeof *res);
    fl_sched_kv kv = fake_iface(f, with_swap);
    fl_sched *s;
    assert_int_equal(fl_sched_new(sp, &kv, &s), FL_OK);
    fl_request *reqs[MAX_REQ];
    int32_t toks[512];
    for (int i = 0; i < 512; i++) toks[i] = i;
    for (int i = 0; i < w->n; i++) {
        fl_request_params p = {0};
        p.prompt = toks;
        p.n_prompt = w->prompt[i];
        p.max_tokens = w->gen[i];
        p.priority = w->prio[i];
        assert_int_equal(fl_request_new(&p, i, 0, i, &reqs[i]), FL_OK);
        assert_int_equal(fl_sched_add(s, reqs[i]), FL_OK);
    }
    int n_done = 0;
    while (n_done < w->n) {
        assert_true(res->steps < 10000);
        /* decode-ready running requests at the start of the step */
        fl_request *ready[MAX_REQ];
        int n_ready = 0;
        for (int32_t i = 0; i < fl_sched_n_running(s); i++) {
            fl_request *r = fl_sched_running_at(s, i);
            if (!r->padding && fl_request_n_uncomputed(r) == 1) ready[n_ready++] = r;
        }
        fl_sched_out out;
        assert_int_equal(fl_sched_schedule(s, &out), FL_OK);
        if (fl_sched_check(s) != FL_OK) fail_msg("%s", fl_last_error());
        assert_true(out.n_tokens <= sp->max_batch_tokens);
        assert_true(out.n_entries > 0); /* never stalls while work is left */
        if (out.n_tokens > res->max_step_tokens) res->max_step_tokens = out.n_tokens;
        int32_t sum = 0;
        for (int32_t i = 0; i < out.n_entries; i++) {
            fl_request *r = out.e[i].r;
            sum += out.e[i].n;
            assert_true(out.e[i].n >= 1);
            assert_true(out.e[i].pad || r->n_computed + out.e[i].n <= r->n_tokens);
            /* the KV side has room for what runs */
            assert_true(f->held[r->id] >= blocks_for(f, r->n_computed + out.e[i].n));
            for (int32_t j = 0; j < i; j++) assert_ptr_not_equal(out.e[j].r, r);
        }
        assert_int_equal(sum, out.n_tokens);
        if (out.n_preempted == 0)
            for (int k = 0; k < n_ready; k++) {
                int found = 0;
                for (int32_t i = 0; i < out.n_entries; i++) found |= out.e[i].r == ready[k];
                res->decodes_skipped += !found;
            }
        /* block accounting never exceeds the pool */
        int64_t held = 0;
        for (int i = 0; i < w->n; i++) held += f->held[i];
        assert_int_equal(held, f->used);
        assert_true(f->used <= f->total);
        fl_sched_commit(s, &out);
        for (int32_t i = 0; i < out.n_entries; i++) {
            fl_request *r = out.e[i].r;
            if (out.e[i].pad || r->n_computed < r->n_tokens) continue;
            fl_request_append(r, 1000 + fl_request_n_generated(r)); /* "sample" */
            if (fl_request_n_generated(r) == r->max_tokens) {
                r->state = FL_REQ_FINISHED;
                r->finish = FL_FINISH_LENGTH;
                res->generated[r->id] = fl_request_n_generated(r);
                fl_sched_remove(s, r, true);
                n_done++;
            }
        }
        res->steps++;
    }
    /* static mode: the last batch's padding rows are gone once every member finished */
    assert_int_equal(fl_sched_n_running(s), 0);
    assert_int_equal(fl_sched_n_waiting(s), 0);
    assert_int_equal(f->used, 0);
    assert_int_equal(f->swap_used, 0);
    fl_sched_stats st;
    fl_sched_stats_get(s, &st);
    res->preemptions = st.preemptions;
    res->swaps_out = st.swaps_out;
    res->swaps_in = st.swaps_in;
    res->max_running = st.max_running;
    for (int i = 0; i < w->n; i++) {
        /* the tokens of a preempted request survive: generated ids are consecutive */
        for (int32_t j = 0; j < fl_request_n_generated(reqs[i]); j++)
            assert_int_equal(reqs[i]->tokens[reqs[i]->n_prompt + j], 1000 + j);
        fl_request_free(reqs[i]);
    }
    fl_sched_free(s);
}

static const workload W1 = {8, {30, 5, 50, 8, 12, 3, 40, 9}, {4, 10, 3, 6, 5, 8, 7, 12}};

static fl_sched_params params(int32_t max_seqs, int32_t budget, int32_t wm, fl_preempt_mode pm, int32_t st) {
    fl_sched_params p = {max_seqs, budget, wm, pm, st, FL_SCHED_FCFS};
    return p;
}

/* A request with id = arrival = i, priority prio, added to s. */
static fl_request *add_req(fl_sched *s, int i, int32_t n_prompt, int32_t max_tokens, int32_t prio) {
    static int32_t toks[64];
    fl_request_params p = {.prompt = toks, .n_prompt = n_prompt, .max_tokens = max_tokens, .priority = prio};
    fl_request *r;
    assert_int_equal(fl_request_new(&p, i, 0, i, &r), FL_OK);
    assert_int_equal(fl_sched_add(s, r), FL_OK);
    return r;
}

/* Run one step, check the invariants, commit, and "sample" for every request that reached its end. */
static void step(fl_sched *s, fl_sched_out *o) {
    assert_int_equal(fl_sched_schedule(s, o), FL_OK);
    if (fl_sched_check(s) != FL_OK) fail_msg("%s", fl_last_error());
    fl_sched_commit(s, o);
    for (int32_t i = 0; i < o->n_entries; i++)
        if (o->e[i].r->n_computed == o->e[i].r->n_tokens) fl_request_append(o->e[i].r, 1000 + fl_request_n_generated(o->e[i].r));
}

static void free_reqs(fl_sched *s, fl_request **r, int n) {
    for (int i = 0; i < n; i++) {
        fl_sched_remove(s, r[i], false);
        fl_request_free(r[i]);
    }
}

/* Hand-derived trace: budget 16, A (prompt 30) then B (prompt 5). */
static void test_trace(void **state) {
    (void)state;
    fake_kv f = {.bs = 4, .total = 100};
    fl_sched_kv kv = fake_iface(&f, 0);
    fl_sched_params sp = params(4, 16, 1, FL_PREEMPT_RECOMPUTE, 0);
    fl_sched *s;
    assert_int_equal(fl_sched_new(&sp, &kv, &s), FL_OK);
    int32_t toks[64] = {0};
    fl_request *a, *b;
    fl_request_params p = {.prompt = toks, .n_prompt = 30, .max_tokens = 3};
    assert_int_equal(fl_request_new(&p, 0, 0, 0, &a), FL_OK);
    p.n_prompt = 5;
    assert_int_equal(fl_request_new(&p, 1, 0, 1, &b), FL_OK);
    fl_sched_add(s, a);
    fl_sched_add(s, b);
    fl_sched_out o;
    /* step 1: A's first chunk takes the whole budget; B waits */
    assert_int_equal(fl_sched_schedule(s, &o), FL_OK);
    assert_int_equal(o.n_entries, 1);
    assert_ptr_equal(o.e[0].r, a);
    assert_int_equal(o.e[0].n, 16);
    assert_int_equal(f.held[0], 4);
    assert_int_equal(a->state, FL_REQ_RUNNING);
    assert_int_equal(b->state, FL_REQ_WAITING);
    fl_sched_commit(s, &o);
    /* step 2: A's last 14 prompt tokens, B admitted with a 2-token chunk */
    assert_int_equal(fl_sched_schedule(s, &o), FL_OK);
    assert_int_equal(o.n_entries, 2);
    assert_ptr_equal(o.e[0].r, a);
    assert_int_equal(o.e[0].n, 14);
    assert_ptr_equal(o.e[1].r, b);
    assert_int_equal(o.e[1].n, 2);
    fl_sched_commit(s, &o);
    fl_request_append(a, 7); /* A sampled its first token */
    /* step 3: A's decode comes first, then B's remaining 3 prompt tokens */
    assert_int_equal(fl_sched_schedule(s, &o), FL_OK);
    assert_int_equal(o.n_entries, 2);
    assert_ptr_equal(o.e[0].r, a);
    assert_int_equal(o.e[0].n, 1);
    assert_ptr_equal(o.e[1].r, b);
    assert_int_equal(o.e[1].n, 3);
    assert_int_equal(o.n_tokens, 4);
    fl_sched_commit(s, &o);
    fl_request_append(a, 8);
    fl_request_append(b, 9);
    /* step 4: two decodes */
    assert_int_equal(fl_sched_schedule(s, &o), FL_OK);
    assert_int_equal(o.n_entries, 2);
    assert_int_equal(o.n_tokens, 2);
    assert_int_equal(f.held[0], 8); /* 32 tokens of A */
    fl_sched_commit(s, &o);
    a->state = b->state = FL_REQ_FINISHED;
    fl_sched_remove(s, a, false);
    fl_sched_remove(s, b, false);
    assert_int_equal(f.used, 0);
    fl_request_free(a);
    fl_request_free(b);
    fl_sched_free(s);
    fl_test_mem_zero();
}

/* Plenty of KV: no preemption, decodes never skipped, budget and max_seqs respected. */
static void test_replay_roomy(void **state) {
    (void)state;
    fake_kv f = {.bs = 4, .total = 1000};
    fl_sched_params sp = params(4, 16, 2, FL_PREEMPT_RECOMPUTE, 0);
    run_result res;
    run_workload(&W1, &sp, &f, 0, &res);
    assert_int_equal(res.preemptions, 0);
    assert_int_equal(res.decodes_skipped, 0);
    assert_int_equal(res.max_running, 4);
    assert_int_equal(res.max_step_tokens, 16);
    for (int i = 0; i < W1.n; i++) assert_int_equal(res.generated[i], W1.gen[i]);
    fl_test_mem_zero();
}

/* A tiny pool (22 blocks of 4 tokens; the longest request needs 15): preemption by recompute. */
static void test_replay_preempt_recompute(void **state) {
    (void)state;
    fake_kv f = {.bs = 4, .total = 22};
    fl_sched_params sp = params(6, 32, 1, FL_PREEMPT_RECOMPUTE, 0);
    run_result res;
    run_workload(&W1, &sp, &f, 0, &res);
    assert_true(res.preemptions > 0);
    assert_int_equal(res.swaps_out, 0);
    for (int i = 0; i < W1.n; i++) assert_int_equal(res.generated[i], W1.gen[i]);
    fl_test_mem_zero();
}

static void test_replay_preempt_swap(void **state) {
    (void)state;
    fake_kv f = {.bs = 4, .total = 22};
    fl_sched_params sp = params(6, 32, 1, FL_PREEMPT_SWAP, 0);
    run_result res;
    run_workload(&W1, &sp, &f, 1, &res);
    assert_true(res.swaps_out > 0);
    assert_int_equal(res.swaps_in, res.swaps_out);
    for (int i = 0; i < W1.n; i++) assert_int_equal(res.generated[i], W1.gen[i]);
    fl_test_mem_zero();
}

/* Prefix cache: a request whose prompt is cached starts with those tokens computed. */
static void test_prefix_hit(void **state) {
    (void)state;
    fake_kv f = {.bs = 4, .total = 100};
    f.cached[1] = 8;
    f.cached[2] = 12; /* the whole prompt: the scheduler must still compute one token */
    fl_sched_kv kv = fake_iface(&f, 0);
    fl_sched_params sp = params(4, 64, 1, FL_PREEMPT_RECOMPUTE, 0);
    fl_sched *s;
    assert_int_equal(fl_sched_new(&sp, &kv, &s), FL_OK);
    int32_t toks[64] = {0};
    fl_request *r[3];
    for (int i = 0; i < 3; i++) {
        fl_request_params p = {.prompt = toks, .n_prompt = 12, .max_tokens = 2};
        assert_int_equal(fl_request_new(&p, i, 0, i, &r[i]), FL_OK);
        fl_sched_add(s, r[i]);
    }
    fl_sched_out o;
    assert_int_equal(fl_sched_schedule(s, &o), FL_OK);
    assert_int_equal(o.n_entries, 3);
    assert_int_equal(o.e[0].n, 12);
    assert_int_equal(o.e[1].n, 4);
    assert_int_equal(r[1]->n_cached_prompt, 8);
    assert_int_equal(o.e[2].n, 4); /* 12 cached -> last block recomputed */
    assert_int_equal(o.n_tokens, 20);
    fl_sched_stats st;
    fl_sched_stats_get(s, &st);
    assert_int_equal(st.prefix_hit_tokens, 16);
    assert_int_equal(st.prefix_miss_tokens, 20);
    for (int i = 0; i < 3; i++) {
        fl_sched_remove(s, r[i], false);
        fl_request_free(r[i]);
    }
    assert_int_equal(f.used, 0);
    fl_sched_free(s);
    fl_test_mem_zero();
}

/* Watermark: admission stops while fewer than watermark blocks would stay free. */
static void test_watermark(void **state) {
    (void)state;
    fake_kv g = {.bs = 4, .total = 7};
    fl_sched_kv kv = fake_iface(&g, 0);
    fl_sched_params sp = params(8, 256, 3, FL_PREEMPT_RECOMPUTE, 0);
    fl_sched *s;
    assert_int_equal(fl_sched_new(&sp, &kv, &s), FL_OK);
    int32_t toks[64] = {0};
    fl_request *q[3];
    for (int i = 0; i < 3; i++) {
        fl_request_params p = {.prompt = toks, .n_prompt = 8, .max_tokens = 2};
        assert_int_equal(fl_request_new(&p, i, 0, i, &q[i]), FL_OK);
        fl_sched_add(s, q[i]);
    }
    fl_sched_out o;
    assert_int_equal(fl_sched_schedule(s, &o), FL_OK);
    assert_int_equal(o.n_entries, 2); /* 2 blocks each; the third would leave 1 < 3 free */
    assert_int_equal(g.used, 4);
    assert_int_equal(q[2]->state, FL_REQ_WAITING);
    assert_false(q[2]->kv_live);
    for (int i = 0; i < 3; i++) {
        fl_sched_remove(s, q[i], false);
        fl_request_free(q[i]);
    }
    assert_int_equal(g.used, 0);
    fl_sched_free(s);
    fl_test_mem_zero();
}

/* Static baseline: one slot per sequence, a new batch only when the last one is done. */
static void test_static_batches(void **state) {
    (void)state;
    fake_kv f = {.bs = 4, .total = 3, .slot_mode = 1, .slot_tokens = 64};
    fl_sched_params sp = params(3, 64, 0, FL_PREEMPT_RECOMPUTE, 1);
    run_result res;
    run_workload(&W1, &sp, &f, 0, &res);
    assert_int_equal(res.preemptions, 0);
    assert_int_equal(res.max_running, 3);
    for (int i = 0; i < W1.n; i++) assert_int_equal(res.generated[i], W1.gen[i]);
    /* paged with the same 3 "slots" worth of blocks (3*64 tokens = 48 blocks) runs more at once */
    fake_kv g = {.bs = 4, .total = 48};
    fl_sched_params sp2 = params(8, 64, 0, FL_PREEMPT_RECOMPUTE, 0);
    run_result res2;
    run_workload(&W1, &sp2, &g, 0, &res2);
    assert_true(res2.max_running > res.max_running);
    assert_true(res2.steps < res.steps);
    fl_test_mem_zero();
}

/* FL_SCHED_PRIORITY: admission and each step's order by priority, then arrival. */
static void test_priority_order(void **state) {
    (void)state;
    fake_kv f = {.bs = 4, .total = 100};
    fl_sched_kv kv = fake_iface(&f, 0);
    fl_sched_params sp = params(2, 64, 1, FL_PREEMPT_RECOMPUTE, 0);
    sp.policy = FL_SCHED_PRIORITY;
    fl_sched *s;
    assert_int_equal(fl_sched_new(&sp, &kv, &s), FL_OK);
    fl_request *r[4] = {add_req(s, 0, 6, 4, 5), add_req(s, 1, 6, 4, 0), add_req(s, 2, 6, 4, 5), add_req(s, 3, 6, 4, -1)};
    assert_ptr_equal(fl_sched_waiting_at(s, 0), r[3]);
    assert_ptr_equal(fl_sched_waiting_at(s, 1), r[1]);
    assert_ptr_equal(fl_sched_waiting_at(s, 2), r[0]);
    assert_ptr_equal(fl_sched_waiting_at(s, 3), r[2]);
    fl_sched_out o;
    step(s, &o);
    assert_int_equal(o.n_entries, 2);
    assert_ptr_equal(o.e[0].r, r[3]);
    assert_ptr_equal(o.e[1].r, r[1]);
    assert_int_equal(o.n_preempted, 0);
    assert_int_equal(r[0]->state, FL_REQ_WAITING);
    /* the same requests under FCFS: arrival order */
    free_reqs(s, r, 4);
    fl_sched_free(s);
    sp.policy = FL_SCHED_FCFS;
    assert_int_equal(fl_sched_new(&sp, &kv, &s), FL_OK);
    fl_request *q[4] = {add_req(s, 0, 6, 4, 5), add_req(s, 1, 6, 4, 0), add_req(s, 2, 6, 4, 5), add_req(s, 3, 6, 4, -1)};
    step(s, &o);
    assert_int_equal(o.n_entries, 2);
    assert_ptr_equal(o.e[0].r, q[0]);
    assert_ptr_equal(o.e[1].r, q[1]);
    free_reqs(s, q, 4);
    assert_int_equal(f.used, 0);
    fl_sched_free(s);
    sp.policy = (fl_sched_policy)7;
    assert_int_equal(fl_sched_new(&sp, &kv, &s), FL_ERR_INVALID);
    fl_test_mem_zero();
}

/* A waiting request of higher priority preempts the last running one to get a slot (max_seqs) or
 * blocks; one of equal priority does not; under FCFS nothing is preempted. */
static void test_priority_preempts_to_admit(void **state) {
    (void)state;
    for (int policy = 0; policy < 2; policy++)
        for (int swap = 0; swap < 2; swap++) {
            fake_kv f = {.bs = 4, .total = 100};
            fl_sched_kv kv = fake_iface(&f, swap);
            fl_sched_params sp = params(2, 64, 1, swap ? FL_PREEMPT_SWAP : FL_PREEMPT_RECOMPUTE, 0);
            sp.policy = policy ? FL_SCHED_PRIORITY : FL_SCHED_FCFS;
            fl_sched *s;
            assert_int_equal(fl_sched_new(&sp, &kv, &s), FL_OK);
            fl_request *r[5];
            r[0] = add_req(s, 0, 6, 8, 0);
            r[1] = add_req(s, 1, 6, 8, 0);
            fl_sched_out o;
            step(s, &o);
            step(s, &o);
            assert_int_equal(fl_sched_n_running(s), 2);
            r[2] = add_req(s, 2, 5, 8, 0); /* equal priority: waits */
            step(s, &o);
            assert_int_equal(o.n_preempted, 0);
            assert_int_equal(r[2]->state, FL_REQ_WAITING);
            if (!policy) {
                free_reqs(s, r, 3);
                fl_sched_free(s);
                continue;
            }
            r[3] = add_req(s, 3, 5, 8, -1); /* higher: takes r[1]'s place in the same step */
            step(s, &o);
            assert_int_equal(o.n_preempted, 1);
            assert_int_equal(o.n_admitted, 1);
            assert_int_equal(r[1]->state, FL_REQ_PREEMPTED);
            assert_int_equal(r[3]->state, FL_REQ_RUNNING);
            assert_int_equal(r[0]->state, FL_REQ_RUNNING);
            assert_int_equal(o.n_entries, 2);
            assert_ptr_equal(o.e[0].r, r[0]); /* decodes first, then the admission's prefill */
            assert_ptr_equal(o.e[1].r, r[3]);
            assert_int_equal(r[1]->swapped, swap);
            assert_int_equal(f.held[1], 0);
            /* r[1] keeps its rank ahead of r[2] (same priority, earlier) */
            assert_ptr_equal(fl_sched_waiting_at(s, 0), r[1]);
            assert_ptr_equal(fl_sched_waiting_at(s, 1), r[2]);
            /* blocks, not slots: a pool with room for one more small request only */
            r[4] = add_req(s, 4, 30, 2, -2);
            f.total = f.used + 8; /* 30 tokens need 8 blocks; the watermark keeps 1 */
            step(s, &o);
            assert_int_equal(r[4]->state, FL_REQ_RUNNING);
            assert_int_equal(r[0]->state, FL_REQ_PREEMPTED);
            assert_int_equal(r[3]->state, FL_REQ_RUNNING);
            free_reqs(s, r, 5);
            assert_int_equal(f.used, 0);
            assert_int_equal(f.swap_used, 0);
            fl_sched_free(s);
        }
    fl_test_mem_zero();
}

/* Out of blocks while growing, the victim is the lowest priority running request, even one that
 * arrived first (FCFS would preempt the latest arrival: the one growing). */
static void test_priority_victim(void **state) {
    (void)state;
    for (int policy = 0; policy < 2; policy++) {
        fake_kv f = {.bs = 4, .total = 4};
        fl_sched_kv kv = fake_iface(&f, 0);
        fl_sched_params sp = params(4, 64, 0, FL_PREEMPT_RECOMPUTE, 0);
        sp.policy = policy ? FL_SCHED_PRIORITY : FL_SCHED_FCFS;
        fl_sched *s;
        assert_int_equal(fl_sched_new(&sp, &kv, &s), FL_OK);
        fl_request *r[2] = {add_req(s, 0, 8, 8, 3), add_req(s, 1, 8, 8, 0)};
        fl_sched_out o;
        step(s, &o); /* both prompts: 2 blocks each, the pool is full */
        assert_int_equal(o.n_entries, 2);
        assert_int_equal(f.used, 4);
        step(s, &o); /* both need a third block for their first decode */
        assert_int_equal(o.n_preempted, 1);
        fl_request *kept = policy ? r[1] : r[0], *gone = policy ? r[0] : r[1];
        assert_int_equal(kept->state, FL_REQ_RUNNING);
        assert_int_equal(gone->state, FL_REQ_PREEMPTED);
        assert_int_equal(o.n_entries, 1);
        assert_ptr_equal(o.e[0].r, kept);
        free_reqs(s, r, 2);
        assert_int_equal(f.used, 0);
        fl_sched_free(s);
    }
    fl_test_mem_zero();
}

/* The replay workload with priorities in a tiny pool: everything finishes, by recompute and swap. */
static void test_replay_priority(void **state) {
    (void)state;
    workload w = W1;
    const int32_t prio[8] = {2, 0, 1, -1, 2, 0, -3, 1};
    memcpy(w.prio, prio, sizeof prio);
    for (int swap = 0; swap < 2; swap++) {
        fake_kv f = {.bs = 4, .total = 22};
        fl_sched_params sp = params(6, 32, 1, swap ? FL_PREEMPT_SWAP : FL_PREEMPT_RECOMPUTE, 0);
        sp.policy = FL_SCHED_PRIORITY;
        run_result res;
        run_workload(&w, &sp, &f, swap, &res);
        assert_true(res.preemptions > 0);
        for (int i = 0; i < w.n; i++) assert_int_equal(res.generated[i], w.gen[i]);
    }
    fl_test_mem_zero();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trace),          cmocka_unit_test(test_replay_roomy),
        cmocka_unit_test(test_replay_preempt_recompute), cmocka_unit_test(test_replay_preempt_swap),
        cmocka_unit_test(test_prefix_hit),     cmocka_unit_test(test_watermark),
        cmocka_unit_test(test_static_batches),
        cmocka_unit_test(test_priority_order), cmocka_unit_test(test_priority_preempts_to_admit),
        cmocka_unit_test(test_priority_victim), cmocka_unit_test(test_replay_priority),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
