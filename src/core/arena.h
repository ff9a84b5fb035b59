/*
 * arena.h - bump arenas for per-step scratch, charged to one memory category.
 *
 * An arena reserves its capacity once (fl_arena_init) and hands out aligned slices; mark/rewind
 * gives stack-like reuse inside a step, reset frees everything at the start of the next step.
 * Nothing is returned to the system until fl_arena_deinit.  fl_arena_alloc returns NULL (and sets
 * the error) when the capacity is exhausted: arenas never grow behind the caller's back, so what
 * the planner predicts is what is reserved.  `high` records the most bytes ever in use.
 * Not thread-safe: one arena per thread or per step.
 */
#ifndef FL_ARENA_H
#define FL_ARENA_H

#include "core/alloc.h"

typedef struct fl_arena {
    unsigned char *base;
    size_t cap;
    size_t used;
    size_t high; /* high-water mark of `used` */
    fl_mem_cat cat;
} fl_arena;

fl_status fl_arena_init(fl_arena *a, fl_mem_cat cat, size_t cap);
void fl_arena_deinit(fl_arena *a);
void *fl_arena_alloc(fl_arena *a, size_t size, size_t align); /* NULL when full */
static inline size_t fl_arena_mark(const fl_arena *a) { return a->used; }
static inline void fl_arena_rewind(fl_arena *a, size_t mark) { a->used = mark; }
static inline void fl_arena_reset(fl_arena *a) { a->used = 0; }

#endif
