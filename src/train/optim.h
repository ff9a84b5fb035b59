/*
 * optim.h - optimizers (AdamW with fp32 states, 8-bit AdamW), gradient clipping, LR schedules.
 *
 * AdamW (decoupled weight decay, Loshchilov & Hutter):
 *   m = b1 m + (1-b1) g ; v = b2 v + (1-b2) g^2 ; p -= lr (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd p)
 * Weight decay applies only inside the decay ranges given at creation (the trainer excludes
 * norms); states are FL_MEM_OPTIM.
 *
 * 8-bit AdamW (bitsandbytes-style block-wise dynamic quantization, Dettmers et al. 2022):
 *   m and v are stored as one byte per element in blocks of `block_size` (default 256; 2048 also
 *   fine) with one f32 absmax per block.  A byte is an index into a 256-entry "dynamic" code
 *   table: the value is code[i] * absmax.  The tables (built at start-up, sorted):
 *     signed (for m):   for e = 0..6, the 2^e midpoints of linspace(0.1, 1, 2^e + 1) times
 *                       10^(e-6), with both signs, plus 0 and 1  (254 + 2 = 256 entries)
 *     unsigned (for v): for e = 0..6, the 2^(e+1) midpoints of linspace(0.1, 1, 2^(e+1) + 1)
 *                       times 10^(e-6), plus 0 and 1              (254 + 2 = 256 entries)
 *   so small magnitudes keep relative precision (an exponent of 7 decades, a fraction whose
 *   resolution grows with the magnitude).  A step dequantizes a block to f32, does the exact
 *   AdamW update, takes the new absmax and re-quantizes each value to the nearest code.
 *   State bytes: 2 per parameter + 8 per block (vs 8 per parameter for fp32 AdamW).
 *
 * Thread safety: a step threads itself over blocks; one optimizer is not for concurrent steps.
 * Step results do not depend on the thread count.
 */
#ifndef FL_TRAIN_OPTIM_H
#define FL_TRAIN_OPTIM_H

#include "fitllm.h"
#include <stddef.h>
#include <stdint.h>

typedef enum fl_optimizer_kind { FL_OPTIMIZER_ADAMW = 0, FL_OPTIMIZER_ADAMW8BIT = 1 } fl_optimizer_kind;

typedef struct fl_optimizer_config {
    int kind; /* fl_optimizer_kind */
    float beta1, beta2, eps, weight_decay;
    int32_t block_size; /* 8-bit blocks (0 -> 256) */
} fl_optimizer_config;

#define FL_OPTIM_MAX_RANGES 64

typedef struct fl_optim fl_optim;

/* Default config: AdamW, betas (0.9, 0.95), eps 1e-8, weight decay 0.1, blocks of 256. */
fl_optimizer_config fl_optim_default(void);
/* New optimizer for n_params parameters; decay applies to [ranges[2i], ranges[2i+1]) for i <
 * n_ranges (n_ranges = -1 means everything).  FL_ERR_NOMEM / FL_ERR_INVALID. */
fl_status fl_optim_new(const fl_optimizer_config *cfg, int64_t n_params, const int64_t *ranges, int n_ranges,
                       fl_optim **out);
void fl_optim_free(fl_optim *o);
/* One update of params with grads at learning rate lr (increments the step count first). */
void fl_optim_step(fl_optim *o, float *params, const float *grads, float lr);
/* The same with every gradient multiplied by gscale as it is read (grads left as they are): the
 * bits of fl_optim_step after g[i] *= gscale, without that pass over the gradient (clipping:
 * gscale from fl_grad_clip_scale). */
void fl_optim_step_scaled(fl_optim *o, float *params, const float *grads, float lr, float gscale);
int64_t fl_optim_steps(const fl_optim *o);
size_t fl_optim_state_bytes(const fl_optim *o);
/* What fl_optim_new allocates for n_params with blocks of block_size (0: 256), before it does:
 * the states (FL_MEM_OPTIM; for 8-bit a byte per parameter and state plus an f32 absmax per block
 * and state), and the object itself (FL_MEM_MISC). */
uint64_t fl_optim_states_bytes_for(fl_optimizer_kind kind, uint64_t n_params, int64_t block_size);
size_t fl_optim_object_bytes(void);
const fl_optimizer_config *fl_optim_get_config(const fl_optim *o);

/* State tensors for checkpoints: i = 0.. until FL_ERR_RANGE.  *data is the live buffer (read or
 * overwrite it), *bytes its size, *name a stable key ("adam.m", "adam8.qm", ...). */
fl_status fl_optim_state(fl_optim *o, int i, void **data, size_t *bytes, const char **name);
void fl_optim_set_steps(fl_optim *o, int64_t t);
/* State i's layout: *unit_bytes bytes for every *per_params parameters (1 for a per-parameter
 * state, the block size for a per-block one; the last unit may cover fewer).  So for parameters
 * [off, off + len) with off a multiple of *per_params, the state's bytes are
 * [off / per * unit, ceil((off + len) / per) * unit): what a ZeRO shard holds. */
fl_status fl_optim_state_unit(const fl_optim *o, int i, int64_t *per_params, size_t *unit_bytes);

/* The 256-entry code tables (sorted ascending), for tests. */
const float *fl_optim_dynamic_map(int is_signed);
/* The index of the code nearest to x (the lower one on a tie): fl_optim_code_ref by binary
 * search (the specification), fl_optim_code from a table of first candidates by the float's top
 * 16 bits (what the optimizer runs; the same answer for every float). */
uint8_t fl_optim_code(int is_signed, float x);
uint8_t fl_optim_code_ref(int is_signed, float x);
/* Block-wise quantize / dequantize with a code table (n elements, blocks of bs). */
void fl_optim_quantize_blockwise(const float *x, uint8_t *q, float *absmax, int64_t n, int32_t bs, int is_signed);
void fl_optim_dequantize_blockwise(const uint8_t *q, const float *absmax, float *x, int64_t n, int32_t bs,
                                   int is_signed);

/* Global L2 norm of g (n elements, computed in double: 64 fixed parts on the threads, so the
 * same bits on any number of them); if max_norm > 0 and the norm exceeds it, g is scaled by
 * max_norm / norm.  Returns the norm before clipping (inf/NaN if g has any). */
double fl_grad_clip(float *g, int64_t n, double max_norm);
/* Its two halves: the norm (fl_grad_norm, the same bits) and the factor it scales g by
 * (fl_grad_clip_scale: max_norm / norm as a float where max_norm > 0 and a finite norm exceeds
 * it, else 1). */
double fl_grad_norm(const float *g, int64_t n);
float fl_grad_clip_scale(double norm, double max_norm);

typedef enum fl_lr_sched { FL_LR_CONSTANT = 0, FL_LR_COSINE = 1, FL_LR_LINEAR = 2 } fl_lr_sched;
/* LR at step (0-based): linear warmup from lr/warmup to lr over `warmup` steps, then constant,
 * cosine or linear decay to min_lr at step total-1. */
float fl_lr_at(int kind, int64_t step, int64_t warmup, int64_t total, float lr, float min_lr);

#endif
