/* ZeRO stage 1/2 optimizer sharding (see zero.h). */
#include "dist/zero.h"

#include "core/alloc.h"
#include "core/status.h"

#include <math.h>
#include <string.h>

struct fl_zero {
    fl_comm *comm;
    int32_t stage, rank, size;
    int64_t n, L, off, len; /* L = shard stride, len = this shard's valid length */
    float *gshard;          /* FL_MEM_GRAD [L] (stage 2) */
    float *gather;          /* FL_MEM_COMM [size * L + L] */
};

fl_status fl_zero_new(fl_comm *comm, int32_t stage, int64_t n, int64_t align, fl_zero **out) {
    *out = NULL;
    if ((stage != 1 && stage != 2) || n < 1 || align < 1)
        return fl_set_error(FL_ERR_INVALID, "zero: stage %d with %lld parameters, shards aligned to %lld (stages 1 and 2)",
                            stage, (long long)n, (long long)align);
    fl_zero *z = fl_calloc(FL_MEM_MISC, 1, sizeof *z);
    if (!z) return FL_ERR_NOMEM;
    z->comm = comm;
    z->stage = stage;
    z->rank = fl_comm_rank(comm);
    z->size = fl_comm_size(comm);
    z->n = n;
    z->L = (n + z->size - 1) / z->size;
    z->L = (z->L + align - 1) / align * align;
    fl_zero_shard_of(z, z->rank, &z->off, &z->len);
    if (stage == 2 && !(z->gshard = fl_alloc(FL_MEM_GRAD, (size_t)z->L * sizeof(float), 64))) goto fail;
    if (!(z->gather = fl_alloc(FL_MEM_COMM, (size_t)(z->size + 1) * (size_t)z->L * sizeof(float), 64))) goto fail;
    *out = z;
    return FL_OK;
fail:
    fl_zero_free(z);
    return FL_ERR_NOMEM;
}

void fl_zero_free(fl_zero *z) {
    if (!z) return;
    if (z->gshard) fl_free(FL_MEM_GRAD, z->gshard, (size_t)z->L * sizeof(float));
    if (z->gather) fl_free(FL_MEM_COMM, z->gather, (size_t)(z->size + 1) * (size_t)z->L * sizeof(float));
    fl_free(FL_MEM_MISC, z, sizeof *z);
}

void fl_zero_shard(const fl_zero *z, int64_t *off, int64_t *len) {
    *off = z->off;
    *len = z->len;
}

void fl_zero_shard_of(const fl_zero *z, int rank, int64_t *off, int64_t *len) {
    *off = (int64_t)rank * z->L;
    *len = *off >= z->n ? 0 : (z->n - *off < z->L ? z->n - *off : z->L);
}

int64_t fl_zero_padded_n(const fl_zero *z) { return z->L * z->size; }

static double sumsq(const float *g, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)g[i] * g[i];
    return s;
}

fl_status fl_zero_step(fl_zero *z, float *params, float *grads, double max_norm, double *norm, fl_zero_update_fn fn,
                       void *ud) {
    fl_status st;
    float *g; /* this shard's summed gradients */
    double ss;
    if (z->stage == 1) {
        if ((st = fl_comm_allreduce_sum_f32(z->comm, grads, z->n))) return st;
        g = grads + z->off;
        ss = sumsq(grads, z->n);
    } else {
        if ((st = fl_comm_reduce_scatter_sum_f32(z->comm, grads, z->gshard, z->L))) return st;
        g = z->gshard;
        ss = sumsq(g, z->len);
        if ((st = fl_comm_allreduce_sum_f64(z->comm, &ss, 1))) return st;
    }
    const double nrm = sqrt(ss);
    if (norm) *norm = nrm;
    if (!isfinite(nrm)) return FL_OK; /* every rank has the same norm: every rank skips the update */
    if (max_norm > 0 && nrm > max_norm) {
        const float sc = (float)(max_norm / nrm);
        for (int64_t i = 0; i < z->len; i++) g[i] *= sc;
    }
    if (z->len > 0) fn(ud, params + z->off, g, z->len);
    /* all-gather the updated shards (padded to L) */
    float *send = z->gather + (size_t)z->size * (size_t)z->L;
    memset(send, 0, (size_t)z->L * sizeof(float));
    if (z->len > 0) memcpy(send, params + z->off, (size_t)z->len * sizeof(float));
    if ((st = fl_comm_allgather(z->comm, send, z->gather, (size_t)z->L * sizeof(float)))) return st;
    memcpy(params, z->gather, (size_t)z->n * sizeof(float));
    return FL_OK;
}
