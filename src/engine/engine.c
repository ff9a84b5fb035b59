/*
 * engine.c - fl_engine_step(): schedule -> one packed batch -> forward -> sample -> commit.
 *
 * Locking: e->mu guards the request table, the scheduler and the output buffers.  The driver
 * thread holds it while scheduling and while committing, and drops it for the forward, so HTTP
 * threads can add, cancel and poll during the (long) forward.  Requests scheduled for the
 * running forward are not touched by add/cancel: cancel only flags a running request, and the
 * flag is acted on at the next step boundary.
 */
#include "engine/backend.h"
#include "core/clock.h"
#include "engine/engine.h"
#include "engine/grammar.h"
#include "engine/mask_cache.h"
#include "engine/regex_gbnf.h"
#include "engine/regex_guide.h"
#include "engine/sampling.h"
#include "engine/triggers.h"

#include "core/alloc.h"
#include "plan/plan.h"
#include "core/status.h"

#include <math.h>
#include <pthread.h>
#include <xxhash.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct fl_engine {
    fl_engine_params p;
    fl_engine_backend be;
    fl_sched *sched;
    pthread_mutex_t mu;

    fl_request **reqs;  /* every request not yet freed, in creation order */
    int32_t n_reqs, cap_reqs;
    int64_t next_id, next_arrival;

    /* batch buffers [max_tokens] and logits [max_rows][n_vocab] */
    int32_t max_tokens, max_rows;
    int32_t watermark;    /* blocks kept free at admission */
    int32_t *b_tok, *b_pos, *b_seq, *b_lora;
    float *b_mix;         /* with adapters: [max_seqs][n_loras] the adapter mixes of a step (fl_batch.lora_mix) */
    float lora_loaded[FL_ENGINE_MAX_LORAS]; /* each adapter's scale as loaded (fl_engine_params.lora_scales) */
    uint8_t lora_state[FL_ENGINE_MAX_LORAS]; /* LORA_EMPTY, _LOADING, _LOADED or _DRAINING */
    bool in_forward;      /* a step's forward runs (without the lock) */
    int8_t *b_logit;
    float *logits;
    int8_t *b_hid;        /* embeddings: [max_tokens] 1 = the token's final hidden state is pooled */
    float *hidden;        /* [max_tokens][n_embd] those states */
    fl_request **hrow_req; /* [max_tokens] the request of each hidden row, */
    int32_t *hrow_pos;    /* and its prompt position */
    float *poll_embd;     /* poll's copies of finished embeddings */
    int64_t poll_embd_cap;
    fl_request **row_req; /* [max_rows] request that owns each logit row */
    int32_t *row_pos;     /* [max_rows] prompt position whose next token the row scores, or -1:
                           * the row samples, or -2: a draft token's row (its group's first row samples) */
    int32_t *row_spec;    /* [max_rows] a sampling row: draft tokens whose rows follow it */

    /* poll buffers: valid until the next poll */
    int32_t *poll_tok;
    int64_t poll_tok_cap;
    fl_token_logprob *poll_lp;
    int64_t poll_lp_cap;
    char *poll_text;
    int64_t poll_text_cap;

    /* constrained requests: every token's text, and the masked row */
    fl_vocab_text voc;          /* token t's text voc.text[voc.off[t] .. voc.off[t + 1]), the tokens by text */
    uint8_t *vocab_plain;       /* [n_vocab] 1: plain string text (fl_json_plain) */
    uint64_t *gbits;            /* [fl_mask_words(n_vocab)] a grammar mask computed where none are kept */
    uint8_t gbits_key[16];      /* the grammar state whose mask gbits holds (fl_grammar_guide_key), if gbits_valid */
    bool gbits_valid;
    float *masked;              /* [n_vocab] */
    int32_t eog[16], n_eog;     /* end-of-generation ids (masked before a request's min_tokens) */
    fl_mask_cache *masks;       /* regex and grammar requests' token masks by state (guide_masks of them), or NULL */
    int64_t guide_mem;          /* the constraints' budget (fl_engine_guide_mem), set on FL_MEM_GUIDE */
    bool guide_budget_set;
    size_t guide_refused;       /* fl_mem_refused(FL_MEM_GUIDE) when last looked at */

    fl_backend_kv_stats kv_snap; /* taken by the driver under the lock: the cache is never read
                                  * from other threads while a forward may be changing it */
    double t0;
    int64_t steps, finished, generated, prefilled, prefix_hit, prefix_miss;
    int64_t forward_errors;
    int64_t spec_drafts, spec_drafted, spec_accepted;
    double t_forward;
};

void fl_engine_params_default(fl_engine_params *p) {
    memset(p, 0, sizeof *p);
    p->max_seqs = 16;
    p->max_batch_tokens = 512;
    p->kv_block_size = 16;
    p->kv_type = "f16";
    p->prefix_cache = 1;
    p->kv_layout = FL_KV_PAGED;
    p->preempt = FL_PREEMPT_RECOMPUTE;
    p->seed = 1234;
    p->max_logprobs = FL_MAX_TOP_LOGPROBS;
    p->guide_masks = FL_MASK_CACHE_DEFAULT;
    p->guide_mem = -1;
    p->spec_draft_p_min = 0.75f;
    p->max_lora_rank = 16;
}

int64_t fl_engine_guide_mem(const fl_engine_params *p) {
    if (p->guide_mem >= 0) return p->guide_mem;
    return p->mem_total > 0 && p->mem_total / 16 < FL_GUIDE_MEM_DEFAULT ? p->mem_total / 16 : FL_GUIDE_MEM_DEFAULT;
}

void fl_sampling_params_default(fl_sampling_params *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 0.0f;
    p->top_p = 1.0f;
    p->repeat_penalty = 1.0f;
    p->penalty_last_n = 64;
}

/* ---- sampling: each request owns an fl_sampler (sampling.h) with its own seeded RNG ---- */

static fl_status req_sampler_new(fl_engine *e, fl_request *r, const fl_logit_bias *bias, int32_t n_bias) {
    const fl_sampling_params *sp = &r->sampling;
    fl_sampler_params q = {
        .temp = sp->temperature,
        .top_k = sp->top_k,
        .top_p = sp->top_p > 0 ? sp->top_p : 1.0f,                       /* 0 (a zeroed struct) = off */
        .min_p = sp->min_p,
        .repeat_penalty = sp->repeat_penalty > 0 ? sp->repeat_penalty : 1.0f, /* 0 = off */
        .freq_penalty = sp->frequency_penalty,
        .presence_penalty = sp->presence_penalty,
        .penalty_last_n = sp->penalty_last_n,
        .seed = r->rng, /* sampling.seed mixed with the sample index */
        .bias = bias,
        .n_bias = n_bias,
    };
    fl_sampler *smp = NULL;
    fl_status st = fl_sampler_new(&q, e->be.n_vocab, &smp);
    r->sampler = smp;
    return st;
}

static void req_free(fl_request *r) {
    if (!r) return;
    fl_sampler_free((fl_sampler *)r->sampler);
    fl_free(FL_MEM_MISC, r->embd, (size_t)r->n_embd * sizeof *r->embd);
    fl_free(FL_MEM_GUIDE, r->allowed, (size_t)r->allowed_words * sizeof *r->allowed);
    fl_free(FL_MEM_GUIDE, r->bad, (size_t)r->bad_ints * sizeof *r->bad);
    fl_request_free(r);
}

static void commit_token(fl_engine *e, fl_request *r, int32_t tok);
static void finish(fl_engine *e, fl_request *r, fl_finish_reason why);

/* Every token's text (as generated text shows it) and their order by text, once, for the constraints. */
static fl_status vocab_text_build(fl_engine *e) {
    const int32_t nv = e->be.n_vocab;
    fl_status st = fl_vocab_text_build(&e->voc, nv, e->be.piece, e->be.ctx);
    if (st != FL_OK) return st;
    if (!(e->masked = fl_alloc(FL_MEM_MISC, (size_t)nv * sizeof *e->masked, 64)) || !(e->vocab_plain = fl_alloc(FL_MEM_MISC, (size_t)nv, 0)) ||
        !(e->gbits = fl_alloc(FL_MEM_MISC, fl_mask_words(nv) * 8, 0)))
        return fl_set_error(FL_ERR_NOMEM, "constraints: no memory for the vocabulary's text"); /* (freed with the engine) */
    for (int32_t t = 0; t < nv; t++) {
        e->vocab_plain[t] = fl_json_plain(e->voc.text + e->voc.off[t], (int32_t)(e->voc.off[t + 1] - e->voc.off[t]));
        if (e->be.is_eog && e->be.is_eog(e->be.ctx, t) && e->n_eog < (int32_t)(sizeof e->eog / sizeof e->eog[0])) e->eog[e->n_eog++] = t;
    }
    return FL_OK;
}

/* e->masked := row with every token that cannot continue r's JSON (or choice) at -inf: empty
 * tokens always, end-of-generation unless a choice is complete here (a JSON request finishes
 * when its value closes). */
static fl_status json_mask(fl_engine *e, fl_request *r, const float *row) {
    int32_t allowed = 0;
    const bool in_str = fl_json_fsm_in_string(r->json_fsm); /* plain text goes through as it is */
    const bool may_end = fl_json_fsm_may_end(r->json_fsm) && !r->ignore_eos;
    bool first[256];                                          /* bytes that can come next */
    fl_json_fsm f;
    for (int c = 0; c < 256; c++) {
        fl_json_fsm_copy(&f, r->json_fsm);
        const char b = (char)c;
        first[c] = fl_json_fsm_feed(&f, &b, 1);
    }
    for (int32_t t = 0; t < e->be.n_vocab; t++) {
        const int64_t a = e->voc.off[t], n = e->voc.off[t + 1] - a;
        bool ok = n > 0 && first[(unsigned char)e->voc.text[a]];
        if (ok && !(in_str && e->vocab_plain[t])) {
            fl_json_fsm_copy(&f, r->json_fsm);
            ok = fl_json_fsm_feed(&f, e->voc.text + a, (int32_t)n);
        }
        if (e->be.is_eog && e->be.is_eog(e->be.ctx, t)) ok = may_end; /* (choices: where one is complete) */
        e->masked[t] = ok ? row[t] : -INFINITY;
        allowed += ok;
    }
    return allowed ? FL_OK : fl_set_error(FL_ERR_INVALID, "json constraint: no token of the vocabulary continues the %s", r->schema ? "schema's value" : "object");
}

/* Token t may continue r's regex (1), may not (0), or an error (-1, set): empty tokens never;
 * first[] holds the answers for the single bytes (1 can come next, 0 cannot, -1 check the
 * token: a UTF-8 lead byte is looked at with the token, as the text ends on a whole character). */
static int regex_token(fl_engine *e, fl_request *r, const int8_t first[256], int32_t t) {
    const int64_t a = e->voc.off[t], n = e->voc.off[t + 1] - a;
    int ok = n > 0 ? first[(unsigned char)e->voc.text[a]] : 0;
    if (ok && (n > 1 || ok < 0)) ok = fl_regex_guide_allows(r->regex, e->voc.text + a, (size_t)n);
    return ok;
}

static fl_status regex_first(fl_request *r, int8_t first[256]) {
    for (int c = 0; c < 256; c++) {
        if (c >= 0x80) {
            first[c] = c >= 0xC2 && c <= 0xF4 ? -1 : 0;
            continue;
        }
        const char b = (char)c;
        const int ok = fl_regex_guide_allows(r->regex, &b, 1);
        if (ok < 0) return FL_ERR_INVALID;
        first[c] = (int8_t)ok;
    }
    return FL_OK;
}

static bool is_eog(const fl_engine *e, int32_t t) { return e->be.is_eog && e->be.is_eog(e->be.ctx, t); }

/* The tokens other than end-of-generation that may continue r's regex, as a mask (bit t), for
 * the guide's state of key: the engine's kept mask, else computed and kept.  NULL on an error
 * (set). */
static const uint64_t *regex_bits(fl_engine *e, fl_request *r, const uint8_t key[16]) {
    const uint64_t *kept = fl_mask_cache_get(e->masks, key);
    if (kept) return kept;
    uint64_t *m = fl_mask_cache_work(e->masks);
    int8_t first[256];
    if (regex_first(r, first) != FL_OK) return NULL;
    memset(m, 0, fl_mask_words(e->be.n_vocab) * 8);
    for (int32_t t = 0; t < e->be.n_vocab; t++) {
        if (is_eog(e, t)) continue;
        const int ok = regex_token(e, r, first, t);
        if (ok < 0) return NULL;
        if (ok) m[t >> 6] |= (uint64_t)1 << (t & 63);
    }
    fl_mask_cache_put(e->masks, key);
    return m;
}

/* e->masked := row with the tokens of mask m (bits) and, where may_end, end-of-generation; every
 * other token at -inf.  The number of tokens left. */
static int32_t mask_row(fl_engine *e, const uint64_t *m, bool may_end, const float *row) {
    int32_t allowed = 0;
    for (int32_t t = 0; t < e->be.n_vocab; t++) {
        const bool ok = is_eog(e, t) ? may_end : (m[t >> 6] >> (t & 63)) & 1;
        e->masked[t] = ok ? row[t] : -INFINITY;
        allowed += ok;
    }
    return allowed;
}

static bool mask_empty(const fl_engine *e, const uint64_t *m) {
    for (size_t w = 0; w < fl_mask_words(e->be.n_vocab); w++)
        if (m[w]) return false;
    return true;
}

/* e->masked := row with every token that cannot continue r's regex at -inf (regex_token);
 * end-of-generation only where the text so far is a match.  From the kept mask of the guide's
 * state where it has a key (regex_bits), else checked token by token. */
static fl_status regex_mask(fl_engine *e, fl_request *r, const float *row) {
    int32_t allowed = 0;
    const bool may_end = !r->ignore_eos && fl_regex_guide_complete(r->regex);
    uint8_t key[16];
    if (e->masks && fl_regex_guide_key(r->regex, key)) {
        const uint64_t *m = regex_bits(e, r, key);
        if (!m) return FL_ERR_INVALID;
        allowed = mask_row(e, m, may_end, row);
    } else {
        int8_t first[256];
        if (regex_first(r, first) != FL_OK) return FL_ERR_INVALID;
        for (int32_t t = 0; t < e->be.n_vocab; t++) {
            int ok = is_eog(e, t) ? may_end : regex_token(e, r, first, t);
            if (ok < 0) return FL_ERR_INVALID;
            e->masked[t] = ok ? row[t] : -INFINITY;
            allowed += ok != 0;
        }
    }
    return allowed ? FL_OK : fl_set_error(FL_ERR_INVALID, "regex constraint: no token of the vocabulary continues a match");
}

/* r's text is a match that no token of the vocabulary (other than end-of-generation) extends:
 * its request is over.  From the state's mask where it has a key (the next step's mask, kept),
 * else token by token up to the first that extends it.  (An error: not closed; the next mask
 * says it.) */
static bool regex_closed(fl_engine *e, fl_request *r) {
    if (!fl_regex_guide_complete(r->regex)) return false;
    uint8_t key[16];
    if (e->masks && fl_regex_guide_key(r->regex, key)) {
        const uint64_t *m = regex_bits(e, r, key);
        return m && mask_empty(e, m);
    }
    int8_t first[256];
    if (regex_first(r, first) != FL_OK) return false;
    for (int32_t t = 0; t < e->be.n_vocab; t++)
        if (!is_eog(e, t) && regex_token(e, r, first, t) != 0) return false;
    return true;
}

/* The tokens other than end-of-generation that may continue r's grammar, as a mask: the kept
 * mask of the state's key, else walked over the sorted vocabulary (fl_grammar_guide_mask) and
 * kept (or, where the engine keeps none, in e->gbits).  NULL on an error (set). */
static const uint64_t *grammar_bits(fl_engine *e, fl_request *r) {
    uint8_t key[16];
    uint64_t *m = e->gbits;
    fl_grammar_guide_key(r->grammar, key);
    if (e->masks) {
        const uint64_t *kept = fl_mask_cache_get(e->masks, key);
        if (kept) return kept;
        m = fl_mask_cache_work(e->masks);
    } else if (e->gbits_valid && !memcmp(e->gbits_key, key, 16)) {
        return m; /* the state's mask, computed last (a sentence that can go on: grammar_closed then the next sample) */
    }
    e->gbits_valid = false;
    if (fl_grammar_guide_mask(r->grammar, e->voc.text, e->voc.off, e->voc.order, e->be.n_vocab, m) != FL_OK) return NULL;
    for (int32_t t = 0; t < e->be.n_vocab; t++)
        if (is_eog(e, t)) m[t >> 6] &= ~((uint64_t)1 << (t & 63));
    if (e->masks) fl_mask_cache_put(e->masks, key);
    else memcpy(e->gbits_key, key, 16), e->gbits_valid = true;
    return m;
}

/* e->masked := row with every token that cannot continue r's grammar at -inf; end-of-generation
 * only where the text so far is a sentence. */
static fl_status grammar_mask(fl_engine *e, fl_request *r, const float *row) {
    const uint64_t *m = grammar_bits(e, r);
    if (!m) return FL_ERR_INVALID;
    const bool may_end = !r->ignore_eos && fl_grammar_guide_complete(r->grammar);
    return mask_row(e, m, may_end, row) ? FL_OK : fl_set_error(FL_ERR_INVALID, "grammar constraint: no token of the vocabulary continues a sentence");
}

/* r's text is a sentence that no token extends (the next step's mask, kept where masks are) */
static bool grammar_closed(fl_engine *e, fl_request *r) {
    if (!fl_grammar_guide_complete(r->grammar)) return false;
    if (fl_grammar_guide_finished(r->grammar)) return true;
    const uint64_t *m = grammar_bits(e, r);
    return m && mask_empty(e, m);
}

/* Feed the token tok's text s[0, n) to r's grammar.  A lazy grammar's output is free until a
 * trigger fires (triggers.h): the output is kept until then, and from the point the trigger names
 * on it is fed to the grammar, which constrains every token after. */
static fl_status grammar_take(fl_request *r, const char *s, size_t n, int32_t tok) {
    if (!r->lazy) return fl_grammar_guide_feed(r->grammar, s, n);
    if (r->ltext_len + n + 1 > r->ltext_cap) {
        const size_t cap = (size_t)fl_cap_double(r->ltext_cap ? (int64_t)r->ltext_cap : 256, (int64_t)(r->ltext_len + n + 1));
        char *t = fl_realloc(FL_MEM_GUIDE, r->ltext, r->ltext_cap, cap, 0);
        if (!t) return fl_set_error(FL_ERR_NOMEM, "lazy grammar: no memory for the output");
        r->ltext = t;
        r->ltext_cap = cap;
    }
    memcpy(r->ltext + r->ltext_len, s, n);
    r->ltext_len += n;
    const int64_t at = fl_triggers_find(r->triggers, r->ltext, r->ltext_len, n, tok);
    if (at == -2) return FL_ERR_INVALID;
    if (at < 0) return FL_OK;
    r->lazy = false;
    if (fl_grammar_guide_feed(r->grammar, r->ltext + at, r->ltext_len - (size_t)at) != FL_OK)
        return fl_set_error(FL_ERR_INVALID, "lazy grammar: the output from its trigger on (%.*s) is no sentence's start",
                            (int)(r->ltext_len - (size_t)at > 80 ? 80 : r->ltext_len - (size_t)at), r->ltext + at);
    fl_free(FL_MEM_GUIDE, r->ltext, r->ltext_cap);
    r->ltext = NULL;
    r->ltext_len = r->ltext_cap = 0;
    return FL_OK;
}

/* Sample r's next token from its logits row (only read) and commit it, with its logprobs when
 * the request wants them; a JSON request samples among the tokens that keep its object valid
 * (its logprobs stay those of the unconstrained row) and finishes when the object closes. */
static void sample_commit(fl_engine *e, fl_request *r, const float *row) {
    const bool gram = r->grammar && !r->lazy; /* (a lazy grammar constrains from its trigger on) */
    if ((r->json && json_mask(e, r, row) != FL_OK) || (r->regex && regex_mask(e, r, row) != FL_OK) ||
        (gram && grammar_mask(e, r, row) != FL_OK)) {
        finish(e, r, FL_FINISH_ERROR);
        return;
    }
    /* the row masked (a copy) where anything takes tokens out: a constraint (done above), no end
     * before min_tokens, bad_words, allowed_token_ids */
    const bool no_end = fl_request_n_generated(r) < r->min_tokens && (e->n_eog || r->n_stop_ids);
    const bool constrained = r->json || r->regex || gram, masked = constrained || no_end || r->bad || r->allowed;
    if (masked && !constrained) memcpy(e->masked, row, (size_t)e->be.n_vocab * sizeof *e->masked);
    const float *src = masked ? e->masked : row;
    if (no_end) {
        for (int32_t i = 0; i < e->n_eog; i++) e->masked[e->eog[i]] = -INFINITY;
        for (int32_t i = 0; i < r->n_stop_ids; i++) e->masked[r->stop_ids[i]] = -INFINITY;
    }
    if (r->bad) { /* bad_words: the last token of a sequence whose rest the output ends with */
        const int32_t ng = fl_request_n_generated(r);
        const int32_t *gen = r->tokens + r->n_prompt;
        for (int32_t k = 0, o = 0; k < r->n_bad; k++) {
            const int32_t len = r->bad[o], *seq = r->bad + o + 1;
            o += 1 + len;
            if (len - 1 <= ng && !memcmp(gen + ng - (len - 1), seq, (size_t)(len - 1) * sizeof *seq)) e->masked[seq[len - 1]] = -INFINITY;
        }
    }
    if (r->allowed || r->bad) { /* allowed_token_ids: every other token out; and some token must be left */
        int32_t left = 0;
        for (int32_t t = 0; t < e->be.n_vocab; t++) {
            if (r->allowed && !((r->allowed[t >> 6] >> (t & 63)) & 1)) e->masked[t] = -INFINITY;
            left += e->masked[t] > -INFINITY;
        }
        if (!left) {
            fl_set_error(FL_ERR_INVALID, "allowed_token_ids / bad_words: no token may come next here");
            finish(e, r, FL_FINISH_ERROR);
            return;
        }
    }
    const int32_t tok = fl_sample(r->sampler, src, e->be.n_vocab, r->tokens, r->n_tokens);
    if (r->logprobs) {
        fl_token_logprob *lp = r->lp + (size_t)fl_request_n_generated(r) * (size_t)(1 + r->n_top);
        lp[0].token = tok;
        fl_logprobs(row, e->be.n_vocab, tok, r->n_top, &lp[0].logprob, lp + 1);
    }
    if (r->json && !(e->be.is_eog && e->be.is_eog(e->be.ctx, tok))) { /* (end-of-generation ends a choice: no text) */
        const bool fed = fl_json_fsm_feed(r->json_fsm, e->voc.text + e->voc.off[tok], (int32_t)(e->voc.off[tok + 1] - e->voc.off[tok]));
        FL_ASSERT(fed); /* the mask let only such tokens through */
    }
    if (r->regex && !(e->be.is_eog && e->be.is_eog(e->be.ctx, tok)) &&
        fl_regex_guide_feed(r->regex, e->voc.text + e->voc.off[tok], (size_t)(e->voc.off[tok + 1] - e->voc.off[tok])) != FL_OK) {
        finish(e, r, FL_FINISH_ERROR);
        return;
    }
    if (r->grammar && !is_eog(e, tok) && grammar_take(r, e->voc.text + e->voc.off[tok], (size_t)(e->voc.off[tok + 1] - e->voc.off[tok]), tok) != FL_OK) {
        finish(e, r, FL_FINISH_ERROR);
        return;
    }
    commit_token(e, r, tok);
    if (r->json && fl_json_fsm_done(r->json_fsm)) finish(e, r, FL_FINISH_STOP);
    if (r->regex && r->state != FL_REQ_FINISHED && regex_closed(e, r)) finish(e, r, FL_FINISH_STOP);
    if (r->grammar && !r->lazy && r->state != FL_REQ_FINISHED && grammar_closed(e, r)) {
        if (!r->lazy_repeat) {
            finish(e, r, FL_FINISH_STOP);
            return;
        }
        /* (vLLM's structural_tag) the structure is over: free text again, until the next trigger */
        if (fl_grammar_guide_reset(r->grammar) != FL_OK) {
            finish(e, r, FL_FINISH_ERROR);
            return;
        }
        fl_triggers_rearm(r->triggers);
        r->lazy = true;
    }
}

/* ---- engine life cycle ---- */

enum { LORA_EMPTY, LORA_LOADING, LORA_LOADED, LORA_DRAINING }; /* a run-time adapter slot */

static void lora_reap(fl_engine *e);

/* Every adapter of mix is loaded (e->mu held). */
static bool mix_loaded(const fl_engine *e, const float *mix) {
    for (int32_t k = 0; k < e->p.n_loras; k++)
        if (mix[k] != 0.0f && e->lora_state[k] != LORA_LOADED) return false;
    return true;
}

#define REQS_CAP0 64  /* the request table's first capacity; it doubles */
#define POLL_CAP0 256 /* the poll buffers' first capacity (elements); they double */

size_t fl_engine_misc_bytes(int32_t max_seqs, int32_t rows, int32_t max_logprobs, double piece_bytes) {
    const int64_t text = (int64_t)rows * (int64_t)piece_bytes + (int64_t)max_seqs * 3 + 1; /* their pieces, + each request's NUL + an empty error's */
    return sizeof(fl_engine) + fl_sched_misc_bytes(max_seqs, max_seqs) + sizeof(fl_request *) * (size_t)fl_cap_double(REQS_CAP0, max_seqs) +
           sizeof(int32_t) * (size_t)fl_cap_double(POLL_CAP0, (int64_t)rows + 1) + (size_t)fl_cap_double(POLL_CAP0, text) +
           (max_logprobs < 0 ? sizeof(fl_token_logprob) * POLL_CAP0 : 0);
}

static fl_status table_push(fl_engine *e, fl_request *r) {
    if (e->n_reqs == e->cap_reqs) {
        int32_t nc = e->cap_reqs ? e->cap_reqs * 2 : REQS_CAP0;
        fl_request **v = fl_realloc(FL_MEM_MISC, e->reqs, (size_t)e->cap_reqs * sizeof *v, (size_t)nc * sizeof *v, 0);
        if (!v) return FL_ERR_NOMEM;
        e->reqs = v;
        e->cap_reqs = nc;
    }
    e->reqs[e->n_reqs++] = r;
    return FL_OK;
}

static void free_buffers(fl_engine *e) {
    int64_t nv = e->be.n_vocab;
    fl_free(FL_MEM_SCRATCH, e->b_tok, (size_t)e->max_tokens * sizeof(int32_t));
    fl_free(FL_MEM_SCRATCH, e->b_pos, (size_t)e->max_tokens * sizeof(int32_t));
    fl_free(FL_MEM_SCRATCH, e->b_seq, (size_t)e->max_tokens * sizeof(int32_t));
    fl_free(FL_MEM_SCRATCH, e->b_lora, (size_t)e->max_tokens * sizeof(int32_t));
    fl_free(FL_MEM_SCRATCH, e->b_mix, (size_t)e->p.max_seqs * (size_t)e->p.n_loras * sizeof(float));
    fl_free(FL_MEM_SCRATCH, e->b_logit, (size_t)e->max_tokens);
    fl_free(FL_MEM_ACT, e->logits, (size_t)e->max_rows * (size_t)nv * sizeof(float));
    fl_free(FL_MEM_SCRATCH, e->row_req, (size_t)e->max_rows * sizeof(fl_request *));
    fl_free(FL_MEM_SCRATCH, e->row_pos, (size_t)e->max_rows * sizeof(int32_t));
    fl_free(FL_MEM_SCRATCH, e->row_spec, (size_t)e->max_rows * sizeof(int32_t));
    fl_free(FL_MEM_MISC, e->poll_tok, (size_t)e->poll_tok_cap * sizeof(int32_t));
    fl_free(FL_MEM_MISC, e->poll_text, (size_t)e->poll_text_cap);
    fl_free(FL_MEM_MISC, e->poll_lp, (size_t)e->poll_lp_cap * sizeof(fl_token_logprob));
    fl_free(FL_MEM_MISC, e->poll_embd, (size_t)e->poll_embd_cap * sizeof(float));
    fl_free(FL_MEM_SCRATCH, e->b_hid, (size_t)e->max_tokens);
    fl_free(FL_MEM_ACT, e->hidden, e->hidden ? (size_t)e->max_tokens * (size_t)e->be.n_embd * sizeof(float) : 0);
    fl_free(FL_MEM_SCRATCH, e->hrow_req, (size_t)e->max_tokens * sizeof(fl_request *));
    fl_free(FL_MEM_SCRATCH, e->hrow_pos, (size_t)e->max_tokens * sizeof(int32_t));
    fl_vocab_text_free(&e->voc);
    fl_free(FL_MEM_MISC, e->masked, e->masked ? (size_t)nv * sizeof(float) : 0);
    fl_free(FL_MEM_MISC, e->vocab_plain, e->vocab_plain ? (size_t)nv : 0);
    fl_free(FL_MEM_MISC, e->gbits, e->gbits ? fl_mask_words(nv) * 8 : 0);
    fl_mask_cache_free(e->masks);
}

fl_status fl_engine_new_backend(const fl_engine_params *p, const fl_engine_backend *be, fl_engine **out) {
    *out = NULL;
    fl_status st = FL_OK;
    fl_engine *e = fl_calloc(FL_MEM_MISC, 1, sizeof *e);
    if (!e) {
        if (be->free) be->free(be->ctx);
        return FL_ERR_NOMEM;
    }
    e->p = *p;
    e->be = *be;
    pthread_mutex_init(&e->mu, NULL);
    if (e->p.n_loras < 0 || e->p.lora_slots < 0 || e->p.n_loras + e->p.lora_slots > FL_ENGINE_MAX_LORAS ||
        (e->p.lora_slots > 0 && (!be->lora_open || !be->lora_put || !be->lora_close))) {
        st = fl_set_error(FL_ERR_INVALID, "%s: %d LoRA adapters + %d slots (at most %d in all; slots need a backend that loads them)",
                          __func__, e->p.n_loras, e->p.lora_slots, FL_ENGINE_MAX_LORAS);
        e->p.n_loras = 0;
        goto fail;
    }
    for (int32_t k = 0; k < e->p.n_loras; k++) {
        e->lora_loaded[k] = e->p.lora_scales ? e->p.lora_scales[k] : 1.0f;
        e->lora_state[k] = LORA_LOADED;
    }
    e->p.n_loras += e->p.lora_slots; /* from here, every slot (the run-time ones empty) */
    e->p.lora_paths = NULL; /* (the caller's; the backend opened them) */
    e->p.lora_scales = NULL;
    if (e->p.max_logprobs > FL_MAX_TOP_LOGPROBS || e->p.max_logprobs < -1) {
        st = fl_set_error(FL_ERR_INVALID, "%s: max_logprobs %d, accepted -1..%d", __func__, e->p.max_logprobs, FL_MAX_TOP_LOGPROBS);
        goto fail;
    }
    if (e->p.guide_masks < 0) {
        st = fl_set_error(FL_ERR_INVALID, "%s: guide_masks %d (0: none)", __func__, e->p.guide_masks);
        goto fail;
    }
    if (e->p.guide_mem < -1) {
        st = fl_set_error(FL_ERR_INVALID, "%s: guide_mem %lld (-1: the default, 0: no constrained requests)", __func__,
                          (long long)e->p.guide_mem);
        goto fail;
    }
    /* the constraints' budget: 0 refuses them at fl_engine_add (a 1-byte budget backs that up) */
    e->guide_mem = fl_engine_guide_mem(&e->p);
    fl_mem_set_budget(FL_MEM_GUIDE, e->guide_mem > 0 ? (size_t)e->guide_mem : 1);
    e->guide_budget_set = true;
    if (e->p.net_mem < 0) {
        st = fl_set_error(FL_ERR_INVALID, "%s: net_mem %lld (0: none)", __func__, (long long)e->p.net_mem);
        goto fail;
    }
    if (e->p.net_mem > 0) fl_mem_set_budget(FL_MEM_NET, (size_t)e->p.net_mem);
    e->guide_refused = fl_mem_refused(FL_MEM_GUIDE);
    if (e->p.max_seqs < 1 || e->p.max_batch_tokens < 1 || be->n_vocab < 1) {
        st = fl_set_error(FL_ERR_INVALID, "%s: max_seqs (%d) and max_batch_tokens (%d) must be >= 1", __func__,
                          e->p.max_seqs, e->p.max_batch_tokens);
        goto fail;
    }
    if (e->p.spec_tokens < 0 || e->p.spec_tokens > FL_SPEC_MAX || e->p.spec_ngram_min < 0 || e->p.spec_ngram_max < 0 ||
        e->p.spec_ngram_max > FL_SPEC_MAX || e->p.spec_disable_batch < 0 || !(e->p.spec_draft_p_min >= 0 && e->p.spec_draft_p_min <= 1)) {
        st = fl_set_error(FL_ERR_INVALID, "%s: spec_tokens %d, n-grams %d..%d (accepted 0..%d)", __func__, e->p.spec_tokens,
                          e->p.spec_ngram_min, e->p.spec_ngram_max, FL_SPEC_MAX);
        goto fail;
    }
    if (!e->p.spec_ngram_min) e->p.spec_ngram_min = FL_SPEC_NGRAM_MIN;
    if (!e->p.spec_ngram_max) e->p.spec_ngram_max = e->p.spec_ngram_min > FL_SPEC_NGRAM_MAX ? e->p.spec_ngram_min : FL_SPEC_NGRAM_MAX;
    if (e->p.spec_ngram_min > e->p.spec_ngram_max) {
        st = fl_set_error(FL_ERR_INVALID, "%s: spec n-grams %d..%d: the shortest is longer than the longest", __func__,
                          e->p.spec_ngram_min, e->p.spec_ngram_max);
        goto fail;
    }
    if (be->draft_add && (e->p.spec_tokens < 1 || !be->draft_run)) {
        st = fl_set_error(FL_ERR_INVALID, "%s: a draft model needs spec_tokens >= 1", __func__);
        goto fail;
    }
    if (e->p.spec_tokens > 0 && (!be->kv.truncate || e->p.kv_layout == FL_KV_CONTIGUOUS)) {
        st = fl_set_error(FL_ERR_UNSUPPORTED, "%s: speculative decoding needs the paged KV cache", __func__);
        goto fail;
    }
    /* static padding rows take one token each on top of the budget's decodes */
    e->max_tokens = e->p.max_batch_tokens + e->p.max_seqs;
    e->max_rows = fl_engine_rows(e->p.max_seqs, e->p.spec_tokens, e->p.max_batch_tokens);
    int64_t nv = be->n_vocab;
    e->b_tok = fl_alloc(FL_MEM_SCRATCH, (size_t)e->max_tokens * sizeof(int32_t), 0);
    e->b_pos = fl_alloc(FL_MEM_SCRATCH, (size_t)e->max_tokens * sizeof(int32_t), 0);
    e->b_seq = fl_alloc(FL_MEM_SCRATCH, (size_t)e->max_tokens * sizeof(int32_t), 0);
    e->b_lora = fl_alloc(FL_MEM_SCRATCH, (size_t)e->max_tokens * sizeof(int32_t), 0);
    if (e->p.n_loras > 0 && !(e->b_mix = fl_alloc(FL_MEM_SCRATCH, (size_t)e->p.max_seqs * (size_t)e->p.n_loras * sizeof(float), 0))) {
        st = FL_ERR_NOMEM;
        goto fail;
    }
    e->b_logit = fl_alloc(FL_MEM_SCRATCH, (size_t)e->max_tokens, 0);
    e->logits = fl_alloc(FL_MEM_ACT, (size_t)e->max_rows * (size_t)nv * sizeof(float), 0);
    e->row_req = fl_alloc(FL_MEM_SCRATCH, (size_t)e->max_rows * sizeof(fl_request *), 0);
    e->row_pos = fl_alloc(FL_MEM_SCRATCH, (size_t)e->max_rows * sizeof(int32_t), 0);
    e->row_spec = fl_alloc(FL_MEM_SCRATCH, (size_t)e->max_rows * sizeof(int32_t), 0);
    if (!e->b_tok || !e->b_pos || !e->b_seq || !e->b_lora || !e->b_logit || !e->logits || !e->row_req || !e->row_pos || !e->row_spec) {
        st = FL_ERR_NOMEM;
        goto fail;
    }
    if (e->p.embeddings) { /* (plan_engine.c counts these) */
        if (be->n_embd < 1) {
            st = fl_set_error(FL_ERR_INVALID, "%s: this backend gives no hidden states (embeddings)", __func__);
            goto fail;
        }
        e->b_hid = fl_alloc(FL_MEM_SCRATCH, (size_t)e->max_tokens, 0);
        e->hidden = fl_alloc(FL_MEM_ACT, (size_t)e->max_tokens * (size_t)be->n_embd * sizeof(float), 0);
        e->hrow_req = fl_alloc(FL_MEM_SCRATCH, (size_t)e->max_tokens * sizeof(fl_request *), 0);
        e->hrow_pos = fl_alloc(FL_MEM_SCRATCH, (size_t)e->max_tokens * sizeof(int32_t), 0);
        if (!e->b_hid || !e->hidden || !e->hrow_req || !e->hrow_pos) {
            st = FL_ERR_NOMEM;
            goto fail;
        }
    }
    /* ~1% of the pool (at least one block) stays free at admission */
    e->watermark = e->p.kv_layout == FL_KV_CONTIGUOUS ? 0 : (int32_t)(be->n_blocks / 100 > 1 ? be->n_blocks / 100 : 1);
    fl_sched_params sp = {
        .max_seqs = e->p.max_seqs,
        .max_batch_tokens = e->p.max_batch_tokens,
        .watermark_blocks = e->watermark,
        .preempt = e->p.preempt,
        .static_batch = e->p.kv_layout == FL_KV_CONTIGUOUS,
        .policy = e->p.sched_policy,
        .max_rows = e->max_rows,
    };
    st = fl_sched_new(&sp, &be->kv, &e->sched);
    if (st != FL_OK) goto fail;
    st = vocab_text_build(e); /* for JSON requests; built here so that the plan counts it */
    if (st != FL_OK) goto fail;
    if (e->p.guide_masks > 0 && (st = fl_mask_cache_new(e->p.guide_masks, be->n_vocab, &e->masks)) != FL_OK) goto fail;
    if (e->be.kv_stats) e->be.kv_stats(e->be.ctx, &e->kv_snap);
    e->t0 = fl_clock_s();
    *out = e;
    return FL_OK;
fail:
    fl_engine_free(e);
    return st;
}

void fl_engine_free(fl_engine *e) {
    if (!e) return;
    for (int32_t i = 0; i < e->n_reqs; i++) {
        if (e->sched) fl_sched_remove(e->sched, e->reqs[i], false);
        req_free(e->reqs[i]);
    }
    fl_free(FL_MEM_MISC, e->reqs, (size_t)e->cap_reqs * sizeof *e->reqs);
    fl_sched_free(e->sched);
    free_buffers(e);
    if (e->be.free) e->be.free(e->be.ctx);
    pthread_mutex_destroy(&e->mu);
    const bool budget = e->guide_budget_set, net = e->p.net_mem > 0;
    fl_free(FL_MEM_MISC, e, sizeof *e);
    if (budget) fl_mem_set_budget(FL_MEM_GUIDE, 0);
    if (net) fl_mem_set_budget(FL_MEM_NET, 0);
}

/* ---- requests ---- */

static fl_request *find_req(fl_engine *e, int64_t id, int32_t sample) {
    for (int32_t i = 0; i < e->n_reqs; i++)
        if (e->reqs[i]->id == id && e->reqs[i]->sample == sample) return e->reqs[i];
    return NULL;
}

/* A request that failed with st: where an allocation passed the constraints' budget on the way
 * (the refusal count moved from refused0), say so.  FL_ERR_INVALID when nothing else holds
 * constraint memory (the request alone needs more than guide_mem), FL_ERR_BUDGET when the queued
 * and running requests hold it (it may fit later). */
static fl_status guide_refusal(fl_engine *e, fl_status st, size_t refused0) {
    const size_t refused = fl_mem_refused(FL_MEM_GUIDE);
    if (refused == refused0) return st;
    e->guide_refused = refused; /* (seen: not a later step's) */
    char b[32], u[32];
    fl_plan_fmt_bytes((uint64_t)e->guide_mem, b, sizeof b);
    const size_t used = fl_mem_current(FL_MEM_GUIDE);
    if (used == 0)
        return fl_set_error(FL_ERR_INVALID, "the request's output constraint needs more memory than guide_mem (%s) allows", b);
    fl_plan_fmt_bytes(used, u, sizeof u);
    return fl_set_error(FL_ERR_BUDGET, "output constraints: %s of guide_mem (%s) is held by the queued and running requests; "
                        "this one does not fit now", u, b);
}

fl_status fl_engine_add(fl_engine *e, const fl_request_params *p, int64_t *id) {
    if (!p || !p->prompt || p->n_prompt < 1)
        return fl_set_error(FL_ERR_INVALID, "%s: empty prompt", __func__);
    int32_t n = p->n > 0 ? p->n : 1;
    if (n > e->p.max_seqs)
        return fl_set_error(FL_ERR_INVALID, "%s: n = %d samples > max_seqs %d", __func__, n, e->p.max_seqs);
    int32_t max_tokens = p->max_tokens;
    if ((int64_t)p->n_prompt + 1 > e->be.n_ctx)
        return fl_set_error(FL_ERR_INVALID, "%s: prompt of %d tokens does not fit the context of %d", __func__,
                            p->n_prompt, e->be.n_ctx);
    if (max_tokens <= 0 || (int64_t)p->n_prompt + max_tokens > e->be.n_ctx) max_tokens = e->be.n_ctx - p->n_prompt;
    /* a request must fit the pool on its own, or it could never finish */
    int64_t bs = e->be.block_size;
    int64_t need = ((int64_t)p->n_prompt + max_tokens + bs - 1) / bs;
    int64_t avail = e->be.n_blocks - e->watermark;
    if (need > avail)
        return fl_set_error(FL_ERR_INVALID, "%s: prompt + max_tokens = %lld tokens need %lld KV blocks, the pool has %lld",
                            __func__, (long long)p->n_prompt + max_tokens, (long long)need, (long long)avail);
    if (p->lora < 0 || p->lora > e->p.n_loras)
        return fl_set_error(FL_ERR_INVALID, "%s: LoRA adapter %d; this engine has %d", __func__, p->lora, e->p.n_loras);
    if (p->spec_max < -1 || p->spec_max > FL_SPEC_MAX || p->spec_min < 0 || p->spec_min > FL_SPEC_MAX ||
        (p->spec_p_min_set && !(p->spec_p_min >= 0 && p->spec_p_min <= 1)))
        return fl_set_error(FL_ERR_INVALID, "%s: speculative n_max %d (-1..%d), n_min %d (0..%d), p_min %g (0..1)", __func__,
                            p->spec_max, FL_SPEC_MAX, p->spec_min, FL_SPEC_MAX, p->spec_p_min_set ? (double)p->spec_p_min : 0.0);
    if (p->lora_scales && p->lora)
        return fl_set_error(FL_ERR_INVALID, "%s: a LoRA adapter and adapter scales: one or the other", __func__);
    /* the request's adapter mix: each adapter's scale (0: not applied) */
    float mix[FL_ENGINE_MAX_LORAS] = {0};
    bool mixed = false;
    pthread_mutex_lock(&e->mu); /* (the scales and states of run-time adapters change under it) */
    if (p->lora && e->lora_state[p->lora - 1] != LORA_LOADED) {
        pthread_mutex_unlock(&e->mu);
        return fl_set_error(FL_ERR_INVALID, "%s: LoRA adapter %d is not loaded", __func__, p->lora);
    }
    for (int32_t k = 0; k < e->p.n_loras; k++) {
        const float v = p->lora_scales ? p->lora_scales[k] : p->lora == k + 1 ? e->lora_loaded[k] : 0.0f;
        if (!isfinite(v) || fabsf(v) > 1e6f || (v != 0.0f && e->lora_state[k] != LORA_LOADED)) {
            pthread_mutex_unlock(&e->mu);
            return fl_set_error(FL_ERR_INVALID, "%s: LoRA adapter %d: %s%g", __func__, k + 1,
                                e->lora_state[k] != LORA_LOADED ? "not loaded, scale " : "scale (finite, |scale| <= 1e6) ", (double)v);
        }
        mix[k] = v == 0.0f ? 0.0f : v; /* (-0 is 0: one cache salt) */
        mixed |= v != 0.0f;
    }
    pthread_mutex_unlock(&e->mu);
    if (p->priority != 0 && e->p.sched_policy != FL_SCHED_PRIORITY)
        return fl_set_error(FL_ERR_INVALID, "%s: priority %d needs the priority scheduling policy (this engine is FCFS)",
                            __func__, p->priority);
    if (p->min_tokens < 0 || p->n_stop_token_ids < 0 || p->n_stop_token_ids > FL_MAX_STOP_TOKEN_IDS)
        return fl_set_error(FL_ERR_INVALID, "%s: min_tokens %d, %d stop token ids (at most %d)", __func__, p->min_tokens,
                            p->n_stop_token_ids, FL_MAX_STOP_TOKEN_IDS);
    for (int32_t i = 0; i < p->n_stop_token_ids; i++)
        if (p->stop_token_ids[i] < 0 || p->stop_token_ids[i] >= e->be.n_vocab)
            return fl_set_error(FL_ERR_INVALID, "%s: stop token id %d out of the vocabulary (%d)", __func__,
                                p->stop_token_ids[i], e->be.n_vocab);
    const int32_t max_lp = e->p.max_logprobs < e->be.n_vocab ? e->p.max_logprobs : e->be.n_vocab;
    if ((p->logprobs || p->top_logprobs || p->prompt_logprobs) && max_lp < 0)
        return fl_set_error(FL_ERR_INVALID, "%s: logprobs are off in this engine (max_logprobs -1)", __func__);
    if (p->top_logprobs < 0 || (p->top_logprobs > 0 && p->top_logprobs > max_lp))
        return fl_set_error(FL_ERR_INVALID, "%s: top_logprobs = %d, accepted 0..%d", __func__, p->top_logprobs, max_lp);
    if ((p->allowed_token_ids != NULL) != (p->n_allowed_token_ids > 0) || p->n_allowed_token_ids < 0)
        return fl_set_error(FL_ERR_INVALID, "%s: allowed_token_ids: %d ids; at least one when given", __func__, p->n_allowed_token_ids);
    for (int32_t i = 0; i < p->n_allowed_token_ids; i++)
        if (p->allowed_token_ids[i] < 0 || p->allowed_token_ids[i] >= e->be.n_vocab)
            return fl_set_error(FL_ERR_INVALID, "%s: allowed token id %d out of the vocabulary (%d)", __func__,
                                p->allowed_token_ids[i], e->be.n_vocab);
    if (p->n_bad_words < 0 || p->n_bad_words > FL_MAX_BAD_WORDS || (p->n_bad_words && (!p->bad_words_ids || !p->bad_words_lens)))
        return fl_set_error(FL_ERR_INVALID, "%s: %d bad words (at most %d)", __func__, p->n_bad_words, FL_MAX_BAD_WORDS);
    int32_t bad_ints = 0;
    for (int32_t k = 0; k < p->n_bad_words; k++) {
        if (p->bad_words_lens[k] < 1 || p->bad_words_lens[k] > FL_MAX_BAD_WORD_TOKENS)
            return fl_set_error(FL_ERR_INVALID, "%s: bad word %d is %d tokens (1..%d)", __func__, k, p->bad_words_lens[k], FL_MAX_BAD_WORD_TOKENS);
        for (int32_t i = 0; i < p->bad_words_lens[k]; i++)
            if (p->bad_words_ids[bad_ints + i] < 0 || p->bad_words_ids[bad_ints + i] >= e->be.n_vocab)
                return fl_set_error(FL_ERR_INVALID, "%s: bad word %d: token %d out of the vocabulary (%d)", __func__, k,
                                    p->bad_words_ids[bad_ints + i], e->be.n_vocab);
        bad_ints += p->bad_words_lens[k];
    }
    if (p->n_grammar_triggers < 0 || p->n_grammar_triggers > FL_MAX_TRIGGERS) /* (before reading them) */
        return fl_set_error(FL_ERR_INVALID, "%s: %d grammar triggers (at most %d)", __func__, p->n_grammar_triggers, FL_MAX_TRIGGERS);
    for (int32_t i = 0; p->grammar_triggers && i < p->n_grammar_triggers; i++)
        if (p->grammar_triggers[i].type == FL_TRIGGER_TOKEN && (p->grammar_triggers[i].token < 0 || p->grammar_triggers[i].token >= e->be.n_vocab))
            return fl_set_error(FL_ERR_INVALID, "%s: grammar trigger %d: token %d out of the vocabulary (%d)", __func__, i,
                                p->grammar_triggers[i].token, e->be.n_vocab);
    for (int32_t i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= e->be.n_vocab)
            return fl_set_error(FL_ERR_INVALID, "%s: prompt token %d = %d out of the vocabulary (%d)", __func__, i,
                                p->prompt[i], e->be.n_vocab);
    const bool constrained = p->json_object || p->json_schema || p->n_choices || p->regex || p->grammar ||
                             p->n_allowed_token_ids > 0 || p->n_bad_words > 0;
    if (p->pooling != FL_POOLING_NONE) { /* an embedding: the prompt alone */
        if (p->pooling != FL_POOLING_MEAN && p->pooling != FL_POOLING_LAST)
            return fl_set_error(FL_ERR_INVALID, "%s: pooling %d (mean 1, last 2)", __func__, (int)p->pooling);
        if (!e->p.embeddings)
            return fl_set_error(FL_ERR_INVALID, "%s: embedding requests need an engine made with embeddings", __func__);
        if (n > 1 || constrained || p->logprobs || p->top_logprobs || p->prompt_logprobs || p->n_logit_bias)
            return fl_set_error(FL_ERR_INVALID, "%s: an embedding request takes no n > 1, logprobs or output constraints", __func__);
        max_tokens = 1; /* (its KV: the prompt; nothing is generated) */
    }
    if (constrained && e->guide_mem == 0)
        return fl_set_error(FL_ERR_INVALID, "%s: output constraints are off in this engine (guide_mem 0)", __func__);
    const size_t refused0 = fl_mem_refused(FL_MEM_GUIDE);
    fl_request_params q = *p;
    q.max_tokens = max_tokens;
    /* adapters change the prompt's K/V: its blocks are cached under a salt of their mix (the same
     * scales, however asked for, share them) */
    if (mixed) {
        q.cache_salt = XXH3_64bits_withSeed(mix, (size_t)e->p.n_loras * sizeof *mix, q.cache_salt ^ 0x4C6F5241ull);
        if (!q.cache_salt) q.cache_salt = 1; /* (0 is no salt) */
    }
    /* a regex of the common subset runs as a grammar (regex_gbnf.h); PCRE2 still compiles it first,
     * so a bad pattern is refused with PCRE2's message */
    char *rx_gbnf = NULL;
    size_t rx_gbnf_len = 0;
    if (q.regex && !e->p.regex_pcre2) {
        const fl_status rst = fl_regex_to_gbnf(q.regex, &rx_gbnf, &rx_gbnf_len);
        if (rst == FL_ERR_NOMEM || rst == FL_ERR_BUDGET) {
            pthread_mutex_lock(&e->mu);
            const fl_status gst = guide_refusal(e, rst, refused0);
            pthread_mutex_unlock(&e->mu);
            return gst;
        }
    }
    pthread_mutex_lock(&e->mu);
    if (!mix_loaded(e, mix)) { /* (unloaded since it was checked) */
        pthread_mutex_unlock(&e->mu);
        fl_free(FL_MEM_GUIDE, rx_gbnf, rx_gbnf ? rx_gbnf_len + 1 : 0);
        return fl_set_error(FL_ERR_INVALID, "%s: a LoRA adapter the request applies was unloaded", __func__);
    }
    int64_t rid = e->next_id++;
    if (q.sampling.seed == 0) q.sampling.seed = (uint64_t)e->p.seed + (uint64_t)rid * 7919u;
    fl_status st = FL_OK;
    double t = fl_clock_s() - e->t0;
    int32_t added = 0;
    for (int32_t s = 0; s < n && st == FL_OK; s++) {
        fl_request *r;
        st = fl_request_new(&q, rid, s, e->next_arrival++, &r);
        if (st != FL_OK) break;
        r->t_arrival = t;
        r->spec_max = p->spec_max < 0 ? 0 : p->spec_max == 0 || p->spec_max > e->p.spec_tokens ? e->p.spec_tokens : p->spec_max;
        r->spec_min = p->spec_min;
        r->spec_p_min = p->spec_p_min_set ? p->spec_p_min : e->p.spec_draft_p_min;
        r->lora_on = mixed;
        memcpy(r->lora_mix, mix, sizeof mix);
        if (rx_gbnf) { /* (a grammar it cannot be, e.g. a repeat of what can be empty: PCRE2 runs it) */
            fl_grammar_guide *g = NULL;
            if ((st = fl_grammar_guide_new(rx_gbnf, &g)) == FL_OK) {
                fl_regex_guide_free(r->regex);
                r->regex = NULL;
                r->grammar = g;
            } else if (st == FL_ERR_NOMEM || st == FL_ERR_BUDGET) {
                req_free(r);
                break;
            } else {
                fl_clear_error();
                st = FL_OK;
            }
        }
        if (p->n_allowed_token_ids > 0) { /* the allowed tokens as a bitmask */
            const int32_t words = (e->be.n_vocab + 63) / 64;
            if (!(r->allowed = fl_calloc(FL_MEM_GUIDE, (size_t)words, sizeof *r->allowed))) {
                req_free(r);
                st = fl_set_error(FL_ERR_NOMEM, "%s: no memory for allowed_token_ids", __func__);
                break;
            }
            r->allowed_words = words;
            for (int32_t i = 0; i < p->n_allowed_token_ids; i++)
                r->allowed[p->allowed_token_ids[i] >> 6] |= (uint64_t)1 << (p->allowed_token_ids[i] & 63);
        }
        if (p->n_bad_words > 0) { /* each sequence: its length, then its tokens */
            r->bad_ints = bad_ints + p->n_bad_words;
            if (!(r->bad = fl_alloc(FL_MEM_GUIDE, (size_t)r->bad_ints * sizeof *r->bad, 0))) {
                req_free(r);
                st = fl_set_error(FL_ERR_NOMEM, "%s: no memory for bad_words", __func__);
                break;
            }
            r->n_bad = p->n_bad_words;
            for (int32_t k = 0, at = 0, o = 0; k < p->n_bad_words; k++) {
                r->bad[o++] = p->bad_words_lens[k];
                memcpy(r->bad + o, p->bad_words_ids + at, (size_t)p->bad_words_lens[k] * sizeof *r->bad);
                o += p->bad_words_lens[k];
                at += p->bad_words_lens[k];
            }
        }
        st = req_sampler_new(e, r, p->logit_bias, p->n_logit_bias);
        if (st == FL_OK && p->pooling != FL_POOLING_NONE) {
            r->n_embd = e->be.n_embd;
            if (!(r->embd = fl_calloc(FL_MEM_MISC, (size_t)r->n_embd, sizeof *r->embd)))
                st = fl_set_error(FL_ERR_NOMEM, "%s: no memory for the embedding", __func__);
        }
        if (st != FL_OK) {
            req_free(r);
            break;
        }
        if (s > 0) r->fork_parent = find_req(e, rid, 0); /* waits for sample 0's prompt blocks */
        st = table_push(e, r);
        if (st == FL_OK) st = fl_sched_add(e->sched, r);
        if (st != FL_OK) {
            if (e->n_reqs && e->reqs[e->n_reqs - 1] == r) e->n_reqs--;
            req_free(r);
            break;
        }
        added++;
    }
    if (st != FL_OK) /* undo the samples already queued */
        for (int32_t s = 0; s < added; s++) {
            fl_request *r = find_req(e, rid, s);
            fl_sched_remove(e->sched, r, false);
            for (int32_t i = 0; i < e->n_reqs; i++)
                if (e->reqs[i] == r) e->reqs[i] = e->reqs[--e->n_reqs];
            req_free(r);
        }
    fl_free(FL_MEM_GUIDE, rx_gbnf, rx_gbnf ? rx_gbnf_len + 1 : 0);
    if (st != FL_OK) st = guide_refusal(e, st, refused0);
    pthread_mutex_unlock(&e->mu);
    if (st == FL_OK && id) *id = rid;
    return st;
}

/* Mark r finished (under the lock): release the KV (or keep it as a static padding row),
 * flush its held-back text and queue its final event. */
static void finish(fl_engine *e, fl_request *r, fl_finish_reason why) {
    if (r->state == FL_REQ_FINISHED) return;
    r->state = FL_REQ_FINISHED;
    r->finish = why;
    if (why == FL_FINISH_ERROR && !r->error[0]) { /* why, from the failing call just made on this thread */
        const size_t refused = fl_mem_refused(FL_MEM_GUIDE);
        if (refused != e->guide_refused && (r->json || r->regex || r->grammar)) {
            char b[32];
            fl_plan_fmt_bytes((uint64_t)e->guide_mem, b, sizeof b);
            snprintf(r->error, sizeof r->error, "the output constraint's state outgrew what is left of guide_mem (%s): %s", b, fl_last_error());
        } else {
            snprintf(r->error, sizeof r->error, "%s", fl_last_error());
        }
        e->guide_refused = refused;
    }
    r->t_finish = fl_clock_s() - e->t0;
    int64_t s, n;
    fl_stop_release(&r->stop, true, &s, &n);
    r->event_pending = true;
    e->finished++;
    for (int32_t i = 0; i < e->n_reqs; i++) /* samples waiting on this one's prompt go on alone */
        if (e->reqs[i]->fork_parent == r) e->reqs[i]->fork_parent = NULL;
    fl_sched_remove(e->sched, r, why == FL_FINISH_EOS || why == FL_FINISH_LENGTH || why == FL_FINISH_STOP);
}

fl_status fl_engine_cancel(fl_engine *e, int64_t id) {
    pthread_mutex_lock(&e->mu);
    int found = 0;
    for (int32_t i = 0; i < e->n_reqs; i++) {
        fl_request *r = e->reqs[i];
        if (r->id != id) continue;
        found = 1;
        if (r->state == FL_REQ_FINISHED) continue;
        if (r->state == FL_REQ_WAITING && !r->kv_live) finish(e, r, FL_FINISH_CANCELLED); /* at once */
        else r->cancel = true;                                                           /* next step */
    }
    pthread_mutex_unlock(&e->mu);
    return found ? FL_OK : fl_set_error(FL_ERR_INVALID, "%s: no request %lld", __func__, (long long)id);
}

/* Append a sampled token: text, stop conditions, streaming. */
static void commit_token(fl_engine *e, fl_request *r, int32_t tok) {
    double t = fl_clock_s() - e->t0;
    if (fl_request_n_generated(r) == 0 && r->t_first_token == 0) r->t_first_token = t;
    r->t_last_token = t;
    e->generated++;
    if (!r->ignore_eos && e->be.is_eog && e->be.is_eog(e->be.ctx, tok)) {
        finish(e, r, FL_FINISH_EOS);
        return;
    }
    for (int32_t i = 0; i < r->n_stop_ids; i++)
        if (tok == r->stop_ids[i]) { /* like EOS: ends it, not part of the output */
            r->stop_token = tok;
            finish(e, r, FL_FINISH_STOP);
            return;
        }
    fl_request_append(r, tok);
    r->event_pending = true;
    char piece[256];
    int32_t (*text_of)(void *, int32_t, char *, int32_t) = r->special_text && e->be.token_text ? e->be.token_text : e->be.piece;
    int32_t len = text_of ? text_of(e->be.ctx, tok, piece, (int32_t)sizeof piece) : 0;
    bool stopped = false;
    if (len > 0 && fl_stop_push(&r->stop, piece, len, &stopped) != FL_OK) {
        finish(e, r, FL_FINISH_ERROR);
        return;
    }
    if (stopped) {
        finish(e, r, FL_FINISH_STOP);
        return;
    }
    int64_t s, n;
    fl_stop_release(&r->stop, false, &s, &n);
    if (fl_request_n_generated(r) >= r->max_tokens || r->n_tokens >= e->be.n_ctx) finish(e, r, FL_FINISH_LENGTH);
}

/* Free finished requests whose last event was polled and that left the scheduler. */
static void reap(fl_engine *e) {
    int32_t j = 0;
    for (int32_t i = 0; i < e->n_reqs; i++) {
        fl_request *r = e->reqs[i];
        if (r->state == FL_REQ_FINISHED && r->done_polled && !r->in_sched) req_free(r);
        else e->reqs[j++] = r;
    }
    e->n_reqs = j;
}

/* n > 1: sample 0 just computed its prompt.  Before its own token is committed (which may end
 * it), fork its blocks to the samples still waiting for them and sample each one's first token
 * from the same logits row. */
static void fork_samples(fl_engine *e, fl_request *parent, const float *row) {
    for (int32_t i = 0; i < e->n_reqs; i++) {
        fl_request *c = e->reqs[i];
        if (c->fork_parent != parent || c->state != FL_REQ_WAITING) continue;
        if (fl_sched_admit_fork(e->sched, parent, c) != FL_OK) continue;
        c->fork_parent = NULL;
        sample_commit(e, c, row);
    }
}

/* n-gram lookup: the tokens that followed the latest earlier occurrence of t's last g tokens,
 * for the longest g in [g_min, g_max] that occurs; at most k of them into out.  Returns how many. */
int32_t fl_spec_ngram(const int32_t *t, int32_t n, int32_t g_min, int32_t g_max, int32_t k, int32_t *out) {
    for (int32_t g = g_max < n - 1 ? g_max : n - 1; g >= g_min && g >= 1; g--) {
        const int32_t *suf = t + n - g;
        for (int32_t j = n - g - 1; j >= 0; j--) { /* t[j .. j + g) == suf, followed by t[j + g] */
            if (t[j] != suf[0] || memcmp(t + j, suf, (size_t)g * sizeof *t)) continue;
            int32_t m = n - (j + g);
            if (m > k) m = k;
            memcpy(out, t + j + g, (size_t)m * sizeof *t);
            return m;
        }
    }
    return 0;
}

/* Draft tokens for every running request whose next step is a decode (none for the others): as
 * many as may still be generated and fit in the context. */
static void propose_drafts(fl_engine *e) {
    const bool off = e->p.spec_disable_batch > 0 && fl_sched_n_running(e->sched) > e->p.spec_disable_batch;
    const bool model = e->be.draft_add != NULL;
    int32_t queued = 0;
    for (int32_t i = 0; i < e->n_reqs; i++) {
        fl_request *r = e->reqs[i];
        r->n_draft = 0;
        if (off || e->p.spec_tokens < 1 || r->state != FL_REQ_RUNNING || r->padding || r->cancel || r->pooling != FL_POOLING_NONE ||
            fl_request_n_generated(r) < 1 || r->n_computed + 1 != r->n_tokens)
            continue;
        int32_t k = r->spec_max;
        const int32_t gen_left = r->max_tokens - fl_request_n_generated(r) - 1, ctx_left = e->be.n_ctx - r->n_tokens;
        if (k > gen_left) k = gen_left;
        if (k > ctx_left) k = ctx_left;
        if (k < 1 || k < r->spec_min) continue; /* (no draft it could verify) */
        if (model) queued += e->be.draft_add(e->be.ctx, r, k);
        else r->n_draft = fl_spec_ngram(r->tokens, r->n_tokens, e->p.spec_ngram_min, e->p.spec_ngram_max, k, r->draft);
    }
    if (queued) { /* the draft model's forwards, with add / cancel / poll free to go on */
        pthread_mutex_unlock(&e->mu);
        e->be.draft_run(e->be.ctx);
        pthread_mutex_lock(&e->mu);
    }
    for (int32_t i = 0; i < e->n_reqs; i++) /* llama.cpp's n_min: a shorter draft is not worth its rows */
        if (e->reqs[i]->n_draft < e->reqs[i]->spec_min) e->reqs[i]->n_draft = 0;
}

/* A decode with d draft tokens: rows[0 .. d] score the positions after its last token and after
 * each draft.  Sample each in turn with the request's sampler, exactly as one decode step after
 * another would; a draft is kept while it is the token sampled (so the next row saw the right
 * input), and the first sample that differs ends it.  Then r's computed tokens are the kept ones,
 * and the cache gives back the rest. */
static void sample_drafts(fl_engine *e, fl_request *r, const float *rows, int32_t d) {
    int32_t kept = 0;
    for (int32_t i = 0; i <= d && r->state != FL_REQ_FINISHED; i++) {
        sample_commit(e, r, rows + (size_t)i * (size_t)e->be.n_vocab);
        if (i == d || r->state == FL_REQ_FINISHED || r->tokens[r->n_tokens - 1] != r->draft[i]) break;
        kept++;
    }
    e->spec_drafts++;
    e->spec_drafted += d;
    e->spec_accepted += kept;
    if (r->state == FL_REQ_FINISHED) return; /* (its KV is gone) */
    r->n_computed += kept;
    FL_ASSERT(r->n_computed + 1 == r->n_tokens);
    if (kept < d && e->be.kv.truncate(e->be.kv.ctx, r, r->n_computed) != FL_OK) finish(e, r, FL_FINISH_ERROR);
}

fl_status fl_engine_step(fl_engine *e, int32_t *n_active) {
    fl_status st = FL_OK;
    pthread_mutex_lock(&e->mu);
    for (int32_t i = 0; i < e->n_reqs; i++)
        if (e->reqs[i]->cancel && e->reqs[i]->state != FL_REQ_FINISHED) finish(e, e->reqs[i], FL_FINISH_CANCELLED);
    if (e->p.lora_slots > 0) lora_reap(e);
    if (e->p.spec_tokens > 0) propose_drafts(e);
    fl_sched_out out;
    st = fl_sched_schedule(e->sched, &out);
    if (st != FL_OK) goto done;
    if (out.n_entries == 0) {
        /* nothing can run although requests wait: a bug in the accounting; fail the head request
         * rather than spin */
        fl_request *head = fl_sched_waiting_at(e->sched, 0);
        if (head && fl_sched_n_running(e->sched) == 0) {
            st = fl_set_error(FL_ERR_INTERNAL, "%s: request %lld cannot be admitted into an empty engine", __func__,
                              (long long)head->id);
            finish(e, head, FL_FINISH_ERROR);
        }
        goto done;
    }

    /* build the flat batch: each entry's tokens contiguous and in position order, no padding */
    int32_t n = 0, rows = 0, hrows = 0, n_mix = 0;
    FL_ASSERT(out.n_entries <= e->p.max_seqs);
    for (int32_t k = 0; k < out.n_entries; k++) {
        fl_request *r = out.e[k].r;
        int32_t mix = 0; /* the entry's row of adapter scales (0: none) */
        if (r->lora_on) {
            memcpy(e->b_mix + (size_t)n_mix * (size_t)e->p.n_loras, r->lora_mix, (size_t)e->p.n_loras * sizeof(float));
            mix = ++n_mix;
        }
        if (out.e[k].pad) { /* static baseline: a finished row keeps computing a dummy token */
            if (e->b_hid) e->b_hid[n] = 0;
            e->b_tok[n] = r->tokens[r->n_tokens - 1];
            e->b_pos[n] = r->n_computed;
            e->b_seq[n] = (int32_t)r->kv_seq;
            e->b_lora[n] = mix;
            e->b_logit[n++] = 0;
            continue;
        }
        const int32_t spec = out.e[k].spec;
        if (spec > 0) { /* a decode and its drafts: a logits row each */
            e->row_req[rows] = r;
            e->row_pos[rows] = -1;
            e->row_spec[rows++] = spec;
            for (int32_t j = 0; j <= spec; j++) {
                if (e->b_hid) e->b_hid[n] = 0;
                e->b_tok[n] = j ? r->draft[j - 1] : r->tokens[r->n_computed];
                e->b_pos[n] = r->n_computed + j;
                e->b_seq[n] = (int32_t)r->kv_seq;
                e->b_lora[n] = mix;
                e->b_logit[n++] = 1;
                if (j) {
                    e->row_req[rows] = r;
                    e->row_pos[rows++] = -2;
                }
            }
            continue;
        }
        bool sample = r->n_computed + out.e[k].n == r->n_tokens && r->pooling == FL_POOLING_NONE;
        for (int32_t j = 0; j < out.e[k].n; j++) {
            const int32_t pos = r->n_computed + j;
            const bool last = sample && j == out.e[k].n - 1;
            if (e->b_hid) { /* an embedding's states: every prompt position not yet pooled (mean), or the last */
                const bool h = r->pooling != FL_POOLING_NONE && pos >= r->n_pooled &&
                               (r->pooling == FL_POOLING_MEAN || pos == r->n_prompt - 1);
                e->b_hid[n] = (int8_t)h;
                if (h) {
                    e->hrow_req[hrows] = r;
                    e->hrow_pos[hrows++] = pos;
                }
            }
            /* prompt logprobs: a row for each prompt position not yet recorded (the scheduler
             * counted them) */
            const bool score = r->prompt_logprobs && pos >= r->n_plp && pos < r->n_prompt - 1;
            e->b_tok[n] = r->tokens[pos];
            e->b_pos[n] = pos;
            e->b_seq[n] = (int32_t)r->kv_seq;
            e->b_lora[n] = mix;
            e->b_logit[n++] = (int8_t)(last || score);
            if (last || score) {
                e->row_req[rows] = r;
                e->row_spec[rows] = 0;
                e->row_pos[rows++] = score ? pos : -1;
            }
        }
        if (r->n_computed == 0 || r->n_computed + out.e[k].n <= r->n_prompt) e->prefilled += out.e[k].n;
    }
    FL_ASSERT(n <= e->max_tokens && rows <= e->max_rows);
    fl_batch b = {n, e->b_tok, e->b_pos, e->b_seq, e->b_logit, e->b_lora, hrows ? e->b_hid : NULL, e->hidden,
                  n_mix ? e->b_mix : NULL, n_mix};

    /* forward without the lock: add/cancel/poll stay responsive */
    e->in_forward = true;
    pthread_mutex_unlock(&e->mu);
    double t = fl_clock_s();
    fl_status fst = e->be.forward(e->be.ctx, &b, e->logits);
    e->t_forward += fl_clock_s() - t;
    pthread_mutex_lock(&e->mu);
    e->in_forward = false;
    if (e->be.step_done) e->be.step_done(e->be.ctx);
    e->steps++;
    if (fst != FL_OK) {
        /* a failed forward changed nothing in the cache: fail the step's requests */
        e->forward_errors++;
        for (int32_t k = 0; k < out.n_entries; k++)
            if (!out.e[k].pad) finish(e, out.e[k].r, FL_FINISH_ERROR);
        st = fst;
        goto done;
    }
    fl_sched_commit(e->sched, &out);
    for (int32_t k = 0; k < hrows; k++) { /* embeddings: pool the states, in position order */
        fl_request *r = e->hrow_req[k];
        if (r->state == FL_REQ_FINISHED || e->hrow_pos[k] != (r->pooling == FL_POOLING_MEAN ? r->n_pooled : r->n_prompt - 1)) continue;
        const float *h = e->hidden + (size_t)k * (size_t)e->be.n_embd;
        if (r->pooling == FL_POOLING_MEAN)
            for (int32_t j = 0; j < r->n_embd; j++) r->embd[j] += h[j];
        else memcpy(r->embd, h, (size_t)r->n_embd * sizeof *h);
        r->n_pooled = e->hrow_pos[k] + 1;
    }
    for (int32_t k = 0; k < out.n_entries; k++) { /* an embedding whose prompt is done: finished */
        fl_request *r = out.e[k].r;
        if (out.e[k].pad || r->pooling == FL_POOLING_NONE || r->state == FL_REQ_FINISHED || r->n_computed < r->n_prompt) continue;
        FL_ASSERT(r->n_pooled == r->n_prompt);
        if (r->pooling == FL_POOLING_MEAN)
            for (int32_t j = 0; j < r->n_embd; j++) r->embd[j] /= (float)r->n_prompt;
        finish(e, r, FL_FINISH_STOP);
    }
    for (int32_t k = 0; k < rows; k++) {
        fl_request *r = e->row_req[k];
        if (r->state == FL_REQ_FINISHED) continue;
        float *row = e->logits + (size_t)k * (size_t)e->be.n_vocab;
        const int32_t pos = e->row_pos[k];
        if (pos == -2) continue; /* taken with its group's first row */
        if (e->row_spec[k] > 0) {
            sample_drafts(e, r, row, e->row_spec[k]);
            continue;
        }
        if (pos >= 0) { /* prompt token pos + 1 given the ones before it */
            FL_ASSERT(pos == r->n_plp);
            fl_token_logprob *rec = r->plp + (size_t)pos * (size_t)(1 + r->n_top);
            rec[0].token = r->tokens[pos + 1];
            fl_logprobs(row, e->be.n_vocab, rec[0].token, r->n_top, &rec[0].logprob, rec + 1);
            r->plp_rank[pos] = fl_logit_rank(row, e->be.n_vocab, rec[0].token);
            r->n_plp = pos + 1;
            r->event_pending = true; /* handed out as they come */
            continue;
        }
        if (r->sample == 0 && fl_request_n_generated(r) == 0) fork_samples(e, r, row);
        sample_commit(e, r, row);
    }
done:
    if (e->be.kv_stats) e->be.kv_stats(e->be.ctx, &e->kv_snap);
    int32_t active = 0;
    for (int32_t i = 0; i < e->n_reqs; i++) active += e->reqs[i]->state != FL_REQ_FINISHED;
    reap(e);
    pthread_mutex_unlock(&e->mu);
    if (n_active) *n_active = active;
    return st;
}

static fl_status grow(fl_mem_cat cat, void **buf, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return FL_OK;
    const int64_t nc = fl_cap_double(*cap ? *cap : POLL_CAP0, need);
    void *p = fl_alloc(cat, (size_t)nc * elem, 0);
    if (!p) return FL_ERR_NOMEM;
    fl_free(cat, *buf, (size_t)*cap * elem);
    *buf = p;
    *cap = nc;
    return FL_OK;
}

int32_t fl_engine_poll(fl_engine *e, fl_request_output *out, int32_t cap) {
    pthread_mutex_lock(&e->mu);
    /* size the buffers for everything pending first, so pointers handed out stay put */
    int64_t need_tok = 0, need_text = 0, need_lp = 0;
    int32_t n = 0;
    for (int32_t i = 0; i < e->n_reqs && n < cap; i++) {
        fl_request *r = e->reqs[i];
        if (!r->event_pending) continue;
        need_tok += fl_request_n_generated(r) - r->n_streamed;
        need_text += r->stop.emitted - r->text_pending_start + 1 + (int64_t)strlen(r->error) + 1 +
                     (r->stop.stopped ? (int64_t)strlen(r->stop.stop[r->stop.which]) + 1 : 0);
        if (r->logprobs) need_lp += (int64_t)(fl_request_n_generated(r) - r->n_streamed) * (1 + r->n_top);
        if (r->prompt_logprobs) {
            need_lp += (int64_t)(r->n_plp - r->n_plp_sent) * (1 + r->n_top);
            need_tok += r->n_plp - r->n_plp_sent; /* their ranks */
        }
        n++;
    }
    int64_t need_embd = 0; /* finished embeddings */
    for (int32_t i = 0, m = 0; i < e->n_reqs && m < n; i++)
        if (e->reqs[i]->event_pending) {
            m++;
            if (e->reqs[i]->embd && e->reqs[i]->state == FL_REQ_FINISHED) need_embd += e->reqs[i]->n_embd;
        }
    if ((need_embd && grow(FL_MEM_MISC, (void **)&e->poll_embd, &e->poll_embd_cap, need_embd, sizeof(float)) != FL_OK) ||
        grow(FL_MEM_MISC, (void **)&e->poll_tok, &e->poll_tok_cap, need_tok + 1, sizeof(int32_t)) != FL_OK ||
        grow(FL_MEM_MISC, (void **)&e->poll_text, &e->poll_text_cap, need_text + 1, 1) != FL_OK ||
        grow(FL_MEM_MISC, (void **)&e->poll_lp, &e->poll_lp_cap, need_lp + 1, sizeof(fl_token_logprob)) != FL_OK) {
        pthread_mutex_unlock(&e->mu);
        return 0;
    }
    int64_t ot = 0, ox = 0, ol = 0, oe = 0;
    n = 0;
    for (int32_t i = 0; i < e->n_reqs && n < cap; i++) {
        fl_request *r = e->reqs[i];
        if (!r->event_pending) continue;
        fl_request_output *o = &out[n++];
        memset(o, 0, sizeof *o);
        o->request_id = r->id;
        o->sample = r->sample;
        o->n_new = fl_request_n_generated(r) - r->n_streamed;
        memcpy(e->poll_tok + ot, r->tokens + r->n_prompt + r->n_streamed, (size_t)o->n_new * sizeof(int32_t));
        o->new_tokens = e->poll_tok + ot;
        ot += o->n_new;
        if (r->logprobs) {
            const size_t m = (size_t)o->n_new * (size_t)(1 + r->n_top);
            memcpy(e->poll_lp + ol, r->lp + (size_t)r->n_streamed * (size_t)(1 + r->n_top), m * sizeof *e->poll_lp);
            o->new_logprobs = e->poll_lp + ol;
            o->n_top = r->n_top;
            ol += (int64_t)m;
        }
        if (r->prompt_logprobs && r->n_plp > r->n_plp_sent) { /* the prompt's records since the last poll */
            const size_t m = (size_t)(r->n_plp - r->n_plp_sent) * (size_t)(1 + r->n_top);
            memcpy(e->poll_lp + ol, r->plp + (size_t)r->n_plp_sent * (size_t)(1 + r->n_top), m * sizeof *e->poll_lp);
            o->prompt_logprobs = e->poll_lp + ol;
            o->prompt_logprobs_from = r->n_plp_sent;
            o->n_prompt_logprobs = r->n_plp - r->n_plp_sent;
            memcpy(e->poll_tok + ot, r->plp_rank + r->n_plp_sent, (size_t)o->n_prompt_logprobs * sizeof *r->plp_rank);
            o->prompt_ranks = e->poll_tok + ot;
            ot += o->n_prompt_logprobs;
            o->n_top = r->n_top;
            ol += (int64_t)m;
            r->n_plp_sent = r->n_plp;
        }
        int64_t tl = r->stop.emitted - r->text_pending_start;
        memcpy(e->poll_text + ox, r->stop.text + r->text_pending_start, (size_t)tl);
        e->poll_text[ox + tl] = 0;
        o->new_text = e->poll_text + ox;
        ox += tl + 1;
        o->finish = r->state == FL_REQ_FINISHED ? r->finish : FL_FINISH_NONE;
        o->stop_token = -1;
        if (o->finish == FL_FINISH_STOP && r->stop.stopped) { /* the stop string that ended it */
            const size_t sl = strlen(r->stop.stop[r->stop.which]);
            memcpy(e->poll_text + ox, r->stop.stop[r->stop.which], sl + 1);
            o->stop_str = e->poll_text + ox;
            ox += (int64_t)sl + 1;
        } else if (o->finish == FL_FINISH_STOP) {
            o->stop_token = r->stop_token;
        }
        if (o->finish == FL_FINISH_ERROR && r->error[0]) {
            const size_t el = strlen(r->error);
            memcpy(e->poll_text + ox, r->error, el + 1);
            o->error = e->poll_text + ox;
            ox += (int64_t)el + 1;
        }
        if (r->embd && r->state == FL_REQ_FINISHED && r->finish == FL_FINISH_STOP) {
            memcpy(e->poll_embd + oe, r->embd, (size_t)r->n_embd * sizeof *r->embd);
            o->embedding = e->poll_embd + oe;
            o->n_embd = r->n_embd;
            oe += r->n_embd;
        }
        o->n_prompt = r->n_prompt;
        o->n_generated = fl_request_n_generated(r);
        o->n_cached_prompt = r->n_cached_prompt;
        o->ttft_s = r->t_first_token > 0 ? r->t_first_token - r->t_arrival : 0;
        r->n_streamed = fl_request_n_generated(r);
        r->text_pending_start = r->stop.emitted;
        r->event_pending = false;
        if (r->state == FL_REQ_FINISHED) r->done_polled = true;
    }
    reap(e);
    pthread_mutex_unlock(&e->mu);
    return n;
}

void fl_engine_stats_get(fl_engine *e, fl_engine_stats *s) {
    memset(s, 0, sizeof *s);
    pthread_mutex_lock(&e->mu);
    fl_sched_stats ss;
    fl_sched_stats_get(e->sched, &ss);
    s->steps = e->steps;
    s->requests_finished = e->finished;
    s->tokens_generated = e->generated;
    s->tokens_prefilled = e->prefilled;
    s->n_waiting = fl_sched_n_waiting(e->sched) - fl_sched_n_preempted(e->sched);
    s->n_preempted = fl_sched_n_preempted(e->sched);
    s->n_running = fl_sched_n_running(e->sched);
    s->preemptions = ss.preemptions;
    s->swaps_out = ss.swaps_out;
    s->swaps_in = ss.swaps_in;
    s->prefix_hit_tokens = ss.prefix_hit_tokens;
    s->prefix_miss_tokens = ss.prefix_miss_tokens;
    const fl_backend_kv_stats ks = e->kv_snap;
    s->kv_blocks_total = ks.blocks_total;
    s->kv_blocks_used = ks.blocks_used;
    s->kv_blocks_free = ks.blocks_free;
    s->kv_blocks_cached = ks.blocks_cached;
    s->kv_evictions = ks.evictions;
    s->kv_utilization = ks.slots_allocated ? (double)ks.tokens_live / (double)ks.slots_allocated : 0;
    s->kv_waste = ks.slots_allocated ? 1.0 - s->kv_utilization : 0;
    fl_mask_cache_stats ms;
    fl_mask_cache_get_stats(e->masks, &ms);
    s->guide_mask_hits = ms.hits;
    s->guide_mask_misses = ms.misses;
    s->spec_drafts = e->spec_drafts;
    s->spec_draft_tokens = e->spec_drafted;
    s->spec_accepted_tokens = e->spec_accepted;
    pthread_mutex_unlock(&e->mu);
}

int32_t fl_engine_n_ctx(const fl_engine *e) { return e->be.n_ctx; }
int32_t fl_engine_special_token(fl_engine *e, fl_special_token which) {
    return e->be.special ? e->be.special(e->be.ctx, which) : which == FL_SPECIAL_ADD_BOS ? 0 : -1;
}
int32_t fl_engine_n_embd(const fl_engine *e) { return e->be.n_embd; }
int32_t fl_engine_embeddings(const fl_engine *e) { return e->p.embeddings != 0; }

int32_t fl_engine_n_vocab(const fl_engine *e) { return e->be.n_vocab; }
const char *fl_engine_model_name(const fl_engine *e) { return e->be.name ? e->be.name : "?"; }
const char *fl_engine_chat_template(const fl_engine *e) { return e->be.chat_template; }

fl_status fl_engine_tokenize(fl_engine *e, const char *text, size_t len, int add_special, int32_t *out, int64_t cap,
                             int64_t *n_out) {
    if (!e->be.tokenize) return fl_set_error(FL_ERR_UNSUPPORTED, "%s: this engine has no tokenizer", __func__);
    return e->be.tokenize(e->be.ctx, text, len, add_special, out, cap, n_out);
}
fl_sched_policy fl_engine_sched_policy(const fl_engine *e) { return e->p.sched_policy; }
int32_t fl_engine_max_seqs(const fl_engine *e) { return e->p.max_seqs; }
int32_t fl_engine_n_loras(const fl_engine *e) { return e->p.n_loras; }
int32_t fl_engine_lora_slots(const fl_engine *e) { return e->p.lora_slots; }

static bool lora_in_use(const fl_engine *e, int32_t k) {
    for (int32_t i = 0; i < e->n_reqs; i++) {
        const fl_request *r = e->reqs[i];
        if (r->state != FL_REQ_FINISHED && r->lora_on && r->lora_mix[k] != 0.0f) return true;
    }
    return false;
}

/* Free the unloading adapters no request applies any more (e->mu held, no forward running). */
static void lora_reap(fl_engine *e) {
    for (int32_t k = 0; k < e->p.n_loras; k++) {
        if (e->lora_state[k] != LORA_DRAINING || lora_in_use(e, k)) continue;
        void *old = NULL;
        if (e->be.lora_put(e->be.ctx, k + 1, NULL, &old) != FL_OK) {
            fl_clear_error();
            continue;
        }
        e->be.lora_close(e->be.ctx, old);
        e->lora_state[k] = LORA_EMPTY;
        e->lora_loaded[k] = 0.0f;
    }
}

fl_status fl_engine_lora_load(fl_engine *e, const char *path, float scale, int32_t *k) {
    *k = 0;
    if (!path || !path[0] || !isfinite(scale) || fabsf(scale) > 1e6f)
        return fl_set_error(FL_ERR_INVALID, "%s: a path and a finite scale of at most 1e6", __func__);
    if (!e->be.lora_open || e->p.lora_slots < 1)
        return fl_set_error(FL_ERR_UNSUPPORTED, "%s: this engine has no slots for adapters loaded at run time (lora_slots)", __func__);
    pthread_mutex_lock(&e->mu);
    int32_t slot = -1;
    for (int32_t i = 0; i < e->p.n_loras && slot < 0; i++)
        if (e->lora_state[i] == LORA_EMPTY) slot = i;
    if (slot >= 0) e->lora_state[slot] = LORA_LOADING;
    pthread_mutex_unlock(&e->mu);
    if (slot < 0)
        return fl_set_error(FL_ERR_BUDGET, "%s: every adapter slot is taken (%d run-time slots; unload one first)", __func__, e->p.lora_slots);
    void *h = NULL, *old = NULL;
    fl_status st = e->be.lora_open(e->be.ctx, path, scale, &h); /* (file I/O: steps go on) */
    pthread_mutex_lock(&e->mu);
    if (st == FL_OK) st = e->be.lora_put(e->be.ctx, slot + 1, h, &old); /* (no request applies the slot: no batch reads it) */
    if (st == FL_OK) {
        FL_ASSERT(!old);
        e->lora_loaded[slot] = scale;
        e->lora_state[slot] = LORA_LOADED;
        *k = slot + 1;
    } else {
        e->lora_state[slot] = LORA_EMPTY;
    }
    pthread_mutex_unlock(&e->mu);
    if (st != FL_OK && h) e->be.lora_close(e->be.ctx, h);
    return st;
}

fl_status fl_engine_lora_unload(fl_engine *e, int32_t k) {
    pthread_mutex_lock(&e->mu);
    if (k < 1 || k > e->p.n_loras || e->lora_state[k - 1] != LORA_LOADED || !e->be.lora_put) {
        pthread_mutex_unlock(&e->mu);
        return fl_set_error(FL_ERR_INVALID, "%s: adapter %d is not loaded%s", __func__, k,
                            e->be.lora_put ? "" : " (this backend unloads none)");
    }
    e->lora_state[k - 1] = LORA_DRAINING;
    if (!e->in_forward) lora_reap(e); /* (else the next step's start) */
    pthread_mutex_unlock(&e->mu);
    return FL_OK;
}

int32_t fl_engine_lora_loaded(fl_engine *e, int32_t k, float *scale) {
    pthread_mutex_lock(&e->mu);
    const bool on = k >= 1 && k <= e->p.n_loras && e->lora_state[k - 1] == LORA_LOADED;
    if (scale) *scale = on ? e->lora_loaded[k - 1] : 0.0f;
    pthread_mutex_unlock(&e->mu);
    return on;
}

int32_t fl_engine_token_text(fl_engine *e, int32_t token, char *buf, int32_t cap) {
    if (token < 0 || token >= e->be.n_vocab) return -1;
    if (e->be.token_text) return e->be.token_text(e->be.ctx, token, buf, cap);
    return e->be.piece ? e->be.piece(e->be.ctx, token, buf, cap) : -1;
}

int64_t fl_engine_detokenize(fl_engine *e, const int32_t *ids, int64_t n, char *buf, int64_t cap) {
    if (!e->be.detokenize) return -1;
    return e->be.detokenize(e->be.ctx, ids, n, buf, cap);
}

double fl_engine_forward_seconds(const fl_engine *e) { return e->t_forward; }
