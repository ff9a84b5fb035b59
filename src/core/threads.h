/*
 * threads.h - the kernel thread team (a persistent pthread pool, core/threads.c) and the ith/nth
 * convention.
 *
 * fl_parallel(fn, ctx) runs fn(ctx, ith, nth) for every ith in [0, nth), nth = fl_threads_get(),
 * and returns when all are done; with nth == 1 it is a plain call.  Each ith runs exactly once,
 * but not necessarily on a thread of its own: the caller runs ith 0, then any ith no worker has
 * claimed yet, so a task must not wait inside for another ith.  Kernels split rows or tiles by
 * ith/nth themselves, or take chunks from an atomic counter.  fl_threads_set(0) means every CPU the process may run on.
 * The thread count is process-wide (set once by the CLI's -t); not for concurrent changes.
 */
#ifndef FL_THREADS_H
#define FL_THREADS_H

#include <stdatomic.h>
#include <stdint.h>

typedef void (*fl_task_fn)(void *ctx, int ith, int nth);

#define FL_THREADS_MAX 256 /* the most threads a parallel call runs on (fl_threads_set caps n) */

void fl_threads_set(int n);
/* The CPUs this process may run on: its affinity mask (a container's cpuset, taskset), else the
 * online CPUs.  fl_threads_set(0) takes this many. */
int fl_threads_cpus(void);
int fl_threads_get(void);
void fl_parallel(fl_task_fn fn, void *ctx);
void fl_parallel_n(fl_task_fn fn, void *ctx, int nth); /* explicit team size */

/* Split [0, n) evenly: thread ith gets [*lo, *hi). */
static inline void fl_split_range(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi) {
    int64_t per = (n + nth - 1) / nth;
    *lo = per * ith < n ? per * ith : n;
    *hi = *lo + per < n ? *lo + per : n;
}

#endif
