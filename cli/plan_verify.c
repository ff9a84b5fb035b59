/* `fitllm plan -m MODEL --verify`: the engine-exact plan (plan/plan_engine.h) beside what the
 * real engine allocates.  The engine runs the plan's worst case: max_seqs requests whose prompts
 * fill the step budget, each generating to the end of its context; peaks are reset once the
 * engine is built (load-time temporaries are not part of the steady state). */
#include "cli/cli.h"
#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"
#include "engine/engine.h"
#include "plan/plan.h"
#include "plan/plan_engine.h"
#include "fitllm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One run: plan ep (max_logprobs as given), run the worst case, print the table.  With
 * logprobs every request asks for max_logprobs alternatives on its prompt and its output, so the
 * records reach the plan's; those prompts go max_seqs rows a step, so the step-sized categories
 * (act, scratch) and the total are then checked as upper bounds.  Returns the rows out of line,
 * or -1. */
static int verify_run(const fl_plan_verify_opts *vo, fl_engine_params ep) {
    fl_plan_engine_in pi;
    fl_plan_engine_out po;
    const bool lp = ep.max_logprobs >= 0;
    fl_status st = fl_engine_plan_input(&ep, &pi);
    if (!st) st = fl_plan_engine(&pi, &po); /* context and block size */
    if (st) return -1;
    if (ep.n_ctx <= 0) ep.n_ctx = po.n_ctx > 1024 ? 1024 : po.n_ctx;
    if (ep.max_batch_tokens >= ep.n_ctx) ep.max_batch_tokens = ep.n_ctx / 2 > 0 ? ep.n_ctx / 2 : 1;
    const int32_t bs = ep.kv_block_size > 0 ? ep.kv_block_size : 16;
    if (vo->mem > 0) {
        ep.mem_total = vo->mem;
        ep.kv_mem = 0;
    } else {
        ep.kv_mem = (int64_t)po.kv_bytes_per_block * ((int64_t)ep.max_seqs * ((ep.n_ctx + bs - 1) / bs) + 2);
    }
    if ((st = fl_engine_plan_input(&ep, &pi))) return -1;
    if (vo->mem > 0 && (st = fl_plan_engine_kv_mem(&pi, (uint64_t)vo->mem, &pi.kv_mem))) return -1;
    if ((st = fl_plan_engine(&pi, &po))) return -1;
    fl_engine *e = NULL;
    if ((st = fl_engine_new(&ep, &e))) return -1;
    fl_mem_reset_peaks();
    for (int32_t k = 0; vo->lora && k < vo->lora_slots && !st; k++) { /* the adapter in every run-time slot too */
        int32_t slot;
        st = fl_engine_lora_load(e, vo->lora, 1.0f, &slot);
    }
    const int32_t n_ad = vo->lora ? fl_engine_n_loras(e) : 0; /* (the adapters loaded) */
    const int32_t nv = fl_engine_n_vocab(e), P = ep.max_batch_tokens;
    /* the harness's prompt lives on the stack so the allocator measures only the engine */
    int32_t prompt[8192];
    if (P > 8192) {
        fl_engine_free(e);
        fl_set_error(FL_ERR_INVALID, "--prefill %d: --verify handles at most 8192 tokens per step", P);
        return -1;
    }
    for (int32_t r = 0; r < ep.max_seqs && !st; r++) {
        for (int32_t i = 0; i < P; i++) prompt[i] = 3 + (int32_t)(((int64_t)r * 7919 + (int64_t)i * 104729) % (nv - 3));
        fl_request_params rp;
        memset(&rp, 0, sizeof rp);
        rp.prompt = prompt;
        rp.n_prompt = P - r % P > 1 ? P - r % P : 1;
        rp.max_tokens = ep.n_ctx - rp.n_prompt;
        rp.ignore_eos = 1;
        rp.logprobs = rp.prompt_logprobs = lp;
        rp.top_logprobs = lp ? ep.max_logprobs : 0;
        rp.lora = n_ad > 0 ? 1 + r % n_ad : 0; /* every request through an adapter */
        int64_t id;
        st = fl_engine_add(e, &rp, &id);
    }
    int32_t active = 1;
    fl_request_output ev[64];
    while (!st && active) {
        st = fl_engine_step(e, &active);
        while (fl_engine_poll(e, ev, 64) > 0) {}
    }
    for (int32_t r = 0; ep.embeddings && r < ep.max_seqs && !st; r++) { /* then as many embeddings (mean: every state) */
        for (int32_t i = 0; i < P; i++) prompt[i] = 3 + (int32_t)(((int64_t)r * 104729 + (int64_t)i * 7919) % (nv - 3));
        fl_request_params rp;
        memset(&rp, 0, sizeof rp);
        rp.prompt = prompt;
        rp.n_prompt = P - r % P > 1 ? P - r % P : 1;
        rp.pooling = FL_POOLING_MEAN;
        rp.lora = n_ad > 0 ? 1 + r % n_ad : 0;
        int64_t id;
        st = fl_engine_add(e, &rp, &id);
    }
    for (active = ep.embeddings; !st && active;) {
        st = fl_engine_step(e, &active);
        while (fl_engine_poll(e, ev, 64) > 0) {}
    }
    uint64_t meas[FL_MEM_COUNT];
    for (int c = 0; c < FL_MEM_COUNT; c++) meas[c] = fl_mem_peak((fl_mem_cat)c);
    const uint64_t mt = fl_mem_peak_total();
    fl_engine_stats es;
    fl_engine_stats_get(e, &es);
    fl_engine_free(e);
    if (st) return -1;
    static const fl_mem_cat cats[] = {FL_MEM_MAPPED, FL_MEM_WEIGHTS, FL_MEM_KV, FL_MEM_ACT, FL_MEM_SCRATCH, FL_MEM_MISC, FL_MEM_GUIDE};
    printf("plan vs engine: %s, weights %s, KV %s x %lld blocks of %d, %d seqs x %d tokens, %d-token steps, %d threads%s, ",
           vo->model, vo->weights ? vo->weights : "(file)", vo->kv_type ? vo->kv_type : "f16", (long long)po.kv_blocks, bs,
           ep.max_seqs, ep.n_ctx, ep.max_batch_tokens, pi.n_threads > 0 ? pi.n_threads : 0, vo->mem > 0 ? " (KV from --mem)" : "");
    if (lp) printf("logprobs: %d alternatives on every prompt and output token (act, scratch, total: upper bounds)", ep.max_logprobs);
    else printf("no logprobs");
    printf("%s\n", ep.embeddings ? ", then as many embedding requests" : "");
    printf("%-10s %14s %14s %9s\n", "category", "predicted", "measured", "error");
    int bad = 0;
    for (size_t k = 0; k <= sizeof cats / sizeof cats[0]; k++) {
        const bool tot = k == sizeof cats / sizeof cats[0];
        const uint64_t p = tot ? po.total : po.bytes[cats[k]], m = tot ? mt : meas[cats[k]];
        char a[32], b[32];
        fl_plan_fmt_bytes(p, a, sizeof a);
        fl_plan_fmt_bytes(m, b, sizeof b);
        const double err = m ? 100.0 * ((double)p - (double)m) / (double)m : (p ? 100.0 : 0.0);
        /* the constraints' budget is a bound (these requests have none); the total is checked
         * without it, and as a bound with it */
        const bool guide = !tot && cats[k] == FL_MEM_GUIDE;
        const bool bound = guide || (lp && (tot || cats[k] == FL_MEM_ACT || cats[k] == FL_MEM_SCRATCH)) ||
                           (vo->lora_slots > 0 && (tot || cats[k] == FL_MEM_MAPPED || cats[k] == FL_MEM_MISC)); /* (the slots' reservation) */
        const uint64_t pg = tot ? p - po.bytes[FL_MEM_GUIDE] : p, mg = tot ? m - meas[FL_MEM_GUIDE] : m;
        const double eg = mg ? 100.0 * ((double)pg - (double)mg) / (double)mg : (pg ? 100.0 : 0.0);
        const bool ok = bound ? p >= m : (eg <= 5.0 && eg >= -5.0 && p >= pg) || (pg < 65536 && mg < 65536);
        if (!ok) bad++;
        if (guide) printf("%-10s %14s %14s %9s%s\n", fl_mem_cat_name(cats[k]), a, b, "bound", ok ? "" : "  > the plan");
        else if (tot && pg != p)
            printf("%-10s %14s %14s %+8.2f%%%s (without guide: %+.2f%%)\n", "total", a, b, err, ok ? "" : bound ? "  > the plan" : "  > 5%", eg);
        else printf("%-10s %14s %14s %+8.2f%%%s\n", tot ? "total" : fl_mem_cat_name(cats[k]), a, b, err, ok ? "" : bound ? "  > the plan" : "  > 5%");
    }
    printf("%lld steps, %lld tokens generated, %lld preemptions\n", (long long)es.steps, (long long)es.tokens_generated,
           (long long)es.preemptions);
    if (vo->lora_slots > 0)
        printf("mapped, misc and total are bounds: %d run-time adapter slots reserve what an adapter of rank %d takes (%s)\n",
               vo->lora_slots, vo->max_lora_rank, vo->lora ? "each loaded with --lora here" : "empty here");
    return bad;
}

int fl_plan_verify(const fl_plan_verify_opts *vo) {
    fl_engine_params ep;
    fl_engine_params_default(&ep);
    ep.model_path = vo->model;
    ep.n_threads = vo->n_threads;
    ep.n_ctx = vo->n_ctx;
    if (vo->max_seqs > 0) ep.max_seqs = vo->max_seqs;
    if (vo->max_batch_tokens > 0) ep.max_batch_tokens = vo->max_batch_tokens;
    ep.kv_type = vo->kv_type;
    ep.weights_type = vo->weights;
    ep.lora_paths = vo->lora ? &vo->lora : NULL;
    ep.n_loras = vo->lora ? 1 : 0;
    ep.lora_slots = vo->lora_slots;
    ep.max_lora_rank = vo->max_lora_rank;
    if (vo->kv_block > 0) ep.kv_block_size = vo->kv_block;
    ep.guide_mem = vo->guide_mem;
    ep.embeddings = vo->embeddings;
    ep.spec_tokens = vo->spec_tokens;
    ep.spec_draft_model = vo->draft;
    ep.spec_draft_p_min = 0; /* (a draft of every token: the worst case) */
    /* the plain worst case first (every category exact), then the logprob records on top */
    const int32_t max_lp = vo->max_logprobs;
    ep.max_logprobs = -1;
    int bad = verify_run(vo, ep);
    if (bad >= 0 && max_lp >= 0) {
        printf("\n");
        ep.max_logprobs = max_lp;
        const int b2 = verify_run(vo, ep);
        bad = b2 < 0 ? -1 : bad + b2;
    }
    if (bad < 0) {
        fprintf(stderr, "fitllm plan --verify: %s\n", fl_last_error());
        return 1;
    }
    return bad ? 1 : 0;
}
