/* AdamW (fp32 and 8-bit block-wise states), gradient clipping, LR schedules (see optim.h). */
#include "train/optim.h"

#include "core/alloc.h"
#include "core/status.h"
#include "core/threads.h"
#include "kernels/adam8.h"
#include "kernels/dispatch.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct fl_optim {
    fl_optimizer_config cfg;
    int64_t n, t;
    int64_t ranges[2 * FL_OPTIM_MAX_RANGES];
    int n_ranges; /* -1: decay everything */
    /* fp32 */
    float *m, *v;
    /* 8-bit */
    uint8_t *qm, *qv;
    float *am, *av; /* absmax per block */
    int64_t n_blocks;
};

/* ---------------------------------------------------------------- code tables */

static float g_map[2][256];
/* The nearest-code table (see code_fast).  Per map, for each float in [2^-TAB_EXP0, 2) of either
 * sign, keyed by its top 16 bits (sign, exponent, 7 mantissa bits: a bucket of 65536 floats):
 * bits 16-23 the code c of the bucket's first float (low 16 bits 0), bits 0-15 the last low half
 * t that still takes c (0xffff: the whole bucket does); past t the bucket takes the next code,
 * c + 1 for positive floats and c - 1 for negative ones (their magnitude grows with the low
 * bits).  The codes rise with x (the nearest, the lower on a tie), so a bucket holds one code or
 * two; one whose ends lie further apart is marked by bit 31 and takes the binary search (none
 * does for these maps).  Below 2^-TAB_EXP0 every float is nearer 0 than any other code
 * (build_maps checks it), so the table starts there. */
#define TAB_EXP0 23
#define TAB_E_LO (127 - TAB_EXP0) /* biased exponents TAB_E_LO .. 127 */
#define TAB_KEYS ((128 - TAB_E_LO) * 128)
#define TAB_SLOW 0x80000000u
static uint32_t g_tab[2][2 * TAB_KEYS]; /* [map][sign * TAB_KEYS + key] */
static uint8_t g_zero[2];             /* the code of 0 */
static pthread_once_t g_map_once = PTHREAD_ONCE_INIT;

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* The bracket map[lo] <= x < map[lo + 1] by binary search: lo = 0 below map[0] (and for NaN),
 * 254 from map[255] up. */
static int bracket(const float *map, float x) {
    int lo = 0, hi = 255;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (map[mid] <= x) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* The specification: the nearer of the bracket's two codes, the lower on a tie (NaN: 1). */
static uint8_t code_ref(const float *map, float x) {
    const int lo = bracket(map, x);
    return (uint8_t)(fabsf(x - map[lo]) <= fabsf(map[lo + 1] - x) ? lo : lo + 1);
}

static float f32_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void build_maps(void) {
    for (int sgn = 0; sgn < 2; sgn++) {
        float *d = g_map[sgn];
        int n = 0;
        for (int e = 0; e < 7; e++) {
            const int items = sgn ? (1 << e) + 1 : (1 << (e + 1)) + 1; /* boundaries */
            const double scale = pow(10.0, e - 6);
            for (int i = 0; i + 1 < items; i++) {
                const double b0 = 0.1 + 0.9 * i / (items - 1), b1 = 0.1 + 0.9 * (i + 1) / (items - 1);
                const double mid = 0.5 * (b0 + b1) * scale;
                d[n++] = (float)mid;
                if (sgn) d[n++] = (float)-mid;
            }
        }
        d[n++] = 0.0f;
        d[n++] = 1.0f;
        FL_ASSERT(n == 256);
        qsort(d, 256, sizeof(float), cmp_float);
        for (int k = 0; k < TAB_KEYS; k++) {
            for (uint32_t neg = 0; neg < 2; neg++) {
                const uint32_t top = neg << 31 | (uint32_t)(TAB_E_LO * 128 + k) << 16;
                const int c0 = code_ref(d, f32_of(top)), c1 = code_ref(d, f32_of(top | 0xffffu));
                uint32_t e = (uint32_t)c0 << 16 | 0xffffu;
                if (c1 != c0 && c1 - c0 != (neg ? -1 : 1)) {
                    e = TAB_SLOW;
                } else if (c1 != c0) { /* the last low half with c0, by bisection: monotone */
                    uint32_t lo = 0, hi = 0xffff;
                    while (hi - lo > 1) {
                        const uint32_t mid = (lo + hi) / 2;
                        if (code_ref(d, f32_of(top | mid)) == c0) lo = mid;
                        else hi = mid;
                    }
                    e = (uint32_t)c0 << 16 | lo;
                }
                g_tab[sgn][neg * TAB_KEYS + k] = e;
            }
        }
        g_zero[sgn] = code_ref(d, 0.0f);
        /* below the table: the code of 0 (the floats just under 2^-TAB_EXP0 of either sign,
         * and with them, the codes rising with x, every smaller one) */
        const float below = f32_of(((uint32_t)TAB_E_LO << 23) - 1u);
        FL_ASSERT(code_ref(d, below) == g_zero[sgn] && code_ref(d, -below) == g_zero[sgn]);
    }
}

const float *fl_optim_dynamic_map(int is_signed) {
    pthread_once(&g_map_once, build_maps);
    return g_map[is_signed ? 1 : 0];
}

/* code_ref's answer from the table: the bucket's code, or its neighbour past the bucket's
 * threshold.  Zero and the floats below the table take the code of 0; those above it (>= 2,
 * infinities, NaN) and a bucket marked slow, code_ref's way. */
static inline uint8_t code_fast(int m, const float *map, float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    const uint32_t e = (u >> 23) & 0xff;
    if (e < TAB_E_LO) return g_zero[m];
    if (e > 127) return code_ref(map, x);
    const uint32_t t = g_tab[m][(u >> 31) * TAB_KEYS + (u >> 16 & 0x7fff) - TAB_E_LO * 128];
    if (t & TAB_SLOW) return code_ref(map, x);
    const int c = (int)(t >> 16 & 0xff);
    if ((u & 0xffff) <= (t & 0xffff)) return (uint8_t)c;
    return (uint8_t)(u >> 31 ? c - 1 : c + 1);
}

uint8_t fl_optim_code(int is_signed, float x) {
    const float *map = fl_optim_dynamic_map(is_signed);
    return code_fast(is_signed ? 1 : 0, map, x);
}

uint8_t fl_optim_code_ref(int is_signed, float x) { return code_ref(fl_optim_dynamic_map(is_signed), x); }

static void quant_block_ref(int m, const float *x, uint8_t *q, float *absmax, int64_t n) {
    const float *map = g_map[m];
    float a = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        a = ax > a ? ax : a; /* fmaxf's answer (a NaN is passed over), without its call */
    }
    *absmax = a;
    const float inv = a > 0.0f ? 1.0f / a : 0.0f;
    for (int64_t i = 0; i < n; i++) q[i] = code_fast(m, map, x[i] * inv);
}

static uint8_t code_slow(const float *map, float x) { return code_ref(map, x); }

/* quant_block_ref's bits, on the AVX-512 kernel where fl_isa_get() says so */
static void quant_block(int m, const float *x, uint8_t *q, float *absmax, int64_t n) {
    if (fl_isa_get() == FL_ISA_AVX512) {
        const fl_adam8_codes c = {g_map[m], g_tab[m], TAB_KEYS, TAB_E_LO, g_zero[m], code_slow};
        fl_adam8_quant_avx512(&c, x, q, absmax, n);
    } else {
        quant_block_ref(m, x, q, absmax, n);
    }
}

void fl_optim_quantize_blockwise(const float *x, uint8_t *q, float *absmax, int64_t n, int32_t bs, int is_signed) {
    fl_optim_dynamic_map(is_signed);
    for (int64_t b = 0; b * bs < n; b++) {
        const int64_t len = n - b * bs < bs ? n - b * bs : bs;
        quant_block(is_signed ? 1 : 0, x + b * bs, q + b * bs, absmax + b, len);
    }
}

void fl_optim_dequantize_blockwise(const uint8_t *q, const float *absmax, float *x, int64_t n, int32_t bs,
                                   int is_signed) {
    const float *map = fl_optim_dynamic_map(is_signed);
    for (int64_t i = 0; i < n; i++) x[i] = map[q[i]] * absmax[i / bs];
}

/* ---------------------------------------------------------------- lifetime */

fl_optimizer_config fl_optim_default(void) {
    return (fl_optimizer_config){.kind = FL_OPTIMIZER_ADAMW, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                             .weight_decay = 0.1f, .block_size = 256};
}

static size_t state_bytes(const fl_optim *o) {
    if (o->cfg.kind == FL_OPTIMIZER_ADAMW) return 2 * (size_t)o->n * sizeof(float);
    return 2 * (size_t)o->n + 2 * (size_t)o->n_blocks * sizeof(float);
}

uint64_t fl_optim_states_bytes_for(fl_optimizer_kind kind, uint64_t n_params, int64_t block_size) {
    if (kind == FL_OPTIMIZER_ADAMW) return 2 * n_params * sizeof(float);
    const uint64_t bs = block_size > 0 ? (uint64_t)block_size : 256;
    return 2 * n_params + 2 * ((n_params + bs - 1) / bs) * sizeof(float);
}

size_t fl_optim_object_bytes(void) { return sizeof(fl_optim); }

fl_status fl_optim_new(const fl_optimizer_config *cfg, int64_t n_params, const int64_t *ranges, int n_ranges,
                       fl_optim **out) {
    *out = NULL;
    if (n_params <= 0 || (cfg->kind != FL_OPTIMIZER_ADAMW && cfg->kind != FL_OPTIMIZER_ADAMW8BIT) ||
        n_ranges > FL_OPTIM_MAX_RANGES || cfg->block_size < 0)
        return fl_set_error(FL_ERR_INVALID, "%s: bad optimizer config", __func__);
    fl_optim *o = fl_calloc(FL_MEM_MISC, 1, sizeof *o);
    if (!o) return FL_ERR_NOMEM;
    o->cfg = *cfg;
    if (o->cfg.block_size == 0) o->cfg.block_size = 256;
    o->n = n_params;
    o->n_ranges = n_ranges;
    if (n_ranges > 0) memcpy(o->ranges, ranges, (size_t)n_ranges * 2 * sizeof(int64_t));
    if (cfg->kind == FL_OPTIMIZER_ADAMW) {
        o->m = fl_calloc(FL_MEM_OPTIM, (size_t)n_params, sizeof(float));
        o->v = fl_calloc(FL_MEM_OPTIM, (size_t)n_params, sizeof(float));
        if (!o->m || !o->v) goto fail;
    } else {
        fl_optim_dynamic_map(1);
        o->n_blocks = (n_params + o->cfg.block_size - 1) / o->cfg.block_size;
        o->qm = fl_alloc(FL_MEM_OPTIM, (size_t)n_params, 64);
        o->qv = fl_alloc(FL_MEM_OPTIM, (size_t)n_params, 64);
        o->am = fl_calloc(FL_MEM_OPTIM, (size_t)o->n_blocks, sizeof(float));
        o->av = fl_calloc(FL_MEM_OPTIM, (size_t)o->n_blocks, sizeof(float));
        if (!o->qm || !o->qv || !o->am || !o->av) goto fail;
        /* code of 0.0 in each table, absmax 0: all states start at zero */
        const uint8_t zm = g_zero[1], zv = g_zero[0];
        memset(o->qm, zm, (size_t)n_params);
        memset(o->qv, zv, (size_t)n_params);
    }
    *out = o;
    return FL_OK;
fail:
    fl_optim_free(o);
    return fl_set_error(FL_ERR_NOMEM, "%s: no memory for optimizer states (%lld params)", __func__, (long long)n_params);
}

void fl_optim_free(fl_optim *o) {
    if (!o) return;
    const size_t n = (size_t)o->n;
    fl_free(FL_MEM_OPTIM, o->m, n * sizeof(float));
    fl_free(FL_MEM_OPTIM, o->v, n * sizeof(float));
    fl_free(FL_MEM_OPTIM, o->qm, n);
    fl_free(FL_MEM_OPTIM, o->qv, n);
    fl_free(FL_MEM_OPTIM, o->am, (size_t)o->n_blocks * sizeof(float));
    fl_free(FL_MEM_OPTIM, o->av, (size_t)o->n_blocks * sizeof(float));
    fl_free(FL_MEM_MISC, o, sizeof *o);
}

int64_t fl_optim_steps(const fl_optim *o) { return o->t; }
void fl_optim_set_steps(fl_optim *o, int64_t t) { o->t = t; }
size_t fl_optim_state_bytes(const fl_optim *o) { return state_bytes(o); }
const fl_optimizer_config *fl_optim_get_config(const fl_optim *o) { return &o->cfg; }

fl_status fl_optim_state(fl_optim *o, int i, void **data, size_t *bytes, const char **name) {
    const size_t n = (size_t)o->n, nb = (size_t)o->n_blocks * sizeof(float);
    if (o->cfg.kind == FL_OPTIMIZER_ADAMW) {
        if (i == 0) { *data = o->m; *bytes = n * sizeof(float); *name = "adam.m"; return FL_OK; }
        if (i == 1) { *data = o->v; *bytes = n * sizeof(float); *name = "adam.v"; return FL_OK; }
    } else {
        if (i == 0) { *data = o->qm; *bytes = n; *name = "adam8.qm"; return FL_OK; }
        if (i == 1) { *data = o->qv; *bytes = n; *name = "adam8.qv"; return FL_OK; }
        if (i == 2) { *data = o->am; *bytes = nb; *name = "adam8.absmax_m"; return FL_OK; }
        if (i == 3) { *data = o->av; *bytes = nb; *name = "adam8.absmax_v"; return FL_OK; }
    }
    return FL_ERR_RANGE;
}

fl_status fl_optim_state_unit(const fl_optim *o, int i, int64_t *per_params, size_t *unit_bytes) {
    if (i < 0 || i >= (o->cfg.kind == FL_OPTIMIZER_ADAMW ? 2 : 4)) return FL_ERR_RANGE;
    const bool block = o->cfg.kind != FL_OPTIMIZER_ADAMW && i >= 2;
    *per_params = block ? o->cfg.block_size : 1;
    *unit_bytes = o->cfg.kind == FL_OPTIMIZER_ADAMW || block ? sizeof(float) : 1;
    return FL_OK;
}

/* ---------------------------------------------------------------- step */

typedef struct step_ctx {
    fl_optim *o;
    float *p;
    const float *g;
    float lr, bc1, bc2;
    float gs; /* each gradient times this as it is read */
} step_ctx;

/* Decay of element i and the end of the run of equal decay that starts at i. */
static float decay_run(const fl_optim *o, int64_t i, int64_t *end) {
    *end = o->n;
    if (o->n_ranges < 0) return o->cfg.weight_decay;
    float wd = 0.0f;
    for (int r = 0; r < o->n_ranges; r++) {
        const int64_t a = o->ranges[2 * r], b = o->ranges[2 * r + 1];
        if (i >= a && i < b) wd = o->cfg.weight_decay;
        if (a > i && a < *end) *end = a;
        if (b > i && b < *end) *end = b;
    }
    return wd;
}

static inline void adam_elem(const step_ctx *c, float wd, float *p, float g, float *m, float *v) {
    const float b1 = c->o->cfg.beta1, b2 = c->o->cfg.beta2;
    g *= c->gs;
    *m = b1 * *m + (1.0f - b1) * g;
    *v = b2 * *v + (1.0f - b2) * g * g;
    const float mh = *m / c->bc1, vh = *v / c->bc2;
    *p -= c->lr * (mh / (sqrtf(vh) + c->o->cfg.eps) + wd * *p);
}

/* Work unit: a block of bs elements (fp32 uses blocks of 4096 for threading only). */
static void step_task(void *arg, int ith, int nth) {
    const step_ctx *c = arg;
    fl_optim *o = c->o;
    const int64_t bs = o->cfg.kind == FL_OPTIMIZER_ADAMW ? 4096 : o->cfg.block_size;
    const int64_t nblk = (o->n + bs - 1) / bs;
    int64_t lo, hi;
    fl_split_range(nblk, ith, nth, &lo, &hi);
    float mbuf[4096], vbuf[4096];
    const float *smap = g_map[1], *umap = g_map[0];
    const bool simd = fl_isa_get() == FL_ISA_AVX512; /* the same bits as the loops */
    const fl_optimizer_config *h = &o->cfg;
    for (int64_t b = lo; b < hi; b++) {
        const int64_t i0 = b * bs, len = o->n - i0 < bs ? o->n - i0 : bs;
        if (o->cfg.kind == FL_OPTIMIZER_ADAMW) {
            for (int64_t i = i0; i < i0 + len;) {
                int64_t end;
                const float wd = decay_run(o, i, &end);
                if (end > i0 + len) end = i0 + len;
                if (simd) {
                    fl_adam_update_avx512(c->p + i, c->g + i, c->gs, o->m + i, o->v + i, end - i, h->beta1, h->beta2,
                                          c->bc1, c->bc2, c->lr, h->eps, wd);
                    i = end;
                }
                for (; i < end; i++) adam_elem(c, wd, &c->p[i], c->g[i], &o->m[i], &o->v[i]);
            }
            continue;
        }
        float *mb = mbuf, *vb = vbuf;
        if (simd) {
            fl_adam8_dequant_avx512(smap, o->qm + i0, o->am[b], mb, len);
            fl_adam8_dequant_avx512(umap, o->qv + i0, o->av[b], vb, len);
        } else {
            for (int64_t i = 0; i < len; i++) {
                mb[i] = smap[o->qm[i0 + i]] * o->am[b];
                vb[i] = umap[o->qv[i0 + i]] * o->av[b];
            }
        }
        for (int64_t i = 0; i < len;) {
            int64_t end;
            const float wd = decay_run(o, i0 + i, &end);
            end = end - i0 < len ? end - i0 : len;
            if (simd) {
                fl_adam_update_avx512(c->p + i0 + i, c->g + i0 + i, c->gs, mb + i, vb + i, end - i, h->beta1, h->beta2,
                                      c->bc1, c->bc2, c->lr, h->eps, wd);
                i = end;
            }
            for (; i < end; i++) adam_elem(c, wd, &c->p[i0 + i], c->g[i0 + i], &mb[i], &vb[i]);
        }
        quant_block(1, mb, o->qm + i0, &o->am[b], len);
        quant_block(0, vb, o->qv + i0, &o->av[b], len);
    }
}

void fl_optim_step_scaled(fl_optim *o, float *params, const float *grads, float lr, float gscale) {
    FL_ASSERT(o->cfg.block_size <= 4096);
    o->t++;
    step_ctx c = {o, params, grads, lr, 1.0f - powf(o->cfg.beta1, (float)o->t), 1.0f - powf(o->cfg.beta2, (float)o->t),
                  gscale};
    fl_parallel(step_task, &c);
}

/* (g * 1 is g, bit for bit, for every finite and infinite g) */
void fl_optim_step(fl_optim *o, float *params, const float *grads, float lr) { fl_optim_step_scaled(o, params, grads, lr, 1.0f); }

/* ---------------------------------------------------------------- clipping, schedules */

/* The sum of squares in CLIP_PARTS fixed parts (each over 8 interleaved double sums), the
 * parts on the threads, added in order: the same bits on any number of threads. */
#define CLIP_PARTS 64

typedef struct {
    float *g;
    int64_t n;
    float scale;
    double part[CLIP_PARTS];
} clip_ctx;

static void part_range(int64_t n, int k, int64_t *lo, int64_t *hi) {
    *lo = n / CLIP_PARTS * k + (k < n % CLIP_PARTS ? k : n % CLIP_PARTS);
    *hi = *lo + n / CLIP_PARTS + (k < n % CLIP_PARTS ? 1 : 0);
}

static void clip_ss_task(void *p, int ith, int nth) {
    clip_ctx *c = p;
    for (int k = ith; k < CLIP_PARTS; k += nth) {
        int64_t lo, hi;
        part_range(c->n, k, &lo, &hi);
        double s[8] = {0};
        int64_t i = lo;
        for (; i + 8 <= hi; i += 8)
            for (int j = 0; j < 8; j++) s[j] += (double)c->g[i + j] * c->g[i + j];
        for (int j = 0; i < hi; i++, j++) s[j] += (double)c->g[i] * c->g[i];
        c->part[k] = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    }
}

static void clip_scale_task(void *p, int ith, int nth) {
    clip_ctx *c = p;
    int64_t lo, hi;
    fl_split_range(c->n, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) c->g[i] *= c->scale;
}

double fl_grad_norm(const float *g, int64_t n) {
    clip_ctx c = {.g = (float *)g, .n = n}; /* (the sum of squares only reads g) */
    fl_parallel(clip_ss_task, &c);
    double ss = 0.0;
    for (int k = 0; k < CLIP_PARTS; k++) ss += c.part[k];
    return sqrt(ss);
}

float fl_grad_clip_scale(double norm, double max_norm) {
    return max_norm > 0 && isfinite(norm) && norm > max_norm ? (float)(max_norm / norm) : 1.0f;
}

double fl_grad_clip(float *g, int64_t n, double max_norm) {
    const double norm = fl_grad_norm(g, n);
    clip_ctx c = {.g = g, .n = n, .scale = fl_grad_clip_scale(norm, max_norm)};
    if (c.scale != 1.0f) fl_parallel(clip_scale_task, &c);
    return norm;
}

float fl_lr_at(int kind, int64_t step, int64_t warmup, int64_t total, float lr, float min_lr) {
    if (step < warmup) return lr * (float)(step + 1) / (float)warmup;
    if (kind == FL_LR_CONSTANT || total <= warmup + 1) return lr;
    double frac = (double)(step - warmup) / (double)(total - 1 - warmup);
    if (frac > 1.0) frac = 1.0;
    if (kind == FL_LR_COSINE) return (float)(min_lr + 0.5 * (lr - min_lr) * (1.0 + cos(3.141592653589793 * frac)));
    return (float)(lr + (min_lr - lr) * frac);
}
