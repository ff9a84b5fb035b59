/*
 * alloc.h - the one tracked allocator of the process.
 *
 * Every allocation names a category (fl_mem_cat in fitllm.h).  The allocator keeps current and
 * peak bytes per category and in total (atomics, cache-line padded: thread-safe and cheap) and
 * enforces optional budgets per category and in total.
 *
 * Like lua_Alloc, the caller passes the size back on free, so counting needs no per-block
 * header in release builds.  Debug builds (FL_DEBUG_MEM) add a header and a trailing canary to
 * every block and abort on a size or category mismatch or a smashed canary.
 *
 *   fl_alloc()         try-variant: returns NULL and sets the error (FL_ERR_BUDGET or
 *                      FL_ERR_NOMEM) when a budget would be exceeded or the system is out
 *   fl_alloc_or_die()  for start-up only: aborts with a message instead of returning NULL
 *   fl_mem_charge()    account bytes that were not allocated here (mmap of model files)
 *   fl_mem_fail_after(n)  inject a failure: the n-th fl_alloc from now returns NULL (tests;
 *                      also read from FL_MEM_FAIL_AFTER at start-up)
 *
 * Libraries that allocate with a malloc/free pair (cJSON) use fl_mem_malloc / fl_mem_free_any,
 * which store the size in a small header.
 */
#ifndef FL_ALLOC_H
#define FL_ALLOC_H

#include "fitllm.h"
#include <stdbool.h>

#define FL_ALIGN_DEFAULT 64

void *fl_alloc(fl_mem_cat cat, size_t size, size_t align);
void *fl_calloc(fl_mem_cat cat, size_t n, size_t elem_size); /* zeroed, 64-aligned, overflow-checked */
void *fl_alloc_or_die(fl_mem_cat cat, size_t size, size_t align);
void fl_free(fl_mem_cat cat, void *ptr, size_t size);         /* ptr may be NULL */
/* Grow/shrink keeping contents (min of both sizes). On failure returns NULL, ptr untouched. */
void *fl_realloc(fl_mem_cat cat, void *ptr, size_t old_size, size_t new_size, size_t align);
char *fl_strdup(fl_mem_cat cat, const char *s); /* free with fl_free(cat, p, strlen(p) + 1) */
/* The capacity of an array that doubles from cap (its current one, or its first) until it holds
 * n: what its reserve allocates, and what the engine-exact plan counts for it. */
static inline int64_t fl_cap_double(int64_t cap, int64_t n) {
    while (cap < n) cap *= 2;
    return cap;
}

fl_status fl_mem_charge(fl_mem_cat cat, size_t size);  /* FL_ERR_BUDGET if over a budget */
/* Advise the 2 MiB-aligned part of [p, p + size) MADV_HUGEPAGE (a hint; nothing without THP).
 * fl_alloc does it itself for blocks of 8 MiB or more. */
void fl_mem_advise_huge(void *p, size_t size);
void fl_mem_uncharge(fl_mem_cat cat, size_t size);

/* The memory this machine has: its physical memory, or a smaller cgroup v2 limit (memory.max);
 * 0 if unknown.  Allocations are not checked against it (the system overcommits, so a block is
 * only really taken when touched); commands that size buffers from their arguments compare the
 * total they will touch with it first, rather than be killed part way. */
uint64_t fl_mem_system_bytes(void);

void fl_mem_fail_after(long n); /* n < 0 disables injection */
/* How many of this thread's fl_alloc calls have failed (any reason: a budget, the system,
 * injection): code that builds something whose parts may be dropped on failure (cJSON's
 * helpers) compares it before and after, to fail as a whole rather than hand out a part. */
size_t fl_mem_thread_failures(void);

/* malloc-compatible pair with a size header (for cJSON hooks and the like): charged to this
 * thread's malloc category (FL_MEM_MISC unless fl_mem_set_malloc_cat changed it), which the
 * header keeps, so any thread frees a block as it was charged. */
void *fl_mem_malloc(size_t size);
void fl_mem_free_any(void *ptr);
/* This thread's category for fl_mem_malloc (the server: FL_MEM_NET while it handles a request,
 * so that the JSON it parses and prints is the server's); returns the previous one. */
fl_mem_cat fl_mem_set_malloc_cat(fl_mem_cat cat);
/* The same for allocators that pass a context pointer along (PCRE2's general contexts): ctx NULL
 * charges FL_MEM_MISC, ctx = fl_mem_ctx(cat) charges cat. */
void *fl_mem_malloc_ctx(size_t size, void *ctx);
void fl_mem_free_ctx(void *ptr, void *ctx);
void *fl_mem_ctx(fl_mem_cat cat);

/* Install cJSON hooks so cJSON's allocations are charged to FL_MEM_MISC. Idempotent.
 * cJSON's hooks are global, and an object must be freed by the allocator that made it,
 * so only a program installs them, once, before any cJSON call (fitllm's main does; so do
 * tests that count cJSON's bytes). Library code never does: a host program may already
 * hold cJSON objects made by malloc, and a thread may be between a parse and its delete. */
void fl_mem_install_cjson_hooks(void);

bool fl_mem_all_zero(void); /* every category at 0 bytes (tests end with this) */

#endif
