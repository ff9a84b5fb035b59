#include "core/threads.h"

#include <omp.h>
#include <unistd.h>

static int g_nthreads;

void fl_threads_set(int n) {
    if (n <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n = c > 0 ? (int)c : 1;
    }
    g_nthreads = n;
}

int fl_threads_get(void) {
    if (g_nthreads <= 0) fl_threads_set(0);
    return g_nthreads;
}

void fl_parallel_n(fl_task_fn fn, void *ctx, int nth) {
    if (nth <= 1) {
        fn(ctx, 0, 1);
        return;
    }
#pragma omp parallel num_threads(nth)
    {
        fn(ctx, omp_get_thread_num(), omp_get_num_threads());
    }
}

void fl_parallel(fl_task_fn fn, void *ctx) { fl_parallel_n(fn, ctx, fl_threads_get()); }
