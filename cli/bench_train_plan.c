/* The planner's training prediction for `fitllm bench train` (its own file: plan.h and the
 * training headers both name an optimizer-kind enum, so they are kept in separate units). */
#include "cli/bench_train.h"

#include "plan/plan.h"

#include <stdio.h>
#include <string.h>

int fl_bench_train_plan(const fl_bench_train_shape *b, uint64_t bytes[FL_MEM_COUNT], uint64_t *total) {
    fl_model_shape s;
    memset(&s, 0, sizeof s);
    snprintf(s.name, sizeof s.name, "bench-train");
    s.n_vocab = b->n_vocab;
    s.n_embd = b->n_embd;
    s.n_ff = b->n_ff;
    s.n_layer = b->n_layer;
    s.n_head = b->n_head;
    s.n_head_kv = b->n_head_kv;
    s.head_dim = b->head_dim;
    s.n_ctx_train = b->n_ctx;
    fl_plan_input in;
    fl_plan_input_default(&in, &s);
    if (fl_plan_parse_wtype("f32", &in.weights) != FL_OK) return -1;
    in.weights_from_file = false;
    in.train = true;
    in.n_ctx = b->n_ctx;
    in.n_seq = b->batch;
    in.train_seqs = b->batch; /* its batches: one sequence a row */
    in.ckpt_every = b->ckpt_every;
    in.optim = b->optim8 ? FL_PLAN_OPTIM_ADAMW8BIT : FL_PLAN_OPTIM_ADAMW;
    in.n_threads = b->n_threads;
    in.attn = FL_PLAN_ATTN_FLASH;
    in.lora_rank = b->lora_rank;
    in.lora_nf4 = b->lora_nf4 != 0;
    fl_plan_result r;
    if (fl_plan_compute(&s, &in, &r) != FL_OK) return -1;
    for (int c = 0; c < FL_MEM_COUNT; c++) bytes[c] = r.dev[0].bytes[c];
    *total = r.dev[0].total;
    return 0;
}
