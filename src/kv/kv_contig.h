/*
 * kv_contig.h - the contiguous KV cache: one max-length reservation per sequence.
 *
 * The static baseline the paged cache is measured against.  For n_seq_max sequences of up to
 * n_ctx positions each it reserves, once, K and V with elements of p.type (f16 or f32)
 *     k, v: [n_layer][n_seq_max][n_head_kv][n_ctx][head_dim]
 * in one FL_MEM_KV block of fl_kv_contig_bytes(p) bytes (exactly 2 * n_layer * n_seq_max * n_ctx
 * * n_head_kv * head_dim * sizeof(element)).  A token at position pos of sequence s lives at
 * [s][hk][pos] for each kv head hk (a head's positions are contiguous: attention reads tiles of
 * keys); a sequence's length is one past its highest position.
 *
 * Implements kv/kv_iface.h (fl_kv_contig_iface(), ctx = the fl_kv_contig *):
 *   prepare  FL_ERR_INVALID for seq_id >= n_seq_max or a position that leaves a gap after the
 *            sequence's length; FL_NO_KV_SPACE (soft) when a position is >= n_ctx.  Nothing is
 *            changed on failure.  A position below the length rewinds the sequence there.
 *   attend   plain online-softmax loop (scale 1/sqrt(head_dim)) over positions
 *            [max(0, pos - n_swa + 1), pos] of the token's own sequence, GQA: q head h reads kv
 *            head h / (n_head / n_head_kv).  Threaded over (token, head) pairs.
 * Sequences are created implicitly (all n_seq_max exist, empty); fl_kv_contig_seq_clear empties one.
 * Thread safety: one step at a time; attend threads internally.
 */
#ifndef FL_KV_CONTIG_H
#define FL_KV_CONTIG_H

#include "kv/kv_iface.h"

typedef struct fl_kv_contig_params {
    int32_t n_layer;
    int32_t n_head;    /* query heads (local) */
    int32_t n_head_kv; /* kv heads (local) */
    int32_t head_dim;
    int32_t n_ctx;     /* positions reserved per sequence */
    int32_t n_seq_max;
    int32_t n_swa;     /* sliding window, 0 = none */
    int32_t type;      /* element type of K/V: FL_TYPE_F16 (as llama.cpp's default) or FL_TYPE_F32 */
} fl_kv_contig_params;

typedef struct fl_kv_contig fl_kv_contig;

/* Exact FL_MEM_KV bytes for p (0 if p is invalid or overflows). */
size_t fl_kv_contig_bytes(const fl_kv_contig_params *p);
/* FL_ERR_INVALID for bad params, FL_ERR_BUDGET / NOMEM when the reservation fails. */
fl_status fl_kv_contig_new(const fl_kv_contig_params *p, fl_kv_contig **out);
void fl_kv_contig_free(fl_kv_contig *kv);
const fl_kv_iface *fl_kv_contig_iface(void);
void fl_kv_contig_seq_clear(fl_kv_contig *kv, int32_t seq);
void fl_kv_contig_clear(fl_kv_contig *kv); /* every sequence */
int32_t fl_kv_contig_seq_len(const fl_kv_contig *kv, int32_t seq);

#endif
