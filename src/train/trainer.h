/*
 * trainer.h - the training loop state: model (borrowed), optimizer, batcher, LR schedule,
 * gradient accumulation, clipping, fp16 dynamic loss scaling, checkpoints.
 *
 * One step = grad_accum micro-batches (each `batch` rows of `ctx` tokens): the scored tokens of
 * all micro-batches are counted first, so every token's loss gets weight 1/total and K
 * micro-batches give exactly the gradient of one batch K times larger (up to f32 summation order).
 * fp16 precision: the loss gradient is multiplied by loss_scale; a step whose gradients hold
 * inf/NaN is skipped and the scale halved; after FL_LOSS_SCALE_WINDOW good steps it doubles.
 *
 * Checkpoints (fl_trainer_save / fl_trainer_load): one GGUF file written atomically (temp file,
 * fsync, rename by fl_gguf_writer): the llama.* keys and F32 parameter tensors under their
 * standard names (so a checkpoint also loads as a model), the optimizer states as tensors
 * "optim.<name>", and keys  fitllm.train.version (= FL_TRAIN_CKPT_VERSION), .step, .optim_steps,
 * .data_pos, .data_epoch, .rng, .loss_scale, .good_steps, .optim_kind, .block_size, .lora_rank,
 * .lora_alpha (+ "data.perm" for bucketed batches).  Loading restores every piece of state, so
 * the continuation is bit-identical to an uninterrupted run (with ZeRO: on as many ranks); a
 * killed run loses only the steps since the last checkpoint.
 */
#ifndef FL_TRAIN_TRAINER_H
#define FL_TRAIN_TRAINER_H

#include "train/data.h"
#include "train/model.h"
#include "train/optim.h"
#include "dist/zero.h"

#define FL_TRAIN_CKPT_VERSION 1
#define FL_LOSS_SCALE_WINDOW 200

typedef struct fl_trainer_opts {
    int64_t ctx, batch, grad_accum;
    int64_t steps;               /* total steps (for the schedule) */
    float lr, min_lr;
    int64_t warmup;
    int sched;                   /* fl_lr_sched */
    float clip;                  /* 0 = no clipping */
    int ckpt_every;              /* activation checkpointing interval (0 = keep all) */
    int precision;               /* fl_train_precision */
    fl_optimizer_config optim;
    int batch_mode;              /* fl_batch_mode */
    uint64_t seed;
    float loss_scale_init;       /* fp16 (0 -> 32768) */
    /* Data parallel over comm's ranks with ZeRO (dist/zero.h): every rank runs the same batcher
     * and takes micro-batches i with i % size == rank, so N ranks with grad_accum K compute the
     * step of one process with grad_accum N*K; gradients are summed (stage 1: allreduce, 2:
     * reduce-scatter), each rank updates its 1/N shard with its own 1/N of the optimizer
     * states, parameters are all-gathered.  NULL or one rank: plain single-process training.
     * fp16 loss scaling works as in one process (the overflow test is on the global norm, so
     * every rank skips alike).  Checkpoints are collective: see fl_trainer_save. */
    fl_comm *comm;
    int zero_stage;              /* 1 or 2 (0 -> 1) */
} fl_trainer_opts;

fl_trainer_opts fl_trainer_default_opts(void);

typedef struct fl_step_stats {
    double loss;        /* mean loss of the step's scored tokens */
    double grad_norm;   /* before clipping (unscaled) */
    float lr;
    int64_t tokens, scored;
    bool skipped;       /* fp16 overflow */
    float loss_scale;
} fl_step_stats;

typedef struct fl_trainer fl_trainer;

/* Reserve the model for ctx*batch tokens, create the optimizer and batcher.  m and train are
 * borrowed and must outlive the trainer. */
fl_status fl_trainer_new(fl_train_model *m, const fl_train_data *train, const fl_trainer_opts *o, fl_trainer **out);
void fl_trainer_free(fl_trainer *t);
fl_status fl_trainer_step(fl_trainer *t, fl_step_stats *stats);
int64_t fl_trainer_step_count(const fl_trainer *t);
const fl_optim *fl_trainer_optim(const fl_trainer *t);

/* With ZeRO every rank calls it: rank 0 writes the file, taking the other ranks' optimizer
 * shards over the communicator one state at a time (its peak grows by one state over all
 * parameters, FL_MEM_MISC: 4 bytes a parameter for AdamW, 1 for 8-bit), and every rank returns
 * rank 0's result.  The file is the one a single process writes: the states over all parameters. */
fl_status fl_trainer_save(fl_trainer *t, const char *path);
/* Restore a checkpoint written by fl_trainer_save for the same model shape and options, with or
 * without ZeRO and for any number of ranks (each rank reads its slice of the states: shards start
 * on the optimizer's blocks).  With ZeRO every rank calls it and reads path itself (a path all
 * ranks can read); if any rank fails, all do. */
fl_status fl_trainer_load(fl_trainer *t, const char *path);

#endif
