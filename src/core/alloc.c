#include "core/alloc.h"
#include "core/status.h"

#include <cjson/cJSON.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

/* One padded counter set per category (zmalloc style): no false sharing between categories. */
typedef struct {
    _Alignas(64) atomic_size_t cur;
    atomic_size_t peak;
    atomic_size_t budget;
    atomic_size_t refused; /* allocations refused by this budget */
} mem_counter;

static mem_counter g_mem[FL_MEM_COUNT + 1]; /* last entry: total */
static atomic_long g_fail_after = -1;
static atomic_int g_env_read;

static const char *const cat_names[FL_MEM_COUNT] = {
    "weights", "mapped", "kv", "act", "scratch", "grad", "optim", "comm", "net", "guide", "misc",
};

const char *fl_mem_cat_name(fl_mem_cat cat) {
    return (unsigned)cat < FL_MEM_COUNT ? cat_names[cat] : "?";
}

static long g_env_fail_after = -1; /* FL_MEM_FAIL_AFTER as read */

/* At exit, where FL_MEM_FAIL_AFTER never fired: said on stderr with the allocations made, so a
 * sweep over N (tests/cli_oom.sh) knows it has passed the last one. */
static void report_unfired(void) {
    const long left = atomic_load(&g_fail_after);
    if (left >= 0 && g_env_fail_after >= 0)
        fprintf(stderr, "fitllm: FL_MEM_FAIL_AFTER=%ld: no allocation failed (%ld allocations)\n", g_env_fail_after,
                g_env_fail_after - left);
}

static void read_env_once(void) {
    if (atomic_load_explicit(&g_env_read, memory_order_relaxed)) return;
    int expected = 0;
    if (!atomic_compare_exchange_strong(&g_env_read, &expected, 1)) return;
    const char *s = getenv("FL_MEM_FAIL_AFTER");
    if (s && *s) {
        g_env_fail_after = atol(s);
        atomic_store(&g_fail_after, g_env_fail_after);
        if (g_env_fail_after >= 0) atexit(report_unfired);
    }
}

static void peak_update(mem_counter *c, size_t now) {
    size_t p = atomic_load_explicit(&c->peak, memory_order_relaxed);
    while (now > p && !atomic_compare_exchange_weak_explicit(&c->peak, &p, now, memory_order_relaxed,
                                                             memory_order_relaxed)) {
    }
}

/* Add size to cat and total, respecting budgets. Returns FL_OK or FL_ERR_BUDGET (nothing added). */
static fl_status charge(fl_mem_cat cat, size_t size) {
    mem_counter *c = &g_mem[cat], *t = &g_mem[FL_MEM_COUNT];
    size_t now = atomic_fetch_add_explicit(&c->cur, size, memory_order_relaxed) + size;
    size_t b = atomic_load_explicit(&c->budget, memory_order_relaxed);
    if (b && now > b) {
        atomic_fetch_sub_explicit(&c->cur, size, memory_order_relaxed);
        atomic_fetch_add_explicit(&c->refused, 1, memory_order_relaxed);
        return fl_set_error(FL_ERR_BUDGET, "memory budget for '%s' exceeded: %zu + %zu > %zu bytes",
                            cat_names[cat], now - size, size, b);
    }
    size_t tnow = atomic_fetch_add_explicit(&t->cur, size, memory_order_relaxed) + size;
    size_t tb = atomic_load_explicit(&t->budget, memory_order_relaxed);
    if (tb && tnow > tb) {
        atomic_fetch_sub_explicit(&t->cur, size, memory_order_relaxed);
        atomic_fetch_sub_explicit(&c->cur, size, memory_order_relaxed);
        return fl_set_error(FL_ERR_BUDGET, "total memory budget exceeded: %zu + %zu > %zu bytes (for '%s')",
                            tnow - size, size, tb, cat_names[cat]);
    }
    peak_update(c, now);
    peak_update(t, tnow);
    return FL_OK;
}

static void uncharge(fl_mem_cat cat, size_t size) {
    size_t old = atomic_fetch_sub_explicit(&g_mem[cat].cur, size, memory_order_relaxed);
    if (FL_UNLIKELY(old < size)) fl_abort(__FILE__, __LINE__, "'%s' freed %zu bytes with %zu live", cat_names[cat], size, old);
    atomic_fetch_sub_explicit(&g_mem[FL_MEM_COUNT].cur, size, memory_order_relaxed);
}

fl_status fl_mem_charge(fl_mem_cat cat, size_t size) {
    FL_ASSERT((unsigned)cat < FL_MEM_COUNT);
    return charge(cat, size);
}

void fl_mem_uncharge(fl_mem_cat cat, size_t size) {
    FL_ASSERT((unsigned)cat < FL_MEM_COUNT);
    uncharge(cat, size);
}

void fl_mem_fail_after(long n) {
    atomic_store(&g_env_read, 1);
    atomic_store(&g_fail_after, n);
}

/* True when the injected failure fires on this allocation. */
static int inject_failure(void) {
    read_env_once();
    long n = atomic_load_explicit(&g_fail_after, memory_order_relaxed);
    if (n < 0) return 0;
    long prev = atomic_fetch_sub(&g_fail_after, 1);
    return prev == 0;
}

#ifdef FL_DEBUG_MEM
/* Debug layout: [pad..][hdr: size, cat, magic][user bytes][16-byte tail canary] */
typedef struct {
    size_t size;
    size_t offset; /* from raw pointer to user pointer */
    uint32_t cat;
    uint32_t magic;
} dbg_hdr;
#define DBG_MAGIC 0xF17A110Cu
#define DBG_TAIL 16
static const unsigned char tail_pat = 0xCD;
#endif

/* Blocks of at least this many bytes (the KV pool, activation workspaces, weights converted at
 * load) get transparent huge pages where the kernel grants them on request (THP "madvise"
 * mode): the 2 MiB-aligned part is advised MADV_HUGEPAGE before anything touches it.  A hint:
 * without THP the pages stay 4 KiB.  The paged attention of a 16-sequence decode step reads a
 * few KiB from each of thousands of blocks spread over the pool; with 4 KiB pages each of them
 * missed the TLB (`fitllm bench serve` on TinyLlama-shaped Q4_0, 16 sequences x 16 + 96 tokens:
 * attention 9.5-11.1% of a decode step with 4 KiB pages, 7.8-9.2% advised, six alternated
 * pairs). */
#define HUGE_HINT_BYTES ((size_t)8 << 20)

void fl_mem_advise_huge(void *p, size_t size) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const uintptr_t hp = (uintptr_t)2 << 20, lo = ((uintptr_t)p + hp - 1) & ~(hp - 1), hi = ((uintptr_t)p + size) & ~(hp - 1);
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#else
    (void)p;
    (void)size;
#endif
}

uint64_t fl_mem_system_bytes(void) {
    const long pages = sysconf(_SC_PHYS_PAGES), pg = sysconf(_SC_PAGESIZE);
    uint64_t total = pages > 0 && pg > 0 ? (uint64_t)pages * (uint64_t)pg : 0;
    /* a cgroup v2 limit (a container's memory.max), where it is a number and smaller */
    FILE *f = fopen("/sys/fs/cgroup/memory.max", "r");
    if (f) {
        unsigned long long lim = 0;
        if (fscanf(f, "%llu", &lim) == 1 && lim > 0 && (total == 0 || lim < total)) total = lim;
        fclose(f);
    }
    return total;
}

static void huge_hint(void *p, size_t size) {
    if (size >= HUGE_HINT_BYTES) fl_mem_advise_huge(p, size);
}

static void *raw_alloc(size_t size, size_t align) {
    void *p = NULL;
    if (align < sizeof(void *)) align = sizeof(void *);
    if (posix_memalign(&p, align, size ? size : 1) != 0) return NULL;
    huge_hint(p, size);
    return p;
}

static _Thread_local size_t tl_failures; /* fl_alloc's NULLs on this thread */

size_t fl_mem_thread_failures(void) { return tl_failures; }

static void *alloc_impl(fl_mem_cat cat, size_t size, size_t align);

void *fl_alloc(fl_mem_cat cat, size_t size, size_t align) {
    void *p = alloc_impl(cat, size, align);
    if (!p) tl_failures++;
    return p;
}

static void *alloc_impl(fl_mem_cat cat, size_t size, size_t align) {
    FL_ASSERT((unsigned)cat < FL_MEM_COUNT);
    if (align == 0) align = FL_ALIGN_DEFAULT;
    FL_ASSERT((align & (align - 1)) == 0);
    if (inject_failure()) {
        fl_set_error(FL_ERR_NOMEM, "injected allocation failure (%zu bytes for '%s')", size, cat_names[cat]);
        return NULL;
    }
    if (size > ((size_t)1 << 52)) {
        fl_set_error(FL_ERR_NOMEM, "allocation of %zu bytes for '%s' is impossibly large", size, cat_names[cat]);
        return NULL;
    }
    if (charge(cat, size) != FL_OK) return NULL;
#ifdef FL_DEBUG_MEM
    size_t hdr_space = (sizeof(dbg_hdr) + align - 1) / align * align;
    unsigned char *raw = raw_alloc(hdr_space + size + DBG_TAIL, align);
    if (!raw) {
        uncharge(cat, size);
        fl_set_error(FL_ERR_NOMEM, "out of memory allocating %zu bytes for '%s'", size, cat_names[cat]);
        return NULL;
    }
    unsigned char *user = raw + hdr_space;
    dbg_hdr *h = (dbg_hdr *)(user - sizeof(dbg_hdr));
    h->size = size;
    h->offset = hdr_space;
    h->cat = (uint32_t)cat;
    h->magic = DBG_MAGIC;
    memset(user + size, tail_pat, DBG_TAIL);
    memset(user, 0xA5, size); /* poison: catch reads of uninitialized memory in tests */
    return user;
#else
    void *p = raw_alloc(size, align);
    if (!p) {
        uncharge(cat, size);
        fl_set_error(FL_ERR_NOMEM, "out of memory allocating %zu bytes for '%s'", size, cat_names[cat]);
    }
    return p;
#endif
}

void fl_free(fl_mem_cat cat, void *ptr, size_t size) {
    if (!ptr) return;
    FL_ASSERT((unsigned)cat < FL_MEM_COUNT);
#ifdef FL_DEBUG_MEM
    unsigned char *user = ptr;
    dbg_hdr *h = (dbg_hdr *)(user - sizeof(dbg_hdr));
    if (h->magic != DBG_MAGIC) fl_abort(__FILE__, __LINE__, "fl_free: bad header magic (double free or wild pointer)");
    if (h->size != size) fl_abort(__FILE__, __LINE__, "fl_free: size mismatch: allocated %zu, freed %zu", h->size, size);
    if (h->cat != (uint32_t)cat) fl_abort(__FILE__, __LINE__, "fl_free: category mismatch: %s vs %s", cat_names[h->cat], cat_names[cat]);
    for (int i = 0; i < DBG_TAIL; i++)
        if (user[size + i] != tail_pat) fl_abort(__FILE__, __LINE__, "fl_free: buffer overrun past %zu bytes (%s)", size, cat_names[cat]);
    h->magic = 0;
    free(user - h->offset);
#else
    free(ptr);
#endif
    uncharge(cat, size);
}

void *fl_calloc(fl_mem_cat cat, size_t n, size_t elem_size) {
    if (elem_size && n > SIZE_MAX / elem_size) {
        fl_set_error(FL_ERR_RANGE, "allocation of %zu x %zu bytes overflows", n, elem_size);
        return NULL;
    }
    void *p = fl_alloc(cat, n * elem_size, FL_ALIGN_DEFAULT);
    if (p) memset(p, 0, n * elem_size);
    return p;
}

void *fl_alloc_or_die(fl_mem_cat cat, size_t size, size_t align) {
    void *p = fl_alloc(cat, size, align);
    if (!p) fl_abort(__FILE__, __LINE__, "%s", fl_last_error());
    return p;
}

void *fl_realloc(fl_mem_cat cat, void *ptr, size_t old_size, size_t new_size, size_t align) {
    void *p = fl_alloc(cat, new_size, align);
    if (!p) return NULL;
    if (ptr) {
        memcpy(p, ptr, old_size < new_size ? old_size : new_size);
        fl_free(cat, ptr, old_size);
    }
    return p;
}

char *fl_strdup(fl_mem_cat cat, const char *s) {
    size_t n = strlen(s) + 1;
    char *p = fl_alloc(cat, n, 8);
    if (p) memcpy(p, s, n);
    return p;
}

/* Size-header pair: [size_t size][pad to 16][user] */
/* The header: the size, then the category (so a block is freed as it was charged, whichever
 * thread frees it and whatever that thread's category is then). */
static void *malloc_cat(fl_mem_cat cat, size_t size) {
    if (size > SIZE_MAX - 16) return NULL;
    unsigned char *p = fl_alloc(cat, size + 16, 16);
    if (!p) return NULL;
    const uint32_t c = (uint32_t)cat;
    memcpy(p, &size, sizeof size);
    memcpy(p + 8, &c, sizeof c);
    return p + 16;
}

static void free_cat(void *ptr) {
    if (!ptr) return;
    unsigned char *p = (unsigned char *)ptr - 16;
    size_t size;
    uint32_t c;
    memcpy(&size, p, sizeof size);
    memcpy(&c, p + 8, sizeof c);
    fl_free((fl_mem_cat)c, p, size + 16);
}

static _Thread_local fl_mem_cat tl_malloc_cat = FL_MEM_MISC;

fl_mem_cat fl_mem_set_malloc_cat(fl_mem_cat cat) {
    FL_ASSERT((unsigned)cat < FL_MEM_COUNT);
    const fl_mem_cat prev = tl_malloc_cat;
    tl_malloc_cat = cat;
    return prev;
}

void *fl_mem_malloc(size_t size) { return malloc_cat(tl_malloc_cat, size); }
void fl_mem_free_any(void *ptr) { free_cat(ptr); }

static const fl_mem_cat ctx_cats[FL_MEM_COUNT] = {
    FL_MEM_WEIGHTS, FL_MEM_MAPPED, FL_MEM_KV, FL_MEM_ACT, FL_MEM_SCRATCH, FL_MEM_GRAD, FL_MEM_OPTIM, FL_MEM_COMM, FL_MEM_NET, FL_MEM_GUIDE, FL_MEM_MISC,
};
_Static_assert(FL_MEM_MISC + 1 == FL_MEM_COUNT, "ctx_cats lists every category");

void *fl_mem_ctx(fl_mem_cat cat) {
    FL_ASSERT((unsigned)cat < FL_MEM_COUNT && ctx_cats[cat] == cat);
    return (void *)&ctx_cats[cat];
}

void *fl_mem_malloc_ctx(size_t size, void *ctx) { return malloc_cat(ctx ? *(const fl_mem_cat *)ctx : FL_MEM_MISC, size); }
void fl_mem_free_ctx(void *ptr, void *ctx) {
    (void)ctx; /* (the header names the category) */
    free_cat(ptr);
}

void fl_mem_install_cjson_hooks(void) {
    static cJSON_Hooks hooks = {fl_mem_malloc, fl_mem_free_any};
    cJSON_InitHooks(&hooks);
}

size_t fl_mem_current(fl_mem_cat cat) { return (unsigned)cat < FL_MEM_COUNT ? atomic_load(&g_mem[cat].cur) : 0; }
size_t fl_mem_peak(fl_mem_cat cat) { return (unsigned)cat < FL_MEM_COUNT ? atomic_load(&g_mem[cat].peak) : 0; }
size_t fl_mem_current_total(void) { return atomic_load(&g_mem[FL_MEM_COUNT].cur); }
size_t fl_mem_peak_total(void) { return atomic_load(&g_mem[FL_MEM_COUNT].peak); }

void fl_mem_reset_peaks(void) {
    for (int i = 0; i <= FL_MEM_COUNT; i++) atomic_store(&g_mem[i].peak, atomic_load(&g_mem[i].cur));
}

void fl_mem_set_budget(fl_mem_cat cat, size_t bytes) {
    if ((unsigned)cat < FL_MEM_COUNT) atomic_store(&g_mem[cat].budget, bytes);
}
void fl_mem_set_budget_total(size_t bytes) { atomic_store(&g_mem[FL_MEM_COUNT].budget, bytes); }
size_t fl_mem_budget(fl_mem_cat cat) { return (unsigned)cat < FL_MEM_COUNT ? atomic_load(&g_mem[cat].budget) : 0; }
size_t fl_mem_refused(fl_mem_cat cat) { return (unsigned)cat < FL_MEM_COUNT ? atomic_load(&g_mem[cat].refused) : 0; }

bool fl_mem_all_zero(void) {
    for (int i = 0; i <= FL_MEM_COUNT; i++)
        if (atomic_load(&g_mem[i].cur) != 0) return false;
    return true;
}

static void fmt_bytes(char *buf, size_t n, size_t b) {
    if (b >= (1ull << 30)) snprintf(buf, n, "%.2f GiB", b / 1073741824.0);
    else if (b >= (1ull << 20)) snprintf(buf, n, "%.2f MiB", b / 1048576.0);
    else if (b >= 1024) snprintf(buf, n, "%.2f KiB", b / 1024.0);
    else snprintf(buf, n, "%zu B", b);
}

void fl_mem_report(FILE *out) {
    char a[32], b[32];
    fprintf(out, "memory      %12s %12s\n", "current", "peak");
    for (int i = 0; i < FL_MEM_COUNT; i++) {
        size_t c = fl_mem_current((fl_mem_cat)i), p = fl_mem_peak((fl_mem_cat)i);
        if (!c && !p) continue;
        fmt_bytes(a, sizeof a, c);
        fmt_bytes(b, sizeof b, p);
        fprintf(out, "  %-9s %12s %12s\n", cat_names[i], a, b);
    }
    fmt_bytes(a, sizeof a, fl_mem_current_total());
    fmt_bytes(b, sizeof b, fl_mem_peak_total());
    fprintf(out, "  %-9s %12s %12s\n", "total", a, b);
}

/* Writes {"current":{cat:bytes,...,"total":n},"peak":{...}} into buf; returns the length
 * (as snprintf: a result >= n means it was truncated). */
int fl_mem_report_json(char *buf, size_t n) {
    size_t len = 0;
    char tmp[1024];
    for (int pass = 0; pass < 2; pass++) {
        len += (size_t)snprintf(tmp + len, sizeof tmp - len, pass ? ",\"peak\":{" : "{\"current\":{");
        for (int i = 0; i < FL_MEM_COUNT; i++)
            len += (size_t)snprintf(tmp + len, sizeof tmp - len, "\"%s\":%zu,", cat_names[i],
                                    pass ? fl_mem_peak((fl_mem_cat)i) : fl_mem_current((fl_mem_cat)i));
        len += (size_t)snprintf(tmp + len, sizeof tmp - len, "\"total\":%zu}",
                                pass ? fl_mem_peak_total() : fl_mem_current_total());
    }
    len += (size_t)snprintf(tmp + len, sizeof tmp - len, "}");
    return snprintf(buf, n, "%s", tmp);
}
