/* ZeRO-1/2 data parallelism: run directly (one rank) and under `mpirun -np 2/4` (cli_mpi.sh).
 * A small MLP trained with AdamW on a global batch split across ranks must follow the same loss
 * curve as one process training on the whole batch. */
#include "test.h"

#include "core/status.h"
#include "core/threads.h"
#include "dist/dist.h"
#include "dist/zero.h"

#include <math.h>
#include <string.h>

static fl_comm *g_comm;

static void mem_zero_but_comm(void) {
    for (int c = 0; c < FL_MEM_COUNT; c++) {
        if (c == FL_MEM_COMM) continue;
        if (fl_mem_current((fl_mem_cat)c)) {
            fl_mem_report(stderr);
            fail_msg("memory category %s not back at zero", fl_mem_cat_name((fl_mem_cat)c));
        }
    }
}

/* y = s * (W2 tanh(W1 x + b1) + b2): parameters [W1 16x8][b1 16][W2 4x16][b2 4][s] = 213 */
enum { DI = 8, DH = 16, DO = 4, NPAR = DH * DI + DH + DO * DH + DO + 1, B = 12, STEPS = 25 };

static float rnd(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return ((float)(*s >> 8) / 16777216.0f) * 2.0f - 1.0f;
}

static void sample(int step, int i, float *x, float *y) {
    uint32_t s = (uint32_t)(step * 131 + i * 7 + 1);
    for (int k = 0; k < DI; k++) x[k] = rnd(&s);
    for (int o = 0; o < DO; o++) y[o] = sinf(x[o] + 0.5f * x[o + 4]) * 0.8f;
}

/* Add d(loss_i)/dp * scale to g and return loss_i * scale (loss_i = 0.5 |y - t|^2). */
static double backward(const float *p, const float *x, const float *t, float scale, float *g) {
    const float *W1 = p, *b1 = p + DH * DI, *W2 = b1 + DH, *b2 = W2 + DO * DH, s = b2[DO];
    float *gW1 = g, *gb1 = g + DH * DI, *gW2 = gb1 + DH, *gb2 = gW2 + DO * DH;
    float h[DH], z[DO], dz[DO], dh[DH];
    for (int j = 0; j < DH; j++) {
        float a = b1[j];
        for (int k = 0; k < DI; k++) a += W1[j * DI + k] * x[k];
        h[j] = tanhf(a);
    }
    double loss = 0;
    float gs = 0;
    for (int o = 0; o < DO; o++) {
        float a = b2[o];
        for (int j = 0; j < DH; j++) a += W2[o * DH + j] * h[j];
        z[o] = a;
        const float d = s * a - t[o];
        loss += 0.5 * d * d;
        dz[o] = d * s * scale;
        gs += d * a * scale;
    }
    gb2[DO] += gs;
    for (int j = 0; j < DH; j++) dh[j] = 0;
    for (int o = 0; o < DO; o++) {
        gb2[o] += dz[o];
        for (int j = 0; j < DH; j++) {
            gW2[o * DH + j] += dz[o] * h[j];
            dh[j] += dz[o] * W2[o * DH + j];
        }
    }
    for (int j = 0; j < DH; j++) {
        const float da = dh[j] * (1 - h[j] * h[j]);
        gb1[j] += da;
        for (int k = 0; k < DI; k++) gW1[j * DI + k] += da * x[k];
    }
    (void)z;
    return loss * scale;
}

typedef struct adamw {
    float *m, *v;
    int64_t n, t;
} adamw;

static void adamw_update(void *ud, float *p, const float *g, int64_t n) {
    adamw *a = ud;
    FL_ASSERT(n == a->n);
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.01f;
    a->t++;
    const float c1 = 1.0f - powf(b1, (float)a->t), c2 = 1.0f - powf(b2, (float)a->t);
    for (int64_t i = 0; i < n; i++) {
        a->m[i] = b1 * a->m[i] + (1 - b1) * g[i];
        a->v[i] = b2 * a->v[i] + (1 - b2) * g[i] * g[i];
        p[i] -= lr * ((a->m[i] / c1) / (sqrtf(a->v[i] / c2) + eps) + wd * p[i]);
    }
}

static void adamw_init(adamw *a, int64_t n) {
    a->n = n;
    a->t = 0;
    a->m = fl_calloc(FL_MEM_OPTIM, (size_t)(n > 0 ? n : 1), sizeof(float));
    a->v = fl_calloc(FL_MEM_OPTIM, (size_t)(n > 0 ? n : 1), sizeof(float));
    assert_non_null(a->m);
    assert_non_null(a->v);
}

static void adamw_free(adamw *a) {
    fl_free(FL_MEM_OPTIM, a->m, (size_t)(a->n > 0 ? a->n : 1) * sizeof(float));
    fl_free(FL_MEM_OPTIM, a->v, (size_t)(a->n > 0 ? a->n : 1) * sizeof(float));
}

static void init_params(float *p) {
    uint32_t s = 99;
    for (int i = 0; i < NPAR; i++) p[i] = 0.4f * rnd(&s);
    p[NPAR - 1] = 1.0f;
}

/* Single process on the whole batch. */
static void reference(double *loss, float *p) {
    init_params(p);
    adamw a;
    adamw_init(&a, NPAR);
    float g[NPAR], x[DI], t[DO];
    for (int step = 0; step < STEPS; step++) {
        memset(g, 0, sizeof g);
        double l = 0;
        for (int i = 0; i < B; i++) {
            sample(step, i, x, t);
            l += backward(p, x, t, 1.0f / B, g);
        }
        loss[step] = l;
        double ss = 0;
        for (int i = 0; i < NPAR; i++) ss += (double)g[i] * g[i];
        const double nrm = sqrt(ss);
        if (nrm > 1.0)
            for (int i = 0; i < NPAR; i++) g[i] *= (float)(1.0 / nrm);
        adamw_update(&a, p, g, NPAR);
    }
    adamw_free(&a);
}

/* bucket > 0 (stage 2): each sample's gradient handed over in buckets of that many floats,
 * from the end (fl_zero_reduce_range, as the trainer's backward does), then fl_zero_step
 * without a whole gradient. */
static void zero_case(int32_t stage, int64_t align, int64_t piece, int64_t bucket) {
    const int32_t N = fl_comm_size(g_comm), r = fl_comm_rank(g_comm);
    double ref_loss[STEPS], got_loss[STEPS];
    float ref_p[NPAR], p[NPAR];
    reference(ref_loss, ref_p);
    fl_zero *z;
    const size_t comm0 = fl_mem_current(FL_MEM_COMM), misc0 = fl_mem_current(FL_MEM_MISC);
    assert_int_equal(fl_zero_new(g_comm, stage, NPAR, align, piece, &z), FL_OK);
    int64_t off, len;
    fl_zero_shard(z, &off, &len);
    const int64_t L = fl_zero_shard_stride(z);
    assert_int_equal(L, fl_zero_stride(N, NPAR, align));
    /* what it allocated is what fl_zero_bytes_for says */
    uint64_t gb, cb;
    fl_zero_bytes_for(stage, N, NPAR, align, piece, &gb, &cb);
    assert_int_equal(fl_mem_current(FL_MEM_GRAD), gb);
    assert_int_equal(fl_mem_current(FL_MEM_COMM) - comm0, cb);
    assert_int_equal(fl_mem_current(FL_MEM_MISC) - misc0, fl_zero_object_bytes());
    /* the shards start on multiples of align and cover [0, NPAR) once */
    assert_int_equal(off % align, 0);
    double cover = (double)len;
    assert_int_equal(fl_comm_allreduce_sum_f64(g_comm, &cover, 1), FL_OK);
    assert_true(cover == (double)NPAR);
    assert_true(len == 0 || off + len == NPAR || len == L);
    float *g = fl_calloc(FL_MEM_GRAD, NPAR, sizeof(float));
    adamw a;
    adamw_init(&a, len);
    /* the optimizer states are 1/N of a single process's */
    assert_int_equal(fl_mem_current(FL_MEM_OPTIM), 2 * (size_t)(len > 0 ? len : 1) * sizeof(float));
    init_params(p);
    float x[DI], t[DO];
    for (int step = 0; step < STEPS; step++) {
        memset(g, 0, NPAR * sizeof(float));
        double l = 0;
        if (bucket > 0) {
            fl_zero_begin(z);
            for (int k = 0; k < (B + N - 1) / N; k++) { /* as many on every rank: collective */
                const int i = r * B / N + k;
                memset(g, 0, NPAR * sizeof(float));
                if (i < (r + 1) * B / N) {
                    sample(step, i, x, t);
                    l += backward(p, x, t, 1.0f / B, g);
                }
                for (int64_t e = NPAR; e > 0; e -= bucket) {
                    const int64_t b0 = e - bucket > 0 ? e - bucket : 0;
                    assert_int_equal(fl_zero_reduce_range(z, g + b0, b0, e - b0), FL_OK);
                }
            }
        } else {
            for (int i = r * B / N; i < (r + 1) * B / N; i++) {
                sample(step, i, x, t);
                l += backward(p, x, t, 1.0f / B, g);
            }
        }
        assert_int_equal(fl_comm_allreduce_sum_f64(g_comm, &l, 1), FL_OK);
        got_loss[step] = l;
        double nrm;
        assert_int_equal(fl_zero_step(z, p, bucket > 0 ? NULL : g, 1.0, &nrm, adamw_update, &a), FL_OK);
    }
    double maxl = 0, maxp = 0;
    for (int s = 0; s < STEPS; s++) maxl = fmax(maxl, fabs(ref_loss[s] - got_loss[s]) / ref_loss[s]);
    for (int i = 0; i < NPAR; i++) maxp = fmax(maxp, fabs(ref_p[i] - p[i]));
    fprintf(stderr, "rank %d/%d zero-%d, align %lld, pieces of %lld, buckets of %lld: shard [%lld, +%lld) of %d, loss %.5f -> %.5f (ref %.5f -> %.5f), max rel dloss %.2g, max |dp| %.2g\n",
            r, N, stage, (long long)align, (long long)piece, (long long)bucket, (long long)off, (long long)len, NPAR, got_loss[0], got_loss[STEPS - 1], ref_loss[0],
            ref_loss[STEPS - 1], maxl, maxp);
    assert_true(got_loss[STEPS - 1] < 0.7 * got_loss[0]); /* it learns */
    assert_true(maxl < 1e-4);
    assert_true(maxp < 1e-4);
    adamw_free(&a);
    fl_free(FL_MEM_GRAD, g, NPAR * sizeof(float));
    fl_zero_free(z);
    mem_zero_but_comm();
}

static void test_zero1(void **state) {
    (void)state;
    zero_case(1, 1, 0, 0);
    zero_case(1, 32, 0, 0);
    zero_case(1, 32, 7, 0); /* pieces of 7 floats: the shards in several, the last short */
}
static void test_zero2(void **state) {
    (void)state;
    zero_case(2, 1, 0, 0);
    zero_case(2, 32, 0, 0);
    zero_case(2, 32, 7, 0);
    zero_case(2, 1, 1, 0);
    /* bucketed: buckets across shard ends, in pieces, one bucket for everything */
    zero_case(2, 1, 0, 13);
    zero_case(2, 32, 7, 13);
    zero_case(2, 16, 5, 100);
    zero_case(2, 1, 0, NPAR);
}

/* A gradient that is not finite on one rank (an fp16 overflow): every rank gets the non-finite
 * norm, no shard is updated, no parameter changes, and the next finite step updates again. */
static void nonfinite_case(int32_t stage) {
    const int32_t r = fl_comm_rank(g_comm);
    fl_zero *z;
    assert_int_equal(fl_zero_new(g_comm, stage, NPAR, 16, 5, &z), FL_OK);
    int64_t off, len;
    fl_zero_shard(z, &off, &len);
    float *g = fl_calloc(FL_MEM_GRAD, NPAR, sizeof(float));
    assert_non_null(g);
    adamw a;
    adamw_init(&a, len);
    float p[NPAR], p0[NPAR], x[DI], t[DO];
    init_params(p);
    memcpy(p0, p, sizeof p);
    sample(0, r, x, t);
    backward(p, x, t, 1.0f, g);
    if (r == 0) g[NPAR - 1] = INFINITY;
    double nrm = 0;
    assert_int_equal(fl_zero_step(z, p, g, 1.0, &nrm, adamw_update, &a), FL_OK);
    assert_false(isfinite(nrm));
    assert_int_equal(a.t, 0);
    assert_memory_equal(p, p0, sizeof p);
    memset(g, 0, NPAR * sizeof(float));
    backward(p, x, t, 1.0f, g);
    assert_int_equal(fl_zero_step(z, p, g, 1.0, &nrm, adamw_update, &a), FL_OK);
    assert_true(isfinite(nrm) && nrm > 0);
    assert_int_equal(a.t, len > 0 ? 1 : 0);
    assert_true(memcmp(p, p0, sizeof p) != 0);
    adamw_free(&a);
    fl_free(FL_MEM_GRAD, g, NPAR * sizeof(float));
    fl_zero_free(z);
    mem_zero_but_comm();
}

static void test_zero_nonfinite(void **state) {
    (void)state;
    nonfinite_case(1);
    nonfinite_case(2);
}
static void test_zero_bad(void **state) {
    (void)state;
    fl_zero *z;
    assert_int_equal(fl_zero_new(g_comm, 3, 10, 1, 0, &z), FL_ERR_INVALID);
    assert_int_equal(fl_zero_new(g_comm, 1, 0, 1, 0, &z), FL_ERR_INVALID);
    assert_int_equal(fl_zero_new(g_comm, 1, 10, 0, 0, &z), FL_ERR_INVALID);
    assert_int_equal(fl_zero_new(g_comm, 1, 10, 1, -1, &z), FL_ERR_INVALID);
    /* stage 1 keeps no shard to sum buckets into, and needs the whole gradient; ranges past n */
    float g[10] = {0}, p[10] = {0};
    assert_int_equal(fl_zero_new(g_comm, 1, 10, 1, 0, &z), FL_OK);
    assert_int_equal(fl_zero_reduce_range(z, g, 0, 10), FL_ERR_INVALID);
    assert_int_equal(fl_zero_step(z, p, NULL, 0, NULL, NULL, NULL), FL_ERR_INVALID);
    fl_zero_free(z);
    assert_int_equal(fl_zero_new(g_comm, 2, 10, 1, 0, &z), FL_OK);
    assert_int_equal(fl_zero_reduce_range(z, g, 4, 7), FL_ERR_INVALID);
    assert_int_equal(fl_zero_reduce_range(z, g, -1, 2), FL_ERR_INVALID);
    assert_int_equal(fl_zero_reduce_range(z, g, 0, -1), FL_ERR_INVALID);
    fl_zero_free(z);
    fl_clear_error();
    mem_zero_but_comm();
}

int main(int argc, char **argv) {
    if (fl_comm_new(&argc, &argv, &g_comm) != FL_OK) {
        fprintf(stderr, "comm: %s\n", fl_last_error());
        return 1;
    }
    fl_threads_set(1);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_zero_bad), cmocka_unit_test(test_zero1),
                                       cmocka_unit_test(test_zero2), cmocka_unit_test(test_zero_nonfinite)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fl_comm_free(g_comm);
    return rc;
}
