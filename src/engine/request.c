/* Request state and the incremental stop-string matcher (see request.h). */
#include "engine/request.h"

#include "engine/json_schema.h"
#include "engine/grammar.h"
#include "engine/triggers.h"
#include "engine/regex_guide.h"

#include "core/alloc.h"
#include "core/status.h"

#include <string.h>

/* ---- stop strings ---- */

fl_status fl_stop_init(fl_stop_matcher *m, const char *const *stop) {
    memset(m, 0, sizeof *m);
    for (int i = 0; stop && i < FL_MAX_STOP_STRINGS && stop[i]; i++) {
        if (!stop[i][0]) continue;
        m->stop[m->n_stop] = fl_strdup(FL_MEM_MISC, stop[i]);
        if (!m->stop[m->n_stop]) {
            fl_stop_deinit(m);
            return FL_ERR_NOMEM;
        }
        int32_t l = (int32_t)strlen(stop[i]);
        if (l > m->max_stop_len) m->max_stop_len = l;
        m->n_stop++;
    }
    m->cap = 64;
    m->text = fl_alloc(FL_MEM_MISC, (size_t)m->cap, 0);
    if (!m->text) {
        fl_stop_deinit(m);
        return FL_ERR_NOMEM;
    }
    m->text[0] = 0;
    return FL_OK;
}

void fl_stop_deinit(fl_stop_matcher *m) {
    for (int i = 0; i < m->n_stop; i++) fl_free(FL_MEM_MISC, m->stop[i], strlen(m->stop[i]) + 1);
    if (m->text) fl_free(FL_MEM_MISC, m->text, (size_t)m->cap);
    memset(m, 0, sizeof *m);
}

/* Append the piece, then look for the earliest complete stop string that starts at or after the
 * released text (anything that could begin a stop string is never released, so no match can
 * start before m->emitted). */
fl_status fl_stop_push(fl_stop_matcher *m, const char *piece, int64_t n, bool *stopped) {
    *stopped = m->stopped;
    if (m->stopped || n <= 0) return FL_OK;
    if (m->len + n + 1 > m->cap) {
        int64_t nc = m->cap;
        while (m->len + n + 1 > nc) nc *= 2;
        char *t = fl_realloc(FL_MEM_MISC, m->text, (size_t)m->cap, (size_t)nc, 0);
        if (!t) return FL_ERR_NOMEM;
        m->text = t;
        m->cap = nc;
    }
    memcpy(m->text + m->len, piece, (size_t)n);
    m->len += n;
    m->text[m->len] = 0;
    int64_t best = -1;
    int which = 0;
    for (int i = 0; i < m->n_stop; i++) {
        const char *hit = strstr(m->text + m->emitted, m->stop[i]);
        /* strstr stops at an embedded NUL byte; pieces never contain one in practice */
        if (hit && (best < 0 || hit - m->text < best)) best = hit - m->text, which = i;
    }
    if (best >= 0) {
        m->len = best + (m->include ? (int64_t)strlen(m->stop[which]) : 0);
        m->text[m->len] = 0;
        m->stopped = true;
        m->which = which;
    }
    *stopped = m->stopped;
    return FL_OK;
}

/* Bytes at the end of text[from, len) that form an incomplete UTF-8 sequence. */
static int64_t utf8_incomplete_tail(const char *s, int64_t from, int64_t len) {
    for (int64_t k = 1; k <= 3 && len - k >= from; k++) {
        unsigned char c = (unsigned char)s[len - k];
        if ((c & 0xC0) == 0x80) continue; /* continuation byte: keep looking for the lead */
        int64_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
        return need > k ? k : 0;
    }
    return 0;
}

void fl_stop_release(fl_stop_matcher *m, bool final, int64_t *start, int64_t *n) {
    int64_t end = m->len;
    if (!final && !m->stopped) {
        /* hold back the longest suffix that is a proper prefix of some stop string */
        int64_t hold = 0;
        for (int i = 0; i < m->n_stop; i++) {
            int64_t sl = (int64_t)strlen(m->stop[i]);
            for (int64_t k = sl - 1; k > hold; k--) {
                if (k > m->len - m->emitted) continue;
                if (!memcmp(m->text + m->len - k, m->stop[i], (size_t)k)) {
                    hold = k;
                    break;
                }
            }
        }
        int64_t u = utf8_incomplete_tail(m->text, m->emitted, m->len);
        if (u > hold) hold = u;
        end = m->len - hold;
    }
    *start = m->emitted;
    *n = end - m->emitted;
    m->emitted = end;
}

/* ---- requests ---- */

fl_status fl_request_new(const fl_request_params *p, int64_t id, int32_t sample, int64_t arrival,
                         fl_request **out) {
    *out = NULL;
    if (!p || !p->prompt || p->n_prompt < 1)
        return fl_set_error(FL_ERR_INVALID, "%s: empty prompt", __func__);
    if (p->max_tokens < 1)
        return fl_set_error(FL_ERR_INVALID, "%s: max_tokens must be >= 1 (got %d)", __func__, p->max_tokens);
    if ((int64_t)p->n_prompt + p->max_tokens > INT32_MAX / 2)
        return fl_set_error(FL_ERR_RANGE, "%s: prompt + max_tokens too large", __func__);
    fl_request *r = fl_calloc(FL_MEM_MISC, 1, sizeof *r);
    if (!r) return FL_ERR_NOMEM;
    r->cap = p->n_prompt + p->max_tokens;
    r->tokens = fl_alloc(FL_MEM_MISC, (size_t)r->cap * sizeof(int32_t), 0);
    if (!r->tokens || fl_stop_init(&r->stop, p->stop) != FL_OK) {
        fl_request_free(r);
        return FL_ERR_NOMEM;
    }
    r->stop.include = p->include_stop_str_in_output != 0;
    r->stop_token = -1;
    memcpy(r->tokens, p->prompt, (size_t)p->n_prompt * sizeof(int32_t));
    r->id = id;
    r->sample = sample;
    r->arrival = arrival;
    r->priority = p->priority;
    r->state = FL_REQ_WAITING;
    r->n_prompt = r->n_tokens = p->n_prompt;
    r->max_tokens = p->max_tokens;
    r->ignore_eos = p->ignore_eos;
    r->special_text = p->special_text != 0;
    r->min_tokens = p->min_tokens;
    r->n_stop_ids = p->n_stop_token_ids;
    memcpy(r->stop_ids, p->stop_token_ids, (size_t)p->n_stop_token_ids * sizeof *r->stop_ids);
    r->cache_salt = p->cache_salt;
    r->sampling = p->sampling;
    r->logprobs = p->logprobs || p->top_logprobs > 0;
    r->n_top = p->top_logprobs > 0 ? p->top_logprobs : 0;
    if ((p->json_object != 0) + (p->json_schema != NULL) + (p->n_choices != 0) + (p->regex != NULL) + (p->grammar != NULL) > 1) {
        fl_request_free(r);
        return fl_set_error(FL_ERR_INVALID, "one output constraint at a time: json_object, json_schema, choices, regex or grammar");
    }
    if (p->regex || p->grammar) {
        const fl_status st = p->regex ? fl_regex_guide_new(p->regex, &r->regex) : fl_grammar_guide_new(p->grammar, &r->grammar);
        if (st != FL_OK) {
            fl_request_free(r);
            return st;
        }
    }
    if (p->n_grammar_triggers || p->grammar_triggers) { /* a lazy grammar */
        const fl_status st = !p->grammar ? fl_set_error(FL_ERR_INVALID, "grammar triggers without a grammar")
                                         : fl_triggers_new(p->grammar_triggers, p->n_grammar_triggers, INT32_MAX, p->lazy_after_think, &r->triggers); /* (the engine checks token ids) */
        if (st != FL_OK) {
            fl_request_free(r);
            return st;
        }
        r->lazy = true;
        r->lazy_repeat = p->lazy_repeat != 0;
    }
    r->json = p->json_object != 0 || p->json_schema || p->n_choices;
    if (r->json) {
        if (!(r->json_fsm = fl_alloc(FL_MEM_GUIDE, sizeof *r->json_fsm, 0))) {
            fl_request_free(r);
            return FL_ERR_NOMEM;
        }
        fl_json_fsm_init(r->json_fsm);
    }
    if (p->json_schema || p->n_choices) {
        const fl_status st = p->json_schema ? fl_json_schema_compile(p->json_schema, &r->schema)
                                            : fl_json_schema_choices(p->choices, p->n_choices, &r->schema);
        if (st != FL_OK) {
            fl_request_free(r);
            return st;
        }
        fl_json_fsm_init_schema(r->json_fsm, r->schema);
    }
    r->pooling = p->pooling;
    r->prompt_logprobs = p->prompt_logprobs && sample == 0; /* the samples share one prompt */
    const size_t rec = (size_t)(1 + r->n_top) * sizeof *r->lp;
    if ((r->logprobs && !(r->lp = fl_alloc(FL_MEM_MISC, (size_t)r->max_tokens * rec, 0))) ||
        (r->prompt_logprobs && p->n_prompt > 1 && (!(r->plp = fl_alloc(FL_MEM_MISC, (size_t)(p->n_prompt - 1) * rec, 0)) ||
                                                   !(r->plp_rank = fl_alloc(FL_MEM_MISC, (size_t)(p->n_prompt - 1) * sizeof *r->plp_rank, 0))))) {
        fl_request_free(r);
        return FL_ERR_NOMEM;
    }
    /* splitmix-style mix so samples of one request get unrelated streams */
    r->rng = p->sampling.seed + 0x9E3779B97F4A7C15ull * (uint64_t)(sample + 1);
    *out = r;
    return FL_OK;
}

void fl_request_free(fl_request *r) {
    if (!r) return;
    if (r->tokens) fl_free(FL_MEM_MISC, r->tokens, (size_t)r->cap * sizeof(int32_t));
    if (r->lp) fl_free(FL_MEM_MISC, r->lp, (size_t)r->max_tokens * (size_t)(1 + r->n_top) * sizeof *r->lp);
    if (r->plp) fl_free(FL_MEM_MISC, r->plp, (size_t)(r->n_prompt - 1) * (size_t)(1 + r->n_top) * sizeof *r->plp);
    if (r->plp_rank) fl_free(FL_MEM_MISC, r->plp_rank, (size_t)(r->n_prompt - 1) * sizeof *r->plp_rank);
    if (r->stop.text || r->stop.n_stop) fl_stop_deinit(&r->stop);
    fl_json_schema_free(r->schema);
    fl_regex_guide_free(r->regex);
    fl_grammar_guide_free(r->grammar);
    fl_triggers_free(r->triggers);
    fl_free(FL_MEM_GUIDE, r->ltext, r->ltext_cap);
    fl_free(FL_MEM_GUIDE, r->json_fsm, r->json_fsm ? sizeof *r->json_fsm : 0);
    fl_free(FL_MEM_MISC, r, sizeof *r);
}

void fl_request_append(fl_request *r, int32_t token) {
    FL_ASSERT(r->n_tokens < r->cap);
    r->tokens[r->n_tokens++] = token;
}

const char *fl_request_state_name(fl_request_state s) {
    switch (s) {
    case FL_REQ_WAITING: return "waiting";
    case FL_REQ_RUNNING: return "running";
    case FL_REQ_PREEMPTED: return "preempted";
    case FL_REQ_FINISHED: return "finished";
    }
    return "?";
}

const char *fl_finish_reason_name(fl_finish_reason f) {
    switch (f) {
    case FL_FINISH_NONE: return "none";
    case FL_FINISH_EOS: return "eos";
    case FL_FINISH_LENGTH: return "length";
    case FL_FINISH_STOP: return "stop";
    case FL_FINISH_CANCELLED: return "cancelled";
    case FL_FINISH_ERROR: return "error";
    }
    return "?";
}
