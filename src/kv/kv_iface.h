/*
 * kv_iface.h - how the model's forward pass reads and writes K/V.
 *
 * The forward never touches KV storage directly: it calls these three operations, so the
 * contiguous cache (kv/kv_contig.c, the static baseline) and the paged cache (kv/kv_cache.c)
 * are interchangeable without changes to model code.  For training no cache is used at all
 * (attention runs on the batch's own K/V through the varlen flash kernels).
 *
 *   prepare(ctx, batch)          make room for the batch's tokens in their sequences (the
 *                                sequences must exist); FL_NO_KV_SPACE (soft) if the cache is
 *                                full, in which case nothing was changed.
 *   store(ctx, il, batch, k, v)  write layer il's K (already roped) and V for every batch token;
 *                                k, v: [n_tokens][n_head_kv][head_dim] f32
 *   attend(ctx, il, batch, q, out)
 *                                causal attention for every batch token against all cached
 *                                tokens of its own sequence at positions <= its own (and inside
 *                                the sliding window when the model has one);
 *                                q: [n_tokens][n_head][head_dim] f32 (roped), out: same shape.
 *                                Implementations thread internally (fl_parallel).
 */
#ifndef FL_KV_IFACE_H
#define FL_KV_IFACE_H

#include "model/batch.h"

typedef struct fl_kv_iface {
    fl_status (*prepare)(void *ctx, const fl_batch *b);
    void (*store)(void *ctx, int32_t il, const fl_batch *b, const float *k, const float *v);
    void (*attend)(void *ctx, int32_t il, const fl_batch *b, const float *q, float *out);
} fl_kv_iface;

#endif
