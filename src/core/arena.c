#include "core/arena.h"
#include "core/status.h"

#include <string.h>

fl_status fl_arena_init(fl_arena *a, fl_mem_cat cat, size_t cap) {
    memset(a, 0, sizeof *a);
    a->cat = cat;
    if (cap == 0) return FL_OK;
    a->base = fl_alloc(cat, cap, 64);
    if (!a->base) return fl_mem_budget(cat) ? FL_ERR_BUDGET : FL_ERR_NOMEM;
    a->cap = cap;
    return FL_OK;
}

void fl_arena_deinit(fl_arena *a) {
    if (a->base) fl_free(a->cat, a->base, a->cap);
    memset(a, 0, sizeof *a);
}

void *fl_arena_alloc(fl_arena *a, size_t size, size_t align) {
    if (align == 0) align = 64;
    size_t off = (a->used + align - 1) & ~(align - 1);
    if (off > a->cap || size > a->cap - off) {
        fl_set_error(FL_ERR_NOMEM, "arena (%s) full: %zu of %zu bytes used, %zu more requested",
                     fl_mem_cat_name(a->cat), a->used, a->cap, size);
        return NULL;
    }
    a->used = off + size;
    if (a->used > a->high) a->high = a->used;
    return a->base + off;
}
