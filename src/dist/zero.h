/*
 * zero.h - ZeRO data parallelism, stages 1 and 2, over a flat f32 parameter vector.
 *
 * Every rank holds the full parameters (the forward/backward need them) and runs the backward on
 * its own slice of the global batch.  The optimizer is sharded: rank r owns parameters
 * [off, off + len) (off = r L, L = ceil(n / N) rounded up to a multiple of `align`, len = L but
 * the last shards shorter or empty) and keeps optimizer states for those only (the caller
 * creates its optimizer for `len` parameters: 1/N of the states).
 *   stage 1: grads are allreduced (sum over ranks) in place; each rank updates its shard.
 *   stage 2: each rank keeps only the summed gradients of its shard (FL_MEM_GRAD, L floats,
 *            owned here) and updates from it.  Either the caller hands fl_zero_step a whole
 *            gradient, which is reduce-scattered (L floats more than stage 1, half the bytes
 *            moved), or the backward never holds one: it hands over its gradients a bucket at a
 *            time (fl_zero_reduce_range after fl_zero_begin, each range summed into its owners'
 *            shards) and calls fl_zero_step with grads NULL.  A rank then holds L floats and one
 *            bucket, not the n floats of the whole gradient.
 * Then the updated shards are all-gathered into every rank's parameters.  Gradient clipping uses
 * the global norm (stage 2: shard norms summed with an f64 allreduce).  The sum over ranks is
 * not averaged: the caller scales its local gradients (e.g. by 1 / global batch).  A global norm
 * that is not finite (an fp16 overflow) skips the update and the gather on every rank alike.
 * `align` makes every shard start on a block of a blockwise optimizer (8-bit AdamW's block size):
 * a shard's states are then the slice [off, off + len) of one optimizer's over all n parameters,
 * byte for byte, which is how the trainer's checkpoints are written and read for any N.
 * The update is a callback, so any optimizer works on a shard (train/optim.h AdamW or 8-bit
 * AdamW created for `len` parameters with its decay ranges shifted by -off); gradient
 * checkpointing is the backward's business and combines freely.
 *
 * Buffers: the reduce-scatter and the all-gather go in pieces of K = min(L, piece) floats per
 * rank through one FL_MEM_COMM buffer of (N + 1) K floats (piece 0: FL_ZERO_PIECE), so the
 * communication memory stays bounded and no MPI count passes 2^31 whatever the model's size.
 * fl_zero_bytes_for gives these sizes before anything is allocated (the planner).
 * Errors: FL_ERR_INVALID for bad stage / sizes, FL_ERR_NOMEM, communicator errors.
 * Collective; not thread-safe.
 */
#ifndef FL_ZERO_H
#define FL_ZERO_H

#include "dist/dist.h"

typedef struct fl_zero fl_zero;

#define FL_ZERO_PIECE ((int64_t)1 << 20) /* floats per rank in one collective piece: 4 MiB */

/* Update params[0..n) of this rank's shard from grads[0..n) (the shard's summed gradients). */
typedef void (*fl_zero_update_fn)(void *ud, float *params, const float *grads, int64_t n);

fl_status fl_zero_new(fl_comm *comm, int32_t stage, int64_t n_params, int64_t align, int64_t piece, fl_zero **out);
void fl_zero_free(fl_zero *z);
void fl_zero_shard(const fl_zero *z, int64_t *off, int64_t *len); /* this rank's shard */
void fl_zero_shard_of(const fl_zero *z, int rank, int64_t *off, int64_t *len); /* any rank's */
int64_t fl_zero_shard_stride(const fl_zero *z);                   /* L */

/* Sizes before allocating: the shard stride L over `size` ranks, and what fl_zero_new allocates:
 * *grad (FL_MEM_GRAD: stage 2's L floats) and *comm (FL_MEM_COMM), plus the object (MISC). */
int64_t fl_zero_stride(int32_t size, int64_t n_params, int64_t align);
void fl_zero_bytes_for(int32_t stage, int32_t size, int64_t n_params, int64_t align, int64_t piece, uint64_t *grad,
                       uint64_t *comm);
size_t fl_zero_object_bytes(void);

/* Stage 2, bucketed: fl_zero_begin clears the summed shard; fl_zero_reduce_range (collective:
 * every rank calls it with the same off and n) adds the sum over ranks of src[0..n), the
 * gradients of parameters [off, off + n), to the shard of each rank that owns part of them,
 * in pieces of at most K floats through the COMM buffer.  fl_zero_shard_grads is the shard's
 * summed gradient (len floats; fp16 unscales it there). */
void fl_zero_begin(fl_zero *z);
fl_status fl_zero_reduce_range(fl_zero *z, const float *src, int64_t off, int64_t n);
float *fl_zero_shard_grads(fl_zero *z);

/* One data-parallel step: sum grads over ranks (stage 1: allreduce, stage 2: reduce-scatter;
 * stage 2 with grads NULL: the shard fl_zero_reduce_range summed), clip to max_norm (<= 0: no
 * clipping; *norm gets the global norm before clipping when not NULL), update this rank's shard
 * with fn, all-gather the parameters.  grads is overwritten.  A non-finite norm returns FL_OK
 * with params untouched (the caller decides: skip or fail). */
fl_status fl_zero_step(fl_zero *z, float *params, float *grads, double max_norm, double *norm, fl_zero_update_fn fn,
                       void *ud);

#endif
