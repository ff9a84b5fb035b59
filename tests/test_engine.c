/* Tests for src/engine: the engine over a deterministic toy backend (batching, chunked prefill,
 * preemption by recompute and swap, static batches, cancellation, stop strings, seeds, threads),
 * and the stop-string matcher.  The real-model tests (stories260K greedy equivalence) are at
 * the end and skip without the shared data. */
#include "test.h"

#include "core/status.h"
#include "engine/backend.h"
#include "engine/engine.h"
#include "engine/json_fsm.h"
#include "engine/json_schema.h"
#include "engine/kv_adapter.h"
#include "engine/mask_cache.h"
#include "core/dtype.h"
#include "formats/gguf.h"

#include <cjson/cJSON.h>
#include <regex.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

/* ---- stop-string matcher ---- */

static void push_all(fl_stop_matcher *m, const char *const *pieces, char *out, bool *stopped) {
    out[0] = 0;
    *stopped = false;
    for (int i = 0; pieces[i] && !*stopped; i++) {
        assert_int_equal(fl_stop_push(m, pieces[i], (int64_t)strlen(pieces[i]), stopped), FL_OK);
        int64_t s, n;
        fl_stop_release(m, false, &s, &n);
        strncat(out, m->text + s, (size_t)n);
    }
    int64_t s, n;
    fl_stop_release(m, true, &s, &n);
    strncat(out, m->text + s, (size_t)n);
}

static void test_stop_strings(void **state) {
    (void)state;
    char out[256];
    bool stopped;
    fl_stop_matcher m;
    /* a stop string split over three pieces is found and never streamed */
    const char *stops[] = {"END", "\n\n", NULL};
    const char *p1[] = {"Hello E", "N", "D world", NULL};
    assert_int_equal(fl_stop_init(&m, stops), FL_OK);
    push_all(&m, p1, out, &stopped);
    assert_true(stopped);
    assert_string_equal(out, "Hello ");
    fl_stop_deinit(&m);
    /* a false start is released once it cannot be a stop string any more */
    const char *p2[] = {"a E", "Nx", "\n", "b\n", "\nc", NULL};
    assert_int_equal(fl_stop_init(&m, stops), FL_OK);
    int64_t s, n;
    assert_int_equal(fl_stop_push(&m, p2[0], 3, &stopped), FL_OK);
    fl_stop_release(&m, false, &s, &n);
    assert_int_equal(n, 2); /* "E" held back */
    fl_stop_deinit(&m);
    assert_int_equal(fl_stop_init(&m, stops), FL_OK);
    push_all(&m, p2, out, &stopped);
    assert_true(stopped);
    assert_string_equal(out, "a ENx\nb");
    fl_stop_deinit(&m);
    /* include_stop_str_in_output: the stop string found first stays, what follows it goes */
    assert_int_equal(fl_stop_init(&m, stops), FL_OK);
    m.include = true;
    push_all(&m, p2, out, &stopped);
    assert_true(stopped);
    assert_string_equal(out, "a ENx\nb\n\n");
    fl_stop_deinit(&m);
    assert_int_equal(fl_stop_init(&m, stops), FL_OK);
    m.include = true;
    push_all(&m, p1, out, &stopped);
    assert_string_equal(out, "Hello END");
    fl_stop_deinit(&m);
    /* no stop strings: incomplete UTF-8 is held until complete; final flush releases all */
    const char *none[] = {NULL};
    assert_int_equal(fl_stop_init(&m, none), FL_OK);
    assert_int_equal(fl_stop_push(&m, "x\xC3", 2, &stopped), FL_OK);
    fl_stop_release(&m, false, &s, &n);
    assert_int_equal(n, 1);
    assert_int_equal(fl_stop_push(&m, "\xA9", 1, &stopped), FL_OK);
    fl_stop_release(&m, false, &s, &n);
    assert_int_equal(n, 2);
    assert_false(stopped);
    fl_stop_deinit(&m);
    /* the earliest of several matches wins */
    const char *st2[] = {"cd", "b", NULL};
    const char *p3[] = {"abcd", NULL};
    assert_int_equal(fl_stop_init(&m, st2), FL_OK);
    push_all(&m, p3, out, &stopped);
    assert_string_equal(out, "a");
    fl_stop_deinit(&m);
    fl_test_mem_zero();
}

/* ---- toy backend: logits are a hash of the sequence's cached tokens ---- */
#define TOY_VOCAB 40
#define TOY_EOS 2
#define TOY_CTX 256
#define TOY_SEQS 64

typedef struct toy {
    int32_t bs;
    int64_t n_blocks, used;
    int contiguous;             /* one block = one whole max-length slot */
    int32_t toks[TOY_SEQS][TOY_CTX];
    int32_t len[TOY_SEQS];      /* positions stored */
    int64_t held[TOY_SEQS];     /* blocks held */
    int64_t swapped[TOY_SEQS];  /* blocks in the swap tier */
    int32_t swap_toks[TOY_SEQS][TOY_CTX];
    bool seq_used[TOY_SEQS];
    int64_t forwards, max_batch;
    int64_t fail_at; /* > 0: that forward (counting from 1) fails with FL_ERR_NOMEM, writing nothing */
} toy;

static uint64_t toy_hash(const int32_t *t, int32_t n) {
    uint64_t h = 1469598103934665603ull;
    for (int32_t i = 0; i < n; i++) h = (h ^ (uint64_t)(t[i] + 1)) * 1099511628211ull;
    return h;
}
static int32_t toy_window; /* > 0: the toy's logits depend on the last toy_window tokens only (its
                            * output then repeats, as real models' often does: n-gram drafts hit) */
static void toy_logits(const int32_t *t, int32_t n, float *out) {
    if (toy_window > 0 && n > toy_window) {
        t += n - toy_window;
        n = toy_window;
    }
    uint64_t h = toy_hash(t, n);
    for (int32_t v = 0; v < TOY_VOCAB; v++) {
        uint64_t x = (h ^ ((uint64_t)v * 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
        x ^= x >> 31;
        out[v] = (float)(x % 10007) / 1000.0f - (v == TOY_EOS ? 1.5f : 0.0f);
    }
}
/* What a request must produce, computed without any engine: greedy after the prompt until EOS
 * or max_tokens, with a logit bias on EOS, min_tokens (EOS and the stop id masked before it) and
 * a stop token id (-1: none); finish reason in *fin. */
static int32_t toy_reference_stops(const int32_t *prompt, int32_t n_prompt, int32_t max_tokens, int32_t min_tokens,
                                   int32_t stop_id, float eos_bias, int32_t *out, fl_finish_reason *fin) {
    int32_t seq[TOY_CTX];
    memcpy(seq, prompt, (size_t)n_prompt * sizeof *seq);
    int32_t n = n_prompt, g = 0;
    float l[TOY_VOCAB];
    *fin = FL_FINISH_LENGTH;
    while (g < max_tokens) {
        toy_logits(seq, n, l);
        l[TOY_EOS] += eos_bias;
        if (g < min_tokens) {
            l[TOY_EOS] = -INFINITY;
            if (stop_id >= 0) l[stop_id] = -INFINITY;
        }
        int32_t best = 0;
        for (int32_t v = 1; v < TOY_VOCAB; v++)
            if (l[v] > l[best]) best = v;
        if (best == TOY_EOS || best == stop_id) {
            *fin = best == TOY_EOS ? FL_FINISH_EOS : FL_FINISH_STOP;
            break;
        }
        seq[n++] = out[g++] = best;
    }
    return g;
}

/* The plain request: no bias, no min_tokens, no stop id. */
static int32_t toy_reference(const int32_t *prompt, int32_t n_prompt, int32_t max_tokens, int32_t *out) {
    fl_finish_reason fin;
    return toy_reference_stops(prompt, n_prompt, max_tokens, 0, -1, 0.0f, out, &fin);
}

static int64_t toy_blocks(const toy *t, int32_t n) { return t->contiguous ? (n > 0) : (n + t->bs - 1) / t->bs; }
static int64_t toy_n_free(void *ctx) {
    toy *t = ctx;
    return t->n_blocks - t->used;
}
static fl_status toy_seq_begin(void *ctx, fl_request *r, int32_t *n_cached) {
    toy *t = ctx;
    for (int32_t s = 0; s < TOY_SEQS; s++)
        if (!t->seq_used[s]) {
            t->seq_used[s] = true;
            t->len[s] = 0;
            r->kv_seq = s;
            *n_cached = 0;
            return FL_OK;
        }
    return fl_set_error(FL_ERR_INTERNAL, "toy: out of sequence ids");
}
static int64_t toy_n_needed(void *ctx, const fl_request *r, int32_t n_total) {
    toy *t = ctx;
    int64_t have = r->swapped ? 0 : t->held[r->kv_seq];
    int64_t need = toy_blocks(t, n_total) - have;
    return need > 0 ? need : 0;
}
static fl_status toy_reserve(void *ctx, fl_request *r, int32_t n_total) {
    toy *t = ctx;
    if (n_total > TOY_CTX) return FL_NO_KV_SPACE;
    int64_t need = toy_n_needed(ctx, r, n_total);
    if (need > t->n_blocks - t->used) return FL_NO_KV_SPACE;
    t->held[r->kv_seq] += need;
    t->used += need;
    return FL_OK;
}
static void toy_seq_end(void *ctx, fl_request *r) {
    toy *t = ctx;
    int32_t s = (int32_t)r->kv_seq;
    t->used -= t->held[s];
    t->held[s] = t->swapped[s] = 0;
    t->len[s] = 0;
    t->seq_used[s] = false;
}
static fl_status toy_swap_out(void *ctx, fl_request *r) {
    toy *t = ctx;
    int32_t s = (int32_t)r->kv_seq;
    memcpy(t->swap_toks[s], t->toks[s], sizeof t->toks[s]);
    memset(t->toks[s], 0xff, sizeof t->toks[s]); /* the pool copy is gone */
    t->swapped[s] = t->held[s];
    t->used -= t->held[s];
    t->held[s] = 0;
    return FL_OK;
}
static fl_status toy_swap_in(void *ctx, fl_request *r) {
    toy *t = ctx;
    int32_t s = (int32_t)r->kv_seq;
    if (t->swapped[s] > t->n_blocks - t->used) return FL_NO_KV_SPACE;
    memcpy(t->toks[s], t->swap_toks[s], sizeof t->toks[s]);
    t->held[s] = t->swapped[s];
    t->used += t->held[s];
    t->swapped[s] = 0;
    return FL_OK;
}
static fl_status toy_forward(void *ctx, const fl_batch *b, float *logits) {
    toy *t = ctx;
    t->forwards++;
    if (t->forwards == t->fail_at) return fl_set_error(FL_ERR_NOMEM, "toy: forward %lld fails", (long long)t->forwards);
    if (b->n_tokens > t->max_batch) t->max_batch = b->n_tokens;
    int32_t row = 0;
    for (int32_t i = 0; i < b->n_tokens; i++) {
        int32_t s = b->seq_id[i], p = b->pos[i];
        /* the engine must feed positions in order, into room it reserved */
        assert_true(s >= 0 && s < TOY_SEQS && t->seq_used[s]);
        assert_int_equal(p, t->len[s]);
        assert_true(p < toy_blocks(t, TOY_CTX) * (t->contiguous ? TOY_CTX : t->bs));
        assert_true(toy_blocks(t, p + 1) <= t->held[s]);
        t->toks[s][p] = b->tokens[i];
        t->len[s] = p + 1;
        if (b->logits[i]) toy_logits(t->toks[s], p + 1, logits + (size_t)row++ * TOY_VOCAB);
    }
    return FL_OK;
}
static bool toy_is_eog(void *ctx, int32_t tok) { return tok == TOY_EOS; }
static int32_t toy_piece(void *ctx, int32_t tok, char *buf, int32_t cap) {
    /* tokens 3..28 are one letter, the others two */
    if (tok >= 3 && tok < 29) return snprintf(buf, (size_t)cap, "%c", 'a' + tok - 3);
    return snprintf(buf, (size_t)cap, "%c%c", 'A' + tok % 26, '0' + tok % 10);
}
static void toy_kv_stats(void *ctx, fl_backend_kv_stats *st) {
    toy *t = ctx;
    st->blocks_total = t->n_blocks;
    st->blocks_used = t->used;
    st->blocks_free = t->n_blocks - t->used;
    int64_t live = 0;
    for (int s = 0; s < TOY_SEQS; s++) live += t->held[s] ? t->len[s] : 0;
    st->tokens_live = live;
    st->slots_allocated = t->used * (t->contiguous ? TOY_CTX : t->bs);
}
static void toy_free(void *ctx) { fl_free(FL_MEM_MISC, ctx, sizeof(toy)); }

static toy *toy_new(int32_t bs, int64_t n_blocks, int contiguous, fl_engine_backend *be) {
    toy *t = fl_calloc(FL_MEM_MISC, 1, sizeof *t);
    assert_non_null(t);
    t->bs = contiguous ? TOY_CTX : bs;
    t->n_blocks = n_blocks;
    t->contiguous = contiguous;
    memset(be, 0, sizeof *be);
    be->ctx = t;
    be->n_vocab = TOY_VOCAB;
    be->n_ctx = TOY_CTX;
    be->block_size = t->bs;
    be->n_blocks = n_blocks;
    be->kv = (fl_sched_kv){t, toy_n_free, toy_seq_begin, toy_n_needed, toy_reserve, toy_seq_end,
                           toy_swap_out, toy_swap_in, NULL};
    be->forward = toy_forward;
    be->is_eog = toy_is_eog;
    be->piece = toy_piece;
    be->kv_stats = toy_kv_stats;
    be->free = toy_free;
    be->name = "toy";
    return t;
}

/* ---- a workload and a driver ---- */
#define NREQ 12
typedef struct wl {
    int32_t prompt[NREQ][64];
    int32_t n_prompt[NREQ], max_tokens[NREQ];
    int32_t got[NREQ][TOY_CTX], n_got[NREQ];
    char text[NREQ][1024];
    fl_finish_reason finish[NREQ];
    int64_t id[NREQ];
    int32_t top;                  /* >= 0: requests ask for logprobs with this many alternatives */
    fl_token_logprob lp[NREQ][TOY_CTX][1 + 6]; /* the streamed records (top <= 6) */
    int32_t prompt_lp;            /* requests ask for prompt logprobs (with top alternatives) */
    fl_token_logprob plp[NREQ][64][1 + 6];
    int32_t plp_rank[NREQ][64];   /* their prompt tokens' ranks */
    int32_t stop_token[NREQ];     /* the final event's stop_token */
    int32_t n_plp[NREQ];          /* prompt records received */
    int32_t min_tokens[NREQ], stop_id[NREQ]; /* per request (stop_id -1: none) */
    float eos_bias[NREQ];         /* a logit bias on EOS (0: none) */
    int32_t prio[NREQ];           /* request priorities (engines with FL_SCHED_PRIORITY) */
    int32_t order[NREQ], n_order; /* the requests in the order they finished */
} wl;

static void make_wl(wl *w, uint32_t seed) {
    memset(w, 0, sizeof *w);
    w->top = -1;
    for (int i = 0; i < NREQ; i++) w->stop_id[i] = -1;
    for (int i = 0; i < NREQ; i++) {
        seed = seed * 1664525u + 1013904223u;
        w->n_prompt[i] = 2 + (int32_t)(seed >> 8) % 50;
        w->max_tokens[i] = 4 + (int32_t)(seed >> 16) % 40;
        w->prompt[i][0] = 1;
        for (int j = 1; j < w->n_prompt[i]; j++) {
            seed = seed * 1664525u + 1013904223u;
            w->prompt[i][j] = 3 + (int32_t)(seed >> 12) % (TOY_VOCAB - 3);
        }
    }
}

static int idx_of(const wl *w, int64_t id) {
    for (int i = 0; i < NREQ; i++)
        if (w->id[i] == id) return i;
    fail_msg("unknown request id %lld", (long long)id);
    return -1;
}

/* Add every request at once (or every `stagger` steps one more), step until done, collect the
 * streamed tokens and text. */
static void drive(fl_engine *e, wl *w, int stagger) {
    int added = 0, done = 0;
    fl_request_output ev[16];
    for (int guard = 0; done < NREQ; guard++) {
        assert_true(guard < 20000);
        while (added < NREQ && (stagger == 0 || guard % stagger == 0)) {
            fl_request_params p = {0};
            fl_sampling_params_default(&p.sampling);
            p.prompt = w->prompt[added];
            p.n_prompt = w->n_prompt[added];
            p.max_tokens = w->max_tokens[added];
            p.logprobs = w->top >= 0;
            p.top_logprobs = w->top > 0 ? w->top : 0;
            p.prompt_logprobs = w->prompt_lp;
            p.min_tokens = w->min_tokens[added];
            p.priority = w->prio[added];
            if (w->stop_id[added] >= 0) {
                p.stop_token_ids[0] = w->stop_id[added];
                p.n_stop_token_ids = 1;
            }
            const fl_logit_bias eb = {TOY_EOS, w->eos_bias[added]};
            if (w->eos_bias[added] != 0.0f) {
                p.logit_bias = &eb;
                p.n_logit_bias = 1;
            }
            if (fl_engine_add(e, &p, &w->id[added]) != FL_OK) fail_msg("add: %s", fl_last_error());
            added++;
            if (stagger) break;
        }
        int32_t active;
        assert_int_equal(fl_engine_step(e, &active), FL_OK);
        int32_t n;
        while ((n = fl_engine_poll(e, ev, 16)) > 0)
            for (int32_t k = 0; k < n; k++) {
                int i = idx_of(w, ev[k].request_id);
                assert_true(w->finish[i] == FL_FINISH_NONE);
                memcpy(w->got[i] + w->n_got[i], ev[k].new_tokens, (size_t)ev[k].n_new * sizeof(int32_t));
                if (w->top >= 0) {
                    assert_non_null(ev[k].new_logprobs);
                    assert_int_equal(ev[k].n_top, w->top);
                    for (int32_t j = 0; j < ev[k].n_new; j++)
                        memcpy(w->lp[i][w->n_got[i] + j], ev[k].new_logprobs + (size_t)j * (size_t)(1 + w->top),
                               (size_t)(1 + w->top) * sizeof(fl_token_logprob));
                } else {
                    assert_null(ev[k].new_logprobs);
                }
                if (ev[k].prompt_logprobs) { /* in order, as the prompt is computed */
                    assert_true(w->prompt_lp);
                    assert_int_equal(ev[k].prompt_logprobs_from, w->n_plp[i]);
                    assert_true(ev[k].n_prompt_logprobs >= 1 && ev[k].n_prompt_logprobs <= 8); /* <= max_seqs rows a step */
                    const int32_t wd = 1 + (w->top > 0 ? w->top : 0);
                    assert_non_null(ev[k].prompt_ranks);
                    for (int32_t j = 0; j < ev[k].n_prompt_logprobs; j++) {
                        w->plp_rank[i][w->n_plp[i]] = ev[k].prompt_ranks[j];
                        memcpy(w->plp[i][w->n_plp[i]++], ev[k].prompt_logprobs + (size_t)j * (size_t)wd, (size_t)wd * sizeof(fl_token_logprob));
                    }
                }
                w->n_got[i] += ev[k].n_new;
                assert_int_equal(ev[k].n_generated, w->n_got[i]);
                strcat(w->text[i], ev[k].new_text);
                if (ev[k].finish != FL_FINISH_NONE) {
                    w->finish[i] = ev[k].finish;
                    w->stop_token[i] = ev[k].stop_token;
                    assert_null(ev[k].stop_str); /* (these workloads have no stop strings) */
                    w->order[w->n_order++] = i;
                    done++;
                }
            }
    }
}

static void check_reference(const wl *w) {
    for (int i = 0; i < NREQ; i++) {
        int32_t ref[TOY_CTX];
        int32_t n = toy_reference(w->prompt[i], w->n_prompt[i], w->max_tokens[i], ref);
        if (n != w->n_got[i] || memcmp(ref, w->got[i], (size_t)n * sizeof *ref))
            fail_msg("request %d: %d tokens vs reference %d (or different ids)", i, w->n_got[i], n);
        assert_int_equal(w->finish[i], n < w->max_tokens[i] ? FL_FINISH_EOS : FL_FINISH_LENGTH);
        char txt[1024] = "";
        for (int32_t j = 0; j < n; j++) {
            char pc[8];
            toy_piece(NULL, ref[j], pc, 8);
            strcat(txt, pc);
        }
        assert_string_equal(txt, w->text[i]);
    }
}

/* A record (token, logprob, top alternatives) against the toy's logits after seq[0..n): log
 * softmax in double, the alternatives by a full sort (ties: lower id). */
static void check_record(const fl_token_logprob *rec, const int32_t *seq, int32_t n, int32_t token, int32_t top) {
    float l[TOY_VOCAB];
    toy_logits(seq, n, l);
    double mx = l[0], sum = 0;
    for (int v = 1; v < TOY_VOCAB; v++) mx = l[v] > mx ? l[v] : mx;
    for (int v = 0; v < TOY_VOCAB; v++) sum += exp((double)l[v] - mx);
    const double lse = mx + log(sum);
    assert_int_equal(rec[0].token, token);
    assert_true(fabs(rec[0].logprob - ((double)l[token] - lse)) < 1e-5);
    bool used[TOY_VOCAB] = {false};
    for (int32_t k = 0; k < top; k++) {
        int best = -1;
        for (int v = 0; v < TOY_VOCAB; v++)
            if (!used[v] && (best < 0 || l[v] > l[best])) best = v;
        used[best] = true;
        assert_int_equal(rec[1 + k].token, best);
        assert_true(fabs(rec[1 + k].logprob - ((double)l[best] - lse)) < 1e-5);
    }
}

/* Prompt records: all of them, token j + 1 of the prompt scored after tokens 0..j. */
static void check_prompt_logprobs(const wl *w) {
    for (int i = 0; i < NREQ; i++) {
        assert_int_equal(w->n_plp[i], w->prompt_lp ? w->n_prompt[i] - 1 : 0);
        for (int32_t j = 0; w->prompt_lp && j < w->n_prompt[i] - 1; j++) {
            check_record(w->plp[i][j], w->prompt[i], j + 1, w->prompt[i][j + 1], w->top > 0 ? w->top : 0);
            float l[TOY_VOCAB]; /* the rank: 1 + the tokens scored above it */
            toy_logits(w->prompt[i], j + 1, l);
            int32_t above = 0;
            for (int v = 0; v < TOY_VOCAB; v++) above += l[v] > l[w->prompt[i][j + 1]];
            assert_int_equal(w->plp_rank[i][j], 1 + above);
        }
    }
}

/* Each streamed logprob record against the toy's logits recomputed from the tokens so far. */
static void check_logprobs(const wl *w) {
    for (int i = 0; i < NREQ; i++) {
        int32_t seq[TOY_CTX];
        memcpy(seq, w->prompt[i], (size_t)w->n_prompt[i] * sizeof *seq);
        memcpy(seq + w->n_prompt[i], w->got[i], (size_t)w->n_got[i] * sizeof *seq);
        for (int32_t g = 0; g < w->n_got[i]; g++) {
            check_record(w->lp[i][g], seq, w->n_prompt[i] + g, w->got[i][g], w->top);
            if (w->top > 0) assert_int_equal(w->lp[i][g][1].token, w->got[i][g]); /* greedy */
        }
    }
}

static fl_engine *toy_engine_policy(int32_t max_seqs, int32_t budget, int32_t bs, int64_t n_blocks, int contiguous,
                                    fl_preempt_mode pm, fl_sched_policy policy, toy **tp) {
    fl_engine_params p;
    fl_engine_params_default(&p);
    p.sched_policy = policy;
    p.max_seqs = max_seqs;
    p.max_batch_tokens = budget;
    p.preempt = pm;
    p.kv_layout = contiguous ? FL_KV_CONTIGUOUS : FL_KV_PAGED;
    fl_engine_backend be;
    *tp = toy_new(bs, n_blocks, contiguous, &be);
    fl_engine *e;
    assert_int_equal(fl_engine_new_backend(&p, &be, &e), FL_OK);
    return e;
}

static fl_engine *toy_engine(int32_t max_seqs, int32_t budget, int32_t bs, int64_t n_blocks, int contiguous,
                             fl_preempt_mode pm, toy **tp) {
    return toy_engine_policy(max_seqs, budget, bs, n_blocks, contiguous, pm, FL_SCHED_FCFS, tp);
}

static void test_toy_batched_equals_alone(void **state) {
    (void)state;
    wl w;
    make_wl(&w, 7);
    toy *t;
    /* roomy pool, budget 16: long prompts are chunked beside decodes */
    fl_engine *e = toy_engine(6, 16, 4, 1000, 0, FL_PREEMPT_RECOMPUTE, &t);
    drive(e, &w, 0);
    check_reference(&w);
    assert_int_equal(t->max_batch, 16);
    fl_engine_stats st;
    fl_engine_stats_get(e, &st);
    assert_int_equal(st.preemptions, 0);
    assert_int_equal(st.requests_finished, NREQ);
    assert_int_equal(st.kv_blocks_used, 0);
    fl_engine_free(e);
    /* staggered arrivals, budget 7 */
    make_wl(&w, 11);
    e = toy_engine(4, 7, 4, 1000, 0, FL_PREEMPT_RECOMPUTE, &t);
    drive(e, &w, 3);
    check_reference(&w);
    fl_engine_free(e);
    fl_test_mem_zero();
}

static void test_toy_preempt_recompute(void **state) {
    (void)state;
    wl w;
    make_wl(&w, 7);
    toy *t;
    /* 26 blocks of 4 tokens: the longest request needs ~23; many preemptions */
    fl_engine *e = toy_engine(8, 32, 4, 26, 0, FL_PREEMPT_RECOMPUTE, &t);
    drive(e, &w, 0);
    check_reference(&w);
    fl_engine_stats st;
    fl_engine_stats_get(e, &st);
    assert_true(st.preemptions > 0);
    assert_int_equal(st.swaps_out, 0);
    assert_int_equal(st.kv_blocks_used, 0);
    fl_engine_free(e);
    fl_test_mem_zero();
}

static void test_toy_preempt_swap(void **state) {
    (void)state;
    wl w;
    make_wl(&w, 7);
    toy *t;
    fl_engine *e = toy_engine(8, 32, 4, 26, 0, FL_PREEMPT_SWAP, &t);
    drive(e, &w, 0);
    check_reference(&w);
    fl_engine_stats st;
    fl_engine_stats_get(e, &st);
    assert_true(st.swaps_out > 0);
    assert_int_equal(st.swaps_in, st.swaps_out);
    assert_int_equal(st.kv_blocks_used, 0);
    fl_engine_free(e);
    fl_test_mem_zero();
}

/* FL_SCHED_PRIORITY: one sequence at a time, requests finish in (priority, arrival) order; in a
 * tiny pool with staggered arrivals (a request of higher priority preempting running ones to get
 * in) every output still equals the request run alone; an FCFS engine refuses priorities. */
static void test_toy_priority(void **state) {
    (void)state;
    wl w;
    make_wl(&w, 7);
    for (int i = 0; i < NREQ; i++) w.prio[i] = (i * 5) % 3 - 1;
    toy *t;
    fl_engine *e = toy_engine_policy(1, 16, 4, 1000, 0, FL_PREEMPT_RECOMPUTE, FL_SCHED_PRIORITY, &t);
    drive(e, &w, 0);
    check_reference(&w);
    assert_int_equal(w.n_order, NREQ);
    for (int k = 1; k < NREQ; k++) {
        const int a = w.order[k - 1], b = w.order[k];
        assert_true(w.prio[a] < w.prio[b] || (w.prio[a] == w.prio[b] && a < b));
    }
    fl_engine_free(e);
    for (int pm = 0; pm < 2; pm++) {
        make_wl(&w, 11);
        for (int i = 0; i < NREQ; i++) w.prio[i] = 2 - i % 4; /* later arrivals outrank earlier ones */
        e = toy_engine_policy(3, 16, 4, 26, 0, pm ? FL_PREEMPT_SWAP : FL_PREEMPT_RECOMPUTE, FL_SCHED_PRIORITY, &t);
        drive(e, &w, 3);
        check_reference(&w);
        fl_engine_stats st;
        fl_engine_stats_get(e, &st);
        assert_true(st.preemptions > 0);
        assert_int_equal(st.kv_blocks_used, 0);
        fl_engine_free(e);
    }
    e = toy_engine(2, 16, 4, 1000, 0, FL_PREEMPT_RECOMPUTE, &t);
    const int32_t prompt[3] = {1, 5, 6};
    fl_request_params p = {.prompt = prompt, .n_prompt = 3, .max_tokens = 4, .priority = -1};
    fl_sampling_params_default(&p.sampling);
    int64_t id;
    assert_int_equal(fl_engine_add(e, &p, &id), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "priority"));
    p.priority = 0;
    assert_int_equal(fl_engine_add(e, &p, &id), FL_OK);
    fl_engine_free(e);
    fl_test_mem_zero();
}

/* logprobs ride along with batching, chunking and preemption (recompute keeps what was already
 * reported; swap too), with 0 and 6 alternatives, with and without prompt logprobs */
static void test_toy_logprobs(void **state) {
    (void)state;
    wl w;
    const fl_preempt_mode modes[3] = {FL_PREEMPT_RECOMPUTE, FL_PREEMPT_RECOMPUTE, FL_PREEMPT_SWAP};
    const int64_t blocks[3] = {1000, 26, 26};
    for (int c = 0; c < 6; c++) {
        make_wl(&w, 7 + (uint32_t)c);
        w.top = c % 3 == 1 ? 0 : 6;
        w.prompt_lp = c >= 3; /* prompts of 2-51 tokens through 8 rows a step */
        toy *t;
        fl_engine *e = toy_engine(8, 16, 4, blocks[c % 3], 0, modes[c % 3], &t);
        drive(e, &w, c % 3);
        check_reference(&w);
        check_logprobs(&w);
        check_prompt_logprobs(&w);
        fl_engine_stats st;
        fl_engine_stats_get(e, &st);
        if (c % 3) assert_true(st.preemptions > 0);
        assert_true(t->max_batch <= 16);
        fl_engine_free(e);
    }
    /* out-of-range requests are refused */
    toy *t;
    fl_engine *e = toy_engine(4, 16, 4, 100, 0, FL_PREEMPT_RECOMPUTE, &t);
    int32_t prompt[2] = {1, 5};
    fl_request_params p = {.prompt = prompt, .n_prompt = 2, .max_tokens = 4, .logprobs = 1};
    int64_t id;
    p.top_logprobs = FL_MAX_TOP_LOGPROBS + 1;
    assert_int_equal(fl_engine_add(e, &p, &id), FL_ERR_INVALID);
    p.top_logprobs = -1;
    assert_int_equal(fl_engine_add(e, &p, &id), FL_ERR_INVALID);
    p.top_logprobs = TOY_VOCAB < FL_MAX_TOP_LOGPROBS ? TOY_VOCAB : FL_MAX_TOP_LOGPROBS;
    assert_int_equal(fl_engine_add(e, &p, &id), FL_OK);
    char txt[64];
    assert_int_equal(fl_engine_token_text(e, 3, txt, sizeof txt), 1);
    assert_string_equal(txt, "a");
    assert_int_equal(fl_engine_token_text(e, TOY_VOCAB, txt, sizeof txt), -1);
    assert_int_equal(fl_engine_token_text(e, -1, txt, sizeof txt), -1);
    fl_engine_free(e);
    fl_test_mem_zero();
}

/* JSON-constrained requests over the toy model with a vocabulary of JSON pieces: every output is
 * a prefix of an object the recognizer accepts; an output that finished with STOP is a whole
 * object (cJSON parses it) and one cut by max_tokens is not; end-of-generation never appears */
static const char *const JSON_PIECES[] = {"{", "}", "[", "]", "\"k\"", ":", ",", "1", " ", "\"v", "x\"", "tr", "ue", "-", "2.5", "\n"};
static int32_t json_piece(void *ctx, int32_t tok, char *buf, int32_t cap) {
    (void)ctx;
    if (tok >= 3 && tok < 3 + (int32_t)(sizeof JSON_PIECES / sizeof *JSON_PIECES)) return snprintf(buf, (size_t)cap, "%s", JSON_PIECES[tok - 3]);
    return snprintf(buf, (size_t)cap, "%c%c", 'A' + tok % 26, '0' + tok % 10); /* only inside strings */
}

static int32_t g_regex_pcre2; /* the toy engines' fl_engine_params.regex_pcre2 */

/* The toy model whose pieces are JSON_PIECES, in an engine of default parameters but these. */
static fl_engine *json_toy_engine_mm(int32_t guide_masks, int64_t guide_mem) {
    fl_engine_params p;
    fl_engine_params_default(&p);
    p.guide_masks = guide_masks;
    p.guide_mem = guide_mem;
    p.regex_pcre2 = g_regex_pcre2;
    fl_engine_backend be;
    toy_new(4, 1000, 0, &be);
    be.piece = json_piece;
    fl_engine *e;
    assert_int_equal(fl_engine_new_backend(&p, &be, &e), FL_OK);
    return e;
}
static fl_engine *json_toy_engine_masks(int32_t guide_masks) { return json_toy_engine_mm(guide_masks, -1); }
static fl_engine *json_toy_engine(void) { return json_toy_engine_masks(FL_MASK_CACHE_DEFAULT); }

/* Step e until it is idle; the one request's text into text, its token count, its finish;
 * end-of-generation never appears (JSON requests mask it) */
static fl_finish_reason run_json_request(fl_engine *e, char text[4096], int32_t *n_tok) {
    fl_finish_reason fin = FL_FINISH_NONE;
    int32_t active = 1;
    while (active) {
        assert_int_equal(fl_engine_step(e, &active), FL_OK);
        fl_request_output ev[4];
        int32_t k = fl_engine_poll(e, ev, 4);
        for (int32_t j = 0; j < k; j++) {
            strcat(text, ev[j].new_text);
            *n_tok += ev[j].n_new;
            for (int32_t i = 0; i < ev[j].n_new; i++) assert_int_not_equal(ev[j].new_tokens[i], TOY_EOS);
            if (ev[j].finish) fin = ev[j].finish;
        }
    }
    return fin;
}

static void test_toy_json(void **state) {
    (void)state;
    int stops = 0, lengths = 0;
    for (int run = 0; run < 24; run++) {
        fl_engine *e = json_toy_engine();
        int32_t prompt[3] = {1, 3 + run % 7, 5};
        fl_logit_bias close = {4, 4.0f}; /* '}' a little likelier: most runs end */
        fl_request_params q = {.prompt = prompt, .n_prompt = 3, .max_tokens = 60, .json_object = 1};
        fl_sampling_params_default(&q.sampling);
        q.sampling.temperature = run < 4 ? 0.0f : 1.0f;
        q.sampling.seed = (uint64_t)run + 1;
        if (run % 2) {
            q.logit_bias = &close;
            q.n_logit_bias = 1;
        }
        int64_t id;
        assert_int_equal(fl_engine_add(e, &q, &id), FL_OK);
        char text[4096] = "";
        int32_t n_tok = 0;
        const fl_finish_reason fin = run_json_request(e, text, &n_tok);
        fl_json_fsm f;
        fl_json_fsm_init(&f);
        if (!fl_json_fsm_feed(&f, text, (int32_t)strlen(text))) fail_msg("run %d: not a JSON prefix: %s", run, text);
        if (fin == FL_FINISH_STOP) {
            assert_true(fl_json_fsm_done(&f));
            cJSON *o = cJSON_Parse(text);
            if (!cJSON_IsObject(o)) fail_msg("run %d: cJSON does not read an object: %s", run, text);
            cJSON_Delete(o);
            stops++;
        } else {
            assert_int_equal(fin, FL_FINISH_LENGTH);
            assert_int_equal(n_tok, 60);
            assert_false(fl_json_fsm_done(&f));
            lengths++;
        }
        fl_engine_free(e);
    }
    assert_true(stops >= 8); /* both endings seen (the counts are fixed by the seeds) */
    assert_true(lengths >= 1);
    fl_test_mem_zero();
}

/* json_schema on the toy model: every output is a prefix of a value of the schema; the ones
 * that finish with STOP are whole values (cJSON reads {"k": [integers]} and nothing else, as the
 * schema says), the others ran out of tokens; a schema the engine cannot follow is refused when
 * the request is added, with the keyword named, and nothing leaks */
static void test_toy_json_schema(void **state) {
    (void)state;
    const char *schema = "{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"array\",\"items\":{\"type\":\"integer\","
                         "\"minimum\":-20,\"maximum\":20},\"minItems\":1}},\"required\":[\"k\"],\"additionalProperties\":false}";
    int stops = 0, lengths = 0;
    for (int run = 0; run < 16; run++) {
        fl_engine *e = json_toy_engine();
        int32_t prompt[3] = {1, 3 + run % 7, 5};
        fl_logit_bias close[2] = {{4, 3.0f}, {6, 2.0f}}; /* '}' and ']' a little likelier: most runs end */
        const int32_t max_tokens = run % 4 == 3 ? 5 : 40;
        fl_request_params q = {.prompt = prompt, .n_prompt = 3, .max_tokens = max_tokens, .json_schema = schema,
                               .logit_bias = close, .n_logit_bias = run % 2 ? 2 : 0};
        fl_sampling_params_default(&q.sampling);
        q.sampling.temperature = run < 2 ? 0.0f : 1.0f;
        q.sampling.seed = (uint64_t)run + 7;
        int64_t id;
        assert_int_equal(fl_engine_add(e, &q, &id), FL_OK);
        if (run == 0) { /* refused at add: the keyword and the place named */
            fl_request_params b = q;
            b.json_schema = "{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"pattern\":\"\\\\bx\"}}}";
            int64_t id2;
            assert_int_equal(fl_engine_add(e, &b, &id2), FL_ERR_INVALID);
            assert_non_null(strstr(fl_last_error(), "#/properties/s"));
            assert_non_null(strstr(fl_last_error(), "pattern at offset 0: assertions"));
        }
        char text[4096] = "";
        int32_t n_tok = 0;
        const fl_finish_reason fin = run_json_request(e, text, &n_tok);
        if (fin == FL_FINISH_STOP) {
            cJSON *o = cJSON_ParseWithOpts(text, NULL, 1);
            if (!cJSON_IsObject(o) || cJSON_GetArraySize(o) != 1) fail_msg("run %d: not an object of one member: %s", run, text);
            const cJSON *k = cJSON_GetObjectItemCaseSensitive(o, "k"), *x;
            if (!cJSON_IsArray(k) || cJSON_GetArraySize(k) < 1) fail_msg("run %d: no non-empty array k: %s", run, text);
            cJSON_ArrayForEach(x, k) if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || fabs(x->valuedouble) > 20)
                fail_msg("run %d: an item out of the schema: %s", run, text);
            cJSON_Delete(o);
            stops++;
        } else { /* cut short: a prefix of a value, not a whole one */
            assert_int_equal(fin, FL_FINISH_LENGTH);
            assert_int_equal(n_tok, max_tokens);
            fl_json_schema *sc;
            assert_int_equal(fl_json_schema_compile(schema, &sc), FL_OK);
            fl_json_fsm f;
            fl_json_fsm_init_schema(&f, sc);
            if (!fl_json_fsm_feed(&f, text, (int32_t)strlen(text))) fail_msg("run %d: not a prefix of the schema: %s", run, text);
            assert_false(fl_json_fsm_done(&f));
            fl_json_schema_free(sc);
            lengths++;
        }
        fl_engine_free(e);
    }
    assert_true(stops >= 6); /* (the counts are fixed by the seeds) */
    assert_true(lengths >= 2);
    /* a string with a pattern, of the toy's pieces ("v, letter-digit pairs, x"): every finished
     * output's string is a whole match (glibc's POSIX regex says) */
    const char *pat_schema = "{\"type\":\"object\",\"properties\":{\"vx\":{\"type\":\"string\",\"pattern\":\"^v([A-D][0-9])*x$\"}},"
                             "\"required\":[\"vx\"],\"additionalProperties\":false}";
    regex_t re;
    assert_int_equal(regcomp(&re, "^v([A-D][0-9])*x$", REG_EXTENDED | REG_NOSUB), 0);
    int matched = 0;
    for (int run = 0; run < 8; run++) {
        fl_engine *e = json_toy_engine();
        int32_t prompt[3] = {1, 3 + run % 7, 5};
        fl_logit_bias close[2] = {{4, 3.0f}, {12, 2.0f}}; /* '}' and 'x"' a little likelier */
        fl_request_params q = {.prompt = prompt, .n_prompt = 3, .max_tokens = 30, .json_schema = pat_schema, .logit_bias = close, .n_logit_bias = 2};
        fl_sampling_params_default(&q.sampling);
        q.sampling.temperature = 1.0f;
        q.sampling.seed = (uint64_t)run + 70;
        int64_t id;
        assert_int_equal(fl_engine_add(e, &q, &id), FL_OK);
        char text[4096] = "";
        int32_t n_tok = 0;
        const fl_finish_reason fin = run_json_request(e, text, &n_tok);
        if (fin == FL_FINISH_STOP) {
            cJSON *o = cJSON_ParseWithOpts(text, NULL, 1);
            const cJSON *sv = cJSON_GetObjectItemCaseSensitive(o, "vx");
            if (!cJSON_IsString(sv) || regexec(&re, sv->valuestring, 0, NULL, 0)) fail_msg("run %d: s is no match: %s", run, text);
            cJSON_Delete(o);
            matched++;
        }
        fl_engine_free(e);
    }
    regfree(&re);
    assert_true(matched >= 4);
    fl_test_mem_zero();
}

/* guided_choice on the toy model: every output is exactly one of the choices, made of the toy's
 * pieces; "tr" is complete where "true" could go on, so there end-of-generation may end it (the
 * only place it may), and otherwise the request stops where no other choice can follow; choices
 * with a JSON constraint are refused */
static void test_toy_choices(void **state) {
    (void)state;
    const char *const ch[] = {"tr", "true", "-2.5", "1 1", "\"vx\""};
    int seen[5] = {0}, eos = 0;
    for (int run = 0; run < 24; run++) {
        fl_engine *e = json_toy_engine();
        int32_t prompt[3] = {1, 3 + run % 7, 5};
        fl_logit_bias bias = {TOY_EOS, 2.0f}; /* end-of-generation likelier where allowed */
        fl_request_params q = {.prompt = prompt, .n_prompt = 3, .max_tokens = 12, .choices = ch, .n_choices = 5,
                               .logit_bias = &bias, .n_logit_bias = run % 2};
        fl_sampling_params_default(&q.sampling);
        q.sampling.temperature = 1.0f;
        q.sampling.seed = (uint64_t)run + 11;
        int64_t id;
        assert_int_equal(fl_engine_add(e, &q, &id), FL_OK);
        if (run == 0) {
            fl_request_params b = q;
            b.json_object = 1;
            assert_int_equal(fl_engine_add(e, &b, &id), FL_ERR_INVALID);
        }
        char text[4096] = "";
        int32_t n_tok = 0;
        const fl_finish_reason fin = run_json_request(e, text, &n_tok);
        int k = -1;
        for (int i = 0; i < 5; i++)
            if (!strcmp(text, ch[i])) k = i;
        if (k < 0) fail_msg("run %d: '%s' is none of the choices", run, text);
        seen[k]++;
        if (fin == FL_FINISH_EOS) {
            assert_int_equal(k, 0); /* only "tr" may end by end-of-generation */
            eos++;
        } else {
            assert_int_equal(fin, FL_FINISH_STOP);
        }
        fl_engine_free(e);
    }
    int kinds = 0;
    for (int i = 0; i < 5; i++) kinds += seen[i] > 0;
    assert_true(kinds >= 3 && eos >= 1); /* (fixed by the seeds) */
    fl_test_mem_zero();
}

/* GBNF grammar: sampled outputs of a recursive grammar (nested lists) are sentences (checked by
 * recursive descent here) when they stop; the masks kept by state give the outputs of masks
 * computed at every step; end-of-generation only where a sentence could go on; refusals */
static const char *toy_list(const char *p) { /* "[" (v ("," " "? v)*)? "]", v: "1" | "-2.5" | a list */
    if (*p++ != '[') return NULL;
    if (*p == ']') return p + 1;
    for (;;) {
        if (*p == '1') p++;
        else if (!strncmp(p, "-2.5", 4)) p += 4;
        else if (!(p = toy_list(p))) return NULL;
        if (*p == ']') return p + 1;
        if (*p++ != ',') return NULL;
        if (*p == ' ') p++;
    }
}

/* One guided request q (its constraint, max_tokens, logit bias; the prompt from run, the seed
 * given) on three engines: masks computed at every step (a fresh engine that keeps none),
 * kept and shared across runs (shared), one kept (one, each new state evicts); all three give the
 * same text, tokens and finish, returned */
static fl_finish_reason toy_guided_run(fl_engine *shared, fl_engine *one, int run, fl_request_params q, uint64_t seed,
                                       char text[4096], int32_t *n_tok) {
    int32_t prompt[3] = {1, 3 + run % 7, 5};
    q.prompt = prompt;
    q.n_prompt = 3;
    fl_sampling_params_default(&q.sampling);
    q.sampling.temperature = 1.0f;
    q.sampling.seed = seed;
    fl_engine *engines[3] = {json_toy_engine_masks(0), shared, one};
    fl_finish_reason fin = FL_FINISH_NONE;
    for (int k = 0; k < 3; k++) {
        char t[4096] = "";
        int32_t n = 0;
        int64_t id;
        assert_int_equal(fl_engine_add(engines[k], &q, &id), FL_OK);
        const fl_finish_reason f = run_json_request(engines[k], t, &n);
        if (!k) {
            fin = f, *n_tok = n;
            strcpy(text, t);
            fl_engine_stats st;
            fl_engine_stats_get(engines[0], &st);
            assert_int_equal(st.guide_mask_hits + st.guide_mask_misses, 0);
            fl_engine_free(engines[0]);
        } else if (f != fin || n != *n_tok || strcmp(text, t))
            fail_msg("run %d: '%s' (%d tokens, finish %d) with the masks kept (%s), '%s' (%d, %d) computed", run, t, n, f,
                     k == 2 ? "one" : "shared", text, *n_tok, fin);
    }
    return fin;
}

/* "tr" then "ue" optional: end-of-generation only after "tr" (the one place a sentence could go
 * on, counted in eos), else STOP at "true" (counted in tr) */
static void tr_true(fl_finish_reason fin, const char *text, int *eos, int *tr) {
    if (fin == FL_FINISH_EOS) {
        assert_string_equal(text, "tr");
        ++*eos;
    } else {
        assert_int_equal(fin, FL_FINISH_STOP);
        assert_string_equal(text, "true");
        ++*tr;
    }
}

static void test_toy_grammar(void **state) {
    (void)state;
    const char *lists = "root ::= \"[\" (v (\",\" \" \"? v)*)? \"]\"\nv ::= \"1\" | \"-2.5\" | root\n";
    int stops = 0, nested = 0, eos = 0, tr = 0, lengths = 0;
    fl_engine *shared = json_toy_engine(), *one = json_toy_engine_masks(1);
    fl_logit_bias bias[2] = {{TOY_EOS, 3.0f}, {6, 2.0f}}; /* end-of-generation likelier where allowed; ']' likelier */
    for (int run = 0; run < 32; run++) {
        const bool list = run < 16;
        const fl_request_params q = {.max_tokens = 24, .grammar = list ? lists : "root ::= \"tr\" \"ue\"?",
                                     .logit_bias = bias + list, .n_logit_bias = 1};
        char text[4096];
        int32_t n_tok = 0;
        const fl_finish_reason fin = toy_guided_run(shared, one, run, q, (uint64_t)run + 11, text, &n_tok);
        if (list) {
            const char *end = toy_list(text);
            if (fin == FL_FINISH_STOP) {
                if (!end || *end) fail_msg("run %d: '%s' stopped but is no sentence", run, text);
                stops++;
                nested += strstr(text + 1, "[") != NULL;
            } else {
                assert_int_equal(fin, FL_FINISH_LENGTH); /* a list closes only at its bracket */
                assert_int_equal(n_tok, 24);
                lengths++;
            }
        } else tr_true(fin, text, &eos, &tr);
    }
    fl_engine_stats st;
    fl_engine_stats_get(shared, &st);
    assert_true(st.guide_mask_misses > 0 && st.guide_mask_hits > st.guide_mask_misses);
    fl_engine_free(shared);
    fl_engine_free(one);
    assert_true(stops + lengths == 16 && stops >= 12 && nested >= 2 && eos >= 4 && tr >= 1); /* (fixed by the seeds) */
    /* refusals at fl_engine_add; a grammar no token starts: the request fails at its first step */
    fl_engine *e = json_toy_engine();
    int32_t prompt[2] = {1, 3};
    int64_t id;
    fl_request_params q = {.prompt = prompt, .n_prompt = 2, .max_tokens = 4, .grammar = "root ::= x"};
    fl_sampling_params_default(&q.sampling);
    assert_int_equal(fl_engine_add(e, &q, &id), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "rule 'x' is used but not defined"));
    q.grammar = "root ::= \"1\"";
    q.regex = "1";
    assert_int_equal(fl_engine_add(e, &q, &id), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "one output constraint at a time"));
    q.regex = NULL;
    q.grammar = "root ::= \"@\"+";
    assert_int_equal(fl_engine_add(e, &q, &id), FL_OK);
    char text[4096] = "";
    int32_t n_tok = 0;
    assert_int_equal(run_json_request(e, text, &n_tok), FL_FINISH_ERROR);
    assert_int_equal(n_tok, 0);
    fl_engine_free(e);
    fl_test_mem_zero();
}

/* A lazy grammar (llama.cpp's grammar_lazy): sampled freely until its trigger fires, then a
 * sentence of the grammar from where the trigger names (here the first "["): every output that
 * stopped is free text without "[" and then a list of 1s; the masks kept give the outputs of
 * masks computed; each kind of trigger; a trigger whose text the grammar refuses fails the
 * request; refusals. */
static const char *toy_ones(const char *p) { /* "[" ("1" ("," "1")*)? "]" */
    if (*p++ != '[') return NULL;
    if (*p == ']') return p + 1;
    for (;;) {
        if (*p++ != '1') return NULL;
        if (*p == ']') return p + 1;
        if (*p++ != ',') return NULL;
    }
}

static void test_toy_lazy_grammar(void **state) {
    (void)state;
    const char *ones = "root ::= \"[\" (\"1\" (\",\" \"1\")*)? \"]\"";
    fl_engine *shared = json_toy_engine(), *one = json_toy_engine_masks(1);
    fl_logit_bias bias = {5, 1.5f}; /* "[" a little likelier */
    const fl_grammar_trigger kinds[4] = {{FL_TRIGGER_WORD, "[", 0}, {FL_TRIGGER_TOKEN, NULL, 5}, {FL_TRIGGER_PATTERN, "x?(\\[)", 0},
                                         {FL_TRIGGER_PATTERN_FULL, "[^\\[]*(\\[)", 0}};
    int stops = 0, free_text = 0, others = 0;
    for (int run = 0; run < 24; run++) {
        const fl_request_params q = {.max_tokens = 40, .grammar = ones, .grammar_triggers = kinds + run % 4, .n_grammar_triggers = 1,
                                     .logit_bias = &bias, .n_logit_bias = 1};
        char text[4096];
        int32_t n_tok = 0;
        const fl_finish_reason fin = toy_guided_run(shared, one, run, q, (uint64_t)run + 101, text, &n_tok);
        const char *open = strchr(text, '[');
        if (fin == FL_FINISH_STOP) { /* the grammar closed: "[" came, and a whole list after it */
            const char *end = open ? toy_ones(open) : NULL;
            if (!end || *end) fail_msg("run %d: '%s' stopped, but is not free text and then a list", run, text);
            stops++;
            free_text += open > text;
        } else { /* cut by max_tokens or ended: no list closed, any "[" began one still open */
            if (open && toy_ones(open)) fail_msg("run %d: '%s' (finish %d) closed its list without stopping", run, text, fin);
            for (const char *c = open ? open + 1 : ""; *c; c++)
                if (*c != '1' && *c != ',') fail_msg("run %d: '%s': after its '[' only the grammar's characters", run, text);
            others++;
        }
    }
    print_message("lazy grammar: %d stopped (%d after free text), %d cut or ended\n", stops, free_text, others);
    assert_true(stops >= 8 && free_text >= 4); /* (fixed by the seeds) */
    /* lazy_repeat (vLLM's structural_tag): where a list closes the output is free again, until the
     * next "[": every "[" opens a list that closes (the last may be cut), the request never stops
     * at a list's end */
    int many = 0;
    for (int run = 0; run < 24; run++) {
        const fl_request_params q = {.max_tokens = 40, .grammar = ones, .grammar_triggers = kinds + run % 4, .n_grammar_triggers = 1,
                                     .logit_bias = &bias, .n_logit_bias = 1, .lazy_repeat = 1};
        char text[4096];
        int32_t n_tok = 0;
        const fl_finish_reason fin = toy_guided_run(shared, one, run, q, (uint64_t)run + 101, text, &n_tok);
        if (fin == FL_FINISH_STOP || fin == FL_FINISH_ERROR) fail_msg("run %d: '%s' finish %d", run, text, fin);
        int lists = 0;
        for (const char *o = strchr(text, '['); o; o = strchr(o, '[')) {
            const char *end = toy_ones(o);
            if (!end) { /* the last, cut: only the grammar's characters to the end */
                for (const char *c = o + 1; *c; c++)
                    if (*c != '1' && *c != ',') fail_msg("run %d: '%s': a list that neither closes nor runs to the end", run, text);
                break;
            }
            lists++;
            o = end;
        }
        many += lists >= 2;
    }
    print_message("lazy grammar, repeated: %d of 24 outputs with two lists or more\n", many);
    assert_true(many >= 4);
    fl_engine_free(shared);
    fl_engine_free(one);
    /* the trigger's text the grammar cannot start: the request fails there; refusals when added */
    fl_engine *e = json_toy_engine();
    int32_t prompt[2] = {1, 3};
    int64_t id;
    fl_logit_bias force = {5, 50.0f};
    fl_request_params q = {.prompt = prompt, .n_prompt = 2, .max_tokens = 8, .grammar = "root ::= \"{\"", .grammar_triggers = kinds,
                           .n_grammar_triggers = 1, .logit_bias = &force, .n_logit_bias = 1};
    fl_sampling_params_default(&q.sampling);
    assert_int_equal(fl_engine_add(e, &q, &id), FL_OK);
    char text[4096] = "";
    int32_t n_tok = 0;
    assert_int_equal(run_json_request(e, text, &n_tok), FL_FINISH_ERROR);
    /* triggers that look past the reasoning: an output that does not start with <think> is all
     * answer (the same failure); where the prompt opened it, no </think> comes here, so none fires */
    q.lazy_after_think = 1;
    assert_int_equal(fl_engine_add(e, &q, &id), FL_OK);
    assert_int_equal(run_json_request(e, text, &n_tok), FL_FINISH_ERROR);
    q.lazy_after_think = 2;
    assert_int_equal(fl_engine_add(e, &q, &id), FL_OK);
    assert_int_equal(run_json_request(e, text, &n_tok), FL_FINISH_LENGTH);
    assert_int_equal(n_tok, 8);
    q.lazy_after_think = 3;
    assert_int_equal(fl_engine_add(e, &q, &id), FL_ERR_INVALID);
    q.lazy_after_think = 0;
    q.grammar = NULL;
    assert_int_equal(fl_engine_add(e, &q, &id), FL_ERR_INVALID); /* triggers without a grammar */
    q.grammar = ones;
    const fl_grammar_trigger bad[4] = {{FL_TRIGGER_PATTERN, "(", 0}, {FL_TRIGGER_TOKEN, NULL, TOY_VOCAB}, {7, "x", 0}, {FL_TRIGGER_WORD, "", 0}};
    for (int i = 0; i < 4; i++) {
        q.grammar_triggers = bad + i;
        assert_int_equal(fl_engine_add(e, &q, &id), FL_ERR_INVALID);
    }
    assert_non_null(strstr(fl_last_error(), "grammar trigger 0"));
    q.grammar_triggers = kinds;
    q.n_grammar_triggers = 17;
    assert_int_equal(fl_engine_add(e, &q, &id), FL_ERR_INVALID);
    fl_engine_free(e);
    fl_test_mem_zero();
}

/* The constraints' budget (guide_mem): 0 refuses constrained requests; a request that alone needs
 * more is refused as invalid, one that does not fit beside the others as over budget; a state that
 * outgrows what is left ends its request with an error that says so; everything comes back. */
static fl_engine *json_toy_engine_guide(int64_t guide_mem) {
    fl_engine *e = json_toy_engine_mm(FL_MASK_CACHE_DEFAULT, guide_mem);
    assert_int_equal(fl_mem_budget(FL_MEM_GUIDE), guide_mem ? (size_t)guide_mem : 1);
    return e;
}

static void test_toy_guide_mem(void **state) {
    (void)state;
    const char *lists = "root ::= \"[\" (v (\",\" \" \"? v)*)? \"]\"\nv ::= \"1\" | \"-2.5\" | root\n";
    int32_t prompt[2] = {1, 3}, ok_ids[2] = {4, 5};
    int64_t id;
    fl_request_params q = {.prompt = prompt, .n_prompt = 2, .max_tokens = 8};
    fl_sampling_params_default(&q.sampling);
    /* 0: no constraint of any kind; plain requests run */
    fl_engine *e = json_toy_engine_guide(0);
    const fl_request_params cons[] = {
        {.prompt = prompt, .n_prompt = 2, .max_tokens = 8, .grammar = lists},
        {.prompt = prompt, .n_prompt = 2, .max_tokens = 8, .json_object = 1},
        {.prompt = prompt, .n_prompt = 2, .max_tokens = 8, .regex = "1+"},
        {.prompt = prompt, .n_prompt = 2, .max_tokens = 8, .allowed_token_ids = ok_ids, .n_allowed_token_ids = 2},
    };
    for (size_t i = 0; i < sizeof cons / sizeof *cons; i++) {
        assert_int_equal(fl_engine_add(e, &cons[i], &id), FL_ERR_INVALID);
        assert_non_null(strstr(fl_last_error(), "output constraints are off in this engine (guide_mem 0)"));
    }
    assert_int_equal(fl_engine_add(e, &q, &id), FL_OK);
    char text[4096] = "";
    int32_t n_tok = 0;
    assert_int_equal(run_json_request(e, text, &n_tok), FL_FINISH_LENGTH);
    fl_engine_free(e);
    assert_int_equal(fl_mem_budget(FL_MEM_GUIDE), 0); /* the engine's budget goes with it */
    /* 1 KiB: a grammar alone needs more */
    e = json_toy_engine_guide(1024);
    assert_int_equal(fl_engine_add(e, &cons[0], &id), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "needs more memory than guide_mem (1.00 KiB)"));
    assert_int_equal(fl_mem_current(FL_MEM_GUIDE), 0);
    fl_engine_free(e);
    /* 64 KiB: grammars compile until the budget is held; their token walks (a 256 KiB memo) do not fit */
    e = json_toy_engine_guide(64 << 10);
    int n_added = 0;
    fl_status st;
    while ((st = fl_engine_add(e, &cons[0], &id)) == FL_OK) {
        n_added++;
        assert_true(fl_mem_current(FL_MEM_GUIDE) <= (64u << 10));
        assert_true(n_added < 64);
    }
    assert_int_equal(st, FL_ERR_BUDGET);
    assert_non_null(strstr(fl_last_error(), "of guide_mem (64.00 KiB) is held by the queued and running requests"));
    assert_true(n_added >= 2);
    const size_t held = fl_mem_current(FL_MEM_GUIDE);
    assert_true(held > 0);
    /* a plain request is not affected */
    assert_int_equal(fl_engine_add(e, &q, &id), FL_OK);
    assert_int_equal(fl_mem_current(FL_MEM_GUIDE), held);
    int errors = 0, plain = 0, active = 1;
    while (active) {
        assert_int_equal(fl_engine_step(e, &active), FL_OK);
        fl_request_output ev[8];
        const int32_t k = fl_engine_poll(e, ev, 8);
        for (int32_t j = 0; j < k; j++) {
            if (ev[j].finish == FL_FINISH_ERROR) {
                assert_non_null(ev[j].error);
                if (!strstr(ev[j].error, "outgrew what is left of guide_mem (64.00 KiB)")) fail_msg("error: %s", ev[j].error);
                errors++;
            } else {
                assert_null(ev[j].error);
                plain += ev[j].finish == FL_FINISH_LENGTH;
            }
        }
    }
    assert_int_equal(errors, n_added);
    assert_int_equal(plain, 1);
    assert_int_equal(fl_mem_current(FL_MEM_GUIDE), 0);
    fl_engine_free(e);
    /* 4 MiB: more of the same grammars (and JSON, allowed_token_ids) run to their ends, inside the budget */
    fl_mem_reset_peaks();
    e = json_toy_engine_guide(4 << 20);
    for (int i = 0; i < 8; i++) assert_int_equal(fl_engine_add(e, &cons[i & 1 ? 0 : i & 2 ? 1 : 3], &id), FL_OK);
    active = 1;
    errors = 0;
    while (active) {
        assert_int_equal(fl_engine_step(e, &active), FL_OK);
        fl_request_output ev[8];
        const int32_t k = fl_engine_poll(e, ev, 8);
        for (int32_t j = 0; j < k; j++) errors += ev[j].finish == FL_FINISH_ERROR;
    }
    assert_int_equal(errors, 0);
    assert_true(fl_mem_peak(FL_MEM_GUIDE) > held && fl_mem_peak(FL_MEM_GUIDE) <= (4u << 20));
    assert_int_equal(fl_mem_current(FL_MEM_GUIDE), 0);
    fl_engine_free(e);
    fl_test_mem_zero();
}

/* guided regex: sampled outputs are whole matches (checked with glibc's POSIX regex) when they
 * stop, end-of-generation only where the text is a match that could go on; a pattern no token
 * can start fails the request; a bad pattern or two constraints fail fl_engine_add */
/* (both ways: patterns of the common subset as grammars, and on PCRE2's matcher) */
static void toy_regex(void);
static void test_toy_regex(void **state) {
    (void)state;
    for (g_regex_pcre2 = 0; g_regex_pcre2 < 2; g_regex_pcre2++) toy_regex();
    g_regex_pcre2 = 0;
}

static void toy_regex(void) {
    const char *list = "\\[(1|-2\\.5)(, ?(1|-2\\.5)){0,3}\\]";
    regex_t re;
    assert_int_equal(regcomp(&re, "^\\[(1|-2\\.5)(, ?(1|-2\\.5)){0,3}\\]$", REG_EXTENDED | REG_NOSUB), 0);
    int stops = 0, eos = 0, tr = 0; /* lists of more than one, EOS after "tr", "true" */
    /* the masks kept by state: one engine for every run (requests with the same pattern share
     * them), and one that keeps a single mask (each new state evicts) give the outputs of
     * masks computed at every step (guide_masks 0) */
    fl_engine *shared = json_toy_engine(), *one = json_toy_engine_masks(1);
    fl_logit_bias bias = {TOY_EOS, 3.0f}; /* end-of-generation likelier where allowed */
    for (int run = 0; run < 32; run++) {
        const bool lists = run < 16;
        const fl_request_params q = {.max_tokens = 16, .regex = lists ? list : "tr(ue)?", .logit_bias = &bias, .n_logit_bias = lists ? 0 : 1};
        char text[4096];
        int32_t n_tok = 0;
        const fl_finish_reason fin = toy_guided_run(shared, one, run, q, (uint64_t)run + 5, text, &n_tok);
        if (lists) { /* (at most 16 tokens: the pattern closes within max_tokens) */
            assert_int_equal(fin, FL_FINISH_STOP);
            if (regexec(&re, text, 0, NULL, 0)) fail_msg("run %d: '%s' stopped but is no match", run, text);
            stops += strchr(text, ',') != NULL;
        } else tr_true(fin, text, &eos, &tr);
    }
    fl_engine_stats st;
    fl_engine_stats_get(shared, &st); /* the patterns' few states, met again and again */
    assert_true(st.guide_mask_misses > 0 && st.guide_mask_misses < 40);
    assert_true(st.guide_mask_hits > 4 * st.guide_mask_misses); /* (153 against 22 with these seeds) */
    fl_engine_stats_get(one, &st);
    assert_true(st.guide_mask_misses > 100);
    fl_engine_free(shared);
    fl_engine_free(one);
    regfree(&re);
    assert_true(stops >= 4 && eos >= 1 && tr >= 1); /* lists of more than one; (fixed by the seeds) */
    /* refusals at fl_engine_add; a pattern no token starts: the request fails at its first step */
    fl_engine *e = json_toy_engine();
    int32_t prompt[2] = {1, 3};
    int64_t id;
    fl_request_params q = {.prompt = prompt, .n_prompt = 2, .max_tokens = 4, .regex = "a(b"};
    fl_sampling_params_default(&q.sampling);
    assert_int_equal(fl_engine_add(e, &q, &id), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "missing closing parenthesis"));
    q.regex = "x+";
    q.json_object = 1;
    assert_int_equal(fl_engine_add(e, &q, &id), FL_ERR_INVALID);
    q.json_object = 0;
    q.regex = "@+";
    assert_int_equal(fl_engine_add(e, &q, &id), FL_OK);
    char text[4096] = "";
    int32_t n_tok = 0;
    assert_int_equal(run_json_request(e, text, &n_tok), FL_FINISH_ERROR);
    assert_int_equal(n_tok, 0);
    fl_engine_free(e);
    fl_test_mem_zero();
}

/* min_tokens and stop_token_ids, batched: each request equals its reference (EOS and the stop
 * ids masked before min_tokens; a stop id ends the request like EOS, outside the output) */
static void test_toy_min_tokens_stop_ids(void **state) {
    (void)state;
    wl w;
    make_wl(&w, 5);
    toy *t;
    fl_engine *e = toy_engine(6, 16, 4, 1000, 0, FL_PREEMPT_RECOMPUTE, &t);
    int32_t want[NREQ][TOY_CTX], n_want[NREQ];
    fl_finish_reason want_fin[NREQ];
    int eos_late = 0, stopped = 0;
    for (int i = 0; i < NREQ; i++) {
        int32_t ref[TOY_CTX];
        const int32_t n_ref = toy_reference(w.prompt[i], w.n_prompt[i], w.max_tokens[i], ref);
        /* odd requests: EOS made likely (+8), and not allowed before 3..6 tokens; even: a token
         * the unconstrained output has ends them */
        w.eos_bias[i] = i % 2 ? 8.0f : 0.0f;
        w.min_tokens[i] = i % 2 ? 3 + i % 4 : 0;
        w.stop_id[i] = i % 2 == 0 && n_ref > 2 ? ref[n_ref / 2] : -1;
        n_want[i] = toy_reference_stops(w.prompt[i], w.n_prompt[i], w.max_tokens[i], w.min_tokens[i], w.stop_id[i],
                                        w.eos_bias[i], want[i], &want_fin[i]);
        eos_late += want_fin[i] == FL_FINISH_EOS && n_want[i] >= w.min_tokens[i] && w.min_tokens[i] > 0;
        stopped += want_fin[i] == FL_FINISH_STOP;
    }
    assert_true(eos_late >= 1 && stopped >= 1); /* both paths are taken by this workload */
    drive(e, &w, 0);
    for (int i = 0; i < NREQ; i++) {
        if (w.n_got[i] != n_want[i] || memcmp(w.got[i], want[i], (size_t)n_want[i] * sizeof(int32_t)))
            fail_msg("request %d: %d tokens, the reference %d (min_tokens %d, stop id %d)", i, w.n_got[i], n_want[i],
                     w.min_tokens[i], w.stop_id[i]);
        assert_int_equal(w.finish[i], want_fin[i]);
        /* the stop id that ended it (a STOP here is one); -1 for the rest */
        assert_int_equal(w.stop_token[i], want_fin[i] == FL_FINISH_STOP ? w.stop_id[i] : -1);
    }
    /* out of range */
    int32_t prompt[2] = {1, 5};
    fl_request_params p = {.prompt = prompt, .n_prompt = 2, .max_tokens = 4, .n_stop_token_ids = 1};
    int64_t id;
    p.stop_token_ids[0] = TOY_VOCAB;
    assert_int_equal(fl_engine_add(e, &p, &id), FL_ERR_INVALID);
    p.stop_token_ids[0] = 3;
    p.n_stop_token_ids = FL_MAX_STOP_TOKEN_IDS + 1;
    assert_int_equal(fl_engine_add(e, &p, &id), FL_ERR_INVALID);
    p.n_stop_token_ids = 1;
    p.min_tokens = -1;
    assert_int_equal(fl_engine_add(e, &p, &id), FL_ERR_INVALID);
    fl_engine_free(e);
    fl_test_mem_zero();
}

/* vLLM's allowed_token_ids: every sampled token is one of them (end-of-generation too only if
 * listed); the same seeds without them sample others; with a constraint, only the ones it
 * allows, and none left fails the request; bad lists are refused */
static fl_finish_reason allowed_run(fl_engine *e, uint64_t seed, const int32_t *ids, int32_t n_ids, int json, int32_t *got, int32_t *n_got) {
    int32_t prompt[3] = {1, 4, 5};
    fl_logit_bias bias = {TOY_EOS, 2.0f};
    fl_request_params q = {.prompt = prompt, .n_prompt = 3, .max_tokens = 12, .allowed_token_ids = ids, .n_allowed_token_ids = n_ids,
                           .json_object = json, .logit_bias = &bias, .n_logit_bias = 1};
    fl_sampling_params_default(&q.sampling);
    q.sampling.temperature = 1.0f;
    q.sampling.seed = seed;
    int64_t id;
    if (fl_engine_add(e, &q, &id) != FL_OK) fail_msg("add: %s", fl_last_error());
    fl_finish_reason fin = FL_FINISH_NONE;
    *n_got = 0;
    for (int32_t active = 1; active;) {
        assert_int_equal(fl_engine_step(e, &active), FL_OK);
        fl_request_output ev[4];
        const int32_t k = fl_engine_poll(e, ev, 4);
        for (int32_t j = 0; j < k; j++) {
            for (int32_t i = 0; i < ev[j].n_new; i++) got[(*n_got)++] = ev[j].new_tokens[i];
            if (ev[j].finish) fin = ev[j].finish;
        }
    }
    return fin;
}

static void test_toy_allowed_token_ids(void **state) {
    (void)state;
    fl_engine *e = json_toy_engine();
    const int32_t ids[] = {9, 11, 30, 39}, with_eos[] = {9, TOY_EOS};
    int32_t got[64], n_got;
    int outside = 0, eos_end = 0;
    for (uint64_t seed = 1; seed <= 8; seed++) {
        assert_int_equal(allowed_run(e, seed, ids, 4, 0, got, &n_got), FL_FINISH_LENGTH); /* (no end-of-generation allowed) */
        assert_int_equal(n_got, 12);
        for (int32_t i = 0; i < n_got; i++)
            if (got[i] != 9 && got[i] != 11 && got[i] != 30 && got[i] != 39) fail_msg("seed %d: token %d not allowed", (int)seed, got[i]);
        allowed_run(e, seed, NULL, 0, 0, got, &n_got);
        for (int32_t i = 0; i < n_got; i++) outside += got[i] != 9 && got[i] != 11 && got[i] != 30 && got[i] != 39;
        if (allowed_run(e, seed, with_eos, 2, 0, got, &n_got) == FL_FINISH_EOS) eos_end++;
        for (int32_t i = 0; i < n_got; i++) assert_true(got[i] == 9 || got[i] == TOY_EOS);
    }
    assert_true(outside > 0 && eos_end > 0);
    /* with a JSON object: '{' (token 3), the one allowed, and then nothing the object allows */
    const int32_t brace[] = {3};
    assert_int_equal(allowed_run(e, 1, brace, 1, 1, got, &n_got), FL_FINISH_ERROR);
    assert_int_equal(n_got, 1);
    assert_int_equal(got[0], 3);
    int32_t prompt[2] = {1, 5};
    int64_t id;
    const int32_t bad[] = {3, TOY_VOCAB};
    fl_request_params p = {.prompt = prompt, .n_prompt = 2, .max_tokens = 4, .allowed_token_ids = bad, .n_allowed_token_ids = 2};
    assert_int_equal(fl_engine_add(e, &p, &id), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "allowed token id 40 out of the vocabulary"));
    p.n_allowed_token_ids = 0;
    assert_int_equal(fl_engine_add(e, &p, &id), FL_ERR_INVALID);
    fl_engine_free(e);
    fl_test_mem_zero();
}

/* vLLM's bad_words, as token sequences: a one-token sequence never appears, a longer one never
 * completes (its last token never follows the rest), with the same seeds that produce both
 * without them; bad lists are refused */
static void test_toy_bad_words(void **state) {
    (void)state;
    fl_engine *e = json_toy_engine();
    int32_t got[64], n_got;
    int single = 0, pair = 0, single_b = 0, pair_b = 0;
    const int32_t ids[3] = {9, 11, 30}, lens[2] = {1, 2}; /* [9], [11, 30] */
    for (uint64_t seed = 1; seed <= 24; seed++)
        for (int banned = 0; banned < 2; banned++) {
            int32_t prompt[3] = {1, 4, 5};
            fl_logit_bias bias[2] = {{9, 1.5f}, {30, 3.0f}}; /* (likelier, so the unbanned runs show them) */
            fl_request_params q = {.prompt = prompt, .n_prompt = 3, .max_tokens = 16, .logit_bias = bias, .n_logit_bias = 2};
            if (banned) q.bad_words_ids = ids, q.bad_words_lens = lens, q.n_bad_words = 2;
            fl_sampling_params_default(&q.sampling);
            q.sampling.temperature = 1.0f;
            q.sampling.seed = seed;
            int64_t id;
            assert_int_equal(fl_engine_add(e, &q, &id), FL_OK);
            n_got = 0;
            for (int32_t active = 1; active;) {
                assert_int_equal(fl_engine_step(e, &active), FL_OK);
                fl_request_output ev[4];
                const int32_t k = fl_engine_poll(e, ev, 4);
                for (int32_t j = 0; j < k; j++)
                    for (int32_t i = 0; i < ev[j].n_new; i++) got[n_got++] = ev[j].new_tokens[i];
            }
            for (int32_t i = 0; i < n_got; i++) {
                *(banned ? &single_b : &single) += got[i] == 9;
                *(banned ? &pair_b : &pair) += i > 0 && got[i - 1] == 11 && got[i] == 30;
            }
        }
    assert_true(single > 0 && pair > 0);
    assert_int_equal(single_b, 0);
    assert_int_equal(pair_b, 0);
    int32_t prompt[2] = {1, 5};
    int64_t id;
    const int32_t bad_ids[2] = {3, TOY_VOCAB}, bad_lens[1] = {2}, zero[1] = {0};
    fl_request_params p = {.prompt = prompt, .n_prompt = 2, .max_tokens = 4, .bad_words_ids = bad_ids, .bad_words_lens = bad_lens, .n_bad_words = 1};
    assert_int_equal(fl_engine_add(e, &p, &id), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "out of the vocabulary"));
    p.bad_words_lens = zero;
    assert_int_equal(fl_engine_add(e, &p, &id), FL_ERR_INVALID);
    fl_engine_free(e);
    fl_test_mem_zero();
}

static void test_toy_static_baseline(void **state) {
    (void)state;
    wl w;
    make_wl(&w, 7);
    toy *t;
    fl_engine *e = toy_engine(4, 64, 4, 4, 1, FL_PREEMPT_RECOMPUTE, &t);
    drive(e, &w, 0);
    check_reference(&w);
    fl_engine_stats st;
    fl_engine_stats_get(e, &st);
    assert_int_equal(st.preemptions, 0);
    assert_int_equal(st.kv_blocks_used, 0);
    fl_engine_free(e);
    fl_test_mem_zero();
}

static void test_toy_cancel(void **state) {
    (void)state;
    wl w;
    make_wl(&w, 3);
    toy *t;
    fl_engine *e = toy_engine(4, 16, 4, 200, 0, FL_PREEMPT_RECOMPUTE, &t);
    for (int i = 0; i < NREQ; i++) {
        fl_request_params p = {0};
        p.prompt = w.prompt[i];
        p.n_prompt = w.n_prompt[i];
        p.max_tokens = 100;
        p.ignore_eos = 1;
        assert_int_equal(fl_engine_add(e, &p, &w.id[i]), FL_OK);
    }
    for (int s = 0; s < 6; s++) assert_int_equal(fl_engine_step(e, NULL), FL_OK);
    fl_engine_stats st;
    fl_engine_stats_get(e, &st);
    assert_true(st.kv_blocks_used > 0);
    assert_true(st.n_running >= 2);
    for (int i = 0; i < NREQ; i++) assert_int_equal(fl_engine_cancel(e, w.id[i]), FL_OK);
    assert_int_equal(fl_engine_cancel(e, 9999), FL_ERR_INVALID);
    int32_t active = -1;
    assert_int_equal(fl_engine_step(e, &active), FL_OK);
    assert_int_equal(active, 0);
    fl_engine_stats_get(e, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    assert_int_equal(t->used, 0);
    assert_int_equal(st.n_running + st.n_waiting + st.n_preempted, 0);
    fl_request_output ev[NREQ];
    assert_int_equal(fl_engine_poll(e, ev, NREQ), NREQ);
    for (int i = 0; i < NREQ; i++) assert_int_equal(ev[i].finish, FL_FINISH_CANCELLED);
    assert_int_equal(fl_engine_poll(e, ev, NREQ), 0);
    fl_engine_free(e);
    fl_test_mem_zero();
}

/* A forward that fails (out of memory in the middle of a step): the step's requests finish with
 * FL_FINISH_ERROR and give their blocks back, fl_engine_step returns the error, and every other
 * request, and one added afterwards, still produces exactly its greedy output alone. */
static void test_toy_forward_error(void **state) {
    (void)state;
    wl w;
    make_wl(&w, 5);
    toy *t;
    fl_engine *e = toy_engine(4, 16, 4, 200, 0, FL_PREEMPT_RECOMPUTE, &t);
    for (int i = 0; i < NREQ; i++) {
        fl_request_params p = {0};
        fl_sampling_params_default(&p.sampling);
        p.prompt = w.prompt[i];
        p.n_prompt = w.n_prompt[i];
        p.max_tokens = w.max_tokens[i];
        assert_int_equal(fl_engine_add(e, &p, &w.id[i]), FL_OK);
    }
    fl_request_output ev[16];
    int done = 0, errors = 0;
    bool failed = false;
    for (int guard = 0; done < NREQ; guard++) {
        assert_true(guard < 20000);
        if (guard == 4) t->fail_at = t->forwards + 1;
        int32_t active;
        const fl_status st = fl_engine_step(e, &active);
        if (guard == 4) {
            assert_int_equal(st, FL_ERR_NOMEM);
            assert_non_null(strstr(fl_last_error(), "toy: forward"));
            failed = true;
        } else {
            assert_int_equal(st, FL_OK);
        }
        int32_t n;
        while ((n = fl_engine_poll(e, ev, 16)) > 0)
            for (int32_t k = 0; k < n; k++) {
                const int i = idx_of(&w, ev[k].request_id);
                memcpy(w.got[i] + w.n_got[i], ev[k].new_tokens, (size_t)ev[k].n_new * sizeof(int32_t));
                w.n_got[i] += ev[k].n_new;
                if (ev[k].finish == FL_FINISH_NONE) continue;
                w.finish[i] = ev[k].finish;
                done++;
                if (ev[k].finish == FL_FINISH_ERROR) {
                    assert_true(failed && guard == 4); /* only the failed step's */
                    errors++;
                }
            }
    }
    assert_true(errors >= 1 && errors <= 4); /* the running ones (max_seqs 4) */
    for (int i = 0; i < NREQ; i++) {
        if (w.finish[i] == FL_FINISH_ERROR) continue;
        int32_t ref[TOY_CTX];
        const int32_t n = toy_reference(w.prompt[i], w.n_prompt[i], w.max_tokens[i], ref);
        if (n != w.n_got[i] || memcmp(ref, w.got[i], (size_t)n * sizeof *ref))
            fail_msg("request %d after the failed step: %d tokens vs reference %d (or different ids)", i, w.n_got[i], n);
    }
    fl_engine_stats st;
    fl_engine_stats_get(e, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    assert_int_equal(t->used, 0);
    /* the failed requests again, on the same engine: their reference outputs */
    for (int i = 0; i < NREQ; i++) {
        if (w.finish[i] != FL_FINISH_ERROR) continue;
        fl_request_params p = {0};
        fl_sampling_params_default(&p.sampling);
        p.prompt = w.prompt[i];
        p.n_prompt = w.n_prompt[i];
        p.max_tokens = w.max_tokens[i];
        int64_t id;
        assert_int_equal(fl_engine_add(e, &p, &id), FL_OK);
        int32_t got[TOY_CTX], n_got = 0, active = 1;
        while (active) {
            assert_int_equal(fl_engine_step(e, &active), FL_OK);
            int32_t n;
            while ((n = fl_engine_poll(e, ev, 16)) > 0)
                for (int32_t k = 0; k < n; k++) {
                    assert_true(ev[k].request_id == id && ev[k].finish != FL_FINISH_ERROR);
                    memcpy(got + n_got, ev[k].new_tokens, (size_t)ev[k].n_new * sizeof(int32_t));
                    n_got += ev[k].n_new;
                }
        }
        int32_t ref[TOY_CTX];
        const int32_t n = toy_reference(w.prompt[i], w.n_prompt[i], w.max_tokens[i], ref);
        assert_int_equal(n_got, n);
        assert_memory_equal(got, ref, (size_t)n * sizeof *ref);
    }
    assert_int_equal(t->used, 0);
    fl_engine_free(e);
    fl_test_mem_zero();
}

static void test_toy_stop_string(void **state) {
    (void)state;
    wl w;
    make_wl(&w, 5);
    /* the reference text of request 0, and a stop string spanning pieces in its middle */
    int32_t ref[TOY_CTX];
    int32_t n = toy_reference(w.prompt[0], w.n_prompt[0], 40, ref);
    char txt[1024] = "";
    for (int32_t j = 0; j < n; j++) {
        char pc[8];
        toy_piece(NULL, ref[j], pc, 8);
        strcat(txt, pc);
    }
    assert_true(strlen(txt) > 12);
    char stop[4] = {txt[8], txt[9], txt[10], 0};
    const char *first = strstr(txt, stop);
    toy *t;
    fl_engine *e = toy_engine(4, 16, 4, 200, 0, FL_PREEMPT_RECOMPUTE, &t);
    for (int include = 0; include < 2; include++) { /* the text ends before the stop string, or after it */
        fl_request_params p = {0};
        p.prompt = w.prompt[0];
        p.n_prompt = w.n_prompt[0];
        p.max_tokens = 40;
        p.stop[0] = "this never appears";
        p.stop[1] = stop;
        p.include_stop_str_in_output = include;
        int64_t id;
        assert_int_equal(fl_engine_add(e, &p, &id), FL_OK);
        char got[1024] = "";
        fl_finish_reason fin = FL_FINISH_NONE;
        for (int s = 0; s < 200 && fin == FL_FINISH_NONE; s++) {
            assert_int_equal(fl_engine_step(e, NULL), FL_OK);
            fl_request_output ev[2];
            int32_t k = fl_engine_poll(e, ev, 2);
            for (int32_t j = 0; j < k; j++) {
                strcat(got, ev[j].new_text);
                fin = ev[j].finish;
                if (fin) { /* the second stop string ended it, and is said */
                    assert_non_null(ev[j].stop_str);
                    assert_string_equal(ev[j].stop_str, stop);
                    assert_int_equal(ev[j].stop_token, -1);
                } else {
                    assert_null(ev[j].stop_str);
                }
            }
        }
        assert_int_equal(fin, FL_FINISH_STOP);
        assert_int_equal(strlen(got), (size_t)(first - txt) + (include ? strlen(stop) : 0));
        assert_memory_equal(got, txt, strlen(got));
    }
    fl_engine_stats st;
    fl_engine_stats_get(e, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    fl_engine_free(e);
    fl_test_mem_zero();
}

/* Step e until nothing is active; request id's streamed tokens into out[*n_out]. */
static void run_collect(fl_engine *e, int64_t id, int32_t *out, int32_t *n_out) {
    *n_out = 0;
    int32_t active = 1;
    while (active) {
        assert_int_equal(fl_engine_step(e, &active), FL_OK);
        fl_request_output ev[4];
        int32_t k = fl_engine_poll(e, ev, 4);
        for (int32_t j = 0; j < k; j++)
            if (ev[j].request_id == id) {
                memcpy(out + *n_out, ev[j].new_tokens, (size_t)ev[j].n_new * sizeof *out);
                *n_out += ev[j].n_new;
            }
    }
}

/* temperature > 0: the same seed reproduces, batched or alone; another seed differs */
static void sample_run(uint64_t seed, int batched, int32_t *out, int32_t *n_out) {
    toy *t;
    fl_engine *e = toy_engine(4, 16, 4, 200, 0, FL_PREEMPT_RECOMPUTE, &t);
    int32_t prompt[3] = {1, 5, 7}, other[5] = {1, 9, 9, 9, 4};
    fl_request_params p = {0};
    fl_sampling_params_default(&p.sampling);
    p.sampling.temperature = 1.5f;
    p.sampling.top_k = 20;
    p.sampling.top_p = 0.95f;
    p.sampling.seed = seed;
    p.ignore_eos = 1;
    p.max_tokens = 30;
    p.n_prompt = 5;
    p.prompt = other;
    int64_t id, other_id = -1;
    if (batched) assert_int_equal(fl_engine_add(e, &p, &other_id), FL_OK);
    p.prompt = prompt;
    p.n_prompt = 3;
    assert_int_equal(fl_engine_add(e, &p, &id), FL_OK);
    run_collect(e, id, out, n_out);
    fl_engine_free(e);
}

static void test_toy_seeds(void **state) {
    (void)state;
    int32_t a[64], b[64], c[64], na, nb, nc;
    sample_run(42, 0, a, &na);
    sample_run(42, 1, b, &nb);
    sample_run(43, 0, c, &nc);
    assert_int_equal(na, 30);
    assert_int_equal(nb, 30);
    assert_memory_equal(a, b, 30 * sizeof(int32_t));
    assert_true(memcmp(a, c, 30 * sizeof(int32_t)) != 0);
    fl_test_mem_zero();
}

/* add / poll from another thread while the driver steps */
typedef struct thr_ctx {
    fl_engine *e;
    wl *w;
    int done;
} thr_ctx;
static void *adder(void *p) {
    thr_ctx *c = p;
    for (int i = 0; i < NREQ; i++) {
        fl_request_params q = {0};
        q.prompt = c->w->prompt[i];
        q.n_prompt = c->w->n_prompt[i];
        q.max_tokens = c->w->max_tokens[i];
        if (fl_engine_add(c->e, &q, &c->w->id[i]) != FL_OK) return p;
    }
    __atomic_store_n(&c->done, 1, __ATOMIC_SEQ_CST);
    return NULL;
}
static void test_toy_threads(void **state) {
    (void)state;
    wl w;
    make_wl(&w, 9);
    for (int i = 0; i < NREQ; i++) w.id[i] = -1;
    toy *t;
    fl_engine *e = toy_engine(4, 16, 4, 300, 0, FL_PREEMPT_RECOMPUTE, &t);
    thr_ctx c = {e, &w, 0};
    pthread_t th;
    pthread_create(&th, NULL, adder, &c);
    int finished = 0;
    /* bounded by time, not steps: on a loaded machine the adder may not run for a while, and
     * steps with nothing to do are quick (100,000 of them ran out before it added anything) */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (double waited = 0; finished < NREQ && waited < 60; waited = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec)) {
        int32_t active;
        assert_int_equal(fl_engine_step(e, &active), FL_OK);
        fl_request_output ev[8];
        int32_t k = fl_engine_poll(e, ev, 8);
        for (int32_t j = 0; j < k; j++) finished += ev[j].finish != FL_FINISH_NONE;
        if (!active) sched_yield();
        clock_gettime(CLOCK_MONOTONIC, &t1);
    }
    void *ret;
    pthread_join(th, &ret);
    assert_null(ret);
    assert_int_equal(finished, NREQ);
    fl_engine_free(e);
    fl_test_mem_zero();
}

static void test_toy_bad_requests(void **state) {
    (void)state;
    toy *t;
    fl_engine *e = toy_engine(4, 16, 4, 10, 0, FL_PREEMPT_RECOMPUTE, &t);
    int32_t prompt[300] = {1};
    fl_request_params p = {0};
    int64_t id;
    p.prompt = prompt;
    p.n_prompt = 0;
    assert_int_equal(fl_engine_add(e, &p, &id), FL_ERR_INVALID);
    p.n_prompt = 300; /* over the context */
    assert_int_equal(fl_engine_add(e, &p, &id), FL_ERR_INVALID);
    p.n_prompt = 30;
    p.max_tokens = 20; /* 50 tokens = 13 blocks > 10 - 1: could never run */
    assert_int_equal(fl_engine_add(e, &p, &id), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "blocks"));
    prompt[3] = TOY_VOCAB;
    p.max_tokens = 2;
    assert_int_equal(fl_engine_add(e, &p, &id), FL_ERR_INVALID);
    fl_engine_free(e);
    fl_test_mem_zero();
}


/* ---- the toy model over the real paged cache and the engine's KV adapter ----
 * prepare() of the real cache must always find the blocks the scheduler promised; prefix-cache
 * hits must skip exactly the cached tokens; recompute and swap preemption give the same output;
 * cancellation and the end of every request give every block back. */
typedef struct tpg {
    fl_kv_cache *kv;
    fl_kv_adapter *ad;
    fl_sched_kv inner;
    int32_t toks[TOY_SEQS][TOY_CTX];
    int32_t len[TOY_SEQS];
    float zeros[512 * 4];
    int64_t max_batch;
} tpg;

static int64_t tpg_n_free(void *ctx) { tpg *t = ctx; return t->inner.n_free(t->inner.ctx); }
static fl_status tpg_seq_begin(void *ctx, fl_request *r, int32_t *n_cached) {
    tpg *t = ctx;
    fl_status st = t->inner.seq_begin(t->inner.ctx, r, n_cached);
    if (st != FL_OK) return st;
    memcpy(t->toks[r->kv_seq], r->tokens, (size_t)*n_cached * sizeof(int32_t));
    t->len[r->kv_seq] = *n_cached;
    return FL_OK;
}
static int64_t tpg_n_needed(void *ctx, const fl_request *r, int32_t n) { tpg *t = ctx; return t->inner.n_needed(t->inner.ctx, r, n); }
static fl_status tpg_reserve(void *ctx, fl_request *r, int32_t n) { tpg *t = ctx; return t->inner.reserve(t->inner.ctx, r, n); }
static void tpg_seq_end(void *ctx, fl_request *r) { tpg *t = ctx; t->inner.seq_end(t->inner.ctx, r); }
static fl_status tpg_swap_out(void *ctx, fl_request *r) { tpg *t = ctx; return t->inner.swap_out(t->inner.ctx, r); }
static fl_status tpg_swap_in(void *ctx, fl_request *r) { tpg *t = ctx; return t->inner.swap_in(t->inner.ctx, r); }
static fl_status tpg_fork(void *ctx, fl_request *parent, fl_request *child, int32_t n) {
    tpg *t = ctx;
    fl_status st = t->inner.fork(t->inner.ctx, parent, child, n);
    if (st != FL_OK) return st;
    memcpy(t->toks[child->kv_seq], t->toks[parent->kv_seq], sizeof t->toks[0]);
    t->len[child->kv_seq] = t->len[parent->kv_seq];
    return FL_OK;
}
static fl_status tpg_forward(void *ctx, const fl_batch *b, float *logits) {
    tpg *t = ctx;
    if (b->n_tokens > t->max_batch) t->max_batch = b->n_tokens;
    fl_status st = fl_kv_prepare(t->kv, b);
    if (st != FL_OK) fail_msg("prepare: %s (%s)", fl_status_str(st), fl_last_error());
    fl_kv_store(t->kv, 0, b, t->zeros, t->zeros);
    int32_t row = 0;
    for (int32_t i = 0; i < b->n_tokens; i++) {
        int32_t s = b->seq_id[i], p = b->pos[i];
        assert_int_equal(p, t->len[s]);
        t->toks[s][p] = b->tokens[i];
        t->len[s] = p + 1;
        if (b->logits[i]) toy_logits(t->toks[s], p + 1, logits + (size_t)row++ * TOY_VOCAB);
    }
    for (int32_t s = 0; s < TOY_SEQS; s++)
        if (fl_kv_seq_exists(t->kv, s) && !fl_kv_seq_swapped(t->kv, s)) assert_true(fl_kv_seq_len(t->kv, s) >= 0);
    return FL_OK;
}
static fl_status tpg_truncate(void *ctx, fl_request *r, int32_t n) {
    tpg *t = ctx;
    assert_true(n < t->len[r->kv_seq]); /* only after drafts, and some were not kept */
    t->len[r->kv_seq] = n;
    return t->inner.truncate(t->inner.ctx, r, n);
}
static void tpg_step_done(void *ctx) { tpg *t = ctx; fl_kv_adapter_step_done(t->ad); }
static void tpg_kv_stats(void *ctx, fl_backend_kv_stats *st) { tpg *t = ctx; fl_kv_adapter_stats(t->ad, st); }
static void tpg_free(void *ctx) {
    tpg *t = ctx;
    fl_kv_adapter_free(t->ad);
    fl_kv_free(t->kv);
    fl_free(FL_MEM_MISC, t, sizeof *t);
}

static int32_t g_spec, g_spec_min, g_spec_batch; /* the paged toy engines' speculative decoding (0: off) */
static fl_engine *paged_engine(int32_t max_seqs, int32_t budget, int32_t n_blocks, fl_preempt_mode pm, tpg **tp) {
    tpg *t = fl_calloc(FL_MEM_MISC, 1, sizeof *t);
    assert_non_null(t);
    fl_kv_config cfg = {.n_layer = 1, .n_head = 1, .n_head_kv = 1, .head_dim = 4, .type = FL_TYPE_F32,
                        .block_size = 4, .n_blocks = n_blocks, .n_seq_max = TOY_SEQS, .n_ctx = TOY_CTX,
                        .prefix_cache = true};
    t->kv = fl_kv_new(&cfg);
    assert_non_null(t->kv);
    assert_int_equal(fl_kv_adapter_new_paged(t->kv, TOY_SEQS, &t->ad), FL_OK);
    t->inner = fl_kv_adapter_iface(t->ad);
    fl_engine_backend be = {0};
    be.ctx = t;
    be.n_vocab = TOY_VOCAB;
    be.n_ctx = TOY_CTX;
    be.block_size = 4;
    be.n_blocks = fl_kv_adapter_n_blocks(t->ad);
    be.kv = (fl_sched_kv){t, tpg_n_free, tpg_seq_begin, tpg_n_needed, tpg_reserve, tpg_seq_end, tpg_swap_out,
                          tpg_swap_in, tpg_fork, tpg_truncate};
    be.forward = tpg_forward;
    be.step_done = tpg_step_done;
    be.is_eog = toy_is_eog;
    be.piece = toy_piece;
    be.kv_stats = tpg_kv_stats;
    be.free = tpg_free;
    fl_engine_params p;
    fl_engine_params_default(&p);
    p.max_seqs = max_seqs;
    p.max_batch_tokens = budget;
    p.preempt = pm;
    p.spec_tokens = g_spec;
    p.spec_ngram_min = g_spec_min;
    p.spec_disable_batch = g_spec_batch;
    fl_engine *e;
    assert_int_equal(fl_engine_new_backend(&p, &be, &e), FL_OK);
    *tp = t;
    return e;
}

static void shared_prefix(wl *w) {
    for (int i = 0; i < NREQ; i++) {
        if (w->n_prompt[i] < 20) w->n_prompt[i] = 20 + i;
        for (int j = 1; j < 13; j++) w->prompt[i][j] = 3 + (j * 7) % 30; /* 13 common tokens: 3 blocks */
    }
}

static void test_paged_equals_alone(void **state) {
    (void)state;
    const fl_preempt_mode modes[3] = {FL_PREEMPT_RECOMPUTE, FL_PREEMPT_RECOMPUTE, FL_PREEMPT_SWAP};
    const int32_t blocks[3] = {400, 28, 28};
    for (int m = 0; m < 3; m++) {
        wl w;
        make_wl(&w, 21);
        shared_prefix(&w);
        tpg *t;
        fl_engine *e = paged_engine(6, 24, blocks[m], modes[m], &t);
        drive(e, &w, m == 0 ? 2 : 0);
        check_reference(&w);
        fl_engine_stats st;
        fl_engine_stats_get(e, &st);
        assert_true(st.prefix_hit_tokens >= 12); /* later requests reuse the shared prefix blocks */
        if (m == 1) assert_true(st.preemptions > 0);
        if (m == 2) assert_true(st.swaps_out > 0);
        assert_int_equal(st.kv_blocks_used, 0);
        assert_int_equal(fl_kv_check(t->kv), FL_OK);
        fl_engine_free(e);
    }
    fl_test_mem_zero();
}

/* The n-gram proposer: the latest earlier occurrence of the longest suffix that occurs. */
static void test_spec_ngram(void **state) {
    (void)state;
    const int32_t t[11] = {1, 2, 3, 4, 1, 2, 3, 5, 9, 1, 2};
    int32_t d[16];
    assert_int_equal(fl_spec_ngram(t, 11, 2, 4, 4, d), 4); /* "1 2" last at 4: 3 5 9 1 follow */
    assert_int_equal(d[0], 3);
    assert_int_equal(d[1], 5);
    assert_int_equal(d[2], 9);
    assert_int_equal(d[3], 1);
    assert_int_equal(fl_spec_ngram(t, 11, 2, 4, 2, d), 2);
    assert_int_equal(fl_spec_ngram(t, 11, 3, 4, 4, d), 0); /* "9 1 2" occurs nowhere before */
    assert_int_equal(fl_spec_ngram(t, 7, 1, 4, 4, d), 4);  /* "1 2 3" at 0: 4 1 2 3 */
    assert_int_equal(d[0], 4);
    assert_int_equal(d[3], 3);
    const int32_t u[4] = {7, 7, 7, 7};
    assert_int_equal(fl_spec_ngram(u, 4, 2, 4, 8, d), 1); /* "7 7 7" at 0, then one 7 before the end */
    assert_int_equal(d[0], 7);
    assert_int_equal(fl_spec_ngram(u, 1, 1, 4, 8, d), 0);
    const int32_t v[6] = {5, 6, 8, 5, 6, 9};
    assert_int_equal(fl_spec_ngram(v, 5, 2, 2, 3, d), 3); /* "5 6" at 0: 8 5 6 */
    assert_int_equal(d[0], 8);
    assert_int_equal(fl_spec_ngram(v, 6, 1, 2, 3, d), 0);
}

/* Speculative decoding over the paged cache: every output equals the reference with drafts on
 * (roomy, tight with recompute and with swap, logprobs), drafts are kept and refused, the steps
 * are fewer, and every block comes back. */
static void test_paged_spec(void **state) {
    (void)state;
    const fl_preempt_mode modes[3] = {FL_PREEMPT_RECOMPUTE, FL_PREEMPT_RECOMPUTE, FL_PREEMPT_SWAP};
    const int32_t blocks[3] = {400, 28, 28};
    int64_t drafted = 0, kept = 0;
    toy_window = 2;
    for (int m = 0; m < 3; m++) {
        int64_t steps[2];
        for (int spec = 0; spec < 2; spec++) {
            wl w;
            make_wl(&w, 21 + (uint32_t)m);
            shared_prefix(&w);
            for (int i = 0; i < NREQ && m == 0; i++) w.max_tokens[i] += 40;
            if (m == 0) w.top = 3;
            tpg *t;
            g_spec = spec ? 4 : 0;
            g_spec_min = m == 2 ? 1 : 0;
            fl_engine *e = paged_engine(6, 24, blocks[m], modes[m], &t);
            drive(e, &w, m == 0 ? 2 : 0);
            check_reference(&w);
            if (w.top >= 0) check_logprobs(&w);
            fl_engine_stats st;
            fl_engine_stats_get(e, &st);
            steps[spec] = st.steps;
            if (m == 1) assert_true(st.preemptions > 0);
            if (m == 2) assert_true(st.swaps_out > 0);
            if (!spec) assert_int_equal(st.spec_draft_tokens, 0);
            assert_true(st.spec_accepted_tokens <= st.spec_draft_tokens);
            drafted += st.spec_draft_tokens;
            kept += st.spec_accepted_tokens;
            assert_int_equal(st.kv_blocks_used, 0);
            assert_int_equal(fl_kv_check(t->kv), FL_OK);
            fl_engine_free(e);
        }
        print_message("spec: case %d: %lld steps without drafts, %lld with\n", m, (long long)steps[0], (long long)steps[1]);
        if (m == 0) assert_true(steps[1] < steps[0]);
    }
    print_message("spec: %lld draft tokens, %lld kept\n", (long long)drafted, (long long)kept);
    assert_true(kept > 0 && kept < drafted);
    /* vLLM's disable_by_batch_size: drafts only in the steps where at most 2 requests run */
    int64_t d_all = 0, d_few = 0;
    for (int lim = 0; lim <= 2; lim += 2) {
        wl w;
        make_wl(&w, 21);
        shared_prefix(&w);
        for (int i = 0; i < NREQ; i++) w.max_tokens[i] += 40;
        tpg *t;
        g_spec = 4;
        g_spec_min = 0;
        g_spec_batch = lim;
        fl_engine *e = paged_engine(6, 24, 400, FL_PREEMPT_RECOMPUTE, &t);
        drive(e, &w, 0);
        check_reference(&w);
        fl_engine_stats st;
        fl_engine_stats_get(e, &st);
        *(lim ? &d_few : &d_all) = st.spec_draft_tokens;
        fl_engine_free(e);
    }
    print_message("spec: %lld draft tokens, %lld with at most 2 requests running\n", (long long)d_all, (long long)d_few);
    assert_true(d_few > 0 && d_few < d_all / 2);
    g_spec = g_spec_min = g_spec_batch = 0;
    toy_window = 0;
    fl_test_mem_zero();
}

/* Sampling with a seed: the same tokens with drafts as without (each token is sampled from the
 * same logits with the same random draw; a draft only saves the step). */
static void spec_sample_run_ex(int32_t spec, int32_t req_max, int32_t req_min, uint64_t seed, int32_t *out, int32_t *n_out,
                               fl_engine_stats *stats) {
    tpg *t;
    g_spec = spec;
    fl_engine *e = paged_engine(4, 32, 400, FL_PREEMPT_RECOMPUTE, &t);
    g_spec = 0;
    int32_t prompt[6] = {1, 5, 7, 5, 7, 5}, other[5] = {1, 9, 9, 9, 4};
    fl_request_params p = {0};
    fl_sampling_params_default(&p.sampling);
    p.sampling.temperature = 0.6f;
    p.sampling.top_k = 20;
    p.sampling.seed = seed;
    p.ignore_eos = 1;
    p.max_tokens = 60;
    p.spec_max = req_max; /* (both requests) */
    p.spec_min = req_min;
    p.prompt = other;
    p.n_prompt = 5;
    int64_t id, other_id;
    assert_int_equal(fl_engine_add(e, &p, &other_id), FL_OK);
    p.prompt = prompt;
    p.n_prompt = 6;
    p.sampling.repeat_penalty = 1.1f; /* the penalties see the kept drafts as generated tokens */
    assert_int_equal(fl_engine_add(e, &p, &id), FL_OK);
    run_collect(e, id, out, n_out);
    fl_engine_stats_get(e, stats);
    assert_int_equal(stats->kv_blocks_used, 0);
    fl_engine_free(e);
}

static void spec_sample_run(int32_t spec, uint64_t seed, int32_t *out, int32_t *n_out, int64_t *kept) {
    fl_engine_stats st;
    spec_sample_run_ex(spec, 0, 0, seed, out, n_out, &st);
    *kept = st.spec_accepted_tokens;
}

static void test_paged_spec_seeded(void **state) {
    (void)state;
    toy_window = 1;
    int64_t kept_all = 0;
    for (uint64_t seed = 40; seed < 44; seed++) {
        int32_t a[64], b[64], na, nb;
        int64_t ka, kb;
        spec_sample_run(0, seed, a, &na, &ka);
        spec_sample_run(5, seed, b, &nb, &kb);
        assert_int_equal(na, 60);
        assert_int_equal(nb, 60);
        assert_memory_equal(a, b, 60 * sizeof(int32_t));
        assert_int_equal(ka, 0);
        kept_all += kb;
        /* per request (llama.cpp's speculative.n_max / n_min): drafts of exactly 2 tokens, or
         * none; the same tokens */
        fl_engine_stats st;
        spec_sample_run_ex(5, 2, 2, seed, b, &nb, &st);
        assert_memory_equal(a, b, 60 * sizeof(int32_t));
        assert_true(st.spec_drafts > 0);
        assert_int_equal(st.spec_draft_tokens, 2 * st.spec_drafts);
        spec_sample_run_ex(5, -1, 0, seed, b, &nb, &st);
        assert_memory_equal(a, b, 60 * sizeof(int32_t));
        assert_int_equal(st.spec_drafts, 0);
    }
    { /* per-request limits out of range are refused */
        tpg *t;
        g_spec = 4;
        fl_engine *e = paged_engine(4, 32, 400, FL_PREEMPT_RECOMPUTE, &t);
        g_spec = 0;
        int32_t prompt[3] = {1, 5, 7};
        int64_t id;
        const fl_request_params bad[3] = {{.prompt = prompt, .n_prompt = 3, .spec_max = FL_SPEC_MAX + 1},
                                          {.prompt = prompt, .n_prompt = 3, .spec_min = -1},
                                          {.prompt = prompt, .n_prompt = 3, .spec_p_min_set = 1, .spec_p_min = 1.5f}};
        for (int i = 0; i < 3; i++) assert_int_equal(fl_engine_add(e, &bad[i], &id), FL_ERR_INVALID);
        fl_engine_free(e);
    }
    toy_window = 0;
    print_message("spec seeded: %lld drafts kept\n", (long long)kept_all);
    assert_true(kept_all > 0);
    /* drafts need a backend that can give KV back, and sane limits */
    fl_engine_params p;
    fl_engine_params_default(&p);
    p.spec_tokens = 4;
    fl_engine_backend be;
    toy_new(4, 100, 0, &be); /* (no truncate) */
    fl_engine *e = NULL;
    assert_int_equal(fl_engine_new_backend(&p, &be, &e), FL_ERR_UNSUPPORTED);
    p.spec_tokens = FL_SPEC_MAX + 1;
    toy_new(4, 100, 0, &be);
    assert_int_equal(fl_engine_new_backend(&p, &be, &e), FL_ERR_INVALID);
    p.spec_tokens = 2;
    p.spec_ngram_min = 5;
    p.spec_ngram_max = 3;
    toy_new(4, 100, 0, &be);
    assert_int_equal(fl_engine_new_backend(&p, &be, &e), FL_ERR_INVALID);
    assert_null(e);
    fl_test_mem_zero();
}

/* prompt logprobs over the paged cache: the shared prefix is computed again for each request
 * (its logits are needed), never taken from the prefix cache */
static void test_paged_prompt_logprobs(void **state) {
    (void)state;
    wl w;
    make_wl(&w, 21);
    shared_prefix(&w);
    w.top = 3;
    w.prompt_lp = 1;
    tpg *t;
    fl_engine *e = paged_engine(6, 24, 400, FL_PREEMPT_RECOMPUTE, &t);
    drive(e, &w, 2);
    check_reference(&w);
    check_logprobs(&w);
    check_prompt_logprobs(&w);
    fl_engine_stats st;
    fl_engine_stats_get(e, &st);
    assert_int_equal(st.prefix_hit_tokens, 0);
    assert_int_equal(st.kv_blocks_used, 0);
    fl_engine_free(e);
    fl_test_mem_zero();
}

static void test_paged_cancel_frees_blocks(void **state) {
    (void)state;
    wl w;
    make_wl(&w, 4);
    tpg *t;
    fl_engine *e = paged_engine(6, 24, 60, FL_PREEMPT_SWAP, &t);
    for (int i = 0; i < NREQ; i++) {
        fl_request_params p = {0};
        p.prompt = w.prompt[i];
        p.n_prompt = w.n_prompt[i];
        p.max_tokens = 100;
        p.ignore_eos = 1;
        assert_int_equal(fl_engine_add(e, &p, &w.id[i]), FL_OK);
    }
    for (int s = 0; s < 25; s++) assert_int_equal(fl_engine_step(e, NULL), FL_OK);
    fl_engine_stats st;
    fl_engine_stats_get(e, &st);
    assert_true(st.kv_blocks_used > 0);
    for (int i = 0; i < NREQ; i++) assert_int_equal(fl_engine_cancel(e, w.id[i]), FL_OK);
    assert_int_equal(fl_engine_step(e, NULL), FL_OK);
    fl_engine_stats_get(e, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    fl_kv_stats ks;
    fl_kv_stats_get(t->kv, &ks);
    assert_int_equal(ks.n_blocks_used, 0);
    assert_int_equal(ks.n_seqs, 0);
    assert_int_equal(fl_kv_check(t->kv), FL_OK);
    fl_engine_free(e);
    fl_test_mem_zero();
}

/* n > 1: the samples fork sample 0's prompt blocks (copy-on-write) when its prefill is done and
 * sample with their own RNG streams; greedy samples all equal the reference. */
static void test_paged_n_samples(void **state) {
    (void)state;
    tpg *t;
    fl_engine *e = paged_engine(6, 64, 100, FL_PREEMPT_RECOMPUTE, &t);
    int32_t prompt[21];
    for (int i = 0; i < 21; i++) prompt[i] = 3 + (i * 5) % 30;
    fl_request_params p = {0};
    fl_sampling_params_default(&p.sampling);
    p.sampling.temperature = 1.0f;
    p.sampling.seed = 5;
    p.prompt = prompt;
    p.n_prompt = 21;
    p.max_tokens = 12;
    p.ignore_eos = 1;
    p.n = 3;
    int64_t id;
    assert_int_equal(fl_engine_add(e, &p, &id), FL_OK);
    int32_t got[3][16], n_got[3] = {0}, n_done = 0, cached[3] = {0};
    for (int guard = 0; n_done < 3 && guard < 100; guard++) {
        assert_int_equal(fl_engine_step(e, NULL), FL_OK);
        fl_request_output ev[4];
        int32_t k = fl_engine_poll(e, ev, 4);
        for (int32_t j = 0; j < k; j++) {
            assert_int_equal(ev[j].request_id, id);
            int sidx = ev[j].sample;
            assert_true(sidx >= 0 && sidx < 3);
            memcpy(got[sidx] + n_got[sidx], ev[j].new_tokens, (size_t)ev[j].n_new * sizeof(int32_t));
            n_got[sidx] += ev[j].n_new;
            cached[sidx] = ev[j].n_cached_prompt;
            n_done += ev[j].finish != FL_FINISH_NONE;
        }
    }
    assert_int_equal(n_done, 3);
    for (int i = 0; i < 3; i++) assert_int_equal(n_got[i], 12);
    assert_true(memcmp(got[0], got[1], sizeof got[0]) || memcmp(got[0], got[2], sizeof got[0]));
    fl_engine_stats st;
    fl_engine_stats_get(e, &st);
    assert_int_equal(cached[0], 0);
    assert_int_equal(cached[1], 21); /* forked: the whole prompt, last partial block shared too */
    assert_int_equal(cached[2], 21);
    assert_int_equal(st.kv_blocks_used, 0);
    /* greedy: every sample is the reference continuation */
    p.sampling.temperature = 0;
    p.ignore_eos = 0;
    assert_int_equal(fl_engine_add(e, &p, &id), FL_OK);
    int32_t ref[16];
    int32_t n_ref = toy_reference(prompt, 21, 12, ref);
    memset(n_got, 0, sizeof n_got);
    n_done = 0;
    for (int guard = 0; n_done < 3 && guard < 100; guard++) {
        assert_int_equal(fl_engine_step(e, NULL), FL_OK);
        fl_request_output ev[4];
        int32_t k = fl_engine_poll(e, ev, 4);
        for (int32_t j = 0; j < k; j++) {
            int sidx = ev[j].sample;
            memcpy(got[sidx] + n_got[sidx], ev[j].new_tokens, (size_t)ev[j].n_new * sizeof(int32_t));
            n_got[sidx] += ev[j].n_new;
            n_done += ev[j].finish != FL_FINISH_NONE;
        }
    }
    for (int i = 0; i < 3; i++) {
        assert_int_equal(n_got[i], n_ref);
        assert_memory_equal(got[i], ref, (size_t)n_ref * sizeof(int32_t));
    }
    assert_int_equal(fl_kv_check(t->kv), FL_OK);
    fl_engine_free(e);
    fl_test_mem_zero();
}

/* ---- the real model: stories260K greedy through the engine == llama.cpp's reference ---- */
#define NREF 12
typedef struct ref_set {
    int32_t prompt[NREF][64], n_prompt[NREF];
    int32_t want[NREF][256], n_want[NREF];
} ref_set;

static void load_refs(ref_set *rs, const char *rel) {
    size_t len;
    char *txt = fl_test_read_file(FL_SHARED_PATH(rel), &len);
    assert_non_null(txt);
    int n = 0;
    for (char *line = strtok(txt, "\n"); line && n < NREF; line = strtok(NULL, "\n"), n++) {
        cJSON *o = cJSON_Parse(line);
        assert_non_null(o);
        const cJSON *x;
        rs->n_prompt[n] = rs->n_want[n] = 0;
        cJSON_ArrayForEach(x, cJSON_GetObjectItem(o, "prompt_tokens")) rs->prompt[n][rs->n_prompt[n]++] = (int32_t)x->valuedouble;
        cJSON_ArrayForEach(x, cJSON_GetObjectItem(o, "greedy_tokens")) rs->want[n][rs->n_want[n]++] = (int32_t)x->valuedouble;
        cJSON_Delete(o);
    }
    assert_int_equal(n, NREF);
    fl_test_free_file(txt, len);
}

typedef struct real_run {
    int64_t preemptions, swaps_out, prefix_hits, max_running, steps;
    int64_t drafted, kept;
} real_run;
static int32_t g_real_spec, g_real_kv_f16; /* run_refs: speculative decoding's drafts (0: off); an f16 cache */
static const char *g_real_draft;          /* run_refs: the draft model (NULL: n-gram drafts) */
static float g_real_pmin = -1;            /* run_refs: its spec_draft_p_min (< 0: the default) */
static float g_real_req_pmin = -1;        /* run_refs: each request's own p_min (< 0: the engine's) */

/* All 12 prompts at once through an engine with the given shape; every output must equal the
 * reference (EOS ends the request and is not streamed as a token). */
static void run_refs(const ref_set *rs, const char *model, fl_kv_layout layout, int32_t max_seqs, int32_t budget,
                     int64_t kv_mem, fl_preempt_mode pm, real_run *rr) {
    fl_engine_params p;
    fl_engine_params_default(&p);
    p.model_path = FL_SHARED_PATH(model);
    p.n_threads = 1;
    p.n_ctx = 256;
    p.max_seqs = max_seqs;
    p.max_batch_tokens = budget;
    p.kv_mem = kv_mem;
    p.kv_type = "f32";
    p.kv_layout = layout;
    p.preempt = pm;
    p.spec_tokens = g_real_spec;
    p.spec_draft_model = g_real_draft;
    if (g_real_pmin >= 0) p.spec_draft_p_min = g_real_pmin;
    if (g_real_kv_f16) p.kv_type = "f16";
    fl_engine *e;
    if (fl_engine_new(&p, &e) != FL_OK) fail_msg("engine: %s", fl_last_error());
    int64_t ids[NREF];
    for (int i = 0; i < NREF; i++) {
        fl_request_params q = {0};
        fl_sampling_params_default(&q.sampling);
        q.prompt = rs->prompt[i];
        q.n_prompt = rs->n_prompt[i];
        q.max_tokens = rs->n_want[i];
        q.spec_p_min_set = g_real_req_pmin >= 0;
        q.spec_p_min = g_real_req_pmin;
        if (fl_engine_add(e, &q, &ids[i]) != FL_OK) fail_msg("add: %s", fl_last_error());
    }
    static int32_t got[NREF][256];
    int32_t n_got[NREF] = {0};
    fl_finish_reason fin[NREF] = {0};
    int32_t active = 1;
    memset(rr, 0, sizeof *rr);
    while (active) {
        assert_int_equal(fl_engine_step(e, &active), FL_OK);
        fl_request_output ev[NREF];
        int32_t k = fl_engine_poll(e, ev, NREF);
        for (int32_t j = 0; j < k; j++) {
            int i = (int)ev[j].request_id - (int)ids[0];
            memcpy(got[i] + n_got[i], ev[j].new_tokens, (size_t)ev[j].n_new * sizeof(int32_t));
            n_got[i] += ev[j].n_new;
            if (ev[j].finish) fin[i] = ev[j].finish;
        }
        fl_engine_stats st;
        fl_engine_stats_get(e, &st);
        if (st.n_running > rr->max_running) rr->max_running = st.n_running;
    }
    for (int i = 0; i < NREF; i++) {
        int32_t nw = rs->n_want[i];
        bool eos = nw > 0 && rs->want[i][nw - 1] == 2;
        if (eos) nw--;
        assert_int_equal(fin[i], eos ? FL_FINISH_EOS : FL_FINISH_LENGTH);
        assert_int_equal(n_got[i], nw);
        for (int32_t t = 0; t < nw; t++)
            if (got[i][t] != rs->want[i][t]) fail_msg("prompt %d token %d: got %d want %d", i, t, got[i][t], rs->want[i][t]);
    }
    fl_engine_stats st;
    fl_engine_stats_get(e, &st);
    rr->preemptions = st.preemptions;
    rr->swaps_out = st.swaps_out;
    rr->prefix_hits = st.prefix_hit_tokens;
    rr->steps = st.steps;
    rr->drafted = st.spec_draft_tokens;
    rr->kept = st.spec_accepted_tokens;
    assert_int_equal(st.kv_blocks_used, 0);
    assert_int_equal(st.n_running + st.n_waiting + st.n_preempted, 0);
    fl_engine_free(e);
}

static void test_stories_batched_chunked(void **state) {
    (void)state;
    NEED_SHARED();
    static ref_set rs;
    load_refs(&rs, "reference/stories260K.greedy.jsonl");
    real_run rr;
    /* 12 at once, an 8-token budget: every prompt is prefilled in chunks beside decodes */
    run_refs(&rs, "models/stories260K.gguf", FL_KV_PAGED, 12, 8, 8 << 20, FL_PREEMPT_RECOMPUTE, &rr);
    assert_int_equal(rr.preemptions, 0);
    assert_int_equal(rr.max_running, 8); /* the budget bounds the decodes per step */
    fl_test_mem_zero();
}

static void test_stories_preempt(void **state) {
    (void)state;
    NEED_SHARED();
    static ref_set rs;
    load_refs(&rs, "reference/stories260K.greedy.jsonl");
    real_run rr;
    /* 24 blocks of 16 tokens (1280 bytes a token): the 12 requests need ~150 */
    const int64_t tiny = 24 * 16 * 1280 + 16 * 1280;
    run_refs(&rs, "models/stories260K.gguf", FL_KV_PAGED, 12, 32, tiny, FL_PREEMPT_RECOMPUTE, &rr);
    assert_true(rr.preemptions > 0);
    run_refs(&rs, "models/stories260K.gguf", FL_KV_PAGED, 12, 32, tiny, FL_PREEMPT_SWAP, &rr);
    assert_true(rr.swaps_out > 0);
    fl_test_mem_zero();
}

/* Speculative decoding on the real model: the reference tokens, in fewer steps (roomy; and a
 * tight pool where drafts must fit beside preemption and swapping; and an f16 cache). */
static void test_stories_spec(void **state) {
    (void)state;
    NEED_SHARED();
    static ref_set rs;
    load_refs(&rs, "reference/stories260K.greedy.jsonl");
    real_run r0, rr;
    run_refs(&rs, "models/stories260K.gguf", FL_KV_PAGED, 12, 64, 8 << 20, FL_PREEMPT_RECOMPUTE, &r0);
    g_real_spec = 4;
    run_refs(&rs, "models/stories260K.gguf", FL_KV_PAGED, 12, 64, 8 << 20, FL_PREEMPT_RECOMPUTE, &rr);
    print_message("stories260K: %lld steps, %lld with 4 drafts (%lld drafted, %lld kept)\n", (long long)r0.steps,
                  (long long)rr.steps, (long long)rr.drafted, (long long)rr.kept);
    assert_true(rr.kept > 0 && rr.kept < rr.drafted);
    assert_true(rr.steps < r0.steps);
    const int64_t tiny = 24 * 16 * 1280 + 16 * 1280;
    run_refs(&rs, "models/stories260K.gguf", FL_KV_PAGED, 12, 32, tiny, FL_PREEMPT_RECOMPUTE, &rr);
    assert_true(rr.preemptions > 0 && rr.kept > 0);
    run_refs(&rs, "models/stories260K.gguf", FL_KV_PAGED, 12, 32, tiny, FL_PREEMPT_SWAP, &rr);
    assert_true(rr.swaps_out > 0 && rr.kept > 0);
    g_real_kv_f16 = 1;
    run_refs(&rs, "models/stories260K.gguf", FL_KV_PAGED, 12, 64, 8 << 20, FL_PREEMPT_RECOMPUTE, &rr);
    g_real_kv_f16 = 0;
    /* a draft model: the model itself (every draft kept), its Q4_0 quantization (most), and the
     * tight pool again, where preemption and swapping drop the drafts' sequences too */
    g_real_draft = FL_SHARED_PATH("models/stories260K.gguf");
    g_real_pmin = 0; /* (every draft token, however unsure) */
    run_refs(&rs, "models/stories260K.gguf", FL_KV_PAGED, 12, 64, 8 << 20, FL_PREEMPT_RECOMPUTE, &rr);
    print_message("stories260K drafting for itself: %lld steps (%lld drafted, %lld kept)\n", (long long)rr.steps, (long long)rr.drafted,
                  (long long)rr.kept);
    assert_true(rr.drafted > 0 && rr.kept == rr.drafted && rr.steps * 3 < r0.steps); /* (every sequence drafts: none starves) */
    g_real_draft = FL_SHARED_PATH("models/stories260K-q4_0.gguf");
    run_refs(&rs, "models/stories260K.gguf", FL_KV_PAGED, 12, 64, 8 << 20, FL_PREEMPT_RECOMPUTE, &rr);
    print_message("stories260K-q4_0 drafting: %lld steps (%lld drafted, %lld kept)\n", (long long)rr.steps, (long long)rr.drafted,
                  (long long)rr.kept);
    assert_true(rr.kept > rr.drafted / 2 && rr.kept < rr.drafted && rr.steps < r0.steps);
    /* llama.cpp's p_min: drafts end at the first unsure token: fewer, a larger share kept */
    real_run rp;
    g_real_pmin = 0.75f;
    run_refs(&rs, "models/stories260K.gguf", FL_KV_PAGED, 12, 64, 8 << 20, FL_PREEMPT_RECOMPUTE, &rp);
    print_message("  with p_min 0.75: %lld steps (%lld drafted, %lld kept)\n", (long long)rp.steps, (long long)rp.drafted, (long long)rp.kept);
    assert_true(rp.drafted < rr.drafted && (double)rp.kept / (double)rp.drafted > (double)rr.kept / (double)rr.drafted);
    /* the requests' own p_min 0 (llama.cpp's speculative.p_min) over the engine's 0.75: as with 0 */
    g_real_req_pmin = 0;
    run_refs(&rs, "models/stories260K.gguf", FL_KV_PAGED, 12, 64, 8 << 20, FL_PREEMPT_RECOMPUTE, &rp);
    g_real_req_pmin = -1;
    assert_int_equal(rp.drafted, rr.drafted);
    assert_int_equal(rp.kept, rr.kept);
    g_real_pmin = 0;
    run_refs(&rs, "models/stories260K.gguf", FL_KV_PAGED, 12, 32, tiny, FL_PREEMPT_RECOMPUTE, &rr);
    assert_true(rr.preemptions > 0 && rr.kept > 0);
    run_refs(&rs, "models/stories260K.gguf", FL_KV_PAGED, 12, 32, tiny, FL_PREEMPT_SWAP, &rr);
    assert_true(rr.swaps_out > 0 && rr.kept > 0);
    g_real_draft = NULL;
    g_real_spec = 0;
    g_real_pmin = -1;
    /* a draft whose vocabulary is not the model's is refused */
    fl_engine_params p;
    fl_engine_params_default(&p);
    p.model_path = FL_SHARED_PATH("models/stories260K.gguf");
    p.spec_tokens = 4;
    p.spec_draft_model = FL_SHARED_PATH("models/llama-2-tiny-random.gguf");
    fl_engine *e = NULL;
    assert_int_equal(fl_engine_new(&p, &e), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "vocabulary"));
    p.spec_draft_model = FL_SHARED_PATH("models/missing.gguf");
    assert_true(fl_engine_new(&p, &e) != FL_OK);
    assert_null(e);
    fl_test_mem_zero();
}

static void test_stories_static_baseline(void **state) {
    (void)state;
    NEED_SHARED();
    static ref_set rs;
    load_refs(&rs, "reference/stories260K.greedy.jsonl");
    real_run rr;
    /* 4 contiguous slots of 256 positions: 3 static batches of 4, padded */
    run_refs(&rs, "models/stories260K.gguf", FL_KV_CONTIGUOUS, 12, 512, 4 * 256 * 1280, FL_PREEMPT_RECOMPUTE, &rr);
    assert_int_equal(rr.max_running, 4);
    fl_test_mem_zero();
}

/* n = 3 greedy samples of one prompt on the real model: forked (copy-on-write) blocks, every
 * sample equal to the reference. */
static void test_stories_n_samples(void **state) {
    (void)state;
    NEED_SHARED();
    static ref_set rs;
    load_refs(&rs, "reference/stories260K.greedy.jsonl");
    fl_engine_params p;
    fl_engine_params_default(&p);
    p.model_path = FL_SHARED_PATH("models/stories260K.gguf");
    p.n_threads = 1;
    p.n_ctx = 256;
    p.kv_type = "f32";
    p.kv_mem = 4 << 20;
    fl_engine *e;
    if (fl_engine_new(&p, &e) != FL_OK) fail_msg("engine: %s", fl_last_error());
    const int k = 1; /* "Lily and Tom went to the park": 12 prompt tokens, a partial block */
    fl_request_params q = {0};
    fl_sampling_params_default(&q.sampling);
    q.prompt = rs.prompt[k];
    q.n_prompt = rs.n_prompt[k];
    q.max_tokens = 40;
    q.n = 3;
    int64_t id;
    assert_int_equal(fl_engine_add(e, &q, &id), FL_OK);
    int32_t got[3][64], n_got[3] = {0}, cached[3] = {0};
    int32_t active = 1;
    while (active) {
        assert_int_equal(fl_engine_step(e, &active), FL_OK);
        fl_request_output ev[4];
        int32_t n = fl_engine_poll(e, ev, 4);
        for (int32_t j = 0; j < n; j++) {
            int si = ev[j].sample;
            memcpy(got[si] + n_got[si], ev[j].new_tokens, (size_t)ev[j].n_new * sizeof(int32_t));
            n_got[si] += ev[j].n_new;
            cached[si] = ev[j].n_cached_prompt;
        }
    }
    for (int i = 0; i < 3; i++) {
        assert_int_equal(n_got[i], 40);
        for (int32_t t = 0; t < 40; t++)
            if (got[i][t] != rs.want[k][t]) fail_msg("sample %d token %d: got %d want %d", i, t, got[i][t], rs.want[k][t]);
    }
    assert_int_equal(cached[1], rs.n_prompt[k]);
    fl_engine_free(e);
    fl_test_mem_zero();
}

/* ---- embeddings: the final hidden states, pooled ---- */
static fl_engine *embd_engine(int32_t embeddings, int32_t budget, fl_kv_layout layout) {
    fl_engine_params p;
    fl_engine_params_default(&p);
    p.model_path = FL_SHARED_PATH("models/stories260K.gguf");
    p.n_threads = 1;
    p.n_ctx = 256;
    p.max_seqs = 8;
    p.max_batch_tokens = budget;
    p.kv_mem = 2 << 20;
    p.kv_type = "f16";
    p.kv_layout = layout;
    p.embeddings = embeddings;
    fl_engine *e;
    if (fl_engine_new(&p, &e) != FL_OK) fail_msg("engine: %s", fl_last_error());
    return e;
}

/* Requests i < n: pooling pool[i] of prompts[i] (NONE: a generation of 8 tokens beside them),
 * all at once; each embedding into out[i] */
static void embd_run(fl_engine *e, int n, const fl_pooling *pool, const int32_t *const *prompts, const int32_t *lens,
                     float (*out)[64]) {
    int64_t ids[16];
    bool fin[16] = {0};
    for (int i = 0; i < n; i++) {
        fl_request_params q = {0};
        fl_sampling_params_default(&q.sampling);
        q.prompt = prompts[i];
        q.n_prompt = lens[i];
        q.pooling = pool[i];
        q.max_tokens = 8;
        if (fl_engine_add(e, &q, &ids[i]) != FL_OK) fail_msg("add: %s", fl_last_error());
    }
    int32_t active = 1;
    while (active) {
        assert_int_equal(fl_engine_step(e, &active), FL_OK);
        fl_request_output ev[16];
        const int32_t k = fl_engine_poll(e, ev, 16);
        for (int32_t j = 0; j < k; j++) {
            int i = 0;
            while (ids[i] != ev[j].request_id) i++;
            if (!ev[j].finish) continue;
            fin[i] = true;
            if (pool[i] == FL_POOLING_NONE) {
                assert_null(ev[j].embedding);
                continue;
            }
            assert_int_equal(ev[j].finish, FL_FINISH_STOP);
            assert_int_equal(ev[j].n_generated, 0);
            assert_int_equal(ev[j].n_embd, 64);
            assert_non_null(ev[j].embedding);
            memcpy(out[i], ev[j].embedding, sizeof out[i]);
        }
    }
    for (int i = 0; i < n; i++) assert_true(fin[i]);
    fl_engine_stats st;
    fl_engine_stats_get(e, &st);
    assert_int_equal(st.kv_blocks_used, 0);
}

/* An embedding is the final hidden state after the output norm: the last token's, times the
 * output matrix, is llama.cpp's logits at that position (reference logits of every prefix); the
 * mean over a prompt is the mean of its prefixes' last states; chunked and batched beside
 * generations it is the same; refusals. */
static void test_stories_embeddings(void **state) {
    (void)state;
    NEED_SHARED();
    size_t len;
    char *txt = fl_test_read_file(FL_SHARED_PATH("reference/stories260K.logits.jsonl"), &len);
    assert_non_null(txt);
    *strchr(txt, '\n') = 0;
    cJSON *ref = cJSON_Parse(txt);
    fl_test_free_file(txt, len);
    assert_non_null(ref);
    int32_t tok[64], n = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, cJSON_GetObjectItem(ref, "tokens")) tok[n++] = (int32_t)x->valuedouble;
    fl_gguf *g;
    assert_int_equal(fl_gguf_open(FL_SHARED_PATH("models/stories260K.gguf"), &g), FL_OK);
    const fl_gguf_tensor *w = fl_gguf_find_tensor(g, "output.weight");
    assert_true(w && w->type == FL_TYPE_F32 && w->ne[0] == 64 && w->ne[1] == 512);
    const float *W = w->data;

    /* every prefix's last state, all at once (and the whole prompt's mean); the contiguous cache,
     * whose f16 attention rounds as llama.cpp's does (the paged one's online softmax keeps its
     * probabilities in f32: up to 4e-3 from llama.cpp's logits here) */
    fl_engine *e = embd_engine(1, 512, FL_KV_CONTIGUOUS);
    fl_pooling pool[16];
    const int32_t *pr[16];
    int32_t lens[16];
    static float got[16][64];
    for (int i = 0; i < n; i++) pool[i] = FL_POOLING_LAST, pr[i] = tok, lens[i] = i + 1;
    pool[n] = FL_POOLING_MEAN, pr[n] = tok, lens[n] = n;
    embd_run(e, n + 1, pool, pr, lens, got);
    const cJSON *rows = cJSON_GetObjectItem(ref, "logits");
    double worst = 0;
    for (int i = 0; i < n; i++) {
        const cJSON *row = cJSON_GetArrayItem(rows, i);
        for (int v = 0; v < 512; v++) {
            double l = 0;
            for (int j = 0; j < 64; j++) l += (double)W[(size_t)v * 64 + j] * got[i][j];
            const double d = fabs(l - cJSON_GetArrayItem(row, v)->valuedouble);
            if (d > worst) worst = d;
        }
    }
    if (worst > 1e-3) fail_msg("output x embedding against llama.cpp's logits: max |diff| %g", worst);
    for (int i = 0; i < n; i++) { /* log-softmax of output x embedding = the engine's logprobs after the prefix */
        fl_request_params q = {0};
        fl_sampling_params_default(&q.sampling);
        q.prompt = tok;
        q.n_prompt = i + 1;
        q.max_tokens = 1;
        q.logprobs = 1;
        q.top_logprobs = 5;
        int64_t id;
        assert_int_equal(fl_engine_add(e, &q, &id), FL_OK);
        fl_token_logprob lp[6];
        int32_t active = 1, got_lp = 0;
        while (active) {
            assert_int_equal(fl_engine_step(e, &active), FL_OK);
            fl_request_output ev[2];
            const int32_t k = fl_engine_poll(e, ev, 2);
            for (int32_t j = 0; j < k; j++)
                if (ev[j].n_new) memcpy(lp, ev[j].new_logprobs, sizeof lp), got_lp = 1;
        }
        assert_true(got_lp);
        double l[512], mx = -1e30, z = 0;
        for (int v = 0; v < 512; v++) {
            l[v] = 0;
            for (int j = 0; j < 64; j++) l[v] += (double)W[(size_t)v * 64 + j] * got[i][j];
            if (l[v] > mx) mx = l[v];
        }
        for (int v = 0; v < 512; v++) z += exp(l[v] - mx);
        for (int t = 1; t < 6; t++) assert_float_equal(lp[t].logprob, l[lp[t].token] - mx - log(z), 1e-4);
    }
    for (int j = 0; j < 64; j++) {
        double m = 0;
        for (int i = 0; i < n; i++) m += got[i][j];
        assert_float_equal(got[n][j], m / n, 1e-5);
    }
    /* on the paged cache: all at once, then chunked (3 tokens a step) and beside generations, alone */
    fl_engine *e1 = embd_engine(1, 512, FL_KV_PAGED);
    embd_run(e1, n + 1, pool, pr, lens, got);
    fl_engine_free(e1);
    fl_engine *e2 = embd_engine(1, 3, FL_KV_PAGED);
    static float got2[16][64];
    fl_pooling pool2[4] = {FL_POOLING_NONE, FL_POOLING_MEAN, FL_POOLING_NONE, FL_POOLING_LAST};
    const int32_t *pr2[4] = {tok, tok, tok + 1, tok};
    int32_t lens2[4] = {n, n, n - 1, n};
    embd_run(e2, 4, pool2, pr2, lens2, got2);
    for (int j = 0; j < 64; j++) {
        assert_float_equal(got2[1][j], got[n][j], 1e-5);
        assert_float_equal(got2[3][j], got[n - 1][j], 1e-5);
    }
    embd_run(e2, 1, pool2 + 1, pr2 + 1, lens2 + 1, got2); /* alone, in chunks of 3 */
    for (int j = 0; j < 64; j++) assert_float_equal(got2[0][j], got[n][j], 1e-5);
    /* refusals */
    fl_request_params q = {0};
    fl_sampling_params_default(&q.sampling);
    q.prompt = tok;
    q.n_prompt = n;
    q.pooling = FL_POOLING_MEAN;
    int64_t id;
    q.n = 2;
    assert_int_equal(fl_engine_add(e2, &q, &id), FL_ERR_INVALID);
    q.n = 1;
    q.logprobs = 1;
    assert_int_equal(fl_engine_add(e2, &q, &id), FL_ERR_INVALID);
    q.logprobs = 0;
    q.pooling = (fl_pooling)7;
    assert_int_equal(fl_engine_add(e2, &q, &id), FL_ERR_INVALID);
    fl_engine *e3 = embd_engine(0, 64, FL_KV_PAGED);
    q.pooling = FL_POOLING_LAST;
    assert_int_equal(fl_engine_add(e3, &q, &id), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "embeddings"));
    assert_int_equal(fl_engine_n_embd(e3), 64);
    assert_int_equal(fl_engine_embeddings(e3), 0);
    assert_int_equal(fl_engine_embeddings(e2), 1);
    fl_engine_free(e3);
    /* cancelled before it finishes: no embedding, every block back */
    assert_int_equal(fl_engine_add(e2, &q, &id), FL_OK);
    assert_int_equal(fl_engine_step(e2, NULL), FL_OK);
    assert_int_equal(fl_engine_cancel(e2, id), FL_OK);
    int32_t active = 1;
    while (active) {
        assert_int_equal(fl_engine_step(e2, &active), FL_OK);
        fl_request_output ev[4];
        const int32_t k = fl_engine_poll(e2, ev, 4);
        for (int32_t j = 0; j < k; j++)
            if (ev[j].finish) {
                assert_int_equal(ev[j].finish, FL_FINISH_CANCELLED);
                assert_null(ev[j].embedding);
            }
    }
    fl_engine_stats st;
    fl_engine_stats_get(e2, &st);
    assert_int_equal(st.kv_blocks_used, 0);
    fl_engine_free(e2);
    fl_engine_free(e);
    fl_gguf_free(g);
    cJSON_Delete(ref);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stop_strings),
        cmocka_unit_test(test_toy_batched_equals_alone),
        cmocka_unit_test(test_toy_preempt_recompute),
        cmocka_unit_test(test_toy_preempt_swap), cmocka_unit_test(test_toy_priority),
        cmocka_unit_test(test_toy_logprobs),
        cmocka_unit_test(test_toy_json),
        cmocka_unit_test(test_toy_json_schema),
        cmocka_unit_test(test_toy_choices),
        cmocka_unit_test(test_toy_regex),
        cmocka_unit_test(test_toy_grammar),
        cmocka_unit_test(test_toy_lazy_grammar),
        cmocka_unit_test(test_toy_guide_mem),
        cmocka_unit_test(test_toy_min_tokens_stop_ids),
        cmocka_unit_test(test_toy_allowed_token_ids),
        cmocka_unit_test(test_toy_bad_words),
        cmocka_unit_test(test_toy_static_baseline),
        cmocka_unit_test(test_toy_cancel), cmocka_unit_test(test_toy_forward_error),
        cmocka_unit_test(test_toy_stop_string),
        cmocka_unit_test(test_toy_seeds),
        cmocka_unit_test(test_toy_threads),
        cmocka_unit_test(test_toy_bad_requests),
        cmocka_unit_test(test_paged_equals_alone),
        cmocka_unit_test(test_spec_ngram),
        cmocka_unit_test(test_paged_spec),
        cmocka_unit_test(test_paged_spec_seeded),
        cmocka_unit_test(test_stories_spec),
        cmocka_unit_test(test_paged_prompt_logprobs),
        cmocka_unit_test(test_paged_cancel_frees_blocks),
        cmocka_unit_test(test_paged_n_samples),
        cmocka_unit_test(test_stories_batched_chunked),
        cmocka_unit_test(test_stories_embeddings),
        cmocka_unit_test(test_stories_preempt),
        cmocka_unit_test(test_stories_static_baseline),
        cmocka_unit_test(test_stories_n_samples),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
