/* Sampling (see sampling.h). */
#include "engine/sampling.h"
#include "core/alloc.h"
#include "core/status.h"
#include "kernels/ops.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct cand {
    int32_t id;
    float logit;
    float p;
} cand;

struct fl_sampler {
    fl_sampler_params p;
    int32_t n_vocab;
    uint64_t rng[4];
    cand *c;    /* [n_vocab] */
    int32_t *count; /* [n_vocab] penalty counts, zero between calls */
    fl_logit_bias *bias; /* [p.n_bias] the caller's biases, copied (p.bias points here) */
};

size_t fl_sampler_struct_bytes(void) { return sizeof(struct fl_sampler); }

fl_sampler_params fl_sampler_default_params(void) {
    fl_sampler_params p = {0.8f, 40, 0.95f, 0.05f, 1.0f, 0.0f, 0.0f, 64, 0, NULL, 0};
    return p;
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t fl_sampler_rand_u64(fl_sampler *s) {
    uint64_t *r = s->rng;
    const uint64_t result = rotl(r[1] * 5, 7) * 9, t = r[1] << 17;
    r[2] ^= r[0];
    r[3] ^= r[1];
    r[1] ^= r[2];
    r[0] ^= r[3];
    r[2] ^= t;
    r[3] = rotl(r[3], 45);
    return result;
}

float fl_sampler_rand_float(fl_sampler *s) { return (float)(fl_sampler_rand_u64(s) >> 40) * (1.0f / 16777216.0f); }

void fl_sampler_reseed(fl_sampler *s, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
}

fl_status fl_sampler_new(const fl_sampler_params *p, int32_t n_vocab, fl_sampler **out) {
    *out = NULL;
    if (n_vocab < 1 || isnan(p->temp) || isnan(p->top_p) || isnan(p->min_p) || !(p->repeat_penalty > 0.0f) ||
        isnan(p->freq_penalty) || isnan(p->presence_penalty) || p->penalty_last_n < -1)
        return fl_set_error(FL_ERR_INVALID, "%s: invalid sampling parameters (n_vocab %d, repeat_penalty %g)", __func__,
                            n_vocab, (double)p->repeat_penalty);
    if (p->n_bias < 0 || (p->n_bias > 0 && !p->bias))
        return fl_set_error(FL_ERR_INVALID, "%s: %d logit biases", __func__, p->n_bias);
    for (int32_t i = 0; i < p->n_bias; i++)
        if (p->bias[i].token < 0 || p->bias[i].token >= n_vocab || !isfinite(p->bias[i].bias))
            return fl_set_error(FL_ERR_INVALID, "%s: logit bias %g for token %d (the vocabulary has %d)", __func__,
                                (double)p->bias[i].bias, p->bias[i].token, n_vocab);
    fl_sampler *s = fl_calloc(FL_MEM_MISC, 1, sizeof *s);
    if (!s) return FL_ERR_NOMEM;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->c = fl_calloc(FL_MEM_MISC, (size_t)n_vocab, sizeof *s->c);
    s->count = fl_calloc(FL_MEM_MISC, (size_t)n_vocab, sizeof *s->count);
    if (p->n_bias) {
        s->bias = fl_alloc(FL_MEM_MISC, (size_t)p->n_bias * sizeof *s->bias, 0);
        if (s->bias) memcpy(s->bias, p->bias, (size_t)p->n_bias * sizeof *s->bias);
    }
    s->p.bias = s->bias;
    if (!s->c || !s->count || (p->n_bias && !s->bias)) {
        fl_sampler_free(s);
        return FL_ERR_NOMEM;
    }
    fl_sampler_reseed(s, p->seed);
    *out = s;
    return FL_OK;
}

void fl_sampler_free(fl_sampler *s) {
    if (!s) return;
    if (s->c) fl_free(FL_MEM_MISC, s->c, (size_t)s->n_vocab * sizeof *s->c);
    if (s->count) fl_free(FL_MEM_MISC, s->count, (size_t)s->n_vocab * sizeof *s->count);
    if (s->bias) fl_free(FL_MEM_MISC, s->bias, (size_t)s->p.n_bias * sizeof *s->bias);
    fl_free(FL_MEM_MISC, s, sizeof *s);
}

/* descending logit, ties by id (deterministic) */
static int cmp_cand(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* The candidate of the two that cmp_cand puts later (the worse one). */
static inline bool worse(const cand *x, const cand *y) { return cmp_cand(x, y) > 0; }

/* Heap on c[0..k) with its worst candidate at the root: move c[i] down into place. */
static void sift_worst(cand *c, int32_t k, int32_t i) {
    for (;;) {
        int32_t w = i;
        const int32_t l = 2 * i + 1, r = l + 1;
        if (l < k && worse(&c[l], &c[w])) w = l;
        if (r < k && worse(&c[r], &c[w])) w = r;
        if (w == i) return;
        const cand t = c[i];
        c[i] = c[w];
        c[w] = t;
        i = w;
    }
}

/* c[0..k) := the k best of c[0..n) in cmp_cand's order, sorted; the same as sorting all n
 * (a total order) at O(n log k): with a full qsort of the 32000-token vocabulary per sampled
 * token, 16 sequences' decode steps took ~100 ms longer (`fitllm bench serve --temp 1`).  Returns how many lead sorted (k, or n where it sorted them all). */
static int32_t select_top(cand *c, int32_t n, int32_t k) {
    if (k >= n / 8) { /* most of them: sorting all is cheaper than the heap */
        qsort(c, (size_t)n, sizeof *c, cmp_cand);
        return n;
    }
    for (int32_t i = k / 2 - 1; i >= 0; i--) sift_worst(c, k, i);
    for (int32_t i = k; i < n; i++)
        if (worse(&c[0], &c[i])) {
            const cand t = c[0];
            c[0] = c[i];
            c[i] = t;
            sift_worst(c, k, 0);
        }
    qsort(c, (size_t)k, sizeof *c, cmp_cand);
    return k;
}

/* p[i] = softmax(logit[i] / temp) over c[0..n) in any order. */
static void softmax_all(cand *c, int32_t n, float temp) {
    float mx = c[0].logit;
    for (int32_t i = 1; i < n; i++) mx = c[i].logit > mx ? c[i].logit : mx;
    double sum = 0;
    for (int32_t i = 0; i < n; i++) sum += c[i].p = expf((c[i].logit - mx) / temp);
    for (int32_t i = 0; i < n; i++) c[i].p = (float)(c[i].p / sum);
}

/* p[i] = softmax(logit[i] / temp) over c[0..n) (sorted, so c[0] holds the max). */
static void softmax_cands(cand *c, int32_t n, float temp) {
    double sum = 0;
    for (int32_t i = 0; i < n; i++) sum += c[i].p = expf((c[i].logit - c[0].logit) / temp);
    for (int32_t i = 0; i < n; i++) c[i].p = (float)(c[i].p / sum);
}

/* One draw from the probabilities c[0..n).p: the first candidate whose cumulative mass passes a
 * uniform r (if rounding leaves the total just under r, the last candidate with mass). */
static int32_t draw(fl_sampler *s, const cand *c, int32_t n) {
    FL_ASSERT(n >= 1);
    const float r = fl_sampler_rand_float(s);
    double cum = 0;
    for (int32_t i = 0; i < n; i++) {
        cum += c[i].p;
        if (r < cum) return c[i].id;
    }
    int32_t last = n - 1;
    while (last > 0 && c[last].p == 0.0f) last--;
    return c[last].id;
}

int32_t fl_sample(fl_sampler *s, const float *logits, int32_t n_vocab, const int32_t *history, int64_t n_history) {
    FL_ASSERT(n_vocab == s->n_vocab);
    const fl_sampler_params *p = &s->p;
    cand *c = s->c;
    /* penalties over the last penalty_last_n tokens */
    const bool penal = p->repeat_penalty != 1.0f || p->freq_penalty != 0.0f || p->presence_penalty != 0.0f;
    const bool apply = penal && history && n_history > 0 && p->penalty_last_n != 0;
    if (!apply && !p->n_bias && !(p->temp > 0.0f)) /* plain greedy: the first largest logit (a NaN never larger) */
        return (int32_t)fl_ops_kernels_get()->argmax(logits, n_vocab);
    for (int32_t i = 0; i < n_vocab; i++) c[i] = (cand){i, logits[i], 0.0f};
    for (int32_t i = 0; i < p->n_bias; i++) c[p->bias[i].token].logit += p->bias[i].bias;
    if (apply) {
        const int64_t first = p->penalty_last_n < 0 || n_history <= p->penalty_last_n ? 0 : n_history - p->penalty_last_n;
        for (int64_t i = first; i < n_history; i++)
            if (history[i] >= 0 && history[i] < n_vocab) s->count[history[i]]++;
        for (int64_t i = first; i < n_history; i++) {
            const int32_t t = history[i];
            if (t < 0 || t >= n_vocab || s->count[t] == 0) continue;
            float l = c[t].logit;
            l = l > 0 ? l / p->repeat_penalty : l * p->repeat_penalty;
            c[t].logit = l - (float)s->count[t] * p->freq_penalty - p->presence_penalty;
            s->count[t] = 0; /* applied once; also resets the scratch counts */
        }
    }
    if (!(p->temp > 0.0f)) {
        int32_t best = 0;
        for (int32_t i = 1; i < n_vocab; i++)
            if (c[i].logit > c[best].logit) best = i;
        return best;
    }
    int32_t n = n_vocab;
    if (p->top_k > 0 && p->top_k < n) { /* only the k best need sorting */
        select_top(c, n, p->top_k);
        n = p->top_k;
        if (p->top_p < 1.0f) {
            softmax_cands(c, n, 1.0f);
            double cum = 0;
            for (int32_t i = 0; i < n; i++) {
                cum += c[i].p;
                if (cum >= p->top_p) {
                    n = i + 1;
                    break;
                }
            }
        }
    } else if (p->top_p >= 1.0f && !(p->min_p > 0.0f)) {
        /* temperature alone (the OpenAI default): no order needed, draw from the softmax of
         * all candidates in vocabulary order */
        softmax_all(c, n, p->temp);
        return draw(s, c, n);
    } else {
        /* top-p and / or min-p without top-k: probabilities over the whole vocabulary, then the
         * best k sorted, k growing 16x until the nucleus (and every candidate min-p keeps) lies
         * inside them; the nucleus is the shortest sorted prefix whose mass reaches top-p */
        softmax_all(c, n, 1.0f);
        float p_max = 0.0f; /* k candidates hold at most k p_max: skip sizes that cannot reach top-p */
        for (int32_t i = 0; i < n; i++) p_max = c[i].p > p_max ? c[i].p : p_max;
        int32_t k = n < 64 ? n : 64;
        while (p->top_p < 1.0f && k < n && (double)k * p_max < p->top_p) k = k > n / 16 ? n : 16 * k;
        for (;;) {
            k = select_top(c, n, k);
            int32_t keep = k;
            bool inside;
            if (p->top_p < 1.0f) {
                double cum = 0;
                keep = 0;
                while (keep < k && (keep == 0 || cum < p->top_p)) cum += c[keep++].p; /* top-p 0: the best */
                inside = cum >= p->top_p;
            } else /* min-p alone: the first candidate it drops must be inside */
                inside = c[k - 1].p < c[0].p * p->min_p;
            if (inside || k == n) {
                n = keep;
                break;
            }
            k = k > n / 16 ? n : 16 * k; /* 64, 1024, ..., then all (a flat distribution: one full sort more) */
        }
    }
    if (p->min_p > 0.0f) {
        softmax_cands(c, n, 1.0f);
        const float thr = c[0].p * p->min_p;
        int32_t k = 1;
        while (k < n && c[k].p >= thr) k++;
        n = k;
    }
    softmax_cands(c, n, p->temp);
    return draw(s, c, n);
}

int32_t fl_logit_rank(const float *logits, int32_t n_vocab, int32_t tok) {
    const float lt = logits[tok] == logits[tok] ? logits[tok] : -INFINITY;
    int32_t above = 0;
    for (int32_t i = 0; i < n_vocab; i++) above += logits[i] > lt; /* (NaN compares false) */
    return 1 + above;
}

void fl_logprobs(const float *logits, int32_t n_vocab, int32_t tok, int32_t k, float *lp_tok, fl_token_logprob *top) {
    float mx = -INFINITY;
    for (int32_t i = 0; i < n_vocab; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (int32_t i = 0; i < n_vocab; i++) sum += expf(logits[i] - mx);
    const double lse = (double)mx + log(sum);
    *lp_tok = (float)((double)logits[tok] - lse);
    /* the k largest by insertion into top[0..cnt): k is at most FL_MAX_TOP_LOGPROBS, and past the
     * first few tokens almost every logit fails the one comparison with the smallest kept */
    int32_t cnt = 0;
    for (int32_t i = 0; i < n_vocab && k > 0; i++) {
        const float l = logits[i] == logits[i] ? logits[i] : -INFINITY; /* NaN: listed last */
        if (cnt == k && !(l > top[k - 1].logprob)) continue;             /* equal: the lower id stays */
        int32_t j = cnt < k ? cnt++ : k - 1;
        while (j > 0 && top[j - 1].logprob < l) {
            top[j] = top[j - 1];
            j--;
        }
        top[j] = (fl_token_logprob){i, l};
    }
    for (int32_t j = 0; j < cnt; j++) top[j].logprob = (float)((double)top[j].logprob - lse);
}
