/* Gradient checks of every training op (src/train/ops_train.c): the f32 backward of each op
 * against central finite differences of a double-precision forward of the same op.
 * Loss of an op = sum_k R_k out_k with random R, so dout = R. */
#include "test.h"

#include "core/threads.h"
#include "train/ops_train.h"

#include <stdlib.h>
#include <string.h>

/* ---- deterministic random numbers (xorshift) ---- */
static uint64_t g_rng = 88172645463325252ull;
static double urand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / 9007199254740992.0;
}
static void fill(float *x, int64_t n, double lo, double hi) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * urand());
}
static float *falloc(int64_t n) { return fl_calloc(FL_MEM_MISC, (size_t)n, sizeof(float)); }
static double *dalloc(int64_t n) { return fl_calloc(FL_MEM_MISC, (size_t)n, sizeof(double)); }
static void ffree(float *p, int64_t n) { fl_free(FL_MEM_MISC, p, (size_t)n * sizeof(float)); }
static void dfree(double *p, int64_t n) { fl_free(FL_MEM_MISC, p, (size_t)n * sizeof(double)); }

/* A double forward: writes n_out outputs from the current inputs held by the case. */
typedef void (*fwd_d_fn)(void *ctx, double *out);

/* Central differences of L = sum R.out wrt every element of x (double, in place perturbation)
 * compared with the analytic gradient g (f32).  Checks |g - fd| <= atol + rtol |fd| for all. */
static void check_grad(const char *what, fwd_d_fn f, void *ctx, double *x, int64_t n, const float *g,
                       const double *R, int64_t n_out, double rtol, double atol) {
    double *o1 = dalloc(n_out), *o2 = dalloc(n_out);
    const double h = 1e-6;
    double worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double x0 = x[i];
        x[i] = x0 + h;
        f(ctx, o1);
        x[i] = x0 - h;
        f(ctx, o2);
        x[i] = x0;
        double l1 = 0, l2 = 0;
        for (int64_t k = 0; k < n_out; k++) {
            l1 += R[k] * o1[k];
            l2 += R[k] * o2[k];
        }
        const double fd = (l1 - l2) / (2 * h), err = fabs(fd - g[i]);
        if (err > worst) worst = err;
        if (!(err <= atol + rtol * fabs(fd))) fail_msg("%s: d[%ld] analytic %.8g vs finite diff %.8g", what, (long)i, g[i], fd);
    }
    dfree(o1, n_out);
    dfree(o2, n_out);
    (void)worst;
}

static void to_d(double *d, const float *f, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] = f[i];
}

/* ---------------------------------------------------------------- rmsnorm */
typedef struct { double *x, *w; int64_t N, C; double eps; } rms_case;
static void rms_fwd_d(void *p, double *out) {
    rms_case *c = p;
    for (int64_t i = 0; i < c->N; i++) {
        double ss = 0;
        for (int64_t j = 0; j < c->C; j++) ss += c->x[i * c->C + j] * c->x[i * c->C + j];
        double r = 1.0 / sqrt(ss / (double)c->C + c->eps);
        for (int64_t j = 0; j < c->C; j++) out[i * c->C + j] = c->x[i * c->C + j] * r * c->w[j];
    }
}

static void test_rmsnorm_grad(void **state) {
    (void)state;
    const int64_t N = 3, C = 13;
    float *x = falloc(N * C), *w = falloc(C), *out = falloc(N * C), *rstd = falloc(N), *dout = falloc(N * C);
    float *dx = falloc(N * C), *dw = falloc(C);
    fill(x, N * C, -1, 1);
    fill(w, C, 0.5, 1.5);
    fill(dout, N * C, -1, 1);
    fl_train_rmsnorm_forward(out, rstd, x, w, N, C, 1e-5f);
    fl_train_rmsnorm_backward(dx, dw, dout, x, w, rstd, N, C);
    rms_case c = {dalloc(N * C), dalloc(C), N, C, 1e-5};
    double *R = dalloc(N * C), *od = dalloc(N * C);
    to_d(c.x, x, N * C);
    to_d(c.w, w, C);
    to_d(R, dout, N * C);
    rms_fwd_d(&c, od);
    for (int64_t i = 0; i < N * C; i++) CHECK_NEAR(out[i], od[i], 1e-5);
    check_grad("rmsnorm dx", rms_fwd_d, &c, c.x, N * C, dx, R, N * C, 1e-3, 1e-4);
    check_grad("rmsnorm dw", rms_fwd_d, &c, c.w, C, dw, R, N * C, 1e-3, 1e-4);
    dfree(c.x, N * C); dfree(c.w, C); dfree(R, N * C); dfree(od, N * C);
    ffree(x, N * C); ffree(w, C); ffree(out, N * C); ffree(rstd, N); ffree(dout, N * C); ffree(dx, N * C); ffree(dw, C);
    fl_test_mem_zero();
}

/* ---------------------------------------------------------------- matmul */
typedef struct { double *x, *w; int64_t N, I, O; } mm_case;
static void mm_fwd_d(void *p, double *out) {
    mm_case *c = p;
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t o = 0; o < c->O; o++) {
            double s = 0;
            for (int64_t i = 0; i < c->I; i++) s += c->x[n * c->I + i] * c->w[o * c->I + i];
            out[n * c->O + o] = s;
        }
}

static void test_matmul_grad(void **state) {
    (void)state;
    const int64_t N = 7, I = 11, O = 5; /* N not a multiple of the 4-row tile */
    float *x = falloc(N * I), *w = falloc(O * I), *out = falloc(N * O), *dout = falloc(N * O);
    float *dx = falloc(N * I), *dw = falloc(O * I);
    fill(x, N * I, -1, 1);
    fill(w, O * I, -1, 1);
    fill(dout, N * O, -1, 1);
    fl_train_matmul_forward(out, x, w, N, I, O);
    fl_train_matmul_backward(dx, dw, dout, x, w, N, I, O);
    mm_case c = {dalloc(N * I), dalloc(O * I), N, I, O};
    double *R = dalloc(N * O), *od = dalloc(N * O);
    to_d(c.x, x, N * I);
    to_d(c.w, w, O * I);
    to_d(R, dout, N * O);
    mm_fwd_d(&c, od);
    for (int64_t i = 0; i < N * O; i++) CHECK_NEAR(out[i], od[i], 1e-5);
    check_grad("matmul dx", mm_fwd_d, &c, c.x, N * I, dx, R, N * O, 1e-4, 1e-5);
    check_grad("matmul dw", mm_fwd_d, &c, c.w, O * I, dw, R, N * O, 1e-4, 1e-5);
    /* accumulation: a second backward doubles the gradients */
    float *dx2 = falloc(N * I);
    memcpy(dx2, dx, (size_t)(N * I) * sizeof(float));
    fl_train_matmul_backward(dx2, NULL, dout, x, w, N, I, O);
    for (int64_t i = 0; i < N * I; i++) CHECK_NEAR(dx2[i], 2 * dx[i], 1e-5);
    ffree(dx2, N * I);
    dfree(c.x, N * I); dfree(c.w, O * I); dfree(R, N * O); dfree(od, N * O);
    ffree(x, N * I); ffree(w, O * I); ffree(out, N * O); ffree(dout, N * O); ffree(dx, N * I); ffree(dw, O * I);
    fl_test_mem_zero();
}

/* ---------------------------------------------------------------- rope */
typedef struct { double *x; const int32_t *pos; int64_t N; int H, hd, rd; double base; } rope_case;
static void rope_fwd_d(void *p, double *out) {
    rope_case *c = p;
    for (int64_t t = 0; t < c->N; t++)
        for (int h = 0; h < c->H; h++) {
            const double *x = c->x + (t * c->H + h) * c->hd;
            double *y = out + (t * c->H + h) * c->hd;
            for (int i = 0; i < c->hd; i++) y[i] = x[i];
            for (int i = 0; i < c->rd / 2; i++) {
                double th = c->pos[t] * pow(c->base, -2.0 * i / c->rd);
                y[2 * i] = x[2 * i] * cos(th) - x[2 * i + 1] * sin(th);
                y[2 * i + 1] = x[2 * i] * sin(th) + x[2 * i + 1] * cos(th);
            }
        }
}

static void test_rope_grad(void **state) {
    (void)state;
    const int64_t N = 4;
    const int H = 3, hd = 8, rd = 6; /* partial rotary: last 2 dims pass through */
    const int32_t pos[4] = {0, 1, 7, 300};
    const int64_t n = N * H * hd;
    float *x = falloc(n), *out = falloc(n), *dout = falloc(n), *dx = falloc(n);
    fill(x, n, -1, 1);
    fill(dout, n, -1, 1);
    fl_train_rope_forward(out, x, pos, N, H, hd, rd, 10000.0f);
    fl_train_rope_backward(dx, dout, pos, N, H, hd, rd, 10000.0f);
    rope_case c = {dalloc(n), pos, N, H, hd, rd, 10000.0};
    double *R = dalloc(n), *od = dalloc(n);
    to_d(c.x, x, n);
    to_d(R, dout, n);
    rope_fwd_d(&c, od);
    for (int64_t i = 0; i < n; i++) CHECK_NEAR(out[i], od[i], 1e-4);
    check_grad("rope dx", rope_fwd_d, &c, c.x, n, dx, R, n, 1e-3, 1e-4);
    /* in place gives the same */
    fl_train_rope_forward(x, x, pos, N, H, hd, rd, 10000.0f);
    for (int64_t i = 0; i < n; i++) assert_true(x[i] == out[i]);
    dfree(c.x, n); dfree(R, n); dfree(od, n);
    ffree(x, n); ffree(out, n); ffree(dout, n); ffree(dx, n);
    fl_test_mem_zero();
}

/* ---------------------------------------------------------------- swiglu + residual */
typedef struct { double *g, *u; int64_t n; } sw_case;
static void sw_fwd_d(void *p, double *out) {
    sw_case *c = p;
    for (int64_t i = 0; i < c->n; i++) out[i] = c->g[i] / (1 + exp(-c->g[i])) * c->u[i];
}

static void test_swiglu_residual_grad(void **state) {
    (void)state;
    const int64_t n = 37;
    float *g = falloc(n), *u = falloc(n), *out = falloc(n), *dout = falloc(n), *dg = falloc(n), *du = falloc(n);
    fill(g, n, -4, 4);
    fill(u, n, -2, 2);
    fill(dout, n, -1, 1);
    fl_train_swiglu_forward(out, g, u, n);
    fl_train_swiglu_backward(dg, du, dout, g, u, n);
    sw_case c = {dalloc(n), dalloc(n), n};
    double *R = dalloc(n);
    to_d(c.g, g, n);
    to_d(c.u, u, n);
    to_d(R, dout, n);
    check_grad("swiglu dg", sw_fwd_d, &c, c.g, n, dg, R, n, 1e-4, 1e-5);
    check_grad("swiglu du", sw_fwd_d, &c, c.u, n, du, R, n, 1e-4, 1e-5);
    /* aliasing dg == dout */
    float *d2 = falloc(n);
    memcpy(d2, dout, (size_t)n * sizeof(float));
    fl_train_swiglu_backward(d2, du, d2, g, u, n);
    for (int64_t i = 0; i < n; i++) assert_true(d2[i] == dg[i]);
    /* residual: out = a + b, d/da = d/db = dout, accumulated */
    float *da = falloc(n), *db = falloc(n);
    fl_train_residual_forward(out, g, u, n);
    for (int64_t i = 0; i < n; i++) CHECK_NEAR(out[i], (double)g[i] + u[i], 1e-6);
    fl_train_residual_backward(da, db, dout, n);
    fl_train_residual_backward(da, NULL, dout, n);
    for (int64_t i = 0; i < n; i++) {
        assert_true(da[i] == 2 * dout[i]);
        assert_true(db[i] == dout[i]);
    }
    ffree(da, n); ffree(db, n); ffree(d2, n);
    dfree(c.g, n); dfree(c.u, n); dfree(R, n);
    ffree(g, n); ffree(u, n); ffree(out, n); ffree(dout, n); ffree(dg, n); ffree(du, n);
    fl_test_mem_zero();
}

/* ---------------------------------------------------------------- embedding */
typedef struct { double *wte; const int32_t *tok; int64_t N, C; } emb_case;
static void emb_fwd_d(void *p, double *out) {
    emb_case *c = p;
    for (int64_t i = 0; i < c->N; i++)
        for (int64_t j = 0; j < c->C; j++) out[i * c->C + j] = c->wte[c->tok[i] * c->C + j];
}

static void test_embed_grad(void **state) {
    (void)state;
    const int64_t V = 6, C = 5, N = 5;
    const int32_t tok[5] = {3, 1, 3, 5, 0}; /* a repeated token accumulates */
    float *wte = falloc(V * C), *out = falloc(N * C), *dout = falloc(N * C), *dw = falloc(V * C);
    fill(wte, V * C, -1, 1);
    fill(dout, N * C, -1, 1);
    fl_train_embed_forward(out, tok, wte, N, C);
    fl_train_embed_backward(dw, dout, tok, N, C);
    emb_case c = {dalloc(V * C), tok, N, C};
    double *R = dalloc(N * C);
    to_d(c.wte, wte, V * C);
    to_d(R, dout, N * C);
    check_grad("embed dwte", emb_fwd_d, &c, c.wte, V * C, dw, R, N * C, 1e-5, 1e-6);
    dfree(c.wte, V * C); dfree(R, N * C);
    ffree(wte, V * C); ffree(out, N * C); ffree(dout, N * C); ffree(dw, V * C);
    fl_test_mem_zero();
}

/* ---------------------------------------------------------------- attention */
typedef struct { double *q, *k, *v; const int32_t *cu; int n_seq, H, Hkv, hd; double scale; } att_case;
static void att_fwd_d(void *p, double *out) {
    att_case *c = p;
    const int grp = c->H / c->Hkv;
    for (int s = 0; s < c->n_seq; s++)
        for (int h = 0; h < c->H; h++)
            for (int i = c->cu[s]; i < c->cu[s + 1]; i++) {
                double sc[64], mx = -1e300, sum = 0;
                for (int j = c->cu[s]; j <= i; j++) {
                    double d = 0;
                    for (int e = 0; e < c->hd; e++)
                        d += c->q[(i * c->H + h) * c->hd + e] * c->k[(j * c->Hkv + h / grp) * c->hd + e];
                    sc[j - c->cu[s]] = d * c->scale;
                    if (sc[j - c->cu[s]] > mx) mx = sc[j - c->cu[s]];
                }
                for (int j = c->cu[s]; j <= i; j++) sum += (sc[j - c->cu[s]] = exp(sc[j - c->cu[s]] - mx));
                for (int e = 0; e < c->hd; e++) {
                    double o = 0;
                    for (int j = c->cu[s]; j <= i; j++) o += sc[j - c->cu[s]] / sum * c->v[(j * c->Hkv + h / grp) * c->hd + e];
                    out[(i * c->H + h) * c->hd + e] = o;
                }
            }
}

static void test_attn_grad(void **state) {
    (void)state;
    const int n_seq = 3, H = 4, Hkv = 2, hd = 5; /* GQA 2:1, three packed sequences */
    const int32_t cu[4] = {0, 4, 5, 11};
    const int64_t N = 11, nq = N * H * hd, nk = N * Hkv * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    float *q = falloc(nq), *k = falloc(nk), *v = falloc(nk), *out = falloc(nq), *lse = falloc(N * H);
    float *dout = falloc(nq), *dq = falloc(nq), *dk = falloc(nk), *dv = falloc(nk);
    fill(q, nq, -1.5, 1.5);
    fill(k, nk, -1.5, 1.5);
    fill(v, nk, -1, 1);
    fill(dout, nq, -1, 1);
    fill(dk, nk, 5, 6); /* garbage: backward overwrites */
    fl_threads_set(2);
    assert_int_equal(fl_train_attn_forward(out, lse, q, k, v, cu, n_seq, H, Hkv, hd, scale), FL_OK);
    assert_int_equal(fl_train_attn_backward(dq, dk, dv, dout, q, k, v, out, lse, cu, n_seq, H, Hkv, hd, scale), FL_OK);
    att_case c = {dalloc(nq), dalloc(nk), dalloc(nk), cu, n_seq, H, Hkv, hd, scale};
    double *R = dalloc(nq), *od = dalloc(nq);
    to_d(c.q, q, nq);
    to_d(c.k, k, nk);
    to_d(c.v, v, nk);
    to_d(R, dout, nq);
    att_fwd_d(&c, od);
    for (int64_t i = 0; i < nq; i++) CHECK_NEAR(out[i], od[i], 1e-5);
    /* single-token sequence 1 (token 4): output equals its v */
    for (int e = 0; e < hd; e++) CHECK_NEAR(out[(4 * H + 3) * hd + e], v[(4 * Hkv + 1) * hd + e], 1e-6);
    check_grad("attn dq", att_fwd_d, &c, c.q, nq, dq, R, nq, 1e-3, 1e-4);
    check_grad("attn dk", att_fwd_d, &c, c.k, nk, dk, R, nq, 1e-3, 1e-4);
    check_grad("attn dv", att_fwd_d, &c, c.v, nk, dv, R, nq, 1e-3, 1e-4);
    /* bad cu_seqlens: error, no crash */
    const int32_t bad[3] = {0, 5, 3};
    assert_int_equal(fl_train_attn_forward(out, lse, q, k, v, bad, 2, H, Hkv, hd, scale), FL_ERR_INVALID);
    assert_int_equal(fl_train_attn_forward(out, lse, q, k, v, cu, n_seq, 3, Hkv, hd, scale), FL_ERR_INVALID);
    dfree(c.q, nq); dfree(c.k, nk); dfree(c.v, nk); dfree(R, nq); dfree(od, nq);
    ffree(q, nq); ffree(k, nk); ffree(v, nk); ffree(out, nq); ffree(lse, N * H);
    ffree(dout, nq); ffree(dq, nq); ffree(dk, nk); ffree(dv, nk);
    fl_test_mem_zero();
}

/* ---------------------------------------------------------------- cross-entropy */
typedef struct { double *x; const int32_t *t; int64_t N, V; } ce_case;
static void ce_fwd_d(void *p, double *out) {
    ce_case *c = p;
    for (int64_t i = 0; i < c->N; i++) {
        double mx = -1e300, s = 0;
        for (int64_t j = 0; j < c->V; j++) mx = fmax(mx, c->x[i * c->V + j]);
        for (int64_t j = 0; j < c->V; j++) s += exp(c->x[i * c->V + j] - mx);
        out[i] = c->t[i] >= 0 ? mx + log(s) - c->x[i * c->V + c->t[i]] : 0.0;
    }
}

static void test_crossentropy_grad(void **state) {
    (void)state;
    const int64_t N = 4, V = 9;
    const int32_t t[4] = {2, -1, 8, 0};
    float *x = falloc(N * V), *losses = falloc(N), *lse = falloc(N), *dl = falloc(N), *dx = falloc(N * V);
    fill(x, N * V, -3, 3);
    fill(dl, N, 0.1, 1);
    fl_train_crossentropy_forward(losses, lse, x, t, N, V);
    fl_train_crossentropy_backward(dx, dl, x, lse, t, N, V);
    ce_case c = {dalloc(N * V), t, N, V};
    double *R = dalloc(N), *od = dalloc(N);
    to_d(c.x, x, N * V);
    to_d(R, dl, N);
    ce_fwd_d(&c, od);
    for (int64_t i = 0; i < N; i++) CHECK_NEAR(losses[i], od[i], 1e-5);
    assert_true(losses[1] == 0.0f);
    check_grad("crossentropy dlogits", ce_fwd_d, &c, c.x, N * V, dx, R, N, 1e-4, 1e-5);
    /* in place: dlogits == logits */
    fl_train_crossentropy_backward(x, dl, x, lse, t, N, V);
    for (int64_t i = 0; i < N * V; i++) assert_true(x[i] == dx[i]);
    dfree(c.x, N * V); dfree(R, N); dfree(od, N);
    ffree(x, N * V); ffree(losses, N); ffree(lse, N); ffree(dl, N); ffree(dx, N * V);
    fl_test_mem_zero();
}

static void test_rounding(void **state) {
    (void)state;
    float x[4] = {1.0f, 1.00390625f + 1e-6f, 70000.0f, -3.14159265f};
    fl_train_round_bf16(x, 4);
    assert_true(x[0] == 1.0f);
    CHECK_NEAR(x[3], -3.140625, 1e-7);
    float y[2] = {70000.0f, 1.0f / 3.0f};
    fl_train_round_fp16(y, 2);
    assert_true(isinf(y[0]));
    CHECK_NEAR(y[1], 0.333251953125, 1e-9);
    fl_test_mem_zero();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm_grad),  cmocka_unit_test(test_matmul_grad),
        cmocka_unit_test(test_rope_grad),     cmocka_unit_test(test_swiglu_residual_grad),
        cmocka_unit_test(test_embed_grad),    cmocka_unit_test(test_attn_grad),
        cmocka_unit_test(test_crossentropy_grad), cmocka_unit_test(test_rounding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
