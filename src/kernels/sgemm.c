/* f32 GEMM for the trainer (see sgemm.h): the blocking, packing and threads around the ISA
 * files' register tiles.
 *
 * Work: C is cut into chunks of up to FL_SGEMM_NC columns (whole NR panels) and, where that
 * gives fewer chunks than threads, row chunks (whole MR tiles); threads take chunks from a
 * counter.  For its chunk a thread walks K in blocks of FL_SGEMM_KC: it packs the block of op(B)
 * (kc x the chunk's columns, panels of NR columns, zero-padded, k-major: bp[panel][k][NR]; a
 * plain copy, or a transpose under TB) into its scratch, which stays in L2, then for each MR
 * rows of A (read in place: the tile broadcasts A's elements from its rows, or from its columns
 * under TA) runs the tile over every panel, the A rows staying in L1.  Each element of C is
 * summed in the same order whatever the chunking, so results do not depend on the threads. */
#include "kernels/sgemm.h"
#include "core/alloc.h"
#include "core/status.h"
#include "core/threads.h"
#include "kernels/dispatch.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

typedef void (*pack_bt_fn)(int64_t kc, int nr, const float *B, int64_t ldb, float *dst, int NR);

/* Pack op(B) = B^T for one panel: dst[k][j] = B[j * ldb + k] for k < kc, j < nr; 0 for j >= nr. */
static void pack_bt_generic(int64_t kc, int nr, const float *B, int64_t ldb, float *dst, int NR) {
    for (int64_t k = 0; k < kc; k++) {
        float *d = dst + k * NR;
        for (int j = 0; j < nr; j++) d[j] = B[j * ldb + k];
        for (int j = nr; j < NR; j++) d[j] = 0.0f;
    }
}

typedef struct {
    fl_sgemm_tile_fn tile;
    pack_bt_fn pack_bt;
    int mr, nr;
} kind;

static kind pick(void) {
    switch (fl_isa_get()) {
    case FL_ISA_AVX512: return (kind){fl_sgemm_tile_avx512, fl_sgemm_pack_bt_avx512, 12, 32};
    case FL_ISA_AVX2: return (kind){fl_sgemm_tile_avx2, pack_bt_generic, 6, 16};
    default: return (kind){fl_sgemm_tile_generic, pack_bt_generic, 4, 16};
    }
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t rnd(int64_t a, int64_t b) { return cdiv(a, b) * b; }

typedef struct {
    int64_t nc, mc, n_chunks, m_chunks, kcb; /* columns and rows per chunk, chunk counts, k per block */
    int nthr;                                /* threads that get a chunk */
    size_t thread_floats;                    /* each one's scratch */
} chunking;

static chunking chunk(const kind *t, int64_t M, int64_t N, int64_t K, int nth) {
    chunking c;
    if (nth < 1) nth = 1;
    c.nc = rnd(cdiv(N, nth), t->nr);
    if (c.nc > FL_SGEMM_NC) c.nc = FL_SGEMM_NC;
    c.n_chunks = cdiv(N, c.nc);
    int64_t parts = 1;
    if (c.n_chunks < nth) {
        parts = cdiv(nth, c.n_chunks);
        if (parts > cdiv(M, t->mr)) parts = cdiv(M, t->mr);
    }
    c.mc = rnd(cdiv(M, parts), t->mr);
    c.m_chunks = cdiv(M, c.mc);
    const int64_t items = c.n_chunks * c.m_chunks;
    c.nthr = items < nth ? (int)items : nth;
    c.kcb = K < FL_SGEMM_KC ? K : FL_SGEMM_KC;
    c.thread_floats = (size_t)rnd(c.kcb * c.nc, 16); /* 64-byte aligned per thread */
    return c;
}

size_t fl_sgemm_scratch_bytes(int64_t M, int64_t N, int64_t K, int nth) {
    if (M <= 0 || N <= 0 || K <= 0) return 0;
    const kind t = pick();
    const chunking c = chunk(&t, M, N, K, nth);
    return (size_t)c.nthr * c.thread_floats * sizeof(float);
}

typedef struct {
    kind t;
    chunking ch;
    int flags;
    int64_t M, N, K, lda, ldb, ldc;
    const float *A, *B;
    float *C, *scratch;
    atomic_llong next;
} ctx;

static void pack_b(const ctx *c, int64_t pc, int64_t kc, int64_t n0, int64_t n1, float *bp) {
    const int NR = c->t.nr;
    for (int64_t j0 = n0; j0 < n1; j0 += NR) {
        const int nr = (int)(n1 - j0 < NR ? n1 - j0 : NR);
        float *dst = bp + (j0 - n0) / NR * kc * NR;
        if (c->flags & FL_SGEMM_TB) {
            c->t.pack_bt(kc, nr, c->B + j0 * c->ldb + pc, c->ldb, dst, NR);
        } else {
            for (int64_t k = 0; k < kc; k++) {
                memcpy(dst + k * NR, c->B + (pc + k) * c->ldb + j0, (size_t)nr * sizeof(float));
                memset(dst + k * NR + nr, 0, (size_t)(NR - nr) * sizeof(float));
            }
        }
    }
}

static void task(void *p, int ith, int nth) {
    (void)nth;
    ctx *c = p;
    const chunking *ch = &c->ch;
    const int MR = c->t.mr, NR = c->t.nr;
    const bool ta = c->flags & FL_SGEMM_TA;
    float *bp = c->scratch + (size_t)ith * ch->thread_floats;
    for (;;) {
        const int64_t it = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed);
        if (it >= ch->n_chunks * ch->m_chunks) break;
        const int64_t n0 = it % ch->n_chunks * ch->nc, n1 = n0 + ch->nc < c->N ? n0 + ch->nc : c->N;
        const int64_t m0 = it / ch->n_chunks * ch->mc, m1 = m0 + ch->mc < c->M ? m0 + ch->mc : c->M;
        for (int64_t pc = 0; pc < c->K; pc += FL_SGEMM_KC) {
            const int64_t kc = c->K - pc < FL_SGEMM_KC ? c->K - pc : FL_SGEMM_KC;
            const int acc = pc > 0 || (c->flags & FL_SGEMM_ACC);
            pack_b(c, pc, kc, n0, n1, bp);
            for (int64_t i = m0; i < m1; i += MR) {
                const int mr = (int)(m1 - i < MR ? m1 - i : MR);
                /* op(A)'s rows i.., columns pc..: element (r, k) at a + r * rsa + k * csa */
                const float *a = ta ? c->A + pc * c->lda + i : c->A + i * c->lda + pc;
                const int64_t rsa = ta ? 1 : c->lda, csa = ta ? c->lda : 1;
                for (int64_t j = n0; j < n1; j += NR) {
                    const int nr = (int)(n1 - j < NR ? n1 - j : NR);
                    c->t.tile(kc, a, rsa, csa, bp + (j - n0) / NR * kc * NR, c->C + i * c->ldc + j, c->ldc, mr, nr, acc);
                }
            }
        }
    }
}

/* Where the scratch cannot be had: the tiles' arithmetic one element at a time, so the same
 * bits (each lane of a tile is its own chain: per K block, a sum from 0 of products in k order,
 * fused where the ISA's tile fuses them, then added to C), rows over the threads. */
typedef struct {
    int flags, fused;
    int64_t M, N, K, lda, ldb, ldc;
    const float *A, *B;
    float *C;
} plain_ctx;

static void plain_task(void *p, int ith, int nth) {
    const plain_ctx *r = p;
    int64_t lo, hi;
    fl_split_range(r->M, ith, nth, &lo, &hi);
    const int64_t rsa = r->flags & FL_SGEMM_TA ? 1 : r->lda, csa = r->flags & FL_SGEMM_TA ? r->lda : 1;
    const int64_t rsb = r->flags & FL_SGEMM_TB ? 1 : r->ldb, csb = r->flags & FL_SGEMM_TB ? r->ldb : 1;
    for (int64_t i = lo; i < hi; i++)
        for (int64_t j = 0; j < r->N; j++) {
            float *c = r->C + i * r->ldc + j;
            for (int64_t pc = 0; pc < r->K; pc += FL_SGEMM_KC) {
                const int64_t k1 = r->K - pc < FL_SGEMM_KC ? r->K : pc + FL_SGEMM_KC;
                float s = 0.0f;
                if (r->fused)
                    for (int64_t k = pc; k < k1; k++) s = fmaf(r->A[i * rsa + k * csa], r->B[k * rsb + j * csb], s);
                else
                    for (int64_t k = pc; k < k1; k++) s += r->A[i * rsa + k * csa] * r->B[k * rsb + j * csb];
                *c = pc > 0 || (r->flags & FL_SGEMM_ACC) ? *c + s : s;
            }
        }
}

void fl_sgemm(int flags, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb,
              float *C, int64_t ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        if (!(flags & FL_SGEMM_ACC))
            for (int64_t i = 0; i < M; i++) memset(C + i * ldc, 0, (size_t)N * sizeof(float));
        return;
    }
    ctx c = {.t = pick(), .flags = flags, .M = M, .N = N, .K = K, .lda = lda, .ldb = ldb, .ldc = ldc, .A = A, .B = B, .C = C};
    c.ch = chunk(&c.t, M, N, K, fl_threads_get());
    const size_t bytes = (size_t)c.ch.nthr * c.ch.thread_floats * sizeof(float);
    c.scratch = fl_alloc(FL_MEM_SCRATCH, bytes, 64);
    if (!c.scratch) {
        fl_clear_error();
        plain_ctx r = {flags, c.t.tile != fl_sgemm_tile_generic, M, N, K, lda, ldb, ldc, A, B, C};
        fl_parallel(plain_task, &r);
        return;
    }
    atomic_init(&c.next, 0);
    fl_parallel_n(task, &c, c.ch.nthr);
    fl_free(FL_MEM_SCRATCH, c.scratch, bytes);
}
