/*
 * block_table.h - one sequence's logical -> physical block map.
 *
 * ids[i] is the pool block holding the sequence's positions [i*block_size, (i+1)*block_size);
 * 0 (the null block) marks blocks released because they slid out of the attention window.
 * The table only grows at the end or shrinks from the end; the owner (kv_cache) keeps the
 * reference counts in the pool consistent with the ids here.  Memory: FL_MEM_MISC.
 * Not thread-safe; plain struct owned by its sequence.
 */
#ifndef FL_BLOCK_TABLE_H
#define FL_BLOCK_TABLE_H

#include "fitllm.h"

#include <stdint.h>

typedef struct fl_kv_table {
    int32_t *ids; /* [cap] physical block ids, the first n valid */
    int32_t n, cap;
} fl_kv_table;

/* Make room for n entries (keeps the contents): the capacity doubles from FL_KV_TABLE_CAP0.
 * FL_ERR_NOMEM/BUDGET, table unchanged. */
#define FL_KV_TABLE_CAP0 8
fl_status fl_kv_table_reserve(fl_kv_table *t, int32_t n);
/* Copy src into dst (dst's old contents are dropped, not unreferenced). */
fl_status fl_kv_table_copy(fl_kv_table *dst, const fl_kv_table *src);
void fl_kv_table_deinit(fl_kv_table *t); /* frees ids; leaves an empty table */

#endif
