/* Per-sequence block tables (see block_table.h). */
#include "kv/block_table.h"

#include "core/alloc.h"

#include <string.h>

fl_status fl_kv_table_reserve(fl_kv_table *t, int32_t n) {
    if (n <= t->cap) return FL_OK;
    const int32_t cap = (int32_t)fl_cap_double(t->cap ? t->cap : FL_KV_TABLE_CAP0, n);
    int32_t *ids = fl_realloc(FL_MEM_MISC, t->ids, sizeof(int32_t) * (size_t)t->cap, sizeof(int32_t) * (size_t)cap, 0);
    if (!ids) return FL_ERR_NOMEM;
    t->ids = ids;
    t->cap = cap;
    return FL_OK;
}

fl_status fl_kv_table_copy(fl_kv_table *dst, const fl_kv_table *src) {
    fl_status st = fl_kv_table_reserve(dst, src->n);
    if (st != FL_OK) return st;
    if (src->n) memcpy(dst->ids, src->ids, sizeof(int32_t) * (size_t)src->n);
    dst->n = src->n;
    return FL_OK;
}

void fl_kv_table_deinit(fl_kv_table *t) {
    fl_free(FL_MEM_MISC, t->ids, sizeof(int32_t) * (size_t)t->cap);
    memset(t, 0, sizeof *t);
}
