/* The kernel thread team: a persistent pthread pool.
 *
 * Why not OpenMP: its workers spin-wait between regions, which is fastest on an idle machine
 * but collapses when the cores are shared (a forward pass of a small model went from 3 s to
 * 90 s on a loaded 2-core box).  Here workers spin briefly on the task generation counter and
 * then sleep on a condition variable, so a busy machine costs wake-ups, not stolen cores.
 *
 * fl_parallel_n(fn, ctx, nth): the caller runs ith = 0 and the workers claim ith 1..nth-1 one at
 * a time; the caller, done with its own, claims whatever no worker has taken yet, so a worker the
 * system has not scheduled (a loaded machine, more threads than cores) delays nothing: the call
 * returns when every ith has run once, whoever ran it.  (It had waited for every worker to check
 * in: TinyLlama-shaped Q4_0 decode with another process busy on one of the 2 cores ran 25 tok/s
 * on 2 threads against 40 on 1.)  A claim names the task's generation, its nth and the next ith
 * in one atomic word, so a worker that wakes late cannot take an ith of a task it has not read.  Calls
 * from inside a task run serially (no nesting), and calls from several threads at once are
 * serialized by a mutex. */
#include "core/threads.h"
#include "core/log.h"
#include "core/status.h"

#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

#define MAX_WORKERS (FL_THREADS_MAX - 1)
#define SPIN_ITERS 4000

static int g_nthreads;

static struct {
    pthread_mutex_t call_mu; /* one parallel call at a time */
    pthread_mutex_t mu;
    pthread_cond_t cv_start, cv_done;
    pthread_t threads[MAX_WORKERS];
    int n_workers;
    atomic_uint gen;          /* bumped for each task, after its fields and claim are set */
    _Atomic uint64_t claim;   /* CLAIM(generation, nth, the next ith to claim) of the current task */
    atomic_int done;          /* iths of the current task finished */
    _Atomic(fl_task_fn) fn;   /* the current task (stable while its claim word names it) */
    _Atomic(void *) ctx;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER};

static _Thread_local bool tl_in_task;

int fl_threads_cpus(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    const long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 ? (int)c : 1;
}

void fl_threads_set(int n) {
    const int cpus = fl_threads_cpus();
    if (n <= 0) n = cpus;
    if (n > MAX_WORKERS + 1) n = MAX_WORKERS + 1;
    /* Said once a process: threads that share a CPU take turns at every parallel call, so such a
     * team runs slower than one of a thread per CPU (TinyLlama-shaped Q4_0 decode on 2 CPUs: -t 8
     * 41 tok/s against -t 2 ~85). */
    static atomic_bool warned;
    if (n > cpus && !atomic_exchange(&warned, true))
        FL_LOG_WARN("%d threads asked for, but this process may run on %d CPU%s: threads sharing a CPU take turns at every "
                    "parallel step, which is slower than %d thread%s",
                    n, cpus, cpus == 1 ? "" : "s", cpus, cpus == 1 ? "" : "s");
    g_nthreads = n;
}

int fl_threads_get(void) {
    if (g_nthreads <= 0) fl_threads_set(0);
    return g_nthreads;
}

/* Run the iths of task generation g that nobody has claimed yet, one claim at a time.  The
 * claim word holds the generation, the task's nth and the next ith, so whether an ith is left
 * is read from the word itself; the task's function and context are read before the claim and
 * used only if the word is unchanged at the claim: the word only grows, so it named g with that
 * ith open throughout, and the caller writes the next task's fields only after every ith of g
 * has been claimed and has run. */
_Static_assert(FL_THREADS_MAX < 65536, "nth and ith fit 16 bits of the claim word");
#define CLAIM(g, nth, i) ((uint64_t)(g) << 32 | (uint64_t)(nth) << 16 | (uint64_t)(i))
static void run_claims(unsigned g) {
    uint64_t c = atomic_load_explicit(&pool.claim, memory_order_acquire);
    for (;;) {
        const int nth = (int)(c >> 16 & 0xFFFF), i = (int)(c & 0xFFFF);
        if ((unsigned)(c >> 32) != g || i >= nth) return;
        const fl_task_fn fn = atomic_load_explicit(&pool.fn, memory_order_relaxed);
        void *ctx = atomic_load_explicit(&pool.ctx, memory_order_relaxed);
        if (!atomic_compare_exchange_weak_explicit(&pool.claim, &c, c + 1, memory_order_acq_rel, memory_order_acquire)) continue;
        fn(ctx, i, nth);
        if (atomic_fetch_add_explicit(&pool.done, 1, memory_order_acq_rel) + 1 == nth) {
            pthread_mutex_lock(&pool.mu);
            pthread_cond_signal(&pool.cv_done);
            pthread_mutex_unlock(&pool.mu);
        }
        c = atomic_load_explicit(&pool.claim, memory_order_acquire);
    }
}

static void *worker_main(void *arg) {
    (void)arg;
    unsigned seen = atomic_load_explicit(&pool.gen, memory_order_acquire);
    tl_in_task = true;
    run_claims(seen); /* (the task posted while this worker was being created, if one was) */
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&pool.gen, memory_order_acquire)) == seen && spins < SPIN_ITERS) {
            CPU_RELAX();
            spins++;
        }
        if (g == seen) {
            pthread_mutex_lock(&pool.mu);
            while ((g = atomic_load_explicit(&pool.gen, memory_order_acquire)) == seen) pthread_cond_wait(&pool.cv_start, &pool.mu);
            pthread_mutex_unlock(&pool.mu);
        }
        seen = g;
        run_claims(g);
    }
    return NULL;
}

/* Make sure at least n workers exist (they are never stopped: the pool lives with the process). */
static int ensure_workers(int n) {
    while (pool.n_workers < n) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&pool.threads[pool.n_workers], &attr, worker_main, NULL);
        pthread_attr_destroy(&attr);
        if (rc) break;
        pool.n_workers++;
    }
    return pool.n_workers;
}

void fl_parallel_n(fl_task_fn fn, void *ctx, int nth) {
    if (nth > MAX_WORKERS + 1) nth = MAX_WORKERS + 1;
    if (nth <= 1 || tl_in_task) {
        /* serial: every ith in turn on this thread, so kernels that split by ith still cover all */
        if (nth <= 1) fn(ctx, 0, 1);
        else
            for (int i = 0; i < nth; i++) fn(ctx, i, nth);
        return;
    }
    pthread_mutex_lock(&pool.call_mu);
    ensure_workers(nth - 1); /* (fewer if a thread cannot be made: the caller claims their iths) */
    const unsigned g = atomic_load_explicit(&pool.gen, memory_order_relaxed) + 1;
    atomic_store_explicit(&pool.fn, fn, memory_order_relaxed);
    atomic_store_explicit(&pool.ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&pool.done, 0, memory_order_relaxed);
    atomic_store_explicit(&pool.claim, CLAIM(g, nth, 1), memory_order_release); /* ith 0 is the caller's */
    pthread_mutex_lock(&pool.mu);
    atomic_store_explicit(&pool.gen, g, memory_order_release);
    pthread_cond_broadcast(&pool.cv_start);
    pthread_mutex_unlock(&pool.mu);

    tl_in_task = true;
    fn(ctx, 0, nth);
    atomic_fetch_add_explicit(&pool.done, 1, memory_order_acq_rel);
    run_claims(g);
    tl_in_task = false;

    int spins = 0;
    while (atomic_load_explicit(&pool.done, memory_order_acquire) < nth && spins < SPIN_ITERS) {
        CPU_RELAX();
        spins++;
    }
    if (atomic_load_explicit(&pool.done, memory_order_acquire) < nth) {
        pthread_mutex_lock(&pool.mu);
        while (atomic_load_explicit(&pool.done, memory_order_acquire) < nth) pthread_cond_wait(&pool.cv_done, &pool.mu);
        pthread_mutex_unlock(&pool.mu);
    }
    pthread_mutex_unlock(&pool.call_mu);
}

void fl_parallel(fl_task_fn fn, void *ctx) { fl_parallel_n(fn, ctx, fl_threads_get()); }
