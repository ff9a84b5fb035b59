/* Open MPI implementation of the communicator (built when CMake finds MPI). */
#include "dist/dist.h"
#include "core/alloc.h"
#include "core/status.h"

#include <mpi.h>
#include <string.h>

static fl_status mpi_err(int rc, const char *what) {
    if (rc == MPI_SUCCESS) return FL_OK;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return fl_set_error(FL_ERR_IO, "%s failed: %.*s", what, len, msg);
}

/* MPI counts are int: large transfers go in chunks of 2^28 elements. */
#define CHUNK ((int64_t)1 << 28)

static fl_status m_barrier(fl_comm *c) { (void)c; return mpi_err(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

static fl_status m_ar32(fl_comm *c, float *b, int64_t n) {
    (void)c;
    for (int64_t o = 0; o < n; o += CHUNK) {
        int k = (int)(n - o < CHUNK ? n - o : CHUNK);
        fl_status st = mpi_err(MPI_Allreduce(MPI_IN_PLACE, b + o, k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
        if (st) return st;
    }
    return FL_OK;
}

static fl_status m_ar64(fl_comm *c, double *b, int64_t n) {
    (void)c;
    for (int64_t o = 0; o < n; o += CHUNK) {
        int k = (int)(n - o < CHUNK ? n - o : CHUNK);
        fl_status st = mpi_err(MPI_Allreduce(MPI_IN_PLACE, b + o, k, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
        if (st) return st;
    }
    return FL_OK;
}

static fl_status m_allgather(fl_comm *c, const void *s, void *r, size_t bytes) {
    (void)c;
    if (bytes > (size_t)INT32_MAX) return fl_set_error(FL_ERR_RANGE, "allgather of %zu bytes per rank is too large", bytes);
    return mpi_err(MPI_Allgather(s, (int)bytes, MPI_BYTE, r, (int)bytes, MPI_BYTE, MPI_COMM_WORLD), "MPI_Allgather");
}

static fl_status m_rs32(fl_comm *c, const float *s, float *r, int64_t n) {
    (void)c;
    if (n > INT32_MAX) return fl_set_error(FL_ERR_RANGE, "reduce-scatter of %lld floats per rank is too large", (long long)n);
    return mpi_err(MPI_Reduce_scatter_block(s, r, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "MPI_Reduce_scatter_block");
}

static fl_status m_reduce32(fl_comm *c, const float *s, float *r, int64_t n, int root) {
    (void)c;
    if (n > INT32_MAX) return fl_set_error(FL_ERR_RANGE, "reduce of %lld floats is too large", (long long)n);
    return mpi_err(MPI_Reduce(s, r, (int)n, MPI_FLOAT, MPI_SUM, root, MPI_COMM_WORLD), "MPI_Reduce");
}

static fl_status m_bcast(fl_comm *c, void *b, size_t n, int root) {
    (void)c;
    for (size_t o = 0; o < n; o += (size_t)CHUNK) {
        int k = (int)(n - o < (size_t)CHUNK ? n - o : (size_t)CHUNK);
        fl_status st = mpi_err(MPI_Bcast((char *)b + o, k, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
        if (st) return st;
    }
    return FL_OK;
}

static fl_status m_sendrecv(fl_comm *c, const void *s, size_t sb, int dst, void *r, size_t rb, int src) {
    (void)c;
    if (sb > (size_t)INT32_MAX || rb > (size_t)INT32_MAX) return fl_set_error(FL_ERR_RANGE, "sendrecv message too large");
    /* dst / src < 0: no send / no receive (plain send or recv for pipeline stages) */
    return mpi_err(MPI_Sendrecv(s, (int)sb, MPI_BYTE, dst < 0 ? MPI_PROC_NULL : dst, 7, r, (int)rb, MPI_BYTE,
                                src < 0 ? MPI_PROC_NULL : src, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Sendrecv");
}

static void m_finalize(fl_comm *c) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (c->owns_mpi && !fin) MPI_Finalize();
}

_Static_assert(sizeof(MPI_Request) <= sizeof(uint64_t), "MPI_Request must fit fl_comm_req");

static fl_status m_isendrecv(fl_comm *c, const void *s, size_t sb, int dst, void *r, size_t rb, int src, fl_comm_req *q) {
    (void)c;
    memset(q, 0, sizeof *q);
    if (sb > (size_t)INT32_MAX || rb > (size_t)INT32_MAX) return fl_set_error(FL_ERR_RANGE, "isendrecv message too large");
    MPI_Request rq[2];
    fl_status st = mpi_err(MPI_Irecv(r, (int)rb, MPI_BYTE, src < 0 ? MPI_PROC_NULL : src, 8, MPI_COMM_WORLD, &rq[0]), "MPI_Irecv");
    if (st) return st;
    if ((st = mpi_err(MPI_Isend(s, (int)sb, MPI_BYTE, dst < 0 ? MPI_PROC_NULL : dst, 8, MPI_COMM_WORLD, &rq[1]), "MPI_Isend"))) {
        MPI_Cancel(&rq[0]);
        MPI_Request_free(&rq[0]);
        return st;
    }
    memcpy(&q->h[0], &rq[0], sizeof rq[0]);
    memcpy(&q->h[1], &rq[1], sizeof rq[1]);
    return FL_OK;
}

static fl_status m_wait(fl_comm *c, fl_comm_req *q) {
    (void)c;
    MPI_Request rq[2];
    memcpy(&rq[0], &q->h[0], sizeof rq[0]);
    memcpy(&rq[1], &q->h[1], sizeof rq[1]);
    return mpi_err(MPI_Waitall(2, rq, MPI_STATUSES_IGNORE), "MPI_Waitall");
}

static const fl_comm_ops mpi_ops = {m_barrier, m_ar32, m_ar64, m_allgather, m_rs32, m_bcast, m_sendrecv, m_finalize,
                                    m_isendrecv, m_wait, m_reduce32};

fl_status fl_comm_new_mpi(int *argc, char ***argv, fl_comm **out) {
    *out = NULL;
    int inited = 0;
    MPI_Initialized(&inited);
    bool owns = false;
    if (!inited) {
        int provided;
        fl_status st = mpi_err(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
        if (st) return st;
        owns = true;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    fl_comm *c = fl_calloc(FL_MEM_COMM, 1, sizeof *c);
    if (!c) return FL_ERR_NOMEM;
    c->ops = &mpi_ops;
    c->mpi = true;
    c->owns_mpi = owns;
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c->size);
    *out = c;
    return FL_OK;
}
