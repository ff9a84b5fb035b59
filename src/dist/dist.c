/* Communicator front end and the single-process implementation. */
#include "dist/dist.h"
#include "core/alloc.h"
#include "core/status.h"

#include <stdlib.h>
#include <string.h>

static fl_status s_barrier(fl_comm *c) { (void)c; return FL_OK; }
static fl_status s_ar32(fl_comm *c, float *b, int64_t n) { (void)c; (void)b; (void)n; return FL_OK; }
static fl_status s_ar64(fl_comm *c, double *b, int64_t n) { (void)c; (void)b; (void)n; return FL_OK; }
static fl_status s_allgather(fl_comm *c, const void *s, void *r, size_t bytes) {
    (void)c;
    if (r != s) memmove(r, s, bytes);
    return FL_OK;
}
static fl_status s_rs32(fl_comm *c, const float *s, float *r, int64_t n) {
    (void)c;
    if (r != s) memmove(r, s, (size_t)n * sizeof(float));
    return FL_OK;
}
static fl_status s_bcast(fl_comm *c, void *b, size_t n, int root) { (void)c; (void)b; (void)n; (void)root; return FL_OK; }
static fl_status s_sendrecv(fl_comm *c, const void *s, size_t sb, int dst, void *r, size_t rb, int src) {
    (void)c;
    if (dst < 0 && src < 0) return FL_OK;
    if (dst != 0 || src != 0 || sb != rb) return fl_set_error(FL_ERR_INVALID, "sendrecv: a single process can only talk to itself with equal sizes");
    if (r != s) memmove(r, s, sb);
    return FL_OK;
}
static void s_finalize(fl_comm *c) { (void)c; }
static fl_status s_isendrecv(fl_comm *c, const void *s, size_t sb, int dst, void *r, size_t rb, int src, fl_comm_req *q) {
    memset(q, 0, sizeof *q);
    return s_sendrecv(c, s, sb, dst, r, rb, src);
}
static fl_status s_wait(fl_comm *c, fl_comm_req *q) { (void)c; (void)q; return FL_OK; }
static fl_status s_reduce32(fl_comm *c, const float *s, float *r, int64_t n, int root) {
    (void)c;
    if (root != 0) return fl_set_error(FL_ERR_INVALID, "reduce: root %d in a single process", root);
    if (r != s) memmove(r, s, (size_t)n * sizeof(float));
    return FL_OK;
}

static const fl_comm_ops single_ops = {s_barrier, s_ar32, s_ar64, s_allgather, s_rs32, s_bcast, s_sendrecv, s_finalize,
                                       s_isendrecv, s_wait, s_reduce32};

fl_comm *fl_comm_new_single(void) {
    fl_comm *c = fl_calloc(FL_MEM_COMM, 1, sizeof *c);
    if (!c) return NULL;
    c->ops = &single_ops;
    c->rank = 0;
    c->size = 1;
    return c;
}

fl_status fl_comm_new(int *argc, char ***argv, fl_comm **out) {
    *out = NULL;
#ifdef FITLLM_HAVE_MPI
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE")) return fl_comm_new_mpi(argc, argv, out);
#else
    (void)argc; (void)argv;
    if (getenv("OMPI_COMM_WORLD_SIZE") && atoi(getenv("OMPI_COMM_WORLD_SIZE")) > 1)
        return fl_set_error(FL_ERR_UNSUPPORTED, "launched by mpirun, but this fitllm was built without MPI");
#endif
    *out = fl_comm_new_single();
    return *out ? FL_OK : FL_ERR_NOMEM;
}

void fl_comm_free(fl_comm *c) {
    if (!c) return;
    c->ops->finalize(c);
    fl_free(FL_MEM_COMM, c, sizeof *c);
}

int fl_comm_rank(const fl_comm *c) { return c->rank; }
int fl_comm_size(const fl_comm *c) { return c->size; }
bool fl_comm_is_mpi(const fl_comm *c) { return c->mpi; }
uint64_t fl_comm_bytes_sent(const fl_comm *c) { return c->bytes_sent; }
size_t fl_comm_object_bytes(void) { return sizeof(fl_comm); }

fl_status fl_comm_barrier(fl_comm *c) { return c->ops->barrier(c); }

/* Volumes counted as a ring algorithm moves them: allreduce sends 2 (p-1)/p of the buffer. */
fl_status fl_comm_allreduce_sum_f32(fl_comm *c, float *buf, int64_t n) {
    if (c->size > 1) c->bytes_sent += (uint64_t)(2.0 * (double)(c->size - 1) / c->size * (double)n * 4.0);
    return c->ops->allreduce_f32(c, buf, n);
}
fl_status fl_comm_allreduce_sum_f64(fl_comm *c, double *buf, int64_t n) {
    if (c->size > 1) c->bytes_sent += (uint64_t)(2.0 * (double)(c->size - 1) / c->size * (double)n * 8.0);
    return c->ops->allreduce_f64(c, buf, n);
}
fl_status fl_comm_allgather(fl_comm *c, const void *send, void *recv, size_t bytes) {
    if (c->size > 1) c->bytes_sent += (uint64_t)(c->size - 1) * bytes;
    return c->ops->allgather(c, send, recv, bytes);
}
fl_status fl_comm_reduce_scatter_sum_f32(fl_comm *c, const float *send, float *recv, int64_t n) {
    if (c->size > 1) c->bytes_sent += (uint64_t)(c->size - 1) * (uint64_t)n * 4;
    return c->ops->reduce_scatter_f32(c, send, recv, n);
}
/* counted as a tree moves it: every rank but the root sends its buffer once */
fl_status fl_comm_reduce_sum_f32(fl_comm *c, const float *send, float *recv, int64_t n, int root) {
    if (c->size > 1 && c->rank != root) c->bytes_sent += (uint64_t)n * 4;
    return c->ops->reduce_f32(c, send, recv, n, root);
}
fl_status fl_comm_bcast(fl_comm *c, void *buf, size_t bytes, int root) {
    if (c->size > 1 && c->rank == root) c->bytes_sent += bytes;
    return c->ops->bcast(c, buf, bytes, root);
}
fl_status fl_comm_isendrecv(fl_comm *c, const void *sendbuf, size_t sbytes, int dst, void *recvbuf, size_t rbytes, int src,
                            fl_comm_req *req) {
    if (dst >= 0) c->bytes_sent += sbytes;
    return c->ops->isendrecv(c, sendbuf, sbytes, dst, recvbuf, rbytes, src, req);
}
fl_status fl_comm_wait(fl_comm *c, fl_comm_req *req) { return c->ops->wait(c, req); }
fl_status fl_comm_sendrecv(fl_comm *c, const void *sendbuf, size_t sbytes, int dst, void *recvbuf, size_t rbytes, int src) {
    if (dst >= 0) c->bytes_sent += sbytes;
    return c->ops->sendrecv(c, sendbuf, sbytes, dst, recvbuf, rbytes, src);
}
