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
    int64_t K;              /* floats per rank in one collective piece */
    float *gshard;          /* FL_MEM_GRAD [L] (stage 2) */
    float *buf;             /* FL_MEM_COMM [size * K + K]: the pieces of every rank, then this rank's to send */
};

int64_t fl_zero_stride(int32_t size, int64_t n, int64_t align) {
    const int64_t L = (n + size - 1) / size;
    return (L + align - 1) / align * align;
}

void fl_zero_bytes_for(int32_t stage, int32_t size, int64_t n, int64_t align, int64_t piece, uint64_t *grad,
                       uint64_t *comm) {
    const int64_t L = fl_zero_stride(size, n, align), p = piece > 0 ? piece : FL_ZERO_PIECE, K = L < p ? L : p;
    *grad = stage == 2 ? (uint64_t)L * sizeof(float) : 0;
    *comm = (uint64_t)(size + 1) * (uint64_t)K * sizeof(float);
}

size_t fl_zero_object_bytes(void) { return sizeof(fl_zero); }

fl_status fl_zero_new(fl_comm *comm, int32_t stage, int64_t n, int64_t align, int64_t piece, fl_zero **out) {
    *out = NULL;
    if ((stage != 1 && stage != 2) || n < 1 || align < 1 || piece < 0)
        return fl_set_error(FL_ERR_INVALID, "zero: stage %d with %lld parameters, shards aligned to %lld, pieces of %lld (stages 1 and 2)",
                            stage, (long long)n, (long long)align, (long long)piece);
    fl_zero *z = fl_calloc(FL_MEM_MISC, 1, sizeof *z);
    if (!z) return FL_ERR_NOMEM;
    z->comm = comm;
    z->stage = stage;
    z->rank = fl_comm_rank(comm);
    z->size = fl_comm_size(comm);
    z->n = n;
    z->L = fl_zero_stride(z->size, n, align);
    if (piece == 0) piece = FL_ZERO_PIECE;
    z->K = z->L < piece ? z->L : piece;
    fl_zero_shard_of(z, z->rank, &z->off, &z->len);
    if (stage == 2 && !(z->gshard = fl_alloc(FL_MEM_GRAD, (size_t)z->L * sizeof(float), 64))) goto fail;
    if (!(z->buf = fl_alloc(FL_MEM_COMM, (size_t)(z->size + 1) * (size_t)z->K * sizeof(float), 64))) goto fail;
    *out = z;
    return FL_OK;
fail:
    fl_zero_free(z);
    return fl_set_error(FL_ERR_NOMEM, "zero: no memory for the gradient shard or the collective pieces");
}

void fl_zero_free(fl_zero *z) {
    if (!z) return;
    if (z->gshard) fl_free(FL_MEM_GRAD, z->gshard, (size_t)z->L * sizeof(float));
    if (z->buf) fl_free(FL_MEM_COMM, z->buf, (size_t)(z->size + 1) * (size_t)z->K * sizeof(float));
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

int64_t fl_zero_shard_stride(const fl_zero *z) { return z->L; }

static double sumsq(const float *g, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)g[i] * g[i];
    return s;
}

/* Of a vector of n floats, how many of [a, a + k) exist. */
static int64_t have(int64_t n, int64_t a, int64_t k) {
    const int64_t h = n - a;
    return h < 0 ? 0 : (h < k ? h : k);
}

/* dst[0..k) = src[a..a+k), zeros past n. */
static void take(float *dst, const float *src, int64_t n, int64_t a, int64_t k) {
    const int64_t h = have(n, a, k);
    if (h > 0) memcpy(dst, src + a, (size_t)h * sizeof(float));
    memset(dst + h, 0, (size_t)(k - h) * sizeof(float));
}

/* dst[a..a+k) = src[0..k), clipped to n. */
static void put(float *dst, int64_t n, int64_t a, const float *src, int64_t k) {
    const int64_t h = have(n, a, k);
    if (h > 0) memcpy(dst + a, src, (size_t)h * sizeof(float));
}

void fl_zero_begin(fl_zero *z) {
    if (z->gshard) memset(z->gshard, 0, (size_t)z->L * sizeof(float));
}

float *fl_zero_shard_grads(fl_zero *z) { return z->gshard; }

fl_status fl_zero_reduce_range(fl_zero *z, const float *src, int64_t off, int64_t n) {
    if (!z->gshard || off < 0 || n < 0 || off + n > z->n)
        return fl_set_error(FL_ERR_INVALID, "zero: reduce of [%lld, %lld) (stage %d, %lld parameters)", (long long)off,
                            (long long)(off + n), z->stage, (long long)z->n);
    for (int32_t r = (int32_t)(off / z->L); r < z->size && (int64_t)r * z->L < off + n; r++) {
        /* the part of [off, off + n) rank r owns, in pieces */
        const int64_t a = off > (int64_t)r * z->L ? off : (int64_t)r * z->L;
        const int64_t b = off + n < (int64_t)(r + 1) * z->L ? off + n : (int64_t)(r + 1) * z->L;
        for (int64_t c = a; c < b; c += z->K) {
            const int64_t k = b - c < z->K ? b - c : z->K;
            fl_status st = fl_comm_reduce_sum_f32(z->comm, src + (c - off), z->buf, k, r);
            if (st) return st;
            if (r == z->rank) {
                float *g = z->gshard + (c - a) + (a - (int64_t)r * z->L);
                for (int64_t i = 0; i < k; i++) g[i] += z->buf[i];
            }
        }
    }
    return FL_OK;
}

fl_status fl_zero_step(fl_zero *z, float *params, float *grads, double max_norm, double *norm, fl_zero_update_fn fn,
                       void *ud) {
    fl_status st;
    float *g; /* this shard's summed gradients */
    double ss;
    const int32_t N = z->size;
    if (z->stage == 1) {
        if (!grads) return fl_set_error(FL_ERR_INVALID, "zero: stage 1 needs the whole gradient");
        if ((st = fl_comm_allreduce_sum_f32(z->comm, grads, z->n))) return st;
        g = grads + z->off;
        ss = sumsq(grads, z->n);
    } else {
        /* grads NULL: fl_zero_reduce_range summed the shard already; else reduce-scatter piece
         * by piece: rank r's k floats at [r L + c, r L + c + k) */
        for (int64_t c = 0; grads && c < z->L; c += z->K) {
            const int64_t k = z->L - c < z->K ? z->L - c : z->K;
            for (int32_t r = 0; r < N; r++) take(z->buf + (size_t)r * (size_t)k, grads, z->n, (int64_t)r * z->L + c, k);
            if ((st = fl_comm_reduce_scatter_sum_f32(z->comm, z->buf, z->gshard + c, k))) return st;
        }
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
    /* all-gather the updated shards piece by piece */
    float *send = z->buf + (size_t)N * (size_t)z->K;
    for (int64_t c = 0; c < z->L; c += z->K) {
        const int64_t k = z->L - c < z->K ? z->L - c : z->K;
        take(send, params, z->n, z->off + c, k);
        if ((st = fl_comm_allgather(z->comm, send, z->buf, (size_t)k * sizeof(float)))) return st;
        for (int32_t r = 0; r < N; r++) put(params, z->n, (int64_t)r * z->L + c, z->buf + (size_t)r * (size_t)k, k);
    }
    return FL_OK;
}
