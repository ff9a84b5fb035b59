/* The kernel thread team: a persistent pthread pool.
 *
 * Why not OpenMP: its workers spin-wait between regions, which is fastest on an idle machine
 * but collapses when the cores are shared (a forward pass of a small model went from 3 s to
 * 90 s on a loaded 2-core box).  Here workers spin briefly on the task generation counter and
 * then sleep on a condition variable, so a busy machine costs wake-ups, not stolen cores.
 *
 * fl_parallel_n(fn, ctx, nth): the caller runs ith = 0 and workers 1..nth-1 run the rest; it
 * returns when all are done.  Calls from inside a task run serially (no nesting), and calls
 * from several threads at once are serialized by a mutex. */
#include "core/threads.h"
#include "core/status.h"

#include <pthread.h>
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
    pthread_mutex_t call_mu;        /* one parallel call at a time */
    pthread_mutex_t mu;
    pthread_cond_t cv_start, cv_done;
    pthread_t threads[MAX_WORKERS];
    int n_workers;
    unsigned start_gen[MAX_WORKERS]; /* the generation each worker was created at */
    atomic_uint gen;                /* bumped for each task */
    atomic_int remaining;           /* workers still running the current task */
    fl_task_fn fn;
    void *ctx;
    int nth;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER};

static _Thread_local bool tl_in_task;

void fl_threads_set(int n) {
    if (n <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n = c > 0 ? (int)c : 1;
    }
    if (n > MAX_WORKERS + 1) n = MAX_WORKERS + 1;
    g_nthreads = n;
}

int fl_threads_get(void) {
    if (g_nthreads <= 0) fl_threads_set(0);
    return g_nthreads;
}

static void *worker_main(void *arg) {
    const int idx = (int)(intptr_t)arg; /* this worker runs ith = idx + 1 */
    unsigned seen = pool.start_gen[idx]; /* not gen: a task may already have been posted */
    tl_in_task = true;
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
        /* Every worker acknowledges every task, running it or not, so none can lag a task
         * behind and read the next task's fields as its own. */
        if (idx + 1 < pool.nth) pool.fn(pool.ctx, idx + 1, pool.nth);
        if (atomic_fetch_sub_explicit(&pool.remaining, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&pool.mu);
            pthread_cond_signal(&pool.cv_done);
            pthread_mutex_unlock(&pool.mu);
        }
    }
    return NULL;
}

/* Make sure at least n workers exist (they are never stopped: the pool lives with the process). */
static int ensure_workers(int n) {
    while (pool.n_workers < n) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pool.start_gen[pool.n_workers] = atomic_load(&pool.gen);
        int rc = pthread_create(&pool.threads[pool.n_workers], &attr, worker_main, (void *)(intptr_t)pool.n_workers);
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
    int have = ensure_workers(nth - 1);
    if (have < nth - 1) nth = have + 1;
    pool.fn = fn;
    pool.ctx = ctx;
    pool.nth = nth;
    atomic_store_explicit(&pool.remaining, have, memory_order_relaxed);
    pthread_mutex_lock(&pool.mu);
    atomic_fetch_add_explicit(&pool.gen, 1, memory_order_release);
    pthread_cond_broadcast(&pool.cv_start);
    pthread_mutex_unlock(&pool.mu);

    tl_in_task = true;
    fn(ctx, 0, nth);
    tl_in_task = false;

    int spins = 0;
    while (atomic_load_explicit(&pool.remaining, memory_order_acquire) > 0 && spins < SPIN_ITERS) {
        CPU_RELAX();
        spins++;
    }
    if (atomic_load_explicit(&pool.remaining, memory_order_acquire) > 0) {
        pthread_mutex_lock(&pool.mu);
        while (atomic_load_explicit(&pool.remaining, memory_order_acquire) > 0) pthread_cond_wait(&pool.cv_done, &pool.mu);
        pthread_mutex_unlock(&pool.mu);
    }
    pthread_mutex_unlock(&pool.call_mu);
}

void fl_parallel(fl_task_fn fn, void *ctx) { fl_parallel_n(fn, ctx, fl_threads_get()); }
