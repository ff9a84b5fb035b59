/*
 * dist.h - the communicator: rank, size and the collectives fitllm's parallel modes need.
 *
 * Two implementations behind one vtable: a single-process one (rank 0 of 1: collectives are
 * copies or no-ops, so every parallel code path also runs without MPI) and an Open MPI one
 * (dist_mpi.c, built when MPI is found: FITLLM_HAVE_MPI).  fl_comm_new() picks MPI when the
 * process was started by mpirun (OMPI_COMM_WORLD_SIZE set) and MPI is built in, else single.
 *
 * Every call is collective over all ranks unless it says otherwise; sizes are per rank.
 * Errors (an MPI failure) return FL_ERR_IO with the MPI error string.  Bytes moved are counted
 * (fl_comm_bytes_sent) so benchmarks can report communication volume per token.
 * Not thread-safe: call from one thread per rank.
 */
#ifndef FL_DIST_H
#define FL_DIST_H

#include "fitllm.h"
#include <stdbool.h>
#include <stdint.h>

typedef struct fl_comm fl_comm;

fl_status fl_comm_new(int *argc, char ***argv, fl_comm **out); /* MPI if launched by mpirun */
fl_comm *fl_comm_new_single(void);                            /* NULL on OOM */
void fl_comm_free(fl_comm *c);                                /* finalizes MPI if this comm initialized it */

int fl_comm_rank(const fl_comm *c);
int fl_comm_size(const fl_comm *c);
bool fl_comm_is_mpi(const fl_comm *c);
uint64_t fl_comm_bytes_sent(const fl_comm *c);
size_t fl_comm_object_bytes(void); /* what fl_comm_new keeps in FL_MEM_COMM (the planner) */

fl_status fl_comm_barrier(fl_comm *c);
/* In-place sum over ranks of buf[n]. */
fl_status fl_comm_allreduce_sum_f32(fl_comm *c, float *buf, int64_t n);
fl_status fl_comm_allreduce_sum_f64(fl_comm *c, double *buf, int64_t n);
/* recv[size * bytes] = concatenation of every rank's send[bytes], in rank order. */
fl_status fl_comm_allgather(fl_comm *c, const void *send, void *recv, size_t bytes);
/* send[size * n] summed over ranks; rank r receives the sum of slice r into recv[n]. */
fl_status fl_comm_reduce_scatter_sum_f32(fl_comm *c, const float *send, float *recv, int64_t n);
/* send[n] summed over ranks into root's recv[n] (recv is not touched on the other ranks). */
fl_status fl_comm_reduce_sum_f32(fl_comm *c, const float *send, float *recv, int64_t n, int root);
fl_status fl_comm_bcast(fl_comm *c, void *buf, size_t bytes, int root);
/* Send sbytes to dst and receive rbytes from src at once (ring steps); not collective.
 * dst < 0: nothing is sent; src < 0: nothing is received (pipeline stages). */
fl_status fl_comm_sendrecv(fl_comm *c, const void *sendbuf, size_t sbytes, int dst, void *recvbuf, size_t rbytes, int src);
/* Non-blocking sendrecv: start it, compute, then fl_comm_wait (both buffers stay untouched until
 * the wait returns).  Several may be in flight; messages between two ranks match in the order
 * they were started.  Not collective. */
typedef struct fl_comm_req {
    uint64_t h[2]; /* implementation handles */
} fl_comm_req;
fl_status fl_comm_isendrecv(fl_comm *c, const void *sendbuf, size_t sbytes, int dst, void *recvbuf, size_t rbytes, int src,
                            fl_comm_req *req);
fl_status fl_comm_wait(fl_comm *c, fl_comm_req *req);

/* Implementation table (dist.c: single process, dist_mpi.c: Open MPI). */
typedef struct fl_comm_ops {
    fl_status (*barrier)(fl_comm *c);
    fl_status (*allreduce_f32)(fl_comm *c, float *buf, int64_t n);
    fl_status (*allreduce_f64)(fl_comm *c, double *buf, int64_t n);
    fl_status (*allgather)(fl_comm *c, const void *send, void *recv, size_t bytes);
    fl_status (*reduce_scatter_f32)(fl_comm *c, const float *send, float *recv, int64_t n);
    fl_status (*bcast)(fl_comm *c, void *buf, size_t bytes, int root);
    fl_status (*sendrecv)(fl_comm *c, const void *s, size_t sb, int dst, void *r, size_t rb, int src);
    void (*finalize)(fl_comm *c);
    fl_status (*isendrecv)(fl_comm *c, const void *s, size_t sb, int dst, void *r, size_t rb, int src, fl_comm_req *q);
    fl_status (*wait)(fl_comm *c, fl_comm_req *q);
    fl_status (*reduce_f32)(fl_comm *c, const float *send, float *recv, int64_t n, int root);
} fl_comm_ops;

struct fl_comm {
    const fl_comm_ops *ops;
    int rank, size;
    bool mpi, owns_mpi;
    uint64_t bytes_sent;
};

#ifdef FITLLM_HAVE_MPI
fl_status fl_comm_new_mpi(int *argc, char ***argv, fl_comm **out);
#endif

#endif
