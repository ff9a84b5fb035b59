/* bench_train.h - the shape `fitllm bench train` measures, shared with its planner unit. */
#ifndef FL_BENCH_TRAIN_H
#define FL_BENCH_TRAIN_H

#include "fitllm.h"
#include <stdint.h>

typedef struct fl_bench_train_shape {
    int64_t n_vocab, n_embd, n_ff, n_layer, n_head, n_head_kv, head_dim, n_ctx, batch;
    int64_t ckpt_every;
    int optim8;
    int32_t n_threads;
    int32_t lora_rank; /* LoRA adapters on a frozen base (0: full training) */
    int lora_nf4;      /* with lora_rank: the base in NF4 (QLoRA) */
} fl_bench_train_shape;

/* Planner (src/plan) prediction per memory category and total; -1 on error. */
int fl_bench_train_plan(const fl_bench_train_shape *b, uint64_t bytes[FL_MEM_COUNT], uint64_t *total);

#endif
