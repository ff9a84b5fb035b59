/* HTTP request handling: routing, auth, limits, OpenAI request parsing and response shapes,
 * streaming with server-sent events, and cancellation when the client goes away. */
#include "server/server_int.h"

#include "engine/json_schema.h"
#include "engine/triggers.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/utf8.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

struct srv_conn {
    srv_buf body;
    bool too_big;
    bool no_mem;     /* the body could not be buffered (the server's buffers are full: --net-mem) */
    bool net_big;    /* the body can never be buffered under --net-mem */
};

/* ---- small response helpers ---- */

static enum MHD_Result send_text(struct MHD_Connection *conn, unsigned status, const char *ctype, const char *body,
                                 size_t len, const char *retry_after) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype);
    if (retry_after) MHD_add_response_header(r, "Retry-After", retry_after);
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result ret = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ret;
}

static void count_status(fl_server *s, unsigned status) {
    pthread_mutex_lock(&s->mu);
    if (status >= 500) s->m.requests_err5xx++;
    else if (status >= 400) s->m.requests_err4xx++;
    pthread_mutex_unlock(&s->mu);
}

/* The error bodies of this thread's request: OpenAI's, or Anthropic's for /v1/messages (libmicrohttpd
 * runs each connection on its own thread; handle() sets it per request). */
static _Thread_local bool err_anthropic;
/* This thread's failed allocations when handle() took the request's last call: a reply built
 * after one more failed is not sent as it is (cJSON's helpers leave out what they cannot make). */
static _Thread_local size_t req_f0;

/* Anthropic's error type for an HTTP status */
static const char *anthropic_error_type(unsigned status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

/* OpenAI-style error body: {"error":{"message","type","param","code"}} (Anthropic's for
 * /v1/messages: {"type":"error","error":{"type","message"}}). */
static enum MHD_Result send_error(fl_server *s, struct MHD_Connection *conn, unsigned status, const char *type,
                                  const char *code, const char *param, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static enum MHD_Result send_error(fl_server *s, struct MHD_Connection *conn, unsigned status, const char *type,
                                  const char *code, const char *param, const char *fmt, ...) {
    char raw[512], msg[3 * sizeof raw];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    /* a message may quote the request (a bad value, a schema's keyword), whose bytes need not be
     * UTF-8, or cut a character: the body stays well-formed */
    msg[fl_utf8_sanitize(raw, strlen(raw), msg)] = 0;
    count_status(s, status);
    cJSON *o = cJSON_CreateObject(), *e;
    if (err_anthropic) {
        cJSON_AddStringToObject(o, "type", "error");
        e = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(e, "type", anthropic_error_type(status));
        cJSON_AddStringToObject(e, "message", msg);
    } else {
        e = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(e, "message", msg);
        cJSON_AddStringToObject(e, "type", type);
        if (param) cJSON_AddStringToObject(e, "param", param); else cJSON_AddNullToObject(e, "param");
        if (code) cJSON_AddStringToObject(e, "code", code); else cJSON_AddNullToObject(e, "code");
    }
    char *txt = cJSON_PrintUnformatted(o);
    enum MHD_Result r;
    if (txt) r = send_text(conn, status, "application/json", txt, strlen(txt), status == 503 || status == 429 ? "1" : NULL);
    else { /* no memory for the message itself (the server's buffers are full): a fixed one */
        static const char full[] = "{\"error\":{\"message\":\"the server's buffers are full; retry later\",\"type\":\"server_error\",\"param\":null,\"code\":\"server_busy\"}}";
        r = send_text(conn, 503, "application/json", full, sizeof full - 1, "1");
    }
    cJSON_free(txt);
    cJSON_Delete(o);
    return r;
}

#define BAD(...) send_error(s, conn, 400, "invalid_request_error", NULL, NULL, __VA_ARGS__)
/* out of memory: under --net-mem the server's buffers are full for now (503, retry) */
#define NOMEM()                                                                                                  \
    (fl_mem_budget(FL_MEM_NET) ? send_error(s, conn, 503, "server_error", "server_busy", NULL,                    \
                                            "the server's buffers (--net-mem %zu bytes) are full; retry later",     \
                                            fl_mem_budget(FL_MEM_NET))                                            \
                               : send_error(s, conn, 500, "server_error", NULL, NULL, "out of memory"))

/* ---- request parsing helpers ---- */

/* The request's body parsed as JSON (NULL when it is not JSON, or when the parse ran out of
 * memory: cJSON says only NULL, so this thread's failed allocations since the request's last call
 * tell the two apart, and BAD_BODY() answers 400 or NOMEM()'s 503 / 500). */
static cJSON *parse_body(const srv_conn *c) { return cJSON_ParseWithLength(c->body.p ? c->body.p : "", c->body.len); }
#define BAD_BODY() (fl_mem_thread_failures() != req_f0 ? NOMEM() : BAD("malformed JSON in the request body"))

/* Optional number in [lo, hi]; returns 0 ok, -1 bad (err filled). */
static int get_num(const cJSON *o, const char *name, double lo, double hi, double *out, char *err, size_t errn) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi) {
        snprintf(err, errn, "'%s' must be a number in [%g, %g]", name, lo, hi);
        return -1;
    }
    *out = v->valuedouble;
    return 0;
}

static int get_int(const cJSON *o, const char *name, double lo, double hi, int64_t *out, char *err, size_t errn) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi) {
        snprintf(err, errn, "'%s' must be an integer in [%.0f, %.0f]", name, lo, hi);
        return -1;
    }
    *out = (int64_t)v->valuedouble;
    return 0;
}

/* x is a token id of the model's vocabulary (an integral number in [0, n_vocab)). */
static bool is_token_id(const fl_server *s, const cJSON *x) {
    return cJSON_IsNumber(x) && x->valuedouble == floor(x->valuedouble) && x->valuedouble >= 0 &&
           x->valuedouble < fl_engine_n_vocab(s->engine);
}

/* The JSON array a of token ids into a new FL_MEM_NET array *ids of *n (cJSON_GetArraySize)
 * entries, NULL when empty: false where an element is no id of the vocabulary (*ids is then
 * still the caller's to free, *n its size); *nomem where the array could not be allocated. */
static bool token_ids_of(const fl_server *s, const cJSON *a, int32_t **ids, int64_t *n, bool *nomem) {
    *n = cJSON_GetArraySize(a);
    *ids = NULL;
    *nomem = false;
    if (*n && !(*ids = fl_alloc(FL_MEM_NET, (size_t)*n * sizeof **ids, 16))) {
        *n = 0;
        *nomem = true;
        return false;
    }
    int64_t k = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, a) {
        if (!is_token_id(s, x)) return false;
        (*ids)[k++] = (int32_t)x->valuedouble;
    }
    return true;
}

/* (refused rather than ignored, where set (not null or false): each would change the output;
 * vLLM's sampling extras this server does not follow) */
static const char *const unsupported_fields[] = {"functions", "function_call", "best_of",
                                                  "suffix", "audio", "modalities", "guided_whitespace_pattern", "use_beam_search",
                                                  NULL};

/* vLLM's add_generation_prompt (default true) and continue_final_message (default false) of a
 * chat request as srv_chat_render_ex's flags; false with err set when one is not a boolean. */
static bool chat_flags(const cJSON *j, unsigned *flags, char *err, size_t n) {
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(j, "add_generation_prompt"), *c = cJSON_GetObjectItemCaseSensitive(j, "continue_final_message");
    if ((g && !cJSON_IsNull(g) && !cJSON_IsBool(g)) || (c && !cJSON_IsNull(c) && !cJSON_IsBool(c))) {
        snprintf(err, n, "'add_generation_prompt' and 'continue_final_message' must be booleans");
        return false;
    }
    *flags = (cJSON_IsFalse(g) ? SRV_CHAT_NO_GEN_PROMPT : 0) | (cJSON_IsTrue(c) ? SRV_CHAT_CONTINUE : 0);
    return true;
}

/* ---- streaming machinery ---- */

static const char *finish_str(fl_finish_reason f) {
    switch (f) {
    case FL_FINISH_EOS: case FL_FINISH_STOP: return "stop";
    case FL_FINISH_LENGTH: return "length";
    case FL_FINISH_CANCELLED: return "cancelled";
    case FL_FINISH_ERROR: return "error";
    default: return NULL;
    }
}

/* Bytes of s that end on a UTF-8 character boundary. */
static size_t utf8_complete(const char *s, size_t n) {
    size_t i = n;
    int back = 0;
    while (i > 0 && back < 4 && ((unsigned char)s[i - 1] & 0xC0) == 0x80) { i--; back++; }
    if (i == 0) return n;
    unsigned char lead = (unsigned char)s[i - 1];
    int need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    if (need > 1 && back + 1 < need) return i - 1;
    return n;
}

/* ---- logprobs ----
 * Each generated token has a record of 1 + n_top (token, logprob) pairs from the engine: itself,
 * then the n_top most likely tokens at its position.  /v1/completions lists them in the legacy
 * shape (tokens, token_logprobs, top_logprobs as {text: logprob} holding the n_top and the sampled
 * token, text_offset in characters); /v1/chat/completions in the chat shape (content: [{token,
 * logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]).  A token whose bytes are not
 * well-formed UTF-8 on their own (a byte-fallback token) is named "bytes:\xNN..." as OpenAI does;
 * its bytes are exact in the chat shape. */

typedef struct tok_name {
    char raw[256];   /* the token's bytes (special tokens as their text) */
    int32_t nraw;
    char name[4 * 256 + 8];
} tok_name;

static void token_name(fl_server *s, int32_t tok, tok_name *t) {
    int32_t n = fl_engine_token_text(s->engine, tok, t->raw, (int32_t)sizeof t->raw);
    t->nraw = n > 0 ? n : 0;
    t->raw[t->nraw] = 0;
    if (fl_utf8_is_valid(t->raw, (size_t)t->nraw)) {
        memcpy(t->name, t->raw, (size_t)t->nraw + 1);
        return;
    }
    size_t k = (size_t)snprintf(t->name, sizeof t->name, "bytes:");
    for (int32_t i = 0; i < t->nraw; i++) k += (size_t)snprintf(t->name + k, sizeof t->name - k, "\\x%02x", (unsigned char)t->raw[i]);
}

static cJSON *token_entry(const tok_name *t, float lp, bool chat_shape) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "token", t->name);
    cJSON_AddNumberToObject(o, "logprob", lp);
    if (chat_shape) {
        cJSON *b = cJSON_AddArrayToObject(o, "bytes");
        for (int32_t i = 0; i < t->nraw; i++) srv_push(b, cJSON_CreateNumber((unsigned char)t->raw[i]));
    }
    return o;
}

/* The legacy shape's four arrays, one entry per token. */
typedef struct legacy_lp {
    cJSON *tokens, *lps, *tops, *offs;
} legacy_lp;

/* Append token rec[0] (rec NULL: tok, the prompt's first token, which has no logprob) to the
 * legacy arrays; *chars: the text offset, advanced by its characters. */
static void legacy_add(fl_server *s, const legacy_lp *a, tok_name *t, int32_t tok, const fl_token_logprob *rec, int32_t w,
                       int64_t *chars) {
    cJSON *top = rec ? cJSON_CreateObject() : cJSON_CreateNull();
    for (int32_t k = 1; rec && k <= w; k++) { /* the n_top, then the sampled token if it is not among them */
        const fl_token_logprob *x = k < w ? &rec[k] : &rec[0];
        token_name(s, x->token, t);
        if (!cJSON_GetObjectItemCaseSensitive(top, t->name)) cJSON_AddNumberToObject(top, t->name, x->logprob);
    }
    token_name(s, rec ? rec[0].token : tok, t);
    srv_push(a->tokens, cJSON_CreateString(t->name));
    srv_push(a->lps, rec ? cJSON_CreateNumber(rec[0].logprob) : cJSON_CreateNull());
    srv_push(a->tops, top);
    srv_push(a->offs, cJSON_CreateNumber((double)*chars));
    for (int32_t b = 0; b < t->nraw; b++) *chars += ((unsigned char)t->raw[b] & 0xC0) != 0x80;
}

/* The logprobs of sample sm's records [sm->lp_sent, to) in the endpoint's shape, led by the
 * prompt's when prompt is set (echo); NULL when none were asked for or there are none.  Marks
 * them sent. */
static cJSON *logprobs_json(fl_server *s, srv_req *r, srv_sample *sm, int32_t to, bool prompt) {
    if (!r->logprobs || (to <= sm->lp_sent && !prompt)) return NULL;
    const int32_t w = 1 + r->n_top, ws = 1 + r->n_show; /* the records' stride; what they list */
    tok_name *t = fl_alloc(FL_MEM_NET, sizeof *t, 16);
    if (!t) return NULL;
    cJSON *o = cJSON_CreateObject();
    if (r->chat) {
        cJSON *content = cJSON_AddArrayToObject(o, "content");
        for (int32_t i = sm->lp_sent; i < to; i++) {
            const fl_token_logprob *rec = sm->lp + (size_t)i * (size_t)w;
            token_name(s, rec[0].token, t);
            cJSON *e = token_entry(t, rec[0].logprob, true), *top = cJSON_AddArrayToObject(e, "top_logprobs");
            for (int32_t k = 1; k < ws; k++) {
                token_name(s, rec[k].token, t);
                srv_push(top, token_entry(t, rec[k].logprob, true));
            }
            srv_push(content, e);
        }
    } else {
        legacy_lp a = {cJSON_AddArrayToObject(o, "tokens"), cJSON_AddArrayToObject(o, "token_logprobs"),
                       cJSON_AddArrayToObject(o, "top_logprobs"), cJSON_AddArrayToObject(o, "text_offset")};
        if (prompt) {
            const srv_prompt *pr = &r->pr[(sm - r->samples) / r->n];
            legacy_add(s, &a, t, pr->first_tok, NULL, ws, &sm->lp_chars);
            for (int32_t i = 0; i < pr->n_plp; i++) legacy_add(s, &a, t, 0, pr->plp + (size_t)i * (size_t)w, ws, &sm->lp_chars);
        }
        for (int32_t i = sm->lp_sent; i < to; i++) legacy_add(s, &a, t, 0, sm->lp + (size_t)i * (size_t)w, ws, &sm->lp_chars);
    }
    fl_free(FL_MEM_NET, t, sizeof *t);
    sm->lp_sent = to;
    return o;
}

/* vLLM's prompt_logprobs of prompt pr: null for its first token, then per token an object by
 * token id (as text) of {logprob, rank, decoded_token}: the prompt token with its rank in the
 * vocabulary, then the k_plp most likely with ranks 1..k_plp (the prompt token once).  NULL
 * when none were asked for. */
static cJSON *prompt_logprobs_json(fl_server *s, const srv_req *r, const srv_prompt *pr) {
    if (r->k_plp < 0) return NULL;
    tok_name *t = fl_alloc(FL_MEM_NET, sizeof *t, 16);
    if (!t) return NULL;
    cJSON *a = cJSON_CreateArray();
    srv_push(a, cJSON_CreateNull());
    const int32_t w = 1 + r->n_top;
    for (int32_t i = 0; i < pr->n_plp; i++) {
        const fl_token_logprob *rec = pr->plp + (size_t)i * (size_t)w;
        cJSON *d = cJSON_CreateObject();
        for (int32_t k = 0; k <= r->k_plp; k++) {
            if (k > 0 && rec[k].token == rec[0].token) continue;
            char id[16];
            snprintf(id, sizeof id, "%d", rec[k].token);
            token_name(s, rec[k].token, t);
            cJSON *e = cJSON_AddObjectToObject(d, id);
            cJSON_AddNumberToObject(e, "logprob", rec[k].logprob);
            cJSON_AddNumberToObject(e, "rank", k ? k : pr->plp_rank[i]);
            cJSON_AddStringToObject(e, "decoded_token", t->name);
        }
        srv_push(a, d);
    }
    fl_free(FL_MEM_NET, t, sizeof *t);
    return a;
}

/* vLLM's stop_reason: the stop string or stop token id that ended the sample, else null */
static void add_stop_reason(cJSON *c, const srv_sample *sm) {
    if (sm->finish == FL_FINISH_STOP && sm->stop_str) cJSON_AddStringToObject(c, "stop_reason", sm->stop_str);
    else if (sm->finish == FL_FINISH_STOP && sm->stop_token >= 0) cJSON_AddNumberToObject(c, "stop_reason", sm->stop_token);
    else cJSON_AddNullToObject(c, "stop_reason");
}

/* c.logprobs := the records up to `to`, led by the prompt's when prompt (null when none) */
static void add_logprobs(fl_server *s, srv_req *r, srv_sample *sm, cJSON *c, int32_t to, bool prompt) {
    cJSON *lp = logprobs_json(s, r, sm, to, prompt);
    if (lp) srv_add(c, "logprobs", lp);
    else cJSON_AddNullToObject(c, "logprobs");
}

/* The reply's model: the named adapter the request picked, else the base model. */
static const char *srv_model_name(const fl_server *s, const srv_req *r) { return r->model[0] ? r->model : s->model_name; }

static cJSON *chunk_base(fl_server *s, srv_req *r) {
    r->chunk_f0 = fl_mem_thread_failures(); /* (emit_chunk checks the chunk against it) */
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", r->created_id);
    cJSON_AddStringToObject(o, "object", r->chat ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)r->created);
    cJSON_AddStringToObject(o, "model", srv_model_name(s, r));
    return o;
}

/* Append SSE chunks for new text and finished samples (called with s->mu held). */
/* usage: prompt, completion and total tokens, and the prompt tokens the prefix cache served
 * (OpenAI's prompt_tokens_details.cached_tokens; each prompt counted once, as its tokens are) */
static void add_usage(cJSON *u, const srv_req *r, int32_t gen) {
    int32_t cached = 0;
    for (int32_t k = 0; k < r->n_pr; k++) cached += r->pr[k].n_cached;
    cJSON_AddNumberToObject(u, "prompt_tokens", srv_prompt_tokens(r));
    cJSON_AddNumberToObject(u, "completion_tokens", gen);
    cJSON_AddNumberToObject(u, "total_tokens", srv_prompt_tokens(r) + gen);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "prompt_tokens_details"), "cached_tokens", cached);
    if (r->reasoning) { /* the thinking's tokens (OpenAI's completion_tokens_details.reasoning_tokens) */
        int32_t think = 0;
        for (int k = 0; k < srv_choices(r); k++) think += r->samples[k].n_reason;
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "completion_tokens_details"), "reasoning_tokens", think);
    }
}

static bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* The seed of choice i's tool call ids */
static uint64_t tool_seed(const srv_req *r, int i) {
    return XXH3_64bits_withSeed(r->created_id, strlen(r->created_id), (uint64_t)r->created * 1000003u + (uint64_t)i);
}

/* A chat choice's message: its content, or its tool calls (and the content beside them).  True
 * where it holds calls. */
static bool add_message(srv_req *r, int i, cJSON *m, const char *txt, size_t n) {
    cJSON_AddStringToObject(m, "role", "assistant");
    size_t r0, r1, c;
    srv_buf think = {0}, content = {0};
    const bool thought = r->reasoning && srv_think_scan(txt, n, r->think_open, true, 0, &r0, &r1, &c) == SRV_THINK_DONE;
    if (thought) { /* the reasoning, and the answer after it, each trimmed */
        while (r0 < r1 && is_space(txt[r0])) r0++;
        while (r1 > r0 && is_space(txt[r1 - 1])) r1--;
        srv_buf_append(&think, txt + r0, r1 - r0);
        while (c < n && is_space(txt[c])) c++;
        txt += c;
        n -= c;
    }
    cJSON *calls = r->tools.mode != SRV_TOOLS_NONE ? srv_tools_parse(&r->tools, txt, n, tool_seed(r, i), true, &content) : NULL;
    if (calls && content.len) cJSON_AddStringToObject(m, "content", content.p);
    else if (calls || (thought && !n)) cJSON_AddNullToObject(m, "content");
    else cJSON_AddStringToObject(m, "content", txt);
    if (thought) cJSON_AddStringToObject(m, "reasoning_content", think.p ? think.p : "");
    if (calls) srv_add(m, "tool_calls", calls);
    srv_buf_free(&content);
    srv_buf_free(&think);
    return calls != NULL;
}

/* A choice's finish reason; "tool_calls" where it ended holding calls it was not told to make
 * (a named function's call ends "stop", as OpenAI's) */
static const char *choice_finish(const srv_req *r, const srv_sample *sm, bool calls) {
    const char *f = finish_str(sm->finish) ? finish_str(sm->finish) : "stop";
    return calls && !strcmp(f, "stop") && r->tools.mode != SRV_TOOLS_NAMED ? "tool_calls" : f;
}

/* A chat.completion.chunk of r's stream: an SSE event, or its Responses (/v1/responses) or
 * Anthropic (/v1/messages) events.  A chunk built through a failed allocation (cJSON's helpers
 * leave the part out) is not sent: the reply is cut (end_cut). */
static void emit_chunk(srv_req *r, cJSON *o) {
    const size_t n0 = r->out.len;
    if (fl_mem_thread_failures() == r->chunk_f0) {
        if (r->resp) srv_resp_chunk(r->resp, o, &r->out);
        else if (r->msgs) srv_msgs_chunk(r->msgs, o, r->pr[0].n_prompt, r->pr[0].n_cached, &r->out);
        else srv_append_json(&r->out, o, true);
        if (fl_mem_thread_failures() == r->chunk_f0) return;
    }
    /* a part of the chunk, or of its events, could not be made: the reply is cut */
    r->cut = true;
    if (r->resp) srv_resp_fail(r->resp); /* (their whole events stay; their end says failed) */
    else if (r->msgs) srv_msgs_fail(r->msgs);
    else r->out.len = n0; /* (not half an event) */
}

/* A new chunk *o of choice i (its entry *c): its delta, with the role where none went out yet. */
static cJSON *delta_chunk(fl_server *s, srv_req *r, int i, cJSON **o, cJSON **c) {
    *o = chunk_base(s, r);
    *c = cJSON_CreateObject();
    if (!srv_push(cJSON_AddArrayToObject(*o, "choices"), *c)) *c = NULL; /* (freed; emit_chunk will not send the chunk) */
    cJSON_AddNumberToObject(*c, "index", i);
    cJSON *d = cJSON_AddObjectToObject(*c, "delta");
    if (!r->role_sent) cJSON_AddStringToObject(d, "role", "assistant");
    return d;
}

/* A chunk of choice i whose delta carries call 0's arguments txt[a, e) (and, first, its id, type
 * and name), with the logprob records up to `to`; no finish. */
static void named_args_chunk(fl_server *s, srv_req *r, int i, const char *txt, size_t a, size_t e, int32_t to) {
    srv_sample *sm = &r->samples[i];
    cJSON *o, *c, *tc, *f, *d = delta_chunk(s, r, i, &o, &c);
    if (e > a) {
        char *frag = fl_alloc(FL_MEM_NET, e - a + 1, 16);
        if (!srv_push(cJSON_AddArrayToObject(d, "tool_calls"), tc = cJSON_CreateObject())) tc = NULL;
        cJSON_AddNumberToObject(tc, "index", 0);
        if (!sm->call_sent) { /* the call's id as the non-streamed reply would give it (srv_tools_parse: call 0 of this seed) */
            srv_buf none = {0};
            cJSON *calls = srv_tools_parse(&r->tools, "{}", 2, tool_seed(r, i), false, &none);
            const cJSON *id = calls ? cJSON_GetObjectItemCaseSensitive(calls->child, "id") : NULL;
            cJSON_AddStringToObject(tc, "id", cJSON_IsString(id) ? id->valuestring : "call_0");
            cJSON_AddStringToObject(tc, "type", "function");
            cJSON_Delete(calls);
            srv_buf_free(&none);
        }
        f = cJSON_AddObjectToObject(tc, "function");
        if (!sm->call_sent) cJSON_AddStringToObject(f, "name", r->tools.named);
        if (frag) {
            memcpy(frag, txt + a, e - a);
            frag[e - a] = 0;
            cJSON_AddStringToObject(f, "arguments", frag);
            fl_free(FL_MEM_NET, frag, e - a + 1);
        }
        sm->call_sent = true;
        sm->sent = e;
    }
    add_logprobs(s, r, sm, c, to, false);
    cJSON_AddNullToObject(c, "finish_reason");
    emit_chunk(r, o);
    cJSON_Delete(o);
    r->role_sent = true;
}

/* Whether choice i's text has a byte that is not a space past what was sent (a named call's
 * arguments have begun). */
static bool named_started(const srv_sample *sm) {
    for (size_t k = sm->sent; k < sm->text.len; k++)
        if (!is_space(sm->text.p[k])) return true;
    return false;
}

/* A named function's arguments as they come (vLLM's stream): from the first byte that is not
 * a space, up to the last such byte of whole characters (the reply's arguments are trimmed). */
static void stream_named_args(fl_server *s, srv_req *r, int i) {
    srv_sample *sm = &r->samples[i];
    const char *txt = sm->text.p ? sm->text.p : "";
    const size_t whole = utf8_complete(txt, sm->text.len);
    /* a chunk per engine output, as content streams (however late the connection reads): up to
     * each recorded boundary in turn, what is held (spaces, a cut character) going with the next */
    for (;;) {
        while (sm->seg_sent < sm->n_seg && sm->seg[sm->seg_sent].end <= sm->sent) sm->seg_sent++;
        const bool last = sm->seg_sent >= sm->n_seg || sm->seg[sm->seg_sent].end >= whole;
        size_t a = sm->sent, e = last ? whole : utf8_complete(txt, sm->seg[sm->seg_sent].end);
        if (!sm->call_sent)
            while (a < e && is_space(txt[a])) a++;
        while (e > a && is_space(txt[e - 1])) e--;
        if (e > a || !r->role_sent) named_args_chunk(s, r, i, txt, a, e, last ? sm->n_lp : sm->seg[sm->seg_sent].n_lp);
        if (last) break;
        sm->seg_sent++;
    }
}

/* Stream choice i's reasoning as delta.reasoning_content while it lasts; true once it is over
 * (or there is none), the answer then starting at sm->content_at. */
static bool stream_reasoning(fl_server *s, srv_req *r, int i, bool fin) {
    srv_sample *sm = &r->samples[i];
    const char *txt = sm->text.p ? sm->text.p : "";
    const size_t n = fin ? sm->text.len : utf8_complete(txt, sm->text.len);
    size_t r0, r1, c;
    const srv_think th = srv_think_scan(txt, n, r->think_open, fin, sm->r_sent, &r0, &r1, &c);
    if (th == SRV_THINK_UNDECIDED) return false;
    if (th == SRV_THINK_NONE) {
        sm->think_done = true;
        return true;
    }
    /* spaces around the reasoning are not streamed (the reply's reasoning_content is trimmed) */
    size_t from = sm->r_sent > r0 ? sm->r_sent : r0;
    if (sm->r_sent <= r0)
        while (from < r1 && is_space(txt[from])) from++;
    while (r1 > from && is_space(txt[r1 - 1])) r1--;
    if (r1 > from) {
        cJSON *o, *ch, *d = delta_chunk(s, r, i, &o, &ch);
        char *piece = fl_alloc(FL_MEM_NET, r1 - from + 1, 16);
        if (piece) {
            memcpy(piece, txt + from, r1 - from);
            piece[r1 - from] = 0;
            cJSON_AddStringToObject(d, "reasoning_content", piece);
            fl_free(FL_MEM_NET, piece, r1 - from + 1);
        }
        add_logprobs(s, r, sm, ch, sm->n_lp, false);
        cJSON_AddNullToObject(ch, "finish_reason");
        emit_chunk(r, o);
        cJSON_Delete(o);
        sm->r_sent = r1;
        r->role_sent = true;
    }
    if (th != SRV_THINK_DONE) return false;
    sm->think_done = true;
    sm->sent = sm->content_at = c;
    return true;
}

/* A chunk of finished choice i: the content not yet sent and the calls of its output (after
 * its reasoning) from call `skip` on (those before were streamed), each whole; true where it
 * holds calls. */
static bool calls_chunk(fl_server *s, srv_req *r, int i, int skip) {
    srv_sample *sm = &r->samples[i];
    srv_buf content = {0};
    const size_t base = sm->content_at;
    cJSON *calls = srv_tools_parse(&r->tools, sm->text.p ? sm->text.p + base : "", sm->text.len - base, tool_seed(r, i), false, &content);
    if (calls && skip > 0) { /* (their indices stay theirs) */
        int k = 0;
        for (cJSON *x = calls->child, *nx; x; x = nx, k++) {
            nx = x->next;
            cJSON_AddNumberToObject(x, "index", k);
            if (k < skip) cJSON_Delete(cJSON_DetachItemViaPointer(calls, x));
        }
        if (!calls->child) {
            cJSON_Delete(calls);
            calls = NULL;
        }
    }
    const size_t sent = sm->sent - base < content.len ? sm->sent - base : content.len;
    cJSON *o, *c, *d = delta_chunk(s, r, i, &o, &c);
    if (content.len > sent) {
        char *rest = fl_alloc(FL_MEM_NET, content.len - sent + 1, 16);
        if (rest) {
            memcpy(rest, content.p + sent, content.len - sent);
            rest[content.len - sent] = 0;
            cJSON_AddStringToObject(d, "content", rest);
            fl_free(FL_MEM_NET, rest, content.len - sent + 1);
        }
    }
    const bool any = calls != NULL;
    if (calls) {
        int k = 0;
        cJSON *x;
        if (skip <= 0) cJSON_ArrayForEach(x, calls) cJSON_AddNumberToObject(x, "index", k++);
        srv_add(d, "tool_calls", calls);
    }
    add_logprobs(s, r, sm, c, sm->n_lp, false);
    cJSON_AddNullToObject(c, "finish_reason");
    emit_chunk(r, o);
    cJSON_Delete(o);
    srv_buf_free(&content);
    return any;
}

/* A chunk of choice i whose delta carries a piece of call k: with name (the call's start) its
 * id, type, name and empty arguments; else more of its arguments, txt[a, e). */
static void call_piece_chunk(fl_server *s, srv_req *r, int i, int32_t k, bool header, const char *txt, size_t a, size_t e, int32_t to) {
    srv_sample *sm = &r->samples[i];
    cJSON *o, *c, *tc, *f, *d = delta_chunk(s, r, i, &o, &c);
    if (!srv_push(cJSON_AddArrayToObject(d, "tool_calls"), tc = cJSON_CreateObject())) tc = NULL;
    cJSON_AddNumberToObject(tc, "index", k);
    char *frag = fl_alloc(FL_MEM_NET, e - a + 1, 16);
    if (frag) {
        memcpy(frag, txt + a, e - a);
        frag[e - a] = 0;
    }
    if (header) {
        char id[40];
        srv_tools_call_id(tool_seed(r, i), k, id, sizeof id);
        cJSON_AddStringToObject(tc, "id", id);
        cJSON_AddStringToObject(tc, "type", "function");
    }
    f = cJSON_AddObjectToObject(tc, "function");
    if (header) cJSON_AddStringToObject(f, "name", frag ? frag : "");
    cJSON_AddStringToObject(f, "arguments", header || !frag ? "" : frag);
    fl_free(FL_MEM_NET, frag, frag ? e - a + 1 : 0);
    add_logprobs(s, r, sm, c, to, false);
    cJSON_AddNullToObject(c, "finish_reason");
    emit_chunk(r, o);
    cJSON_Delete(o);
    r->role_sent = true;
}

/* tool_choice "required" (and "auto" once its calls begin), streamed as vLLM does: each call's
 * id, type and name once its name is whole, then its arguments as they are generated (raw: their
 * pieces add up to the value's JSON text); fin: to the end of the output.  Off the calls' pattern
 * nothing more streams (the rest goes whole at the end). */
static void stream_calls(fl_server *s, srv_req *r, int i, bool fin) {
    srv_sample *sm = &r->samples[i];
    const char *txt = sm->text.p ? sm->text.p : "";
    const size_t base = sm->content_at, total = fin ? sm->text.len : utf8_complete(txt, sm->text.len);
    int32_t k;
    size_t a, e, lim;
    srv_call_piece p;
    if (sm->calls_upto < base) sm->calls_upto = base;
    /* the text as it came, one engine output at a time (the pieces then do not depend on how late
     * the connection reads) */
    do {
        while (sm->seg_sent < sm->n_seg && sm->seg[sm->seg_sent].end <= sm->calls_upto) sm->seg_sent++;
        lim = sm->seg_sent < sm->n_seg && sm->seg[sm->seg_sent].end < total ? utf8_complete(txt, sm->seg[sm->seg_sent].end) : total;
        if (lim <= sm->calls_upto && lim < total) { /* (a boundary inside a character: on to the next) */
            sm->seg_sent++;
            continue;
        }
        while ((p = srv_calls_next(&sm->cs, txt + base, lim - base, fin && lim == total, &k, &a, &e)) != SRV_CALL_NONE)
            call_piece_chunk(s, r, i, k, p == SRV_CALL_HEADER, txt + base, a, e,
                             lim < total && sm->seg_sent < sm->n_seg ? sm->seg[sm->seg_sent].n_lp : sm->n_lp);
        sm->calls_upto = lim > sm->calls_upto ? lim : sm->calls_upto;
    } while (lim < total);
}

/* Stream a finished chat choice that may hold tool calls: the content not yet sent and its
 * calls (a named function's streamed call: the rest of its arguments; "required", and "auto"
 * whose calls began streaming: the rest as they stream, and whole the calls after one off the
 * pattern), then the finish. */
static void stream_tools_finish(fl_server *s, srv_req *r, int i) {
    srv_sample *sm = &r->samples[i];
    bool calls = sm->call_sent;
    if (r->tools.mode == SRV_TOOLS_REQUIRED || sm->in_calls) {
        stream_calls(s, r, i, true);
        calls = sm->cs.n_calls > 0;
        /* off the pattern: the calls after those streamed, whole (and the content, as the reply
         * has it); nothing streamed at all (an output cut short): the role, and that content */
        if (srv_calls_off(&sm->cs) || !r->role_sent) calls = calls_chunk(s, r, i, sm->cs.n_calls) || calls;
    } else if (sm->call_sent || (r->tools.mode == SRV_TOOLS_NAMED && named_started(sm))) {
        /* a named function's arguments one engine output at a time, as they stream when the
         * connection reads in time: also for a request that finished before its first read */
        stream_named_args(s, r, i);
        calls = sm->call_sent;
        const char *txt = sm->text.p ? sm->text.p : "";
        size_t e = sm->text.len;
        while (e > sm->sent && is_space(txt[e - 1])) e--;
        if (e > sm->sent || sm->lp_sent < sm->n_lp) named_args_chunk(s, r, i, txt, sm->sent, e, sm->n_lp);
    } else {
        if (sm->content_at && sm->sent == sm->content_at) /* the answer after the reasoning: from its first non-space */
            while (sm->sent < sm->text.len && is_space(sm->text.p[sm->sent])) sm->content_at = ++sm->sent;
        calls = calls_chunk(s, r, i, 0);
    }
    cJSON *o = chunk_base(s, r), *c = cJSON_CreateObject();
    if (!srv_push(cJSON_AddArrayToObject(o, "choices"), c)) c = NULL;
    cJSON_AddNumberToObject(c, "index", i);
    cJSON_AddObjectToObject(c, "delta");
    cJSON_AddStringToObject(c, "finish_reason", choice_finish(r, sm, calls));
    add_stop_reason(c, sm);
    if (sm->finish == FL_FINISH_ERROR && sm->error[0]) cJSON_AddStringToObject(c, "error", sm->error);
    emit_chunk(r, o);
    cJSON_Delete(o);
    sm->sent = sm->text.len;
    sm->finish_sent = true;
    r->role_sent = true;
}

static void produce_stream(fl_server *s, srv_req *r) {
    for (int i = 0; i < srv_choices(r); i++) {
      for (int guard = 0; guard < 1 << 20; guard++) {
        srv_sample *sm = &r->samples[i];
        bool fin = sm->finish != FL_FINISH_NONE;
        if (sm->finish_sent) break;
        if (r->chat && r->reasoning && !sm->think_done && !stream_reasoning(s, r, i, fin)) break;
        const bool tools = r->chat && r->tools.mode != SRV_TOOLS_NONE;
        if (tools && fin) {
            stream_tools_finish(s, r, i);
            break;
        }
        if (tools && r->tools.mode == SRV_TOOLS_NAMED) {
            stream_named_args(s, r, i);
            break;
        }
        if (tools && (r->tools.mode == SRV_TOOLS_REQUIRED || sm->in_calls)) {
            stream_calls(s, r, i, false);
            break;
        }
        if (sm->content_at && sm->sent == sm->content_at) { /* the answer after the reasoning: from its first non-space */
            size_t k = sm->sent;
            while (k < sm->text.len && is_space(sm->text.p[k])) k++;
            if (k == sm->text.len && !fin) break;
            sm->sent = sm->content_at = k;
        }
        /* one chunk per engine output: up to the next recorded boundary, whole UTF-8 characters */
        while (sm->seg_sent < sm->n_seg && sm->seg[sm->seg_sent].end <= sm->sent) sm->seg_sent++;
        size_t lim = sm->seg_sent < sm->n_seg ? sm->seg[sm->seg_sent].end : sm->text.len;
        size_t avail = utf8_complete(sm->text.p ? sm->text.p : "", lim);
        /* a segment that ends inside a character (byte-fallback tokens split it) has nothing more
         * to send: take the next segments with it until the character is whole (before, the
         * stream stopped there for good) */
        while (avail <= sm->sent && sm->seg_sent + 1 < sm->n_seg) {
            lim = sm->seg[++sm->seg_sent].end;
            avail = utf8_complete(sm->text.p, lim);
        }
        if (fin && lim == sm->text.len) avail = lim;
        if (tools && avail > sm->content_at) { /* what may be a call waits: for the end, or (auto with its
                                                  * grammar) until it is one, then streams as a call */
            const size_t base = sm->content_at;
            const size_t h = base + srv_tools_hold(&r->tools, sm->text.p ? sm->text.p + base : "", avail - base, sm->sent - base);
            const size_t whole = sm->text.p ? utf8_complete(sm->text.p, sm->text.len) : 0;
            if (h < avail && h <= sm->sent && r->tool_lazy && !fin && whole > base &&
                srv_tools_auto_start(&r->tools, sm->text.p + base, whole - base, h - base, &sm->cs) > 0) {
                sm->in_calls = true; /* (the content before it went out) */
                continue;
            }
            if (h < avail) avail = h > sm->sent ? h : sm->sent;
        }
        bool more = avail < sm->text.len;
        if (more) fin = false; /* the finish reason goes on the last chunk */
        bool first_chat = r->chat && !r->role_sent;
        /* echo: the prompt (and its records, once the engine has sent them) leads the first chunk */
        const srv_prompt *pr = &r->pr[i / r->n];
        const bool echo_now = r->echo && !sm->echo_sent && (!r->logprobs || pr->plp_got || fin);
        if (r->echo && !sm->echo_sent && !echo_now) break;
        const size_t pre = echo_now ? pr->echo_text.len : 0, dn = pre + avail - sm->sent;
        if (avail > sm->sent || first_chat || echo_now || (fin && !sm->finish_sent)) {
            cJSON *o = chunk_base(s, r), *ch = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
            cJSON_AddNumberToObject(c, "index", i);
            char *delta = fl_alloc(FL_MEM_NET, dn + 1, 16);
            if (!delta) { /* (the next round tries again) */
                cJSON_Delete(c);
                cJSON_Delete(o);
                break;
            }
            if (pre) memcpy(delta, pr->echo_text.p, pre);
            if (avail > sm->sent) memcpy(delta + pre, sm->text.p + sm->sent, avail - sm->sent); /* (the role chunk: no text yet, p may be NULL) */
            delta[dn] = 0;
            if (r->chat) {
                cJSON *d = cJSON_AddObjectToObject(c, "delta");
                if (first_chat) cJSON_AddStringToObject(d, "role", "assistant");
                if (avail > sm->sent) cJSON_AddStringToObject(d, "content", delta);
            } else {
                cJSON_AddStringToObject(c, "text", delta);
            }
            /* the records of the tokens whose text this chunk carries; the last chunk, all */
            add_logprobs(s, r, sm, c, fin ? sm->n_lp : sm->seg_sent < sm->n_seg ? sm->seg[sm->seg_sent].n_lp : sm->n_lp, echo_now);
            sm->echo_sent |= echo_now;
            fl_free(FL_MEM_NET, delta, dn + 1);
            if (fin) {
                cJSON_AddStringToObject(c, "finish_reason", finish_str(sm->finish));
                add_stop_reason(c, sm);
                if (sm->finish == FL_FINISH_ERROR && sm->error[0]) cJSON_AddStringToObject(c, "error", sm->error);
                sm->finish_sent = true;
            }
            else cJSON_AddNullToObject(c, "finish_reason");
            srv_push(ch, c);
            emit_chunk(r, o);
            cJSON_Delete(o);
            sm->sent = avail;
            if (r->chat) r->role_sent = true;
        } else {
            break;
        }
      }
    }
    bool all_fin = r->n_done == srv_choices(r);
    for (int i = 0; i < srv_choices(r) && all_fin; i++) all_fin = r->samples[i].finish_sent;
    if (!all_fin) return;
    if (r->include_usage && !r->usage_sent) { /* stream_options.include_usage: a last chunk with usage */
        cJSON *o = chunk_base(s, r), *u;
        cJSON_AddArrayToObject(o, "choices");
        u = cJSON_AddObjectToObject(o, "usage");
        int32_t gen = 0;
        for (int k = 0; k < srv_choices(r); k++) gen += r->samples[k].n_tokens;
        add_usage(u, r, gen);
        emit_chunk(r, o);
        cJSON_Delete(o);
        r->usage_sent = true;
    }
    if (r->resp) srv_resp_end(s, r->resp, &r->out); /* (the Responses and Anthropic streams end with their own events) */
    else if (r->msgs) srv_msgs_end(r->msgs, &r->out);
    else if (srv_buf_append(&r->out, "data: [DONE]\n\n", 14)) {
        r->cut = true;
        return;
    }
    r->all_sent = true;
}

static void produce_full(fl_server *s, srv_req *r) {
    const size_t f0 = fl_mem_thread_failures();
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", r->created_id);
    cJSON_AddStringToObject(o, "object", r->chat ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)r->created);
    cJSON_AddStringToObject(o, "model", srv_model_name(s, r));
    cJSON *ch = cJSON_AddArrayToObject(o, "choices");
    int32_t gen = 0;
    for (int i = 0; i < srv_choices(r); i++) {
        srv_sample *sm = &r->samples[i];
        cJSON *c = cJSON_CreateObject();
        cJSON_AddNumberToObject(c, "index", i);
        const char *txt = sm->text.p ? sm->text.p : "";
        bool calls = false;
        if (r->chat) {
            calls = add_message(r, i, cJSON_AddObjectToObject(c, "message"), txt, sm->text.len);
        } else if (r->echo) { /* the prompt, then the completion */
            srv_buf both = {0};
            const srv_buf *et = &r->pr[i / r->n].echo_text;
            if (srv_buf_append(&both, et->p ? et->p : "", et->len) != FL_OK ||
                srv_buf_append(&both, txt, sm->text.len) != FL_OK || srv_buf_append(&both, "", 1) != FL_OK) {
                srv_buf_free(&both);
                cJSON_Delete(c);
                cJSON_Delete(o);
                r->cut = true; /* out of memory: the reply is an error (end_cut) */
                return;
            }
            cJSON_AddStringToObject(c, "text", both.p);
            srv_buf_free(&both);
        } else {
            cJSON_AddStringToObject(c, "text", txt);
        }
        add_logprobs(s, r, sm, c, sm->n_lp, r->echo);
        cJSON_AddStringToObject(c, "finish_reason", choice_finish(r, sm, calls));
        add_stop_reason(c, sm);
        if (sm->finish == FL_FINISH_ERROR && sm->error[0]) cJSON_AddStringToObject(c, "error", sm->error);
        cJSON *plp = r->chat ? NULL : prompt_logprobs_json(s, r, &r->pr[i / r->n]); /* (vLLM: completions per choice) */
        if (plp) srv_add(c, "prompt_logprobs", plp);
        srv_push(ch, c);
        gen += sm->n_tokens;
    }
    cJSON *plp = r->chat ? prompt_logprobs_json(s, r, &r->pr[0]) : NULL; /* (vLLM: chat at the top) */
    if (plp) srv_add(o, "prompt_logprobs", plp);
    add_usage(cJSON_AddObjectToObject(o, "usage"), r, gen);
    const bool whole = fl_mem_thread_failures() == f0; /* (else a part of o is missing) */
    if (r->resp) { /* /v1/responses: the response object */
        if (whole) srv_resp_chunk(r->resp, o, &r->out); /* (its message reads as one delta) */
        else srv_resp_fail(r->resp);
        srv_resp_end(s, r->resp, &r->out);
    } else if (r->msgs) { /* /v1/messages: Anthropic's message */
        if (whole) srv_msgs_chunk(r->msgs, o, r->pr[0].n_prompt, r->pr[0].n_cached, &r->out);
        else srv_msgs_fail(r->msgs);
        srv_msgs_end(r->msgs, &r->out);
    } else if (!whole || srv_append_json(&r->out, o, false)) {
        r->out.len = 0;
        r->cut = true;
        cJSON_Delete(o);
        return;
    }
    cJSON_Delete(o);
    r->all_sent = true;
}

/* The peer closed its side of the connection (checked without blocking). */
static bool client_gone(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* r's choices that had not finished count as aborted (s->mu held; r cancelled, unregistered). */
static void count_aborted(fl_server *s, const srv_req *r) {
    for (int i = 0; i < srv_choices(r); i++)
        if (r->samples[i].finish == FL_FINISH_NONE) s->m.finished[SRV_FINISHED_ABORT]++;
}

/* Unlink r from the live list (s->mu held). */
static void unregister(fl_server *s, srv_req *r) {
    if (!r->registered) return;
    for (srv_req **pp = &s->reqs; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    r->registered = false;
    s->n_live--;
}

typedef struct reader_ctx {
    fl_server *s;
    srv_req *r;
} reader_ctx;

/* ---- llama.cpp's /completion reply ----
 * Non-streamed: one object per prompt (an array of them for a list of prompts): content, tokens
 * (with return_tokens), stop, model, tokens_predicted, tokens_evaluated, tokens_cached,
 * generation_settings, stop_type (eos, limit, word; none for an error, with "error"),
 * stopping_word, truncated, has_new_line, timings, and completion_probabilities with n_probs.
 * Streamed: an object per engine output ({index, content, tokens, stop: false, ...}), then the
 * final object with empty content and stop: true; no [DONE]. */

/* completion_probabilities for records [from, to) of sm: {id, token, bytes, logprob,
 * top_logprobs: [{id, token, bytes, logprob}]} */
static cJSON *native_probs(fl_server *s, const srv_req *r, const srv_sample *sm, int32_t from, int32_t to) {
    tok_name *t = fl_alloc(FL_MEM_NET, sizeof *t, 16);
    cJSON *a = cJSON_CreateArray();
    const int32_t w = 1 + r->n_top;
    for (int32_t i = from; t && i < to; i++) {
        const fl_token_logprob *rec = sm->lp + (size_t)i * (size_t)w;
        cJSON *e = NULL, *top = NULL;
        for (int32_t k = 0; k <= r->n_show; k++) {
            token_name(s, rec[k].token, t);
            cJSON *x = token_entry(t, rec[k].logprob, true);
            cJSON_AddNumberToObject(x, "id", rec[k].token);
            if (k == 0) {
                e = x;
                top = cJSON_AddArrayToObject(e, "top_logprobs");
            } else {
                srv_push(top, x);
            }
        }
        srv_push(a, e);
    }
    if (t) fl_free(FL_MEM_NET, t, sizeof *t);
    return a;
}

static cJSON *native_tokens(const srv_sample *sm, int32_t from, int32_t to) {
    cJSON *a = cJSON_CreateArray();
    for (int32_t i = from; i < to; i++) srv_push(a, cJSON_CreateNumber(sm->toks[i]));
    return a;
}

/* The final object of choice i: with its whole text (content, tokens, probabilities) unless
 * streamed, where the chunks carried them. */
static cJSON *native_final(fl_server *s, srv_req *r, int i, bool streamed) {
    srv_sample *sm = &r->samples[i];
    const srv_prompt *pr = &r->pr[i / r->n];
    const char *txt = sm->text.p ? sm->text.p : "";
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "index", i);
    cJSON_AddStringToObject(o, "content", streamed ? "" : txt);
    srv_add(o, "tokens", r->return_tokens && !streamed ? native_tokens(sm, 0, sm->n_toks) : cJSON_CreateArray());
    cJSON_AddNumberToObject(o, "id_slot", -1);
    cJSON_AddBoolToObject(o, "stop", true);
    cJSON_AddStringToObject(o, "model", srv_model_name(s, r));
    cJSON_AddNumberToObject(o, "tokens_predicted", sm->n_tokens);
    cJSON_AddNumberToObject(o, "tokens_evaluated", pr->n_prompt);
    cJSON_AddNumberToObject(o, "tokens_cached", pr->n_cached);
    cJSON *g = cJSON_AddObjectToObject(o, "generation_settings");
    cJSON_AddNumberToObject(g, "n_ctx", fl_engine_n_ctx(s->engine));
    cJSON_AddNumberToObject(g, "n_predict", (double)r->gs.n_predict);
    cJSON_AddNumberToObject(g, "seed", (double)r->gs.seed);
    cJSON_AddNumberToObject(g, "temperature", r->gs.temperature);
    cJSON_AddNumberToObject(g, "top_k", (double)r->gs.top_k);
    cJSON_AddNumberToObject(g, "top_p", r->gs.top_p);
    cJSON_AddNumberToObject(g, "min_p", r->gs.min_p);
    cJSON_AddNumberToObject(g, "repeat_penalty", r->gs.repeat_penalty);
    cJSON_AddNumberToObject(g, "repeat_last_n", (double)r->gs.repeat_last_n);
    cJSON_AddNumberToObject(g, "presence_penalty", r->gs.presence_penalty);
    cJSON_AddNumberToObject(g, "frequency_penalty", r->gs.frequency_penalty);
    cJSON_AddNumberToObject(g, "n_probs", r->logprobs ? r->n_show : 0);
    cJSON_AddBoolToObject(g, "ignore_eos", r->gs.ignore_eos);
    cJSON_AddBoolToObject(g, "stream", r->stream);
    const char *stype = sm->finish == FL_FINISH_LENGTH ? "limit" : sm->finish == FL_FINISH_STOP && sm->stop_str ? "word"
                        : sm->finish == FL_FINISH_EOS || sm->finish == FL_FINISH_STOP ? "eos" : "none";
    cJSON_AddStringToObject(o, "stop_type", stype);
    cJSON_AddStringToObject(o, "stopping_word", sm->finish == FL_FINISH_STOP && sm->stop_str ? sm->stop_str : "");
    if (sm->finish == FL_FINISH_ERROR) cJSON_AddStringToObject(o, "error", sm->error[0] ? sm->error : "the request failed");
    cJSON_AddBoolToObject(o, "truncated", false);
    cJSON_AddBoolToObject(o, "has_new_line", strchr(txt, '\n') != NULL);
    const double t_first = r->t_first > 0 ? r->t_first : r->t_end, pms = (t_first - r->t_start) * 1e3, gms = (r->t_end - t_first) * 1e3;
    const int32_t pn = pr->n_prompt - pr->n_cached, gn = sm->n_tokens;
    cJSON *tm = cJSON_AddObjectToObject(o, "timings");
    cJSON_AddNumberToObject(tm, "prompt_n", pn);
    cJSON_AddNumberToObject(tm, "prompt_ms", pms);
    cJSON_AddNumberToObject(tm, "prompt_per_token_ms", pn > 0 ? pms / pn : 0);
    cJSON_AddNumberToObject(tm, "prompt_per_second", pms > 0 ? 1e3 * pn / pms : 0);
    cJSON_AddNumberToObject(tm, "predicted_n", gn);
    cJSON_AddNumberToObject(tm, "predicted_ms", gms);
    cJSON_AddNumberToObject(tm, "predicted_per_token_ms", gn > 0 ? gms / gn : 0);
    cJSON_AddNumberToObject(tm, "predicted_per_second", gms > 0 ? 1e3 * gn / gms : 0);
    if (r->logprobs) srv_add(o, "completion_probabilities", native_probs(s, r, sm, streamed ? sm->lp_sent : 0, sm->n_lp));
    return o;
}

static void produce_native(fl_server *s, srv_req *r) {
    if (!r->stream) {
        if (r->n_done < srv_choices(r)) return;
        const bool many = srv_choices(r) > 1;
        cJSON *o = many ? cJSON_CreateArray() : NULL, *one = NULL;
        for (int i = 0; i < srv_choices(r); i++) {
            one = native_final(s, r, i, false);
            if (many) srv_push(o, one);
        }
        srv_append_json(&r->out, many ? o : one, false); /* (a failure: the round's check cuts the reply) */
        cJSON_Delete(many ? o : one);
        r->all_sent = true;
        return;
    }
    bool all_fin = true;
    for (int i = 0; i < srv_choices(r); i++) {
        srv_sample *sm = &r->samples[i];
        if (sm->finish_sent) continue;
        const bool fin = sm->finish != FL_FINISH_NONE;
        const size_t avail = fin ? sm->text.len : utf8_complete(sm->text.p ? sm->text.p : "", sm->text.len);
        if (avail > sm->sent || sm->n_toks > sm->tok_sent) { /* what came since the last chunk */
            cJSON *o = cJSON_CreateObject();
            char *delta = fl_alloc(FL_MEM_NET, avail - sm->sent + 1, 16);
            if (!delta) { cJSON_Delete(o); all_fin = false; continue; }
            if (avail > sm->sent) memcpy(delta, sm->text.p + sm->sent, avail - sm->sent);
            delta[avail - sm->sent] = 0;
            cJSON_AddNumberToObject(o, "index", i);
            cJSON_AddStringToObject(o, "content", delta);
            fl_free(FL_MEM_NET, delta, avail - sm->sent + 1);
            srv_add(o, "tokens", native_tokens(sm, sm->tok_sent, sm->n_toks));
            cJSON_AddBoolToObject(o, "stop", false);
            cJSON_AddNumberToObject(o, "id_slot", -1);
            cJSON_AddNumberToObject(o, "tokens_predicted", sm->n_toks);
            cJSON_AddNumberToObject(o, "tokens_evaluated", r->pr[i / r->n].n_prompt);
            if (r->logprobs) {
                srv_add(o, "completion_probabilities", native_probs(s, r, sm, sm->lp_sent, sm->n_lp));
                sm->lp_sent = sm->n_lp;
            }
            srv_append_json(&r->out, o, true);
            cJSON_Delete(o);
            sm->sent = avail;
            sm->tok_sent = sm->n_toks;
        }
        if (fin && sm->sent == sm->text.len) {
            if (!r->t_end) r->t_end = srv_now();
            cJSON *o = native_final(s, r, i, true);
            srv_append_json(&r->out, o, true);
            cJSON_Delete(o);
            sm->finish_sent = true;
        }
        all_fin = all_fin && sm->finish_sent;
    }
    if (all_fin) r->all_sent = true;
}

/* A part of r's reply could not be built (out of memory; the status, 200, went out before the
 * body): what went out stays, the request stops, and the reply ends with an error in its own
 * form, fixed text where even that finds no memory (s->mu held). */
#define CUT_ERR "{\"message\":\"out of memory while writing the reply\",\"type\":\"server_error\",\"param\":null,\"code\":null}"
#define CUT_ANTHROPIC "{\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"out of memory while writing the reply\"}}"
static void end_cut(fl_server *s, srv_req *r) {
    if (r->registered) {
        srv_cancel(s, r);
        unregister(s, r);
        count_aborted(s, r);
    }
    if (r->resp || r->msgs) { /* (failed: their end says so) */
        if (!r->all_sent && r->resp) srv_resp_end(s, r->resp, &r->out);
        else if (!r->all_sent) srv_msgs_end(r->msgs, &r->out);
        if (!r->out.len && r->msgs) r->tail = r->stream ? "event: error\ndata: " CUT_ANTHROPIC "\n\n" : CUT_ANTHROPIC;
        else if (!r->out.len) r->tail = r->stream ? "event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"out of memory while writing the reply\",\"param\":null}\n\n" : "{\"error\":" CUT_ERR "}";
    } else if (r->native) {
        r->out.len = 0; /* (this round's objects are not known whole) */
        r->tail = r->stream ? "data: {\"error\":" CUT_ERR "}\n\n" : "{\"error\":" CUT_ERR "}";
    } else {
        r->tail = r->stream ? "data: {\"error\":" CUT_ERR "}\n\ndata: [DONE]\n\n" : "{\"error\":" CUT_ERR "}";
    }
    r->all_sent = true;
}

static ssize_t reader_net(void *cls, uint64_t pos, char *buf, size_t max);
static ssize_t reader(void *cls, uint64_t pos, char *buf, size_t max) { /* (JSON: NET, as srv_handle) */
    const fl_mem_cat prev = fl_mem_set_malloc_cat(FL_MEM_NET);
    const ssize_t n = reader_net(cls, pos, buf, max);
    fl_mem_set_malloc_cat(prev);
    return n;
}

static ssize_t reader_net(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    reader_ctx *rc = cls;
    fl_server *s = rc->s;
    srv_req *r = rc->r;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (r->out_off < r->out.len) {
            size_t n = r->out.len - r->out_off;
            if (n > max) n = max;
            memcpy(buf, r->out.p + r->out_off, n);
            r->out_off += n;
            pthread_mutex_unlock(&s->mu);
            return (ssize_t)n;
        }
        r->out.len = r->out_off = 0;
        if (r->tail && r->tail[r->tail_off]) {
            size_t n = strlen(r->tail + r->tail_off);
            if (n > max) n = max;
            memcpy(buf, r->tail + r->tail_off, n);
            r->tail_off += n;
            pthread_mutex_unlock(&s->mu);
            return (ssize_t)n;
        }
        if (r->all_sent) {
            pthread_mutex_unlock(&s->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (r->native) { /* (its objects are checked as a whole, per round) */
            const size_t f0 = fl_mem_thread_failures();
            produce_native(s, r);
            if (fl_mem_thread_failures() != f0) r->cut = true;
        } else if (r->stream) produce_stream(s, r);
        else if (r->n_done == srv_choices(r)) produce_full(s, r);
        if (r->cut && !r->tail) end_cut(s, r);
        if (r->out.len || (r->tail && r->tail[r->tail_off])) continue;
        if (s->stopping || r->cancelled || client_gone(r->conn)) {
            if (r->registered) {
                srv_cancel(s, r);
                unregister(s, r);
                s->m.requests_cancelled++;
                count_aborted(s, r);
            }
            r->cancelled = true;
            pthread_mutex_unlock(&s->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&r->cv, &s->mu, &ts);
    }
}

static void req_free(fl_server *s, srv_req *r) {
    for (int i = 0; i < SRV_MAX_N; i++) {
        srv_buf_free(&r->samples[i].text);
        fl_free(FL_MEM_NET, r->samples[i].seg, (size_t)r->samples[i].cap_seg * sizeof(srv_seg));
        fl_free(FL_MEM_NET, r->samples[i].lp, (size_t)r->samples[i].cap_lp * (size_t)(1 + r->n_top) * sizeof(fl_token_logprob));
        if (r->samples[i].stop_str) fl_free(FL_MEM_NET, r->samples[i].stop_str, strlen(r->samples[i].stop_str) + 1);
        fl_free(FL_MEM_NET, r->samples[i].toks, (size_t)r->samples[i].cap_toks * sizeof(int32_t));
    }
    srv_buf_free(&r->out);
    for (int k = 0; k < SRV_MAX_N; k++) {
        srv_prompt *pr = &r->pr[k];
        srv_buf_free(&pr->echo_text);
        if (pr->plp) fl_free(FL_MEM_NET, pr->plp, (size_t)(pr->n_prompt - 1) * (size_t)(1 + r->n_top) * sizeof *pr->plp);
        if (pr->plp_rank) fl_free(FL_MEM_NET, pr->plp_rank, (size_t)(pr->n_prompt - 1) * sizeof *pr->plp_rank);
    }
    pthread_cond_destroy(&r->cv);
    srv_resp_free(r->resp);
    srv_msgs_free(r->msgs);
    (void)s;
    fl_free(FL_MEM_NET, r, sizeof *r);
}

static void reader_free(void *cls) {
    reader_ctx *rc = cls;
    fl_server *s = rc->s;
    srv_req *r = rc->r;
    pthread_mutex_lock(&s->mu);
    if (r->registered) { /* response torn down before the request finished: the client left */
        srv_cancel(s, r);
        unregister(s, r);
        s->m.requests_cancelled++;
        count_aborted(s, r);
    }
    pthread_mutex_unlock(&s->mu);
    req_free(s, r);
    fl_free(FL_MEM_NET, rc, sizeof *rc);
}

/* ---- /v1/completions and /v1/chat/completions ---- */

/* Tokenize text into a new FL_MEM_NET array *toks of *cap entries (*n used). */
static fl_status tokenize_all(fl_server *s, const srv_buf *text, int flags, int32_t **toks, int64_t *cap, int64_t *n) {
    const char *p = text->p ? text->p : "";
    *cap = (int64_t)text->len + 8;
    if (!(*toks = fl_alloc(FL_MEM_NET, (size_t)*cap * 4, 16))) return FL_ERR_NOMEM;
    fl_status st = fl_engine_tokenize(s->engine, p, text->len, flags, *toks, *cap, n);
    if (st == FL_OK && *n > *cap) { /* more ids than bytes (SPM's "▁" as 3 byte tokens, say): once more at its size */
        fl_free(FL_MEM_NET, *toks, (size_t)*cap * 4);
        *cap = *n;
        if (!(*toks = fl_alloc(FL_MEM_NET, (size_t)*cap * 4, 16))) return FL_ERR_NOMEM;
        st = fl_engine_tokenize(s->engine, p, text->len, flags, *toks, *cap, n);
        if (st == FL_OK && *n > *cap) st = fl_set_error(FL_ERR_INTERNAL, "the tokenizer asked for %lld ids, then for more", (long long)*cap);
    }
    return st;
}

/* out += the text of ids (the engine's detokenizer; a buffer grown until it fits). */
static fl_status detokenize_all(fl_server *s, const int32_t *ids, int64_t n, srv_buf *out) {
    for (int64_t cap = 8 * n + 64; cap <= ((int64_t)1 << 26); cap *= 2) {
        char *buf = fl_alloc(FL_MEM_NET, (size_t)cap, 16);
        if (!buf) return FL_ERR_NOMEM;
        const int64_t len = fl_engine_detokenize(s->engine, ids, n, buf, cap);
        fl_status st = len >= 0 ? srv_buf_append(out, buf, (size_t)len) : FL_OK;
        fl_free(FL_MEM_NET, buf, (size_t)cap);
        if (len >= 0) return st;
    }
    return fl_set_error(FL_ERR_UNSUPPORTED, "these ids have no text (no tokenizer)");
}

/* pr->echo_text := the prompt as the client gave it, or its token ids detokenized. */
static fl_status echo_text(fl_server *s, srv_prompt *pr, const srv_buf *prompt, const int32_t *toks, int64_t n) {
    if (prompt->len) return srv_buf_append(&pr->echo_text, prompt->p, prompt->len);
    fl_status st = detokenize_all(s, toks, n, &pr->echo_text);
    if (st == FL_ERR_UNSUPPORTED) fl_clear_error(); /* nothing to echo */
    return st == FL_ERR_NOMEM ? st : FL_OK;
}

/* Send o as a 200 JSON body (made well-formed UTF-8); out of memory if a part of it may be missing. */
static enum MHD_Result send_json(fl_server *s, struct MHD_Connection *conn, cJSON *o) {
    srv_buf b = {0};
    enum MHD_Result r = fl_mem_thread_failures() == req_f0 && srv_append_json(&b, o, false) == FL_OK
                            ? send_text(conn, 200, "application/json", b.p, b.len, NULL)
                            : NOMEM();
    srv_buf_free(&b);
    cJSON_Delete(o);
    return r;
}

/* POST /tokenize (vLLM's and llama.cpp's): {"prompt" or "content": text, or "messages": [...],
 * "add_special_tokens" or "add_special": bool (default true: BOS as the model asks)} ->
 * {"tokens": [ids], "count": n, "max_model_len": context}. */
static enum MHD_Result handle_tokenize(fl_server *s, struct MHD_Connection *conn, srv_conn *c) {
    enum MHD_Result ret;
    srv_buf text = {0};
    int32_t *toks = NULL;
    int64_t cap = 0, n = 0;
    cJSON *j = parse_body(c);
    if (!j) return BAD_BODY();
    if (!cJSON_IsObject(j)) { ret = BAD("the request body must be a JSON object"); goto out; }
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompt"), *msgs = cJSON_GetObjectItemCaseSensitive(j, "messages");
    if (!p) p = cJSON_GetObjectItemCaseSensitive(j, "content");
    int flags = 0;
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(j, "add_special_tokens");
    if (!add) add = cJSON_GetObjectItemCaseSensitive(j, "add_special");
    if (add && !cJSON_IsBool(add)) { ret = BAD("'add_special_tokens' must be a boolean"); goto out; }
    if (!add || cJSON_IsTrue(add)) flags |= FL_TOKENIZE_ADD_SPECIAL;
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(j, "parse_special"), *wp = cJSON_GetObjectItemCaseSensitive(j, "with_pieces");
    if ((ps && !cJSON_IsBool(ps)) || (wp && !cJSON_IsBool(wp))) { ret = BAD("'parse_special' and 'with_pieces' must be booleans"); goto out; }
    if (cJSON_IsTrue(ps)) flags |= FL_TOKENIZE_PARSE_SPECIAL; /* llama.cpp's: "<|eot_id|>" as its token */
    if (msgs) {
        const char *e2 = NULL;
        unsigned fl;
        char ferr[96];
        if (!chat_flags(j, &fl, ferr, sizeof ferr)) { ret = BAD("%s", ferr); goto out; }
        fl_status st = srv_chat_render_ex(fl_engine_chat_template(s->engine), msgs, NULL, fl, &text, &e2);
        if (st) { ret = st == FL_ERR_NOMEM ? NOMEM() : BAD("%s", e2 ? e2 : "bad messages"); goto out; }
        flags |= FL_TOKENIZE_PARSE_SPECIAL; /* the template's markers are tokens */
    } else if (cJSON_IsString(p)) {
        if (srv_buf_append(&text, p->valuestring, strlen(p->valuestring)) != FL_OK) { ret = NOMEM(); goto out; }
    } else {
        ret = BAD("give 'prompt' (or 'content') as a string, or 'messages'");
        goto out;
    }
    if (!fl_utf8_is_valid(text.p ? text.p : "", text.len)) { ret = BAD("the text is not valid UTF-8"); goto out; }
    fl_status st = tokenize_all(s, &text, flags, &toks, &cap, &n);
    if (st == FL_ERR_NOMEM) { ret = NOMEM(); goto out; }
    if (st != FL_OK) { ret = BAD("cannot tokenize: %s", fl_last_error()); goto out; }
    cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "tokens");
    tok_name *t = cJSON_IsTrue(wp) ? fl_alloc(FL_MEM_NET, sizeof *t, 16) : NULL;
    if (cJSON_IsTrue(wp) && !t) { cJSON_Delete(o); ret = NOMEM(); goto out; }
    for (int64_t i = 0; i < n; i++) {
        if (!t) {
            srv_push(a, cJSON_CreateNumber(toks[i]));
            continue;
        }
        /* llama.cpp's with_pieces: {id, piece}, the piece a string where its bytes are UTF-8, else the bytes */
        token_name(s, toks[i], t);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "id", toks[i]);
        if (fl_utf8_is_valid(t->raw, (size_t)t->nraw)) cJSON_AddStringToObject(e, "piece", t->raw);
        else {
            cJSON *b = cJSON_AddArrayToObject(e, "piece");
            for (int32_t k = 0; k < t->nraw; k++) srv_push(b, cJSON_CreateNumber((unsigned char)t->raw[k]));
        }
        srv_push(a, e);
    }
    if (t) fl_free(FL_MEM_NET, t, sizeof *t);
    cJSON_AddNumberToObject(o, "count", (double)n);
    cJSON_AddNumberToObject(o, "max_model_len", fl_engine_n_ctx(s->engine));
    ret = send_json(s, conn, o);
out:
    if (toks) fl_free(FL_MEM_NET, toks, (size_t)cap * 4);
    srv_buf_free(&text);
    cJSON_Delete(j);
    return ret;
}

/* llama.cpp's POST /apply-template: {"messages": [...]} -> {"prompt": the chat template's text} */
static enum MHD_Result handle_apply_template(fl_server *s, struct MHD_Connection *conn, srv_conn *c) {
    enum MHD_Result ret;
    srv_buf text = {0};
    cJSON *j = parse_body(c);
    if (!j) return BAD_BODY();
    const cJSON *msgs = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "messages") : NULL;
    if (!msgs) { ret = BAD("'messages' is required"); goto out; }
    const char *e2 = NULL;
    srv_tools tt; /* (the tools as a chat request shows them) */
    const cJSON *tools = NULL;
    char *sch = NULL, terr[160];
    bool gr;
    fl_status st = srv_tools_read(j, srv_chat_json_tools(fl_engine_chat_template(s->engine)), &tt, &tools, &sch, &gr, terr, sizeof terr);
    cJSON_free(sch);
    if (st) { ret = st == FL_ERR_NOMEM ? NOMEM() : BAD("%s", terr); goto out; }
    unsigned fl;
    if (!chat_flags(j, &fl, terr, sizeof terr)) { ret = BAD("%s", terr); goto out; }
    st = srv_chat_render_ex(fl_engine_chat_template(s->engine), msgs, tools, fl, &text, &e2);
    if (st) { ret = st == FL_ERR_NOMEM ? NOMEM() : BAD("%s", e2 ? e2 : "bad messages"); goto out; }
    if (srv_buf_append(&text, "", 1) != FL_OK) { ret = NOMEM(); goto out; }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "prompt", text.p);
    ret = send_json(s, conn, o);
out:
    srv_buf_free(&text);
    cJSON_Delete(j);
    return ret;
}

/* llama.cpp's GET /props: what its clients read of a server (the context, the slots, the chat
 * template, the defaults /completion applies). */
/* llama.cpp's [{"id": i, "scale": s}, ...] (a request's "lora", POST /lora-adapters): adapter i
 * (0-based) at scale s, every adapter not listed at 0.  1 with err set when malformed. */
static int srv_lora_parse(const fl_server *s, const cJSON *a, float *mix, char *err, size_t n_err) {
    const int32_t n = fl_engine_n_loras(s->engine);
    for (int32_t k = 0; k < FL_ENGINE_MAX_LORAS; k++) mix[k] = 0.0f;
    if (!cJSON_IsArray(a)) {
        snprintf(err, n_err, "must be an array of {\"id\", \"scale\"}");
        return 1;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, a) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id"), *sc = cJSON_GetObjectItemCaseSensitive(it, "scale");
        if (!cJSON_IsObject(it) || !cJSON_IsNumber(id) || id->valuedouble != floor(id->valuedouble)) {
            snprintf(err, n_err, "each entry must be {\"id\": integer, \"scale\": number}");
            return 1;
        }
        if (id->valuedouble < 0 || id->valuedouble >= n) {
            snprintf(err, n_err, "invalid adapter id %.0f (this server has %d adapter%s)", id->valuedouble, n, n == 1 ? "" : "s");
            return 1;
        }
        if (sc && !cJSON_IsNull(sc) && (!cJSON_IsNumber(sc) || !isfinite(sc->valuedouble) || fabs(sc->valuedouble) > 1e6)) {
            snprintf(err, n_err, "adapter %.0f: the scale must be a number, |scale| <= 1e6", id->valuedouble);
            return 1;
        }
        mix[(int32_t)id->valuedouble] = cJSON_IsNumber(sc) ? (float)sc->valuedouble : 0.0f;
        if (mix[(int32_t)id->valuedouble] != 0.0f && !fl_engine_lora_loaded(s->engine, (int32_t)id->valuedouble + 1, NULL)) {
            snprintf(err, n_err, "adapter %.0f is not loaded", id->valuedouble);
            return 1;
        }
    }
    return 0;
}

/* GET /lora-adapters (llama.cpp's): [{"id", "path", "scale"}], the scales a request gets when it
 * names no adapter. */
static enum MHD_Result handle_lora_list(fl_server *s, struct MHD_Connection *conn) {
    cJSON *o = cJSON_CreateArray();
    if (!o) return NOMEM();
    pthread_mutex_lock(&s->mu);
    for (int32_t k = 0; k < fl_engine_n_loras(s->engine); k++) {
        if (!fl_engine_lora_loaded(s->engine, k + 1, NULL)) continue; /* (an empty run-time slot) */
        cJSON *x = cJSON_CreateObject();
        if (!srv_push(o, x)) x = NULL;
        cJSON_AddNumberToObject(x, "id", k);
        cJSON_AddStringToObject(x, "path", s->lora_paths[k]);
        cJSON_AddNumberToObject(x, "scale", s->lora_scales[k]);
        if (s->lora_names[k][0]) cJSON_AddStringToObject(x, "name", s->lora_names[k]);
    }
    pthread_mutex_unlock(&s->mu);
    return send_json(s, conn, o);
}

/* POST /lora-adapters [{"id", "scale"}]: the scales of requests that name no adapter from now
 * on (those running keep theirs); every adapter not listed goes to 0. */
static enum MHD_Result handle_lora_set(fl_server *s, struct MHD_Connection *conn, srv_conn *c) {
    char err[160];
    float mix[FL_ENGINE_MAX_LORAS];
    cJSON *j = parse_body(c);
    if (!j) return BAD_BODY();
    const int bad = srv_lora_parse(s, j, mix, err, sizeof err);
    cJSON_Delete(j);
    if (bad) return BAD("%s", err);
    pthread_mutex_lock(&s->mu);
    memcpy(s->lora_scales, mix, sizeof mix);
    pthread_mutex_unlock(&s->mu);
    cJSON *o = cJSON_CreateObject();
    if (!o) return NOMEM();
    cJSON_AddBoolToObject(o, "success", true);
    return send_json(s, conn, o);
}

/* vLLM's POST /v1/load_lora_adapter {"lora_name", "lora_path"} (serve --lora-slots N): the adapter
 * goes into a free slot; a request whose model is lora_name applies it.  POST
 * /v1/unload_lora_adapter {"lora_name"}: new requests may no longer name it; it is freed once
 * those that apply it finish. */
static enum MHD_Result handle_lora_runtime(fl_server *s, struct MHD_Connection *conn, srv_conn *c, bool load) {
    enum MHD_Result ret;
    cJSON *j = parse_body(c);
    if (!j) return BAD_BODY();
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "lora_name"), *path = cJSON_GetObjectItemCaseSensitive(j, "lora_path");
    if (!cJSON_IsObject(j) || !cJSON_IsString(name) || !name->valuestring[0] || strlen(name->valuestring) >= sizeof s->lora_names[0] ||
        (load && (!cJSON_IsString(path) || !path->valuestring[0] || strlen(path->valuestring) >= sizeof s->lora_paths[0]))) {
        ret = BAD("give \"lora_name\" (1..127 bytes)%s", load ? " and \"lora_path\" (1..511 bytes)" : "");
        goto out;
    }
    if (fl_engine_lora_slots(s->engine) < 1) {
        ret = BAD("adapters are loaded at run time only by a server started with --lora-slots N");
        goto out;
    }
    char msg[320];
    const int32_t n = fl_engine_n_loras(s->engine);
    pthread_mutex_lock(&s->mu);
    int32_t k = 0;
    for (int32_t i = 0; i < n && !k; i++)
        if (!strcmp(s->lora_names[i], name->valuestring) && fl_engine_lora_loaded(s->engine, i + 1, NULL)) k = i + 1;
    pthread_mutex_unlock(&s->mu);
    if (load) {
        if (k || !strcmp(name->valuestring, s->model_name)) {
            ret = BAD("The lora adapter '%s' has already been loaded.", name->valuestring);
            goto out;
        }
        const fl_status st = fl_engine_lora_load(s->engine, path->valuestring, 1.0f, &k);
        if (st != FL_OK) {
            ret = st == FL_ERR_NOMEM ? NOMEM() : BAD("%s", fl_last_error());
            goto out;
        }
        pthread_mutex_lock(&s->mu);
        snprintf(s->lora_names[k - 1], sizeof s->lora_names[k - 1], "%s", name->valuestring);
        snprintf(s->lora_paths[k - 1], sizeof s->lora_paths[k - 1], "%s", path->valuestring);
        s->lora_scales[k - 1] = 0.0f; /* (only where named, or a request's "lora" asks) */
        pthread_mutex_unlock(&s->mu);
        snprintf(msg, sizeof msg, "Success: LoRA adapter '%s' added successfully.", name->valuestring);
    } else {
        if (!k) {
            ret = send_error(s, conn, 404, "NotFoundError", NULL, "lora_name", "The lora adapter '%s' cannot be found.", name->valuestring);
            goto out;
        }
        pthread_mutex_lock(&s->mu);
        s->lora_names[k - 1][0] = 0;
        s->lora_paths[k - 1][0] = 0;
        s->lora_scales[k - 1] = 0.0f;
        pthread_mutex_unlock(&s->mu);
        if (fl_engine_lora_unload(s->engine, k) != FL_OK) {
            ret = BAD("%s", fl_last_error());
            goto out;
        }
        snprintf(msg, sizeof msg, "Success: LoRA adapter '%s' removed successfully.", name->valuestring);
    }
    ret = send_text(conn, 200, "text/plain", msg, strlen(msg), NULL);
out:
    cJSON_Delete(j);
    return ret;
}

static enum MHD_Result handle_props(fl_server *s, struct MHD_Connection *conn) {
    cJSON *o = cJSON_CreateObject(), *d = cJSON_AddObjectToObject(o, "default_generation_settings");
    cJSON_AddNumberToObject(d, "n_ctx", fl_engine_n_ctx(s->engine));
    cJSON *pa = cJSON_AddObjectToObject(d, "params");
    cJSON_AddNumberToObject(pa, "n_predict", -1);
    cJSON_AddNumberToObject(pa, "temperature", 0.8);
    cJSON_AddNumberToObject(pa, "top_k", 40);
    cJSON_AddNumberToObject(pa, "top_p", 0.95);
    cJSON_AddNumberToObject(pa, "min_p", 0.05);
    cJSON_AddNumberToObject(pa, "repeat_penalty", 1);
    cJSON_AddNumberToObject(pa, "repeat_last_n", 64);
    cJSON_AddNumberToObject(o, "total_slots", fl_engine_max_seqs(s->engine));
    cJSON_AddStringToObject(o, "model_alias", s->model_name);
    const char *tmpl = fl_engine_chat_template(s->engine);
    cJSON_AddStringToObject(o, "chat_template", tmpl ? tmpl : "");
    cJSON *m = cJSON_AddObjectToObject(o, "modalities");
    cJSON_AddBoolToObject(m, "vision", false);
    cJSON_AddBoolToObject(m, "audio", false);
    cJSON_AddStringToObject(o, "build_info", "fitllm");
    return send_json(s, conn, o);
}

/* POST /detokenize: {"tokens": [ids]} -> {"prompt": text, "content": text} (vLLM's and
 * llama.cpp's names); bytes that are not well-formed UTF-8 come back as U+FFFD. */
static enum MHD_Result handle_detokenize(fl_server *s, struct MHD_Connection *conn, srv_conn *c) {
    enum MHD_Result ret;
    srv_buf text = {0};
    int32_t *ids = NULL;
    int64_t n = 0;
    cJSON *j = parse_body(c);
    if (!j) return BAD_BODY();
    const cJSON *t = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "tokens") : NULL;
    if (!cJSON_IsArray(t)) { ret = BAD("'tokens' must be an array of token ids"); goto out; }
    bool nomem;
    if (!token_ids_of(s, t, &ids, &n, &nomem)) {
        ret = nomem ? NOMEM() : BAD("'tokens' must be integers in [0, %d)", fl_engine_n_vocab(s->engine));
        goto out;
    }
    fl_status st = detokenize_all(s, ids, n, &text);
    if (st != FL_OK) { ret = st == FL_ERR_NOMEM ? NOMEM() : BAD("%s", fl_last_error()); goto out; }
    if (srv_buf_append(&text, "", 1) != FL_OK) { ret = NOMEM(); goto out; }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "prompt", text.p);
    cJSON_AddStringToObject(o, "content", text.p);
    ret = send_json(s, conn, o);
out:
    fl_free(FL_MEM_NET, ids, (size_t)n * sizeof *ids);
    srv_buf_free(&text);
    cJSON_Delete(j);
    return ret;
}

/* One prompt of a generation request, as parsed: its text (chat, or a text prompt) and ids. */
typedef struct gen_prompt {
    srv_buf text;
    bool is_text;          /* the client gave text (else ids; chat: the rendered messages) */
    int32_t *toks;         /* FL_MEM_NET [cap] */
    int64_t cap, n;
    bool cut;              /* truncate_prompt_tokens dropped its head: echo its ids, not text */
} gen_prompt;

/* llama.cpp's /completion, read into the fields below by handle_native: n_predict (-1: to the
 * end of the context, 0: the prompt alone), repeat_last_n (-1: the context, 0: no penalties),
 * return_tokens. */
typedef struct native_opts {
    int64_t n_predict, repeat_last_n;
    bool return_tokens;
} native_opts;

/* /v1/completions, /v1/chat/completions, and (nv set, pre its body translated into the OpenAI
 * fields, owned) llama.cpp's /completion. */
/* A completion or chat request (pre: its JSON, parsed and owned, else c's body): nat, llama.cpp's
 * /completion's settings and reply shape; rsp, msg (owned): /v1/responses' or /v1/messages' translation of the reply. */
static enum MHD_Result handle_generate(fl_server *s, struct MHD_Connection *conn, srv_conn *c, bool chat, cJSON *pre,
                                       const native_opts *nat, srv_resp *rsp, srv_msgs *msg) {
    char err[256] = "";
    enum MHD_Result ret;
    gen_prompt gp[SRV_MAX_N];
    int32_t n_gp = 0;
    memset(gp, 0, sizeof gp);
    fl_logit_bias *bias = NULL;
    int32_t bias_cap = 0;
    int32_t *allowed = NULL; /* allowed_token_ids */
    int64_t allowed_n = 0;
    int32_t bw_ids[FL_MAX_BAD_WORDS * FL_MAX_BAD_WORD_TOKENS], bw_lens[FL_MAX_BAD_WORDS]; /* bad_words, tokenized */
    char *schema_text = NULL; /* the request's JSON Schema printed for the engine */
    srv_tools tools_rd = {0};
    char *tool_schema = NULL; /* tool_choice "required" or a named function: the output's constraint, */
    bool tool_grammar = false; /* a GBNF grammar ("required") or a JSON Schema */
    const cJSON *chat_tools = NULL; /* the request's tools, where it has some */
    const cJSON *stag = NULL;  /* vLLM's structural_tag, */
    cJSON *stag_parsed = NULL; /* parsed from its text */
    char *stag_gram = NULL;    /* as a grammar (srv_structural_tag) */
    fl_grammar_trigger stag_trig[FL_MAX_TRIGGERS];
    char *tool_lazy = NULL;    /* tool_choice "auto": the calls' lazy grammar (srv_tools_lazy) */
    fl_grammar_trigger tool_trig[SRV_TOOLS_TRIGGERS];
    cJSON *j = pre ? pre : parse_body(c);
    if (!j) return BAD_BODY();
    if (!cJSON_IsObject(j)) { ret = BAD("the request body must be a JSON object"); goto out; }
    for (const char *const *f = unsupported_fields; *f; f++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, *f);
        if (v && !cJSON_IsNull(v) && !cJSON_IsFalse(v)) { ret = send_error(s, conn, 400, "invalid_request_error", "unsupported_parameter", *f, "'%s' is not supported by this server", *f); goto out; }
    }
    /* logprobs: /v1/completions takes an integer (how many alternatives), chat a boolean and
     * top_logprobs */
    bool want_lp = false;
    int64_t n_top = 0;
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(j, "logprobs");
    if (chat) {
        if (lp && !cJSON_IsNull(lp) && !cJSON_IsBool(lp)) { ret = BAD("'logprobs' must be a boolean"); goto out; }
        want_lp = cJSON_IsTrue(lp);
        if (get_int(j, "top_logprobs", 0, FL_MAX_TOP_LOGPROBS, &n_top, err, sizeof err)) { ret = BAD("%s", err); goto out; }
        const cJSON *tl = cJSON_GetObjectItemCaseSensitive(j, "top_logprobs");
        if (tl && !cJSON_IsNull(tl) && !want_lp) { ret = BAD("'top_logprobs' needs 'logprobs': true"); goto out; }
    } else if (lp && !cJSON_IsNull(lp) && !cJSON_IsFalse(lp)) {
        if (get_int(j, "logprobs", 0, FL_MAX_TOP_LOGPROBS, &n_top, err, sizeof err)) { ret = BAD("%s", err); goto out; }
        want_lp = true;
    }
    /* vLLM's prompt_logprobs: k alternatives (and the prompt token's own logprob and rank) for
     * each prompt token; not streamed */
    int64_t k_plp = -1;
    const cJSON *plpj = cJSON_GetObjectItemCaseSensitive(j, "prompt_logprobs");
    if (plpj && !cJSON_IsNull(plpj) && !cJSON_IsFalse(plpj)) {
        if (!cJSON_IsNumber(plpj) || get_int(j, "prompt_logprobs", 0, FL_MAX_TOP_LOGPROBS, &k_plp, err, sizeof err)) {
            ret = BAD("'prompt_logprobs' must be an integer 0..%d", FL_MAX_TOP_LOGPROBS);
            goto out;
        }
    }
    const cJSON *ec = cJSON_GetObjectItemCaseSensitive(j, "echo");
    if (ec && !cJSON_IsNull(ec) && !cJSON_IsBool(ec)) { ret = BAD("'echo' must be a boolean"); goto out; }
    if (chat && cJSON_IsTrue(ec)) {
        ret = send_error(s, conn, 400, "invalid_request_error", "unsupported_parameter", "echo", "'echo' is taken by /v1/completions only");
        goto out;
    }
    const bool echo = cJSON_IsTrue(ec);
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model");
    if (model && !cJSON_IsString(model) && !cJSON_IsNull(model)) { ret = BAD("'model' must be a string"); goto out; }
    int32_t lora = 0; /* a named adapter (vLLM's LoRA modules): the reply's model is its name */
    pthread_mutex_lock(&s->mu);
    for (int32_t i = 0; cJSON_IsString(model) && i < fl_engine_n_loras(s->engine); i++)
        if (s->lora_names[i][0] && !strcmp(model->valuestring, s->lora_names[i])) lora = i + 1;
    pthread_mutex_unlock(&s->mu);
    /* llama.cpp's "lora": [{id, scale}] mixes the adapters for this request; a request without it
     * or a named adapter takes the server's scales (--lora, POST /lora-adapters) */
    float lmix[FL_ENGINE_MAX_LORAS];
    bool use_mix = false;
    const cJSON *lj = cJSON_GetObjectItemCaseSensitive(j, "lora");
    if (lj && !cJSON_IsNull(lj)) {
        if (srv_lora_parse(s, lj, lmix, err, sizeof err)) { ret = BAD("'lora': %s", err); goto out; }
        use_mix = true;
    } else if (!lora) {
        pthread_mutex_lock(&s->mu);
        memcpy(lmix, s->lora_scales, sizeof lmix);
        pthread_mutex_unlock(&s->mu);
        for (int32_t k = 0; k < fl_engine_n_loras(s->engine); k++) use_mix |= lmix[k] != 0.0f;
    }
    /* the prompts: chat's rendered messages; a completion's string or token ids, or a list of
     * those (one engine request each; a list of one is the prompt, as lm-evaluation-harness
     * sends it) */
    bool special = false;
    unsigned chat_fl = 0; /* chat_flags */
    if (chat) {
        const char *e2 = NULL;
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(j, "messages"), *tools = NULL;
        if (!msgs) { ret = BAD("'messages' is required"); goto out; }
        if (!chat_flags(j, &chat_fl, err, sizeof err)) { ret = BAD("%s", err); goto out; }
        fl_status st = srv_tools_read(j, srv_chat_json_tools(fl_engine_chat_template(s->engine)), &tools_rd, &tools, &tool_schema,
                                      &tool_grammar, err, sizeof err);
        if (st) { ret = st == FL_ERR_NOMEM ? NOMEM() : BAD("%s", err); goto out; }
        chat_tools = tools;
        st = srv_chat_render_ex(fl_engine_chat_template(s->engine), msgs, tools, chat_fl, &gp[0].text, &e2);
        if (st) { ret = st == FL_ERR_NOMEM ? NOMEM() : BAD("%s", e2 ? e2 : "bad messages"); goto out; }
        special = true;
        n_gp = 1;
    } else {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompt");
        static const char *const CHAT_ONLY[] = {"tools", "tool_choice", "parallel_tool_calls", "add_generation_prompt", "continue_final_message"};
        for (size_t i = 0; i < sizeof CHAT_ONLY / sizeof *CHAT_ONLY; i++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, CHAT_ONLY[i]);
            if (v && !cJSON_IsNull(v)) {
                ret = send_error(s, conn, 400, "invalid_request_error", "unsupported_parameter", CHAT_ONLY[i], "'%s' is taken by /v1/chat/completions only", CHAT_ONLY[i]);
                goto out;
            }
        }
        if (!p) { ret = BAD("'prompt' is required"); goto out; }
        const cJSON *items[SRV_MAX_N];
        bool list = cJSON_IsArray(p) && cJSON_GetArraySize(p) > 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, p) list = list && (cJSON_IsString(x) || cJSON_IsArray(x));
        if (list && cJSON_GetArraySize(p) > SRV_MAX_N) { ret = BAD("'prompt' lists at most %d prompts", SRV_MAX_N); goto out; }
        if (list) cJSON_ArrayForEach(x, p) items[n_gp++] = x;
        else items[n_gp++] = p;
        for (int32_t k = 0; k < n_gp; k++) {
            const cJSON *q = items[k];
            if (cJSON_IsString(q)) {
                if (srv_buf_append(&gp[k].text, q->valuestring, strlen(q->valuestring)) != FL_OK) { ret = NOMEM(); goto out; }
                gp[k].is_text = true;
            } else if (cJSON_IsArray(q) && cJSON_GetArraySize(q) > 0 && cJSON_IsNumber(cJSON_GetArrayItem(q, 0))) {
                gp[k].cap = cJSON_GetArraySize(q);
                if (!(gp[k].toks = fl_alloc(FL_MEM_NET, (size_t)gp[k].cap * 4, 16))) { ret = NOMEM(); goto out; }
                cJSON_ArrayForEach(x, q) {
                    if (!is_token_id(s, x)) {
                        ret = BAD("'prompt' token ids must be integers in [0, %d)", fl_engine_n_vocab(s->engine));
                        goto out;
                    }
                    gp[k].toks[gp[k].n++] = (int32_t)x->valuedouble;
                }
            } else {
                ret = BAD("'prompt' must be a string or an array of token ids, or a list of those");
                goto out;
            }
        }
    }
    for (int32_t k = 0; k < n_gp; k++)
        if (!gp[k].toks && !fl_utf8_is_valid(gp[k].text.p ? gp[k].text.p : "", gp[k].text.len)) { ret = BAD("the prompt is not valid UTF-8"); goto out; }

    fl_request_params rp;
    memset(&rp, 0, sizeof rp);
    fl_sampling_params_default(&rp.sampling);
    double temp = 1.0, top_p = 1.0, min_p = 0, pres = 0, freq = 0, rep = 1.0;
    int64_t max_tokens = chat ? -1 : 16, n = 1, seed = -1, top_k = 0;
    int32_t n_ctx = fl_engine_n_ctx(s->engine);
    if (get_num(j, "temperature", 0, 2, &temp, err, sizeof err) || get_num(j, "top_p", 0, 1, &top_p, err, sizeof err) ||
        get_num(j, "min_p", 0, 1, &min_p, err, sizeof err) || get_num(j, "presence_penalty", -2, 2, &pres, err, sizeof err) ||
        get_num(j, "frequency_penalty", -2, 2, &freq, err, sizeof err) || get_num(j, "repetition_penalty", 0.01, 10, &rep, err, sizeof err) ||
        get_int(j, "max_tokens", echo ? 0 : 1, 1e9, &max_tokens, err, sizeof err) || get_int(j, "max_completion_tokens", 1, 1e9, &max_tokens, err, sizeof err) ||
        get_int(j, "n", 1, s->p.max_n, &n, err, sizeof err) || get_int(j, "seed", -9.2e18, 9.2e18, &seed, err, sizeof err) ||
        get_int(j, "top_k", 0, 1e9, &top_k, err, sizeof err)) {
        ret = BAD("%s", err);
        goto out;
    }
    if (max_tokens > s->p.max_tokens_limit) { ret = BAD("'max_tokens' is %lld, the largest accepted is %d", (long long)max_tokens, s->p.max_tokens_limit); goto out; }
    int64_t min_tokens = 0;
    if (get_int(j, "min_tokens", 0, 1e9, &min_tokens, err, sizeof err)) { ret = BAD("%s", err); goto out; }
    rp.min_tokens = (int32_t)min_tokens;
    int64_t priority = 0; /* vLLM's: lower runs first, under --scheduling-policy priority */
    if (get_int(j, "priority", INT32_MIN, INT32_MAX, &priority, err, sizeof err)) { ret = BAD("%s", err); goto out; }
    if (priority != 0 && fl_engine_sched_policy(s->engine) != FL_SCHED_PRIORITY) {
        ret = BAD("'priority' needs the server started with --scheduling-policy priority");
        goto out;
    }
    rp.priority = (int32_t)priority;
    /* llama.cpp's speculative.n_max / n_min / p_min: this request's drafts (with --spec-ngram or
     * --model-draft; n_max is cut to the server's, 0 is none) */
    int64_t sp_max = -2, sp_min = 0;
    if (get_int(j, "speculative.n_max", 0, 1e9, &sp_max, err, sizeof err) || get_int(j, "speculative.n_min", 0, 1e9, &sp_min, err, sizeof err)) {
        ret = BAD("%s", err);
        goto out;
    }
    if (sp_max != -2) {
        if (sp_min > sp_max) sp_min = sp_max; /* (as llama.cpp) */
        rp.spec_max = sp_max == 0 ? -1 : sp_max > FL_SPEC_MAX ? FL_SPEC_MAX : (int32_t)sp_max;
    }
    rp.spec_min = sp_min > FL_SPEC_MAX ? FL_SPEC_MAX : (int32_t)sp_min;
    const cJSON *spp = cJSON_GetObjectItemCaseSensitive(j, "speculative.p_min");
    if (spp && !cJSON_IsNull(spp)) {
        if (!cJSON_IsNumber(spp) || !(spp->valuedouble >= 0 && spp->valuedouble <= 1)) { ret = BAD("'speculative.p_min' must be a number in [0, 1]"); goto out; }
        rp.spec_p_min_set = 1;
        rp.spec_p_min = (float)spp->valuedouble;
    }
    rp.lora = use_mix ? 0 : lora;
    rp.lora_scales = use_mix ? lmix : NULL;
    int64_t trunc = 0; /* vLLM's truncate_prompt_tokens: keep the last k prompt tokens (-1: as many as the context takes) */
    const cJSON *tpt = cJSON_GetObjectItemCaseSensitive(j, "truncate_prompt_tokens");
    if (get_int(j, "truncate_prompt_tokens", -1, 1e9, &trunc, err, sizeof err)) { ret = BAD("%s", err); goto out; }
    if (tpt && !cJSON_IsNull(tpt) && trunc == 0) {
        ret = BAD("'truncate_prompt_tokens' must be -1 or at least 1");
        goto out;
    }
    /* vLLM's cache_salt: prefix-cache blocks are shared only among requests with the same salt */
    const cJSON *salt = cJSON_GetObjectItemCaseSensitive(j, "cache_salt");
    if (salt && !cJSON_IsNull(salt)) {
        if (!cJSON_IsString(salt) || !*salt->valuestring) { ret = BAD("'cache_salt' must be a non-empty string"); goto out; }
        rp.cache_salt = XXH3_64bits(salt->valuestring, strlen(salt->valuestring));
        if (rp.cache_salt == 0) rp.cache_salt = 1; /* (0 means no salt) */
    }
    const cJSON *sti = cJSON_GetObjectItemCaseSensitive(j, "stop_token_ids");
    if (sti && !cJSON_IsNull(sti)) {
        const cJSON *x;
        if (!cJSON_IsArray(sti)) { ret = BAD("'stop_token_ids' must be an array of token ids"); goto out; }
        cJSON_ArrayForEach(x, sti) {
            if (!is_token_id(s, x) || rp.n_stop_token_ids >= FL_MAX_STOP_TOKEN_IDS) {
                ret = BAD("'stop_token_ids' must be at most %d token ids in [0, %d)", FL_MAX_STOP_TOKEN_IDS, fl_engine_n_vocab(s->engine));
                goto out;
            }
            rp.stop_token_ids[rp.n_stop_token_ids++] = (int32_t)x->valuedouble;
        }
    }
    const cJSON *ati = cJSON_GetObjectItemCaseSensitive(j, "allowed_token_ids"); /* vLLM's */
    if (ati && !cJSON_IsNull(ati)) {
        bool nomem = false;
        if (!cJSON_IsArray(ati) || !token_ids_of(s, ati, &allowed, &allowed_n, &nomem) || allowed_n < 1) {
            ret = nomem ? NOMEM() : BAD("'allowed_token_ids' must be a non-empty array of token ids in [0, %d)", fl_engine_n_vocab(s->engine));
            goto out;
        }
        rp.allowed_token_ids = allowed;
        rp.n_allowed_token_ids = (int32_t)allowed_n;
    }
    const cJSON *bw = cJSON_GetObjectItemCaseSensitive(j, "bad_words"); /* vLLM's: each word as it is and after a space */
    if (bw && !cJSON_IsNull(bw)) {
        if (!cJSON_IsArray(bw)) { ret = BAD("'bad_words' must be an array of strings"); goto out; }
        int32_t n_ids = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, bw) {
            if (!cJSON_IsString(x)) { ret = BAD("'bad_words' must be an array of non-empty strings"); goto out; }
            const char *w = x->valuestring;
            while (*w == ' ') w++;
            if (!*w) { ret = BAD("'bad_words' must be an array of non-empty strings"); goto out; }
            for (int sp = 0; sp < 2 && *w; sp++) {
                char text[256];
                const int tl = snprintf(text, sizeof text, "%s%s", sp ? " " : "", w);
                int32_t ids[FL_MAX_BAD_WORD_TOKENS + 1];
                int64_t nt = 0;
                if (tl >= (int)sizeof text || fl_engine_tokenize(s->engine, text, (size_t)tl, 0, ids, FL_MAX_BAD_WORD_TOKENS + 1, &nt) != FL_OK ||
                    nt < 1 || nt > FL_MAX_BAD_WORD_TOKENS) {
                    ret = BAD("'bad_words': '%.40s' must be 1 to %d tokens", x->valuestring, FL_MAX_BAD_WORD_TOKENS);
                    goto out;
                }
                bool dup = false; /* (the same ids both ways) */
                for (int32_t k = 0, o = 0; k < rp.n_bad_words && !dup; o += bw_lens[k++])
                    dup = bw_lens[k] == nt && !memcmp(bw_ids + o, ids, (size_t)nt * sizeof *ids);
                if (dup) continue;
                if (rp.n_bad_words >= FL_MAX_BAD_WORDS) { ret = BAD("'bad_words': at most %d token sequences", FL_MAX_BAD_WORDS); goto out; }
                memcpy(bw_ids + n_ids, ids, (size_t)nt * sizeof *ids);
                n_ids += (int32_t)nt;
                bw_lens[rp.n_bad_words++] = (int32_t)nt;
            }
        }
        rp.bad_words_ids = bw_ids;
        rp.bad_words_lens = bw_lens;
    }
    const cJSON *isso = cJSON_GetObjectItemCaseSensitive(j, "include_stop_str_in_output"); /* vLLM's */
    if (isso && !cJSON_IsBool(isso) && !cJSON_IsNull(isso)) { ret = BAD("'include_stop_str_in_output' must be a boolean"); goto out; }
    rp.include_stop_str_in_output = cJSON_IsTrue(isso);
    const cJSON *ign = cJSON_GetObjectItemCaseSensitive(j, "ignore_eos");
    if (ign && !cJSON_IsBool(ign)) { ret = BAD("'ignore_eos' must be a boolean"); goto out; }
    rp.ignore_eos = cJSON_IsTrue(ign);
    const cJSON *sst = cJSON_GetObjectItemCaseSensitive(j, "skip_special_tokens"); /* vLLM's (default true) */
    if (sst && !cJSON_IsBool(sst) && !cJSON_IsNull(sst)) { ret = BAD("'skip_special_tokens' must be a boolean"); goto out; }
    rp.special_text = cJSON_IsFalse(sst);
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(j, "stream_options");
    if (so && !cJSON_IsNull(so) && !cJSON_IsObject(so)) { ret = BAD("'stream_options' must be an object"); goto out; }
    bool include_usage = so && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(so, "include_usage"));
    const cJSON *stream = cJSON_GetObjectItemCaseSensitive(j, "stream");
    if (stream && !cJSON_IsBool(stream) && !cJSON_IsNull(stream)) { ret = BAD("'stream' must be a boolean"); goto out; }
    /* response_format: {"type": "text"}, {"type": "json_object"} (one object; llama.cpp's
     * "schema" beside it), {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}
     * (OpenAI's structured outputs); also vLLM's guided_json and llama.cpp's json_schema */
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(j, "response_format"), *schema = NULL;
    if (rf && !cJSON_IsNull(rf)) {
        const cJSON *ty = cJSON_IsObject(rf) ? cJSON_GetObjectItemCaseSensitive(rf, "type") : NULL;
        if (!cJSON_IsString(ty)) { ret = BAD("'response_format' must be an object with a 'type'"); goto out; }
        if (!strcmp(ty->valuestring, "json_object")) {
            rp.json_object = 1;
            schema = cJSON_GetObjectItemCaseSensitive(rf, "schema");
        } else if (!strcmp(ty->valuestring, "json_schema")) {
            const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
            schema = cJSON_IsObject(js) ? cJSON_GetObjectItemCaseSensitive(js, "schema") : NULL;
            if (!schema || cJSON_IsNull(schema)) { ret = BAD("'response_format' of type json_schema needs 'json_schema': {\"name\": ..., \"schema\": {...}}"); goto out; }
        } else if (!strcmp(ty->valuestring, "structural_tag")) {
            stag = rf;
        } else if (strcmp(ty->valuestring, "text")) {
            ret = send_error(s, conn, 400, "invalid_request_error", "unsupported_parameter", "response_format",
                             "response_format type '%.40s' is not supported (text, json_object, json_schema and structural_tag are)", ty->valuestring);
            goto out;
        }
    }
    /* vLLM's structured_outputs (its only form since v0.12; the guided_* fields before): json,
     * regex, choice, grammar, json_object, as the fields below; its switches where they change
     * nothing here or only narrow the output to what is still valid (disable_fallback: one
     * backend; disable_additional_properties: objects with declared properties take no others
     * anyway); refused where they would widen or reshape it */
    const cJSON *sout = cJSON_GetObjectItemCaseSensitive(j, "structured_outputs");
    const cJSON *so_field[4] = {NULL, NULL, NULL, NULL}; /* json, choice, regex, grammar */
    if (sout && !cJSON_IsNull(sout)) {
        if (!cJSON_IsObject(sout)) { ret = BAD("'structured_outputs' must be an object"); goto out; }
        static const char *const SO_NAMES[4] = {"json", "choice", "regex", "grammar"};
        const cJSON *x;
        cJSON_ArrayForEach(x, sout) {
            if (cJSON_IsNull(x)) continue;
            int k = 0;
            while (k < 4 && strcmp(x->string, SO_NAMES[k])) k++;
            if (k < 4) {
                so_field[k] = x;
            } else if (!strcmp(x->string, "json_object") || !strcmp(x->string, "disable_fallback") ||
                       !strcmp(x->string, "disable_additional_properties") || !strcmp(x->string, "disable_any_whitespace")) {
                if (!cJSON_IsBool(x)) { ret = BAD("'structured_outputs.%s' must be a boolean", x->string); goto out; }
                if (!strcmp(x->string, "json_object") && cJSON_IsTrue(x)) rp.json_object = 1;
                if (!strcmp(x->string, "disable_any_whitespace") && cJSON_IsTrue(x)) {
                    ret = send_error(s, conn, 400, "invalid_request_error", "unsupported_parameter", "structured_outputs",
                                     "'structured_outputs.disable_any_whitespace' is not supported (JSON output may hold whitespace)");
                    goto out;
                }
            } else if (!strcmp(x->string, "structural_tag")) {
                if (stag) { ret = BAD("give one structural_tag: 'response_format' and 'structured_outputs' both have one"); goto out; }
                stag = x;
            } else if (!strcmp(x->string, "whitespace_pattern")) {
                if (cJSON_IsFalse(x)) continue;
                ret = send_error(s, conn, 400, "invalid_request_error", "unsupported_parameter", "structured_outputs",
                                 "'structured_outputs.%s' is not supported", x->string);
                goto out;
            } else {
                ret = BAD("'structured_outputs': unknown field '%.40s' (json, regex, choice, grammar, json_object are followed)", x->string);
                goto out;
            }
        }
    }
    static const char *const SCHEMA_FIELDS[] = {"guided_json", "json_schema", "structured_outputs.json"};
    for (size_t i = 0; i < sizeof SCHEMA_FIELDS / sizeof *SCHEMA_FIELDS; i++) {
        const cJSON *g = i == 2 ? so_field[0] : cJSON_GetObjectItemCaseSensitive(j, SCHEMA_FIELDS[i]);
        if (!g || cJSON_IsNull(g)) continue;
        if (schema && !cJSON_IsNull(schema)) { ret = BAD("give one JSON Schema: '%s' and another were both given", SCHEMA_FIELDS[i]); goto out; }
        schema = g;
    }
    /* vLLM's guided_choice / structured_outputs.choice: the output is one of these texts */
    const cJSON *gc = cJSON_GetObjectItemCaseSensitive(j, "guided_choice");
    const char *gc_name = "guided_choice";
    if (gc && !cJSON_IsNull(gc) && so_field[1]) { ret = BAD("give one list of choices: 'guided_choice' and 'structured_outputs.choice' were both given"); goto out; }
    if (so_field[1]) gc = so_field[1], gc_name = "structured_outputs.choice";
    const char *choices[FL_JS_MAX_ENUM];
    if (gc && !cJSON_IsNull(gc)) {
        const cJSON *x;
        if (!cJSON_IsArray(gc) || cJSON_GetArraySize(gc) < 1 || cJSON_GetArraySize(gc) > FL_JS_MAX_ENUM) {
            ret = BAD("'%s' must be an array of 1 to %d strings", gc_name, FL_JS_MAX_ENUM);
            goto out;
        }
        cJSON_ArrayForEach(x, gc) {
            if (!cJSON_IsString(x)) { ret = BAD("'%s' must be an array of 1 to %d strings", gc_name, FL_JS_MAX_ENUM); goto out; }
            choices[rp.n_choices++] = x->valuestring;
        }
        rp.choices = choices;
    }
    /* vLLM's guided_regex / structured_outputs.regex: the whole output is one match of this pattern */
    static const char *const REGEX_FIELDS[] = {"guided_regex", "structured_outputs.regex"};
    for (size_t i = 0; i < 2; i++) {
        const cJSON *g = i ? so_field[2] : cJSON_GetObjectItemCaseSensitive(j, REGEX_FIELDS[i]);
        if (!g || cJSON_IsNull(g)) continue;
        if (!cJSON_IsString(g)) { ret = BAD("'%s' must be a string", REGEX_FIELDS[i]); goto out; }
        if (rp.regex) { ret = BAD("give one pattern: 'guided_regex' and 'structured_outputs.regex' were both given"); goto out; }
        rp.regex = g->valuestring;
    }
    /* llama.cpp's grammar and vLLM's guided_grammar / structured_outputs.grammar (GBNF): the
     * whole output is one sentence */
    static const char *const GRAMMAR_FIELDS[] = {"grammar", "guided_grammar", "structured_outputs.grammar"};
    for (size_t i = 0; i < sizeof GRAMMAR_FIELDS / sizeof *GRAMMAR_FIELDS; i++) {
        const cJSON *g = i == 2 ? so_field[3] : cJSON_GetObjectItemCaseSensitive(j, GRAMMAR_FIELDS[i]);
        if (!g || cJSON_IsNull(g)) continue;
        if (!cJSON_IsString(g)) { ret = BAD("'%s' must be a string (a GBNF grammar)", GRAMMAR_FIELDS[i]); goto out; }
        if (rp.grammar) { ret = BAD("give one grammar: '%s' and another were both given", GRAMMAR_FIELDS[i]); goto out; }
        rp.grammar = g->valuestring;
    }
    /* vLLM's structural_tag (response_format's type, structured_outputs' member, the older
     * top-level field; an object or its JSON text): free text with structures at its triggers */
    const cJSON *stag_top = cJSON_GetObjectItemCaseSensitive(j, "structural_tag");
    if (stag_top && !cJSON_IsNull(stag_top)) {
        if (stag) { ret = BAD("give one structural_tag: 'structural_tag' and another were both given"); goto out; }
        stag = stag_top;
    }
    if (stag && cJSON_IsString(stag)) {
        if (!(stag_parsed = cJSON_Parse(stag->valuestring))) { ret = BAD("'structural_tag' must be an object or its JSON text"); goto out; }
        stag = stag_parsed;
    }
    if (stag) {
        if (rp.grammar || rp.regex || rp.choices || rp.json_object || (schema && !cJSON_IsNull(schema))) {
            ret = BAD("structural_tag constrains the output: give no other output constraint");
            goto out;
        }
        const fl_status st = srv_structural_tag(stag, &stag_gram, stag_trig, &rp.n_grammar_triggers, err, sizeof err);
        if (st) { ret = st == FL_ERR_NOMEM ? NOMEM() : BAD("%s", err); goto out; }
        rp.grammar = stag_gram;
        rp.grammar_triggers = stag_trig;
        rp.lazy_repeat = 1;
    }
    /* llama.cpp's grammar_lazy with grammar_triggers [{"type": 0 token | 1 word | 2 pattern |
     * 3 pattern_full, "value": text, "token": id}] (the older {"word": text} too) */
    fl_grammar_trigger trig[FL_MAX_TRIGGERS];
    const cJSON *glz = cJSON_GetObjectItemCaseSensitive(j, "grammar_lazy");
    if (glz && !cJSON_IsNull(glz) && !cJSON_IsBool(glz)) { ret = BAD("'grammar_lazy' must be a boolean"); goto out; }
    if (cJSON_IsTrue(glz)) {
        const cJSON *ta = cJSON_GetObjectItemCaseSensitive(j, "grammar_triggers"), *x;
        if (!rp.grammar) { ret = BAD("'grammar_lazy' needs a grammar"); goto out; }
        if (stag) { ret = BAD("'grammar_lazy' does not go with structural_tag (its triggers are its own)"); goto out; }
        if (!cJSON_IsArray(ta) || cJSON_GetArraySize(ta) < 1 || cJSON_GetArraySize(ta) > FL_MAX_TRIGGERS) {
            ret = BAD("'grammar_lazy' needs 'grammar_triggers': an array of 1..%d {\"type\", \"value\", \"token\"}", FL_MAX_TRIGGERS);
            goto out;
        }
        cJSON_ArrayForEach(x, ta) {
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(x, "type"), *va = cJSON_GetObjectItemCaseSensitive(x, "value"),
                        *to = cJSON_GetObjectItemCaseSensitive(x, "token"), *wo = cJSON_GetObjectItemCaseSensitive(x, "word");
            fl_grammar_trigger *t = &trig[rp.n_grammar_triggers++];
            *t = (fl_grammar_trigger){FL_TRIGGER_WORD, cJSON_IsString(wo) ? wo->valuestring : NULL, -1};
            if (!ty && cJSON_IsString(wo)) continue;
            if (!cJSON_IsNumber(ty) || (!cJSON_IsString(va) && !cJSON_IsNumber(to)) ||
                (cJSON_IsNumber(to) && to->valuedouble != (double)(int32_t)to->valuedouble)) {
                ret = BAD("each of 'grammar_triggers' is {\"type\": 0..3, \"value\": text, \"token\": id}");
                goto out;
            }
            t->type = (int32_t)ty->valuedouble;
            t->value = cJSON_IsString(va) ? va->valuestring : NULL;
            t->token = cJSON_IsNumber(to) ? (int32_t)to->valuedouble : -1;
        }
        rp.grammar_triggers = trig;
    }
    if (schema && !cJSON_IsNull(schema)) {
        if (cJSON_IsString(schema)) rp.json_schema = schema->valuestring; /* (the schema as text) */
        else if (cJSON_IsObject(schema) || cJSON_IsBool(schema)) {
            if (!(schema_text = cJSON_PrintUnformatted(schema))) { ret = NOMEM(); goto out; }
            rp.json_schema = schema_text;
        } else {
            ret = BAD("a JSON Schema must be an object (or its text)");
            goto out;
        }
        rp.json_object = 0;
    }
    /* reasoning_format (llama.cpp's field): where the thinking goes; an output constrained to JSON
     * or a choice from its first byte has none */
    bool reasoning = chat && s->p.reasoning_format;
    const cJSON *rfj = cJSON_GetObjectItemCaseSensitive(j, "reasoning_format");
    if (rfj && !cJSON_IsNull(rfj)) {
        if (!cJSON_IsString(rfj) || (strcmp(rfj->valuestring, "none") && strcmp(rfj->valuestring, "deepseek") && strcmp(rfj->valuestring, "auto"))) {
            ret = BAD("'reasoning_format' must be \"none\", \"deepseek\" or \"auto\"");
            goto out;
        }
        reasoning = chat && strcmp(rfj->valuestring, "none");
    }
    if (rp.json_object || rp.json_schema || rp.choices || tool_schema) reasoning = false;
    /* its generation prompt opens the thinking (DeepSeek-R1's template) */
    const bool think_open = reasoning && srv_chat_think_open(fl_engine_chat_template(s->engine)) && !(chat_fl & SRV_CHAT_NO_GEN_PROMPT);
    if (tool_schema) { /* the call is the output: nothing else may shape it */
        if (rp.json_schema || rp.json_object || rp.regex || rp.grammar || rp.choices) {
            ret = BAD("tool_choice \"required\" or a named function constrains the output: give no other output constraint");
            goto out;
        }
        if (tool_grammar) rp.grammar = tool_schema;
        else rp.json_schema = tool_schema;
    }
    /* tool_choice "auto" with nothing else shaping the output: the calls follow the tools'
     * schemas once one starts (llama.cpp's lazy grammar) */
    if (tools_rd.mode == SRV_TOOLS_AUTO && !rp.grammar && !rp.json_schema && !rp.json_object && !rp.regex && !rp.choices) {
        const fl_status st = srv_tools_lazy(&tools_rd, chat_tools, &tool_lazy, tool_trig, &rp.n_grammar_triggers);
        if (st) { ret = NOMEM(); goto out; }
        if (tool_lazy) {
            rp.grammar = tool_lazy;
            rp.grammar_triggers = tool_trig;
            rp.lazy_after_think = !reasoning ? 0 : think_open ? 2 : 1; /* (a call the model thinks about stays free) */
        }
    }
    /* logit_bias: {"token id": bias in [-100, 100]} */
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(j, "logit_bias");
    if (lb && !cJSON_IsNull(lb)) {
        if (!cJSON_IsObject(lb)) { ret = BAD("'logit_bias' must be an object of token ids to numbers"); goto out; }
        const int32_t nb = cJSON_GetArraySize(lb), nv = fl_engine_n_vocab(s->engine);
        if (nb > nv) { ret = BAD("'logit_bias' has %d entries; the vocabulary has %d tokens", nb, nv); goto out; }
        bias_cap = nb;
        bias = nb ? fl_alloc(FL_MEM_NET, (size_t)nb * sizeof *bias, 16) : NULL;
        if (nb && !bias) { ret = NOMEM(); goto out; }
        const cJSON *x;
        cJSON_ArrayForEach(x, lb) {
            char *end = NULL;
            errno = 0;
            const long long id = strtoll(x->string, &end, 10);
            if (!*x->string || *end || errno || id < 0 || id >= nv) {
                ret = BAD("'logit_bias' keys must be token ids in [0, %d) (got '%.40s')", nv, x->string);
                goto out;
            }
            if (!cJSON_IsNumber(x) || !(x->valuedouble >= -100 && x->valuedouble <= 100)) {
                ret = BAD("'logit_bias' values must be numbers in [-100, 100]");
                goto out;
            }
            bias[rp.n_logit_bias++] = (fl_logit_bias){(int32_t)id, (float)x->valuedouble};
        }
        rp.logit_bias = bias;
    }
    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(j, "stop");
    int n_stop = 0;
    if (cJSON_IsString(stop)) {
        if (!*stop->valuestring) { ret = BAD("'stop' strings must not be empty"); goto out; }
        rp.stop[n_stop++] = stop->valuestring;
    } else if (cJSON_IsArray(stop)) {
        const cJSON *x;
        cJSON_ArrayForEach(x, stop) {
            if (!cJSON_IsString(x) || !*x->valuestring || n_stop >= FL_MAX_STOP_STRINGS) {
                ret = BAD("'stop' must be a string or an array of at most %d non-empty strings", FL_MAX_STOP_STRINGS);
                goto out;
            }
            rp.stop[n_stop++] = x->valuestring;
        }
    } else if (stop && !cJSON_IsNull(stop)) { ret = BAD("'stop' must be a string or an array of strings"); goto out; }

    /* tokenize; every prompt must leave room in the context */
    if (n * n_gp > SRV_MAX_N) { ret = BAD("'n' x prompts is %lld; at most %d choices per request", (long long)(n * n_gp), SRV_MAX_N); goto out; }
    for (int32_t k = 0; k < n_gp; k++) {
        if (!gp[k].toks) {
            const int flags = special ? (FL_TOKENIZE_ADD_SPECIAL | FL_TOKENIZE_PARSE_SPECIAL) : FL_TOKENIZE_ADD_SPECIAL;
            fl_status st = tokenize_all(s, &gp[k].text, flags, &gp[k].toks, &gp[k].cap, &gp[k].n);
            if (st == FL_ERR_NOMEM) { ret = NOMEM(); goto out; }
            if (st != FL_OK) { ret = BAD("cannot tokenize the prompt: %s", fl_last_error()); goto out; }
        }
        if (gp[k].n == 0 || (gp[k].is_text && gp[k].text.len == 0)) { ret = BAD("the prompt is empty"); goto out; }
        const int64_t keep = trunc == -1 ? n_ctx - 1 : trunc;
        if (trunc && gp[k].n > keep) { /* the last `keep` tokens (left truncation, BOS included in what goes) */
            memmove(gp[k].toks, gp[k].toks + (gp[k].n - keep), (size_t)keep * sizeof *gp[k].toks);
            gp[k].n = keep;
            gp[k].cut = true;
        }
        if (gp[k].n >= n_ctx) {
            ret = send_error(s, conn, 400, "invalid_request_error", "context_length_exceeded", "prompt",
                             "the prompt has %lld tokens; the context is %d tokens", (long long)gp[k].n, n_ctx);
            goto out;
        }
    }
    bool drop_gen = echo && max_tokens == 0; /* the engine generates one token, not reported */
    if (nat) { /* llama.cpp's n_predict: -1 to the end of the context (and the token limit), 0 the prompt alone */
        max_tokens = nat->n_predict;
        drop_gen = nat->n_predict == 0;
        if (max_tokens > s->p.max_tokens_limit) { ret = BAD("'n_predict' is %lld, the largest accepted is %d", (long long)max_tokens, s->p.max_tokens_limit); goto out; }
    }
    if (drop_gen) max_tokens = 1;

    fl_engine_stats es;
    fl_engine_stats_get(s->engine, &es);
    if (es.n_waiting >= s->p.max_queue) { ret = send_error(s, conn, 503, "server_error", "queue_full", NULL, "the server is busy (%d requests waiting); retry later", es.n_waiting); goto out; }

    rp.n = (int32_t)n;
    rp.logprobs = want_lp;
    if (k_plp >= 0 && stream && cJSON_IsTrue(stream)) {
        ret = send_error(s, conn, 400, "invalid_request_error", "unsupported_parameter", "prompt_logprobs",
                         "'prompt_logprobs' is not streamed: ask without 'stream'");
        goto out;
    }
    rp.top_logprobs = (int32_t)(k_plp > n_top ? k_plp : n_top); /* records wide enough for both */
    rp.prompt_logprobs = (echo && want_lp) || k_plp >= 0;
    rp.sampling.temperature = (float)temp;
    rp.sampling.top_p = (float)top_p;
    rp.sampling.min_p = (float)min_p;
    rp.sampling.top_k = (int32_t)top_k;
    rp.sampling.presence_penalty = (float)pres;
    rp.sampling.frequency_penalty = (float)freq;
    rp.sampling.repeat_penalty = (float)rep;
    if (nat && nat->repeat_last_n == 0) { /* llama.cpp: no window, no penalties */
        rp.sampling.presence_penalty = rp.sampling.frequency_penalty = 0;
        rp.sampling.repeat_penalty = 1;
    } else if (nat) {
        rp.sampling.penalty_last_n = (int32_t)(nat->repeat_last_n < 0 ? n_ctx : nat->repeat_last_n);
    }
    if (seed >= 0) rp.sampling.seed = (uint64_t)seed;
    else {
        pthread_mutex_lock(&s->mu);
        rp.sampling.seed = 0x9E3779B97F4A7C15ull ^ (uint64_t)(++s->next_local_id) * 0xBF58476D1CE4E5B9ull ^ (uint64_t)time(NULL);
        pthread_mutex_unlock(&s->mu);
    }

    srv_req *r = fl_calloc(FL_MEM_NET, 1, sizeof *r);
    reader_ctx *rc = fl_calloc(FL_MEM_NET, 1, sizeof *rc);
    if (!r || !rc) {
        fl_free(FL_MEM_NET, r, sizeof *r);
        fl_free(FL_MEM_NET, rc, sizeof *rc);
        ret = NOMEM();
        goto out;
    }
    pthread_cond_init(&r->cv, NULL);
    r->resp = rsp; /* (r owns them now) */
    r->msgs = msg;
    rsp = NULL;
    msg = NULL;
    r->n = (int32_t)n;
    r->chat = chat;
    r->stream = stream && cJSON_IsTrue(stream);
    r->include_usage = include_usage;
    r->logprobs = want_lp;
    r->n_top = rp.top_logprobs;
    r->n_show = (int32_t)n_top;
    r->k_plp = (int32_t)k_plp;
    r->echo = echo;
    r->drop_gen = drop_gen;
    r->tools = tools_rd;
    r->reasoning = reasoning;
    r->think_open = think_open;
    r->tool_lazy = tool_lazy != NULL;
    if (nat) {
        r->native = true;
        r->return_tokens = nat->return_tokens;
        r->gs.temperature = temp, r->gs.top_p = top_p, r->gs.min_p = min_p, r->gs.repeat_penalty = rep;
        r->gs.presence_penalty = pres, r->gs.frequency_penalty = freq, r->gs.top_k = top_k, r->gs.n_predict = nat->n_predict;
        r->gs.repeat_last_n = nat->repeat_last_n, r->gs.seed = seed, r->gs.ignore_eos = rp.ignore_eos;
    }
    r->lora = lora;
    if (lora) snprintf(r->model, sizeof r->model, "%s", model->valuestring);
    r->n_pr = n_gp;
    for (int32_t k = 0; k < n_gp; k++) {
        r->pr[k].first_tok = gp[k].toks[0];
        r->pr[k].n_prompt = (int32_t)gp[k].n;
        const srv_buf none = {0};
        if (echo && echo_text(s, &r->pr[k], gp[k].cut ? &none : &gp[k].text, gp[k].toks, gp[k].n) != FL_OK) {
            req_free(s, r);
            fl_free(FL_MEM_NET, rc, sizeof *rc);
            ret = NOMEM();
            goto out;
        }
    }
    r->conn = conn;
    r->t_start = srv_now();
    r->created = (int64_t)time(NULL);
    rc->s = s;
    rc->r = r;

    pthread_mutex_lock(&s->mu); /* register before the driver can see outputs for the ids */
    for (int32_t k = 0; k < n_gp; k++) {
        int64_t mt = max_tokens;
        if (mt < 0 || mt > n_ctx - gp[k].n) mt = n_ctx - gp[k].n;
        if (mt > s->p.max_tokens_limit) mt = s->p.max_tokens_limit;
        rp.prompt = gp[k].toks;
        rp.n_prompt = (int32_t)gp[k].n;
        rp.max_tokens = (int32_t)mt;
        fl_status st = fl_engine_add(s->engine, &rp, &r->pr[k].id);
        if (st != FL_OK && st != FL_ERR_NOMEM && r->tool_lazy) { /* the calls' grammar helps, it was not asked for: where the
                                                                 * constraints' memory (guide_mem) cannot take it, none */
            rp.grammar = NULL;
            rp.grammar_triggers = NULL;
            rp.n_grammar_triggers = rp.lazy_after_think = 0;
            r->tool_lazy = false;
            st = fl_engine_add(s->engine, &rp, &r->pr[k].id);
        }
        if (st != FL_OK) {
            r->n_pr = k; /* the ones queued go again */
            srv_cancel(s, r);
            pthread_mutex_unlock(&s->mu);
            req_free(s, r);
            fl_free(FL_MEM_NET, rc, sizeof *rc);
            ret = st == FL_ERR_INVALID ? BAD("%s", fl_last_error()) : send_error(s, conn, 503, "server_error", NULL, NULL, "cannot queue the request: %s", fl_last_error());
            goto out;
        }
    }
    snprintf(r->created_id, sizeof r->created_id, "%s-%lld", chat ? "chatcmpl" : "cmpl", (long long)r->pr[0].id);
    r->next = s->reqs;
    s->reqs = r;
    r->registered = true;
    s->n_live++;
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->mu);

    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, reader, rc, reader_free);
    if (!resp) { reader_free(rc); ret = MHD_NO; goto out; }
    MHD_add_response_header(resp, "Content-Type", r->stream ? "text/event-stream" : "application/json");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    ret = MHD_queue_response(conn, 200, resp);
    MHD_destroy_response(resp);
out:
    for (int32_t k = 0; k < SRV_MAX_N; k++) {
        if (gp[k].toks) fl_free(FL_MEM_NET, gp[k].toks, (size_t)gp[k].cap * 4);
        srv_buf_free(&gp[k].text);
    }
    if (bias) fl_free(FL_MEM_NET, bias, (size_t)bias_cap * sizeof *bias);
    fl_free(FL_MEM_NET, allowed, (size_t)allowed_n * sizeof *allowed);
    cJSON_free(schema_text);
    cJSON_free(tool_schema);
    cJSON_free(tool_lazy);
    cJSON_free(stag_gram);
    cJSON_Delete(stag_parsed);
    cJSON_Delete(j);
    srv_resp_free(rsp);
    srv_msgs_free(msg);
    return ret;
}

/* base64 of n bytes (RFC 4648, with padding) into out (4 * ceil(n / 3) + 1 bytes) */
static void base64(const unsigned char *in, size_t n, char *out) {
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        const uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0) | (i + 2 < n ? in[i + 2] : 0);
        out[o++] = A[v >> 18 & 63];
        out[o++] = A[v >> 12 & 63];
        out[o++] = i + 1 < n ? A[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? A[v & 63] : '=';
    }
    out[o] = 0;
}

#define SRV_MAX_EMBD_INPUTS 256

/* POST /v1/embeddings (OpenAI's; vLLM's add_special_tokens, truncate_prompt_tokens and normalize,
 * llama.cpp's embd_normalize -1 / 2): each input (a string, token ids, or a list of those) is
 * computed as an engine embedding request (serve --embeddings; --pooling), the vectors L2
 * normalized unless asked not to, as floats or base64 of little-endian f32s. */
static enum MHD_Result handle_embeddings(fl_server *s, struct MHD_Connection *conn, srv_conn *c) {
    char err[256] = "";
    enum MHD_Result ret;
    gen_prompt *gp = NULL;
    int32_t n = 0;
    srv_embd *m = NULL;
    cJSON *j = parse_body(c);
    if (!j) return BAD_BODY();
    if (!fl_engine_embeddings(s->engine)) {
        ret = send_error(s, conn, 400, "invalid_request_error", "embeddings_disabled", NULL, "this server computes no embeddings: start it with --embeddings");
        goto out;
    }
    if (!cJSON_IsObject(j)) { ret = BAD("the request body must be a JSON object"); goto out; }
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(j, "input");
    if (!in) in = cJSON_GetObjectItemCaseSensitive(j, "content"); /* (llama.cpp's name) */
    const cJSON *items[SRV_MAX_EMBD_INPUTS];
    const bool ids_one = cJSON_IsArray(in) && cJSON_IsNumber(cJSON_GetArrayItem(in, 0)); /* one input of token ids */
    if (cJSON_IsString(in) || ids_one) items[n++] = in;
    else if (cJSON_IsArray(in) && cJSON_GetArraySize(in) > 0) {
        if (cJSON_GetArraySize(in) > SRV_MAX_EMBD_INPUTS) { ret = BAD("'input' lists at most %d inputs", SRV_MAX_EMBD_INPUTS); goto out; }
        const cJSON *x;
        cJSON_ArrayForEach(x, in) items[n++] = x;
    } else {
        ret = BAD("'input' must be a string, an array of token ids, or a non-empty list of those");
        goto out;
    }
    const cJSON *ef = cJSON_GetObjectItemCaseSensitive(j, "encoding_format");
    if (ef && !cJSON_IsNull(ef) && (!cJSON_IsString(ef) || (strcmp(ef->valuestring, "float") && strcmp(ef->valuestring, "base64")))) {
        ret = BAD("'encoding_format' must be \"float\" or \"base64\"");
        goto out;
    }
    const bool b64 = cJSON_IsString(ef) && !strcmp(ef->valuestring, "base64");
    const int32_t E = fl_engine_n_embd(s->engine);
    int64_t dims = E, trunc = 0, en = 2;
    if (get_int(j, "dimensions", 1, 1e9, &dims, err, sizeof err) || get_int(j, "truncate_prompt_tokens", -1, 1e9, &trunc, err, sizeof err) ||
        get_int(j, "embd_normalize", -1, 2, &en, err, sizeof err)) {
        ret = BAD("%s", err);
        goto out;
    }
    if (dims != E) { ret = BAD("'dimensions' is %lld; this model's embeddings have %d (they cannot be shortened)", (long long)dims, E); goto out; }
    if (en != -1 && en != 2) { ret = BAD("'embd_normalize' takes -1 (none) or 2 (Euclidean)"); goto out; }
    const cJSON *nz = cJSON_GetObjectItemCaseSensitive(j, "normalize"), *ast = cJSON_GetObjectItemCaseSensitive(j, "add_special_tokens");
    if ((nz && !cJSON_IsNull(nz) && !cJSON_IsBool(nz)) || (ast && !cJSON_IsNull(ast) && !cJSON_IsBool(ast))) {
        ret = BAD("'normalize' and 'add_special_tokens' must be booleans");
        goto out;
    }
    const bool normalize = !cJSON_IsFalse(nz) && en == 2;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model");
    if (model && !cJSON_IsString(model) && !cJSON_IsNull(model)) { ret = BAD("'model' must be a string"); goto out; }
    if (!(gp = fl_calloc(FL_MEM_NET, (size_t)n, sizeof *gp))) { ret = NOMEM(); goto out; }
    const int32_t n_ctx = fl_engine_n_ctx(s->engine);
    for (int32_t k = 0; k < n; k++) {
        const cJSON *q = items[k], *x;
        if (cJSON_IsString(q)) {
            if (!*q->valuestring) { ret = BAD("input %d is empty", k); goto out; }
            if (!fl_utf8_is_valid(q->valuestring, strlen(q->valuestring))) { ret = BAD("input %d is not valid UTF-8", k); goto out; }
            if (srv_buf_append(&gp[k].text, q->valuestring, strlen(q->valuestring)) != FL_OK) { ret = NOMEM(); goto out; }
            const fl_status st = tokenize_all(s, &gp[k].text, cJSON_IsFalse(ast) ? 0 : FL_TOKENIZE_ADD_SPECIAL, &gp[k].toks, &gp[k].cap, &gp[k].n);
            if (st == FL_ERR_NOMEM) { ret = NOMEM(); goto out; }
            if (st != FL_OK) { ret = BAD("cannot tokenize input %d: %s", k, fl_last_error()); goto out; }
        } else if (cJSON_IsArray(q) && cJSON_GetArraySize(q) > 0) {
            gp[k].cap = cJSON_GetArraySize(q);
            if (!(gp[k].toks = fl_alloc(FL_MEM_NET, (size_t)gp[k].cap * 4, 16))) { ret = NOMEM(); goto out; }
            cJSON_ArrayForEach(x, q) {
                if (!is_token_id(s, x)) { ret = BAD("input %d: token ids must be integers in [0, %d)", k, fl_engine_n_vocab(s->engine)); goto out; }
                gp[k].toks[gp[k].n++] = (int32_t)x->valuedouble;
            }
        } else {
            ret = BAD("input %d must be a non-empty string or array of token ids", k);
            goto out;
        }
        if (gp[k].n == 0) { ret = BAD("input %d is empty", k); goto out; }
        const int64_t keep = trunc == -1 ? n_ctx - 1 : trunc;
        if (trunc && gp[k].n > keep) { /* vLLM's: the last tokens */
            memmove(gp[k].toks, gp[k].toks + (gp[k].n - keep), (size_t)keep * sizeof *gp[k].toks);
            gp[k].n = keep;
        }
        if (gp[k].n >= n_ctx) {
            ret = send_error(s, conn, 400, "invalid_request_error", "context_length_exceeded", "input",
                             "input %d has %lld tokens; the context is %d tokens", k, (long long)gp[k].n, n_ctx);
            goto out;
        }
    }
    fl_engine_stats es;
    fl_engine_stats_get(s->engine, &es);
    if (es.n_waiting + n > s->p.max_queue) {
        ret = send_error(s, conn, 503, "server_error", "queue_full", NULL, "the server is busy (%d requests waiting); retry later", es.n_waiting);
        goto out;
    }
    if (!(m = fl_calloc(FL_MEM_NET, 1, sizeof *m))) {
        ret = NOMEM();
        goto out;
    }
    m->n = n; /* (before the arrays: out frees them by these sizes) */
    m->n_embd = E;
    pthread_cond_init(&m->cv, NULL);
    if (!(m->ids = fl_calloc(FL_MEM_NET, (size_t)n, sizeof *m->ids)) || !(m->vec = fl_calloc(FL_MEM_NET, (size_t)n * (size_t)E, sizeof *m->vec))) {
        ret = NOMEM();
        goto out;
    }
    pthread_mutex_lock(&s->mu);
    for (int32_t k = 0; k < n; k++) {
        fl_request_params rp;
        memset(&rp, 0, sizeof rp);
        fl_sampling_params_default(&rp.sampling);
        rp.prompt = gp[k].toks;
        rp.n_prompt = (int32_t)gp[k].n;
        rp.pooling = s->p.pooling == FL_POOLING_LAST ? FL_POOLING_LAST : FL_POOLING_MEAN;
        const fl_status st = fl_engine_add(s->engine, &rp, &m->ids[k]);
        if (st != FL_OK) {
            for (int32_t i = 0; i < k; i++) fl_engine_cancel(s->engine, m->ids[i]);
            pthread_mutex_unlock(&s->mu);
            ret = st == FL_ERR_INVALID ? BAD("%s", fl_last_error()) : send_error(s, conn, 503, "server_error", NULL, NULL, "cannot queue the request: %s", fl_last_error());
            goto out;
        }
    }
    m->next = s->embds;
    s->embds = m;
    s->n_live++;
    pthread_cond_signal(&s->work_cv);
    bool gone = false;
    while (m->n_done < m->n && !gone) { /* the driver fills it in; a client that leaves cancels it */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&m->cv, &s->mu, &ts);
        gone = m->n_done < m->n && (s->stopping || client_gone(conn));
    }
    if (gone) {
        for (srv_embd **pp = &s->embds; *pp; pp = &(*pp)->next)
            if (*pp == m) { *pp = m->next; break; }
        s->n_live--;
        for (int32_t i = 0; i < n; i++) fl_engine_cancel(s->engine, m->ids[i]);
        s->m.requests_cancelled++;
    }
    pthread_mutex_unlock(&s->mu);
    if (gone) { ret = MHD_NO; goto out; }
    if (m->failed) { ret = send_error(s, conn, 500, "server_error", NULL, NULL, "%s", m->error); goto out; }
    cJSON *o = cJSON_CreateObject(), *d = cJSON_AddArrayToObject(o, "data");
    int64_t n_tok = 0;
    char *enc = b64 ? fl_alloc(FL_MEM_NET, ((size_t)E * 4 + 2) / 3 * 4 + 1, 16) : NULL;
    if (!o || (b64 && !enc)) {
        cJSON_Delete(o);
        fl_free(FL_MEM_NET, enc, enc ? ((size_t)E * 4 + 2) / 3 * 4 + 1 : 0);
        ret = NOMEM();
        goto out;
    }
    for (int32_t k = 0; k < n; k++) {
        float *v = m->vec + (size_t)k * (size_t)E;
        double ss = 0;
        for (int32_t i = 0; i < E; i++) ss += (double)v[i] * v[i];
        const double sc = normalize && ss > 0 ? 1.0 / sqrt(ss) : 1.0;
        for (int32_t i = 0; i < E; i++) v[i] = (float)(v[i] * sc);
        cJSON *it = cJSON_CreateObject();
        cJSON_AddStringToObject(it, "object", "embedding");
        cJSON_AddNumberToObject(it, "index", k);
        if (b64) { /* little-endian f32s, as OpenAI's clients decode them */
            base64((const unsigned char *)v, (size_t)E * 4, enc);
            cJSON_AddStringToObject(it, "embedding", enc);
        } else {
            cJSON *a = cJSON_AddArrayToObject(it, "embedding");
            for (int32_t i = 0; i < E; i++) srv_push(a, cJSON_CreateNumber((double)v[i]));
        }
        srv_push(d, it);
        n_tok += gp[k].n;
    }
    fl_free(FL_MEM_NET, enc, enc ? ((size_t)E * 4 + 2) / 3 * 4 + 1 : 0);
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddStringToObject(o, "model", s->model_name);
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)n_tok);
    cJSON_AddNumberToObject(u, "total_tokens", (double)n_tok);
    ret = send_json(s, conn, o);
out:
    for (int32_t k = 0; gp && k < n; k++) {
        if (gp[k].toks) fl_free(FL_MEM_NET, gp[k].toks, (size_t)gp[k].cap * 4);
        srv_buf_free(&gp[k].text);
    }
    fl_free(FL_MEM_NET, gp, gp ? (size_t)n * sizeof *gp : 0);
    if (m) {
        pthread_cond_destroy(&m->cv);
        fl_free(FL_MEM_NET, m->ids, m->ids ? (size_t)m->n * sizeof *m->ids : 0);
        fl_free(FL_MEM_NET, m->vec, m->vec ? (size_t)m->n * (size_t)m->n_embd * sizeof *m->vec : 0);
        fl_free(FL_MEM_NET, m, sizeof *m);
    }
    cJSON_Delete(j);
    return ret;
}

/* One /v1/models entry; an adapter (vLLM's LoRA modules) names its parent. */
static void add_model(fl_server *s, cJSON *d, const char *id, const char *parent) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "fitllm");
    if (parent) cJSON_AddStringToObject(m, "parent", parent);
    cJSON_AddNumberToObject(m, "max_model_len", fl_engine_n_ctx(s->engine));
    srv_push(d, m);
}

/* GET /v1/models (id NULL): the model and its adapters; GET /v1/models/{id} (OpenAI's retrieve):
 * the one named id, or 404 */
static enum MHD_Result handle_models(fl_server *s, struct MHD_Connection *conn, const char *id) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *d = cJSON_AddArrayToObject(o, "data");
    add_model(s, d, s->model_name, NULL);
    pthread_mutex_lock(&s->mu);
    for (int32_t i = 0; i < fl_engine_n_loras(s->engine); i++)
        if (s->lora_names[i][0]) add_model(s, d, s->lora_names[i], s->model_name);
    pthread_mutex_unlock(&s->mu);
    if (id) {
        cJSON *m, *hit = NULL;
        cJSON_ArrayForEach(m, d) if (!strcmp(cJSON_GetObjectItemCaseSensitive(m, "id")->valuestring, id)) hit = m;
        if (!hit) {
            cJSON_Delete(o);
            return send_error(s, conn, 404, "invalid_request_error", "model_not_found", "model", "the model '%.200s' does not exist", id);
        }
        cJSON_DetachItemViaPointer(d, hit);
        cJSON_Delete(o);
        o = hit;
    }
    return send_json(s, conn, o);
}

/* "Authorization: Bearer KEY", or Anthropic's clients' "x-api-key: KEY" */
static bool authorized(fl_server *s, struct MHD_Connection *conn) {
    if (!s->api_key[0]) return true;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    const char *x = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "x-api-key");
    if ((!h || strncmp(h, "Bearer ", 7)) && !x) return false;
    const char *k = h && !strncmp(h, "Bearer ", 7) ? h + 7 : x;
    size_t a = strlen(k), b = strlen(s->api_key);
    unsigned diff = (unsigned)(a ^ b); /* constant-time compare over the key length */
    for (size_t i = 0; i < b; i++) diff |= (unsigned char)(i < a ? k[i] : 0) ^ (unsigned char)s->api_key[i];
    return diff == 0;
}

/* llama.cpp's POST /completion: its fields read into the OpenAI ones handle_generate takes, with
 * llama.cpp's sampling defaults (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05), the rest into
 * native_opts; sampler settings this engine does not have are refused where they would change
 * the output, and cache_prompt, id_slot, n_keep and the like, which do not, are let pass. */
static enum MHD_Result handle_native(fl_server *s, struct MHD_Connection *conn, srv_conn *c, bool infill) {
    enum MHD_Result ret;
    char err[160];
    const size_t f0 = fl_mem_thread_failures(); /* (the translation fails as a whole, not a field short) */
    cJSON *j = parse_body(c), *o = NULL;
    if (!j) return BAD_BODY();
    if (!cJSON_IsObject(j)) { ret = BAD("the request body must be a JSON object"); goto out; }
    if (infill) { /* /infill: its fields become the prompt, as token ids; the rest is /completion's */
        int64_t n_predict = -1;
        if (get_int(j, "n_predict", -1, 1e9, &n_predict, err, sizeof err)) { ret = BAD("%s", err); goto out; }
        const int32_t n_ctx = fl_engine_n_ctx(s->engine);
        cJSON *ids = NULL;
        const char *why = NULL;
        const fl_status st = srv_infill_prompt(s->engine, j, n_ctx < 2048 ? n_ctx : 2048, n_predict, s->p.spm_infill != 0, &ids, &why);
        if (st == FL_ERR_UNSUPPORTED) { ret = send_error(s, conn, 501, "not_supported_error", "infill_not_supported", NULL, "%s", why); goto out; }
        if (st == FL_ERR_NOMEM) { ret = NOMEM(); goto out; }
        if (st != FL_OK) { ret = BAD("%s", why); goto out; }
        static const char *const DROP[] = {"input_prefix", "input_suffix", "input_extra", "prompt"};
        for (size_t i = 0; i < sizeof DROP / sizeof *DROP; i++) cJSON_DeleteItemFromObjectCaseSensitive(j, DROP[i]);
        srv_add(j, "prompt", ids);
    }
    static const struct { const char *name; double off; } OFF[] = {
        {"typical_p", 1}, {"mirostat", 0}, {"dynatemp_range", 0}, {"dry_multiplier", 0}, {"xtc_probability", 0},
        {"n_indent", 0}, {"t_max_predict_ms", 0}, {"n_cmpl", 1}};
    for (size_t i = 0; i < sizeof OFF / sizeof *OFF; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, OFF[i].name);
        if (v && !cJSON_IsNull(v) && !(cJSON_IsNumber(v) && v->valuedouble == OFF[i].off)) {
            ret = send_error(s, conn, 400, "invalid_request_error", "unsupported_parameter", OFF[i].name,
                             "'%s' is not supported by this server (only %g, off)", OFF[i].name, OFF[i].off);
            goto out;
        }
    }
    static const char *const NOT[] = {"samplers", "post_sampling_probs", "response_fields", "suffix", "input_prefix", "input_suffix"};
    for (size_t i = 0; i < sizeof NOT / sizeof *NOT; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, NOT[i]);
        if (v && !cJSON_IsNull(v) && !cJSON_IsFalse(v) && !(cJSON_IsArray(v) && cJSON_GetArraySize(v) == 0)) {
            ret = send_error(s, conn, 400, "invalid_request_error", "unsupported_parameter", NOT[i], "'%s' is not supported by this server", NOT[i]);
            goto out;
        }
    }
    if (!(o = cJSON_CreateObject())) { ret = NOMEM(); goto out; }
    static const char *const SAME[] = {"prompt", "temperature", "top_k", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                                       "stop", "ignore_eos", "grammar", "json_schema", "stream", "model", "lora",
                                       "speculative.n_max", "speculative.n_min", "speculative.p_min", "grammar_lazy", "grammar_triggers"};
    for (size_t i = 0; i < sizeof SAME / sizeof *SAME; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, SAME[i]);
        if (v) srv_add(o, SAME[i], cJSON_Duplicate(v, 1));
    }
    static const struct { const char *name; double def; } DEF[] = {{"temperature", 0.8}, {"top_k", 40}, {"top_p", 0.95}, {"min_p", 0.05}};
    for (size_t i = 0; i < sizeof DEF / sizeof *DEF; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, DEF[i].name);
        if (!v || cJSON_IsNull(v)) {
            cJSON_DeleteItemFromObjectCaseSensitive(o, DEF[i].name);
            cJSON_AddNumberToObject(o, DEF[i].name, DEF[i].def);
        }
    }
    cJSON *tv = cJSON_GetObjectItemCaseSensitive(o, "temperature");
    if (cJSON_IsNumber(tv) && tv->valuedouble < 0) cJSON_SetNumberValue(tv, 0); /* llama.cpp: greedy */
    const cJSON *rpen = cJSON_GetObjectItemCaseSensitive(j, "repeat_penalty");
    if (rpen && !cJSON_IsNull(rpen)) srv_add(o, "repetition_penalty", cJSON_Duplicate(rpen, 1));
    int64_t seed = -1, n_probs = 0;
    native_opts nat = {.n_predict = -1, .repeat_last_n = 64};
    if (get_int(j, "seed", -1, 9.2e18, &seed, err, sizeof err) || get_int(j, "n_probs", 0, FL_MAX_TOP_LOGPROBS, &n_probs, err, sizeof err) ||
        get_int(j, "n_predict", -1, 1e9, &nat.n_predict, err, sizeof err) ||
        get_int(j, "repeat_last_n", -1, 1e9, &nat.repeat_last_n, err, sizeof err)) {
        ret = BAD("%s", err);
        goto out;
    }
    if (seed >= 0) cJSON_AddNumberToObject(o, "seed", (double)seed); /* (-1: a random one) */
    if (n_probs > 0) cJSON_AddNumberToObject(o, "logprobs", (double)n_probs);
    static const char *const FLAGS[] = {"return_tokens", "cache_prompt"};
    for (size_t i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, FLAGS[i]);
        if (v && !cJSON_IsNull(v) && !cJSON_IsBool(v)) { ret = BAD("'%s' must be a boolean", FLAGS[i]); goto out; }
        if (i == 0) nat.return_tokens = cJSON_IsTrue(v); /* (cache_prompt: the prefix cache is always on) */
    }
    /* logit_bias: llama.cpp's [[id, bias or false], ...] (false: never), or the OpenAI object */
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(j, "logit_bias");
    if (cJSON_IsObject(lb)) {
        srv_add(o, "logit_bias", cJSON_Duplicate(lb, 1));
    } else if (cJSON_IsArray(lb)) {
        cJSON *ob = cJSON_AddObjectToObject(o, "logit_bias");
        const cJSON *x;
        cJSON_ArrayForEach(x, lb) {
            const cJSON *id = cJSON_GetArrayItem(x, 0), *b = cJSON_GetArrayItem(x, 1);
            if (!cJSON_IsArray(x) || cJSON_GetArraySize(x) != 2 || !cJSON_IsNumber(id) || !(cJSON_IsNumber(b) || cJSON_IsFalse(b))) {
                ret = BAD("'logit_bias' entries must be [token id, bias or false] (token texts are not supported)");
                goto out;
            }
            char key[32];
            snprintf(key, sizeof key, "%.0f", id->valuedouble);
            cJSON_DeleteItemFromObjectCaseSensitive(ob, key);
            cJSON_AddNumberToObject(ob, key, cJSON_IsFalse(b) ? -100 : b->valuedouble);
        }
    } else if (lb && !cJSON_IsNull(lb)) {
        ret = BAD("'logit_bias' must be an array of [token id, bias] or an object");
        goto out;
    }
    if (fl_mem_thread_failures() != f0) { ret = NOMEM(); goto out; }
    cJSON_Delete(j);
    return handle_generate(s, conn, c, false, o, &nat, NULL, NULL); /* (it owns o) */
out:
    cJSON_Delete(o);
    cJSON_Delete(j);
    return ret;
}

/* The tokens of the prompt chat request `chat` (owned) renders (its tools shown), tokenized as a
 * generation's is, answered as /v1/messages/count_tokens does
 * ({"input_tokens"}) or /v1/responses/input_tokens (openai: with its "object"). */
static enum MHD_Result send_input_tokens(fl_server *s, struct MHD_Connection *conn, cJSON *chat, bool openai) {
    enum MHD_Result ret;
    char err[256] = "";
    srv_tools td = {0};
    const cJSON *tools = NULL;
    char *schema = NULL;
    bool gram = false;
    srv_buf text = {0}, body = {0};
    int32_t *toks = NULL;
    int64_t cap = 0, n = 0;
    const char *e2 = NULL;
    fl_status st = srv_tools_read(chat, srv_chat_json_tools(fl_engine_chat_template(s->engine)), &td, &tools, &schema, &gram, err, sizeof err);
    if (st) { ret = st == FL_ERR_NOMEM ? NOMEM() : BAD("%s", err); goto out; }
    st = srv_chat_render_ex(fl_engine_chat_template(s->engine), cJSON_GetObjectItemCaseSensitive(chat, "messages"), tools, 0, &text, &e2);
    if (st) { ret = st == FL_ERR_NOMEM ? NOMEM() : BAD("%s", e2 ? e2 : "bad messages"); goto out; }
    if (!fl_utf8_is_valid(text.p ? text.p : "", text.len)) { ret = BAD("the messages are not valid UTF-8"); goto out; }
    st = tokenize_all(s, &text, FL_TOKENIZE_ADD_SPECIAL | FL_TOKENIZE_PARSE_SPECIAL, &toks, &cap, &n);
    if (st) { ret = st == FL_ERR_NOMEM ? NOMEM() : BAD("cannot tokenize: %s", fl_last_error()); goto out; }
    ret = srv_buf_printf(&body, "{%s\"input_tokens\": %lld}", openai ? "\"object\": \"response.input_tokens\", " : "", (long long)n)
              ? NOMEM()
              : send_text(conn, 200, "application/json", body.p, body.len, NULL);
out:
    if (toks) fl_free(FL_MEM_NET, toks, (size_t)cap * 4);
    srv_buf_free(&text);
    srv_buf_free(&body);
    cJSON_free(schema);
    cJSON_Delete(chat);
    return ret;
}

/* POST /v1/responses: translated into a chat request (responses.c), whose reply is translated
 * back into a response object or the Responses stream's events. */
static enum MHD_Result handle_responses(fl_server *s, struct MHD_Connection *conn, srv_conn *c, bool count) {
    char err[256] = "";
    cJSON *j = parse_body(c), *chat = NULL;
    if (!j) return BAD_BODY();
    srv_resp *rs = NULL;
    int http = 400;
    const size_t f0 = fl_mem_thread_failures();
    fl_status st = srv_resp_request(s, j, &chat, &rs, &http, err, sizeof err);
    cJSON_Delete(j);
    if (fl_mem_thread_failures() != f0) { /* a part may have been dropped: not a request to run (nor a 400: the
                                            * part missing may be what the error is about) */
        cJSON_Delete(chat);
        srv_resp_free(rs);
        return NOMEM();
    }
    if (st) return send_error(s, conn, (unsigned)http, http == 404 ? "invalid_request_error" : http == 503 ? "server_error" : "invalid_request_error",
                              http == 404 ? "not_found" : NULL, NULL, "%s", err);
    if (count) { /* POST /v1/responses/input_tokens: the prompt's tokens */
        srv_resp_free(rs);
        return send_input_tokens(s, conn, chat, true);
    }
    return handle_generate(s, conn, c, true, chat, NULL, rs, NULL); /* (it owns both) */
}

/* POST /v1/messages (Anthropic's): translated into a chat request (messages.c), whose reply is
 * translated back; POST /v1/messages/count_tokens: the tokens of the prompt it would make. */
static enum MHD_Result handle_messages(fl_server *s, struct MHD_Connection *conn, srv_conn *c, bool count) {
    char err[256] = "";
    cJSON *j = parse_body(c), *chat = NULL;
    if (!j) return BAD_BODY();
    srv_msgs *ms = NULL;
    const size_t f0 = fl_mem_thread_failures();
    fl_status st = srv_msgs_request(s, j, count, &chat, count ? NULL : &ms, err, sizeof err);
    cJSON_Delete(j);
    if (fl_mem_thread_failures() != f0) { /* a part may have been dropped: not a request to run (nor a 400: the
                                            * part missing may be what the error is about) */
        cJSON_Delete(chat);
        srv_msgs_free(ms);
        return NOMEM();
    }
    if (st) return st == FL_ERR_NOMEM ? NOMEM() : BAD("%s", err);
    if (!count) return handle_generate(s, conn, c, true, chat, NULL, NULL, ms); /* (it owns both) */
    return send_input_tokens(s, conn, chat, false);
}

/* /v1/responses/{id}: GET the stored response, DELETE it; GET /v1/responses/{id}/input_items
 * (?limit=1..100, order=asc|desc, after=ITEM_ID): a page of its input items */
static enum MHD_Result handle_response_id(fl_server *s, struct MHD_Connection *conn, const char *rest, const char *method) {
    char id[96];
    const char *slash = strchr(rest, '/');
    const size_t n = slash ? (size_t)(slash - rest) : strlen(rest);
    if (n == 0 || n >= sizeof id) return send_error(s, conn, 404, "invalid_request_error", "not_found", NULL, "no such response");
    memcpy(id, rest, n);
    id[n] = 0;
    const bool get = !strcmp(method, "GET"), del = !strcmp(method, "DELETE");
    int what;
    srv_resp_page pg = {.limit = 20};
    if (!slash) {
        if (!get && !del) return send_error(s, conn, 405, "invalid_request_error", NULL, NULL, "use GET or DELETE for /v1/responses/{id}");
        what = get ? SRV_RESP_GET : SRV_RESP_DELETE;
    } else if (!strcmp(slash, "/input_items")) {
        if (!get) return send_error(s, conn, 405, "invalid_request_error", NULL, NULL, "use GET for /v1/responses/{id}/input_items");
        what = SRV_RESP_ITEMS;
        const char *lim = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "limit");
        const char *ord = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "order");
        const char *aft = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "after");
        char *e = NULL;
        const long l = lim ? strtol(lim, &e, 10) : 20;
        if (lim && (e == lim || *e || l < 1 || l > 100)) return BAD("'limit' must be an integer 1..100");
        if (ord && strcmp(ord, "asc") && strcmp(ord, "desc")) return BAD("'order' must be asc or desc");
        if (aft && strlen(aft) >= sizeof pg.after) return BAD("'after' is not an item id");
        pg.limit = (int32_t)l;
        pg.asc = ord && !strcmp(ord, "asc");
        if (aft) snprintf(pg.after, sizeof pg.after, "%s", aft);
    } else if (!strcmp(slash, "/cancel")) {
        return BAD("only a background response can be cancelled, and this server runs none in the background");
    } else {
        return send_error(s, conn, 404, "invalid_request_error", "not_found", NULL, "no such endpoint: %s /v1/responses/%s", method, rest);
    }
    srv_buf b = {0};
    const fl_status st = srv_resp_get(s, id, what, &pg, &b);
    enum MHD_Result r;
    if (st == FL_ERR_INVALID)
        r = send_error(s, conn, 404, "invalid_request_error", "not_found", NULL,
                       "Response with id '%s' not found (stored responses: those asked with store true that fit --responses-mem)", id);
    else if (st || fl_mem_thread_failures() != req_f0)
        r = NOMEM();
    else
        r = send_text(conn, 200, "application/json", b.p, b.len, NULL);
    srv_buf_free(&b);
    return r;
}

/* a connection's socket context: its pool charged to NET, or refused for want of room */
static char conn_charged, conn_refused;

void srv_connection_notify(void *cls, struct MHD_Connection *conn, void **socket_context, enum MHD_ConnectionNotificationCode toe) {
    (void)cls; (void)conn;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        *socket_context = fl_mem_charge(FL_MEM_NET, SRV_CONN_POOL) == FL_OK ? &conn_charged : &conn_refused;
        fl_clear_error();
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        if (*socket_context == &conn_charged) fl_mem_uncharge(FL_MEM_NET, SRV_CONN_POOL);
        *socket_context = NULL;
    }
}

static bool connection_refused(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci && ci->socket_context == &conn_refused;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                              const char *upload_data, size_t *upload_data_size, void **con_cls) {
    fl_server *s = cls;
    srv_conn *c = *con_cls;
    err_anthropic = !strcmp(url, "/v1/messages") || !strcmp(url, "/v1/messages/count_tokens");
    if (!c) {
        c = fl_calloc(FL_MEM_NET, 1, sizeof *c);
        if (!c) return NOMEM(); /* (answered now: libmicrohttpd then drops the body and closes) */
        *con_cls = c;
        return MHD_YES;
    }
    if (*upload_data_size) {
        if (!c->too_big) {
            if (c->body.len + *upload_data_size > (size_t)s->p.max_body_bytes) {
                c->too_big = true;
                srv_buf_free(&c->body);
            } else if (srv_buf_append(&c->body, upload_data, *upload_data_size)) {
                /* no room: for now (others hold the buffers), or for good (a buffer that grows by
                 * doubling holds the old and the new block at once: up to 3x the body, and the
                 * parse after it; past a quarter of --net-mem it cannot fit) */
                const size_t nb = fl_mem_budget(FL_MEM_NET), need = c->body.len + *upload_data_size;
                c->too_big = true;
                c->no_mem = !(nb && need > nb / 4);
                c->net_big = !c->no_mem;
                srv_buf_free(&c->body);
            }
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    req_f0 = fl_mem_thread_failures();
    if (connection_refused(conn))
        return send_error(s, conn, 503, "server_error", "server_busy", NULL,
                          "no room for this connection's buffers in the server's memory (%zu of --net-mem %zu bytes in use); retry later",
                          fl_mem_current(FL_MEM_NET), fl_mem_budget(FL_MEM_NET));
    if (!strcmp(url, "/health")) {
        if (!get) return send_error(s, conn, 405, "invalid_request_error", NULL, NULL, "use GET for %s", url);
        const char *ok = "{\"status\":\"ok\"}";
        return send_text(conn, 200, "application/json", ok, strlen(ok), NULL);
    }
    bool is_compl = !strcmp(url, "/v1/completions"), is_chat = !strcmp(url, "/v1/chat/completions");
    const char *model_id = !strncmp(url, "/v1/models/", 11) && url[11] ? url + 11 : NULL; /* (MHD has unescaped it) */
    bool is_models = !strcmp(url, "/v1/models") || model_id, is_metrics = !strcmp(url, "/metrics");
    bool is_tok = !strcmp(url, "/tokenize"), is_detok = !strcmp(url, "/detokenize");
    bool is_native = !strcmp(url, "/completion") || !strcmp(url, "/completions"); /* llama.cpp's own */
    bool is_infill = !strcmp(url, "/infill");
    bool is_props = !strcmp(url, "/props"), is_apply = !strcmp(url, "/apply-template");
    bool is_embd = !strcmp(url, "/v1/embeddings") || !strcmp(url, "/embeddings");
    bool is_lora = !strcmp(url, "/lora-adapters");
    bool is_lora_load = !strcmp(url, "/v1/load_lora_adapter"), is_lora_unload = !strcmp(url, "/v1/unload_lora_adapter");
    bool is_resp = !strcmp(url, "/v1/responses"), is_resp_count = !strcmp(url, "/v1/responses/input_tokens");
    bool is_msgs = !strcmp(url, "/v1/messages"), is_msgs_count = !strcmp(url, "/v1/messages/count_tokens");
    const char *resp_id = !strncmp(url, "/v1/responses/", 14) && url[14] && !is_resp_count ? url + 14 : NULL;
    if (!is_compl && !is_chat && !is_models && !is_metrics && !is_tok && !is_detok && !is_native && !is_infill && !is_props && !is_apply && !is_embd &&
        !is_lora && !is_lora_load && !is_lora_unload && !is_resp && !is_resp_count && !resp_id && !is_msgs && !is_msgs_count)
        return send_error(s, conn, 404, "invalid_request_error", "not_found", NULL, "no such endpoint: %s %s", method, url);
    if (!authorized(s, conn)) return send_error(s, conn, 401, "invalid_request_error", "invalid_api_key", NULL, "missing or invalid API key (Authorization: Bearer KEY)");
    if (resp_id) return handle_response_id(s, conn, resp_id, method);
    if (is_lora && get) return handle_lora_list(s, conn);
    if (is_lora && !post) return send_error(s, conn, 405, "invalid_request_error", NULL, NULL, "use GET or POST for %s", url);
    if (is_models || is_metrics || is_props) {
        if (!get) return send_error(s, conn, 405, "invalid_request_error", NULL, NULL, "use GET for %s", url);
        if (is_models) return handle_models(s, conn, model_id);
        if (is_props) return handle_props(s, conn);
        srv_buf b = {0};
        if (srv_metrics_render(s, &b) != FL_OK) { srv_buf_free(&b); return NOMEM(); }
        enum MHD_Result r = send_text(conn, 200, "text/plain; version=0.0.4", b.p, b.len, NULL);
        srv_buf_free(&b);
        return r;
    }
    if (!post) return send_error(s, conn, 405, "invalid_request_error", NULL, NULL, "use POST for %s", url);
    if (c->net_big)
        return send_error(s, conn, 413, "invalid_request_error", "body_too_large", NULL,
                          "the request body needs more than the server's buffers hold (--net-mem %zu bytes)", fl_mem_budget(FL_MEM_NET));
    if (c->no_mem)
        return send_error(s, conn, 503, "server_error", "server_busy", NULL,
                          "the request's body does not fit in the server's buffers now (%zu of --net-mem %zu bytes in use); retry later",
                          fl_mem_current(FL_MEM_NET), fl_mem_budget(FL_MEM_NET));
    if (c->too_big)
        return send_error(s, conn, 413, "invalid_request_error", "body_too_large", NULL, "the request body exceeds %lld bytes", (long long)s->p.max_body_bytes);
    if (is_lora) return handle_lora_set(s, conn, c);
    if (is_lora_load || is_lora_unload) return handle_lora_runtime(s, conn, c, is_lora_load);
    if (is_tok) return handle_tokenize(s, conn, c);
    if (is_detok) return handle_detokenize(s, conn, c);
    if (is_apply) return handle_apply_template(s, conn, c);
    if (is_native || is_infill) return handle_native(s, conn, c, is_infill);
    if (is_embd) return handle_embeddings(s, conn, c);
    if (is_resp || is_resp_count) return handle_responses(s, conn, c, is_resp_count);
    if (is_msgs || is_msgs_count) return handle_messages(s, conn, c, is_msgs_count);
    return handle_generate(s, conn, c, is_chat, NULL, NULL, NULL, NULL);
}

/* A request's JSON (parsed and printed with cJSON) is the server's memory: NET, not MISC (whose
 * plan is the engine's). */
enum MHD_Result srv_handle(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                           const char *version, const char *upload_data, size_t *upload_data_size, void **con_cls) {
    (void)version;
    const fl_mem_cat prev = fl_mem_set_malloc_cat(FL_MEM_NET);
    const enum MHD_Result r = handle(cls, conn, url, method, upload_data, upload_data_size, con_cls);
    fl_mem_set_malloc_cat(prev);
    return r;
}

void srv_request_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls; (void)conn; (void)toe;
    srv_conn *c = *con_cls;
    if (!c) return;
    srv_buf_free(&c->body);
    fl_free(FL_MEM_NET, c, sizeof *c);
    *con_cls = NULL;
}
