/*
 * kv_adapter.h - the scheduler's block accounting (fl_sched_kv) over a real KV cache.
 *
 * Paged (kv/kv_cache.h): a request's KV sequence is a paged-cache sequence id taken from a free
 * list at admission; admission looks the prompt (and, after a recompute preemption, the tokens
 * generated so far) up in the prefix cache.  The cache itself takes blocks in prepare(), during
 * the forward; the adapter makes that safe by promising blocks when the scheduler reserves
 * them: n_free() is the pool's free count (evictable cached blocks included) minus the blocks
 * promised this step, and the promises are dropped after the forward (fl_kv_adapter_step_done).
 * Swap and fork map to fl_kv_seq_swap_out/in and fl_kv_seq_fork.
 *
 * Contiguous (kv/kv_contig.h, the static baseline): one "block" is one max-length slot; a
 * sequence takes a free slot at admission and holds it until it ends.
 *
 * Ownership: the adapter borrows the cache (the backend owns both); bookkeeping is FL_MEM_MISC.
 * Not thread-safe (engine driver thread).
 */
#ifndef FL_KV_ADAPTER_H
#define FL_KV_ADAPTER_H

#include "engine/backend.h"
#include "kv/kv_cache.h"

typedef struct fl_kv_adapter fl_kv_adapter;

/* n_seq_max must equal the cache's cfg.n_seq_max (ids 0 .. n_seq_max-1 are handed out). */
fl_status fl_kv_adapter_new_paged(fl_kv_cache *kv, int32_t n_seq_max, fl_kv_adapter **out);
/* MISC bytes of an adapter handing out n_ids sequence ids (the engine-exact plan counts them). */
size_t fl_kv_adapter_misc_bytes(int32_t n_ids);
/* Contiguous: n_slots sequences of up to n_ctx tokens; clear(ctx, slot) empties a slot. */
fl_status fl_kv_adapter_new_slots(void *kv, int32_t n_slots, int32_t n_ctx, void (*clear)(void *kv, int32_t slot),
                                  fl_kv_adapter **out);
void fl_kv_adapter_free(fl_kv_adapter *a);
fl_sched_kv fl_kv_adapter_iface(fl_kv_adapter *a);
void fl_kv_adapter_step_done(fl_kv_adapter *a);
void fl_kv_adapter_stats(fl_kv_adapter *a, fl_backend_kv_stats *st);
int64_t fl_kv_adapter_n_blocks(const fl_kv_adapter *a);
int32_t fl_kv_adapter_block_size(const fl_kv_adapter *a);

#endif
