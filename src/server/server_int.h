/*
 * server_int.h - internals shared by the server's files (not public).
 *
 * Threads: libmicrohttpd runs one thread per connection (handlers and response callbacks) and
 * the server runs one driver thread that steps the engine and routes its outputs to the
 * waiting connections.  s->mu guards the request list, every srv_req and the metrics; each
 * srv_req has its own condition variable, signalled when output arrives.
 * Memory: request text buffers and JSON bodies are charged to FL_MEM_NET.
 */
#ifndef FL_SERVER_INT_H
#define FL_SERVER_INT_H

#include "fitllm.h"

#include <microhttpd.h>
#include <pthread.h>
#include <stdbool.h>

#define SRV_MAX_N 16


typedef struct srv_buf {
    char *p;
    size_t len, cap;
    bool misc; /* charged to FL_MEM_MISC (a buffer outside the server: fitllm chat); else FL_MEM_NET */
} srv_buf;

fl_status srv_buf_append(srv_buf *b, const char *s, size_t n);
fl_status srv_buf_printf(srv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void srv_buf_free(srv_buf *b);

typedef struct srv_seg {
    size_t end;          /* text offset where an engine output ended (one SSE chunk each) */
    int32_t n_lp;        /* logprob records received by then */
} srv_seg;

/* Reading a growing output's calls piece by piece (tool_choice "required": a JSON array of
 * {"name": N, "parameters": V} objects, as its grammar or schema makes them): state of
 * srv_calls_next.  Zeroed to start. */
typedef struct srv_call_scan {
    int state;           /* where the reading is (tools.c); past the last call DONE, off the pattern OFF */
    int form;            /* 0: a JSON array of calls (zeroed: "required"'s); tool_choice "auto" (srv_tools_auto_start):
                          * also tagged calls, or Llama 3's bare objects */
    int32_t n_calls;     /* calls whose header was handed out */
    size_t pos;          /* where reading resumes */
    size_t sent;         /* the current call's arguments handed out up to */
    int32_t depth;       /* its arguments' nesting, */
    bool str, esc, scalar; /* inside a string, after a backslash, in a bare number or literal */
} srv_call_scan;
typedef enum { SRV_CALL_NONE, SRV_CALL_HEADER, SRV_CALL_ARGS } srv_call_piece;
typedef struct srv_sample {
    srv_buf text;        /* all generated text so far */
    size_t sent;         /* bytes of text already streamed */
    srv_seg *seg;
    int32_t n_seg, cap_seg, seg_sent;
    fl_token_logprob *lp; /* logprobs: [cap_lp][1 + n_top] records as the engine gave them */
    int32_t n_lp, cap_lp, lp_sent;
    int64_t lp_chars;    /* characters of the token texts before lp_sent (text_offset) */
    bool echo_sent;      /* stream: the echoed prompt went out */
    bool call_sent;      /* stream, a named function's call: its id and name went out (then its arguments as they come) */
    srv_call_scan cs;    /* stream, tool_choice "required" (and "auto" once in_calls): the calls handed out so far (srv_calls_next) */
    bool in_calls;       /* stream, tool_choice "auto" with its lazy grammar: the content is over, calls stream from cs */
    size_t calls_upto;   /* stream, calls: the text given to srv_calls_next so far (one engine output at a time) */
    bool think_done;     /* stream with reasoning: the reasoning is over; the answer starts at content_at */
    size_t content_at, r_sent; /* where the answer starts in text (0: no reasoning); reasoning bytes streamed to */
    int32_t n_reason;    /* reasoning: the tokens of the thinking (up to and with the one that ends it; usage's reasoning_tokens) */
    bool reason_over;    /* the thinking is over (or there is none): n_reason is final */
    size_t reason_from;  /* where the search for its end resumes */
    int32_t n_tokens;
    fl_finish_reason finish;
    bool finish_sent;
    char error[192];     /* finish "error": why, where the engine said (the choice's "error") */
    char *stop_str;      /* finish by a stop string: a copy of it (NET), else NULL (vLLM's stop_reason) */
    int32_t *toks;       /* llama.cpp's /completion: the generated ids [cap_toks], n_toks of them, tok_sent streamed */
    int32_t n_toks, cap_toks, tok_sent;
    int32_t stop_token;  /* finish by a stop token id: it, else -1 */
} srv_sample;

/* Tool calling (tools.c): how a chat request's output is read for calls */
#define SRV_MAX_TOOLS 64
typedef enum { SRV_TOOLS_NONE, SRV_TOOLS_AUTO, SRV_TOOLS_REQUIRED, SRV_TOOLS_NAMED } srv_tool_mode;
typedef struct srv_tools {
    srv_tool_mode mode;
    bool json_style;       /* Llama 3's calls: bare {"name", "parameters"} objects; else in <tool_call> tags */
    bool parallel;         /* parallel_tool_calls */
    char named[65];        /* SRV_TOOLS_NAMED: the function */
} srv_tools;

/* One prompt of a request (a list of prompts gives one engine request each). */
typedef struct srv_prompt {
    int64_t id;            /* engine request id */
    int32_t n_prompt;
    int32_t n_cached;      /* of them, served by the prefix cache (sample 0's first admission) */
    int32_t first_tok;     /* echo: listed with a null logprob */
    srv_buf echo_text;     /* echo: the prompt as text (token-id prompts: detokenized) */
    fl_token_logprob *plp; /* echo with logprobs, or prompt_logprobs: [n_prompt - 1][1 + n_top], prompt tokens 1.. */
    int32_t *plp_rank;     /* prompt_logprobs: [n_prompt - 1] their ranks in the vocabulary */
    int32_t n_plp;         /* records arrived */
    bool plp_got;          /* all of them */
} srv_prompt;

typedef struct srv_req {
    struct srv_req *next;
    srv_prompt pr[SRV_MAX_N];
    int32_t n_pr;          /* prompts */
    int32_t n;             /* samples per prompt; choice c is sample c % n of prompt c / n */
    srv_sample samples[SRV_MAX_N]; /* by choice */
    int32_t n_done;        /* choices finished */
    bool chat, stream, cancelled, registered, role_sent, usage_sent, include_usage;
    bool logprobs, out_failed; /* out_failed: no memory for a part of the output (text, a logprob record, an id, the stop string): the request ends in error */
    int32_t n_top;         /* alternatives in each engine record (the most of n_show and k_plp) */
    int32_t n_show;        /* of them, listed with the output's logprobs (logprobs / top_logprobs) */
    int32_t k_plp;         /* vLLM's prompt_logprobs: alternatives listed per prompt token (-1: none asked) */
    /* llama.cpp's /completion (native): its reply's shape, and what generation_settings echo */
    bool native, return_tokens;
    struct { double temperature, top_p, min_p, repeat_penalty, presence_penalty, frequency_penalty;
             int64_t top_k, n_predict, repeat_last_n, seed; bool ignore_eos; } gs;
    /* echo (/v1/completions): the prompt leads each choice's text, and its tokens the logprobs */
    int32_t lora;          /* the engine adapter its model names (0: none) */
    char model[128];       /* that adapter's name, the reply's model ("": the base model's) */
    srv_tools tools;       /* chat: tool_choice and how the output is read */
    bool tool_lazy;        /* tool_choice "auto" with its lazy grammar (srv_tools_lazy): a call, once begun, streams piece by piece */
    bool reasoning;        /* chat: <think>...</think> goes to reasoning_content (reasoning.c) */
    bool think_open;       /* the prompt opened the thinking (DeepSeek-R1's template) */
    bool echo, drop_gen;   /* drop_gen: max_tokens 0 with echo: the engine's one token is not reported */
    double t_start, t_first, t_end;
    pthread_cond_t cv;
    struct MHD_Connection *conn;
    srv_buf out;           /* bytes pending for the response callback */
    size_t out_off;
    bool all_sent;
    bool cut;              /* a part of the reply could not be built (out of memory): it ends with an error */
    size_t chunk_f0;       /* this thread's failed allocations when the chunk being built began (chunk_base) */
    const char *tail;      /* a fixed text sent after out (the error that ends a cut reply) */
    size_t tail_off;
    char created_id[48];
    int64_t created;
    struct srv_resp *resp; /* /v1/responses: the translation of its chat output (responses.c); NULL otherwise */
    struct srv_msgs *msgs; /* /v1/messages (Anthropic's): the same (messages.c) */
} srv_req;

/* why a choice finished, as vLLM's request_success_total labels it */
enum { SRV_FINISHED_STOP, SRV_FINISHED_LENGTH, SRV_FINISHED_ABORT, SRV_FINISHED_ERROR };
#define SRV_NBUCKETS 11
typedef struct srv_hist {
    double sum;
    int64_t count;
    int64_t buckets[SRV_NBUCKETS]; /* cumulative at render time */
} srv_hist;

typedef struct srv_metrics {
    int64_t requests_ok, requests_err4xx, requests_err5xx, requests_cancelled;
    int64_t finished[4];   /* choices (engine requests) finished, by SRV_FINISHED_* */
    int64_t prompt_tokens, completion_tokens;
    srv_hist ttft, e2e;
} srv_metrics;

/* A /v1/embeddings request: one engine request per input, waited for by its connection's
 * thread (the driver fills it in, s->mu held). */
typedef struct srv_embd {
    struct srv_embd *next;
    int32_t n, n_done;
    int64_t *ids;          /* [n] engine ids (NET) */
    float *vec;            /* [n][n_embd] (NET) */
    int32_t n_embd;
    bool failed;           /* an input ended without its embedding */
    char error[192];
    pthread_cond_t cv;
} srv_embd;

struct fl_server {
    fl_engine *engine;
    fl_server_params p;
    char model_name[256];
    char *tls_key, *tls_cert; /* HTTPS: the PEM texts (NET; libmicrohttpd reads them while it runs) */
    size_t tls_key_n, tls_cert_n;
    char lora_names[FL_ENGINE_MAX_LORAS][128]; /* each adapter slot's name ("": none; vLLM's --lora-modules and
                                               * /v1/load_lora_adapter; mu) */
    char lora_paths[FL_ENGINE_MAX_LORAS][512]; /* p.lora_paths, copied (GET /lora-adapters) */
    float lora_scales[FL_ENGINE_MAX_LORAS]; /* the adapters' scales for a request that names none (mu) */
    char api_key[256];
    struct MHD_Daemon *mhd;
    pthread_t driver;
    pthread_mutex_t mu;
    pthread_cond_t work_cv;
    srv_req *reqs;         /* live requests (registered with the engine) */
    srv_embd *embds;       /* live embedding requests (each counted in n_live) */
    int32_t n_live;
    int32_t engine_active; /* from the last step */
    bool stopping;
    int64_t next_local_id;
    srv_metrics m;
    int32_t port;
    struct srv_resp_entry *resp_first, *resp_last; /* the stored responses, least recently used first (mu) */
    size_t resp_bytes;
    int64_t resp_count;
};

static inline int32_t srv_choices(const srv_req *r) { return r->n_pr * r->n; }
static inline int32_t srv_prompt_tokens(const srv_req *r) {
    int32_t t = 0;
    for (int32_t k = 0; k < r->n_pr; k++) t += r->pr[k].n_prompt;
    return t;
}
/* Cancel every engine request of r. */
void srv_cancel(fl_server *s, srv_req *r);

/* api.c */
typedef struct srv_conn srv_conn;
enum MHD_Result srv_handle(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                           const char *version, const char *upload_data, size_t *upload_data_size, void **con_cls);
void srv_request_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe);
/* Each connection's memory pool in libmicrohttpd (MHD_OPTION_CONNECTION_MEMORY_LIMIT; it reads
 * the request line and headers into it): charged to FL_MEM_NET while the connection is open
 * (srv_connection_notify), so --net-mem holds it; a connection that finds no room is answered
 * 503.  (The connection's thread stack is not counted: a reservation whose pages come as used.) */
#define SRV_CONN_POOL ((size_t)32 << 10)
void srv_connection_notify(void *cls, struct MHD_Connection *conn, void **socket_context, enum MHD_ConnectionNotificationCode toe);
/* metrics.c */
void srv_hist_add(srv_hist *h, double v);
fl_status srv_metrics_render(fl_server *s, srv_buf *out);
/* chat.c: render messages (cJSON array) with the model's template kind; *err set on bad input. */
struct cJSON;
fl_status srv_chat_render(const char *tmpl, const struct cJSON *messages, const struct cJSON *tools, srv_buf *out, const char **err);
/* The same with flags: SRV_CHAT_NO_GEN_PROMPT leaves out the assistant's generation prompt
 * (vLLM's add_generation_prompt false); SRV_CHAT_CONTINUE (with NO_GEN_PROMPT) leaves the last
 * message, the assistant's, open, so the output continues its text (continue_final_message). */
#define SRV_CHAT_NO_GEN_PROMPT 1u
#define SRV_CHAT_CONTINUE 2u
fl_status srv_chat_render_ex(const char *tmpl, const struct cJSON *messages, const struct cJSON *tools, unsigned flags, srv_buf *out,
                             const char **err);
/* the template's tool calls are Llama 3's bare JSON objects (else <tool_call> tags) */
bool srv_chat_json_tools(const char *tmpl);
/* the template's generation prompt opens the thinking (DeepSeek-R1's "<think>\n") */
bool srv_chat_think_open(const char *tmpl);
/* no family recognised: the plain "User:/Assistant:" transcript (nothing ends a turn but a stop) */
bool srv_chat_plain(const char *tmpl);
/* --chat-template ARG: a family's name (chatml, llama2, llama3, phi3, deepseek3 or deepseek-r1,
 * plain) gives text whose markers select it; template text (with '{', '<' or '[') is itself.
 * NULL for a name it does not know.  *known: the text is one of the families rendered (else a
 * plain transcript). */
const char *srv_chat_template_resolve(const char *arg, bool *known);
/* reasoning.c: where an output's reasoning and answer are.  UNDECIDED: not yet known (spaces,
 * or a part of <think>); NONE: no reasoning, all answer; IN: reasoning from r0, safe to hand
 * out up to r1 (a part of </think> may follow); DONE: reasoning [r0, r1), the answer from c
 * (c = n where </think> never came; final: the output is whole).  from: a byte before which
 * </think> is known not to start (the reasoning already handed out; 0: none known), so a
 * stream does not search its whole reasoning again at every step. */
typedef enum { SRV_THINK_UNDECIDED, SRV_THINK_NONE, SRV_THINK_IN, SRV_THINK_DONE } srv_think;
srv_think srv_think_scan(const char *t, size_t n, bool open, bool final, size_t from, size_t *r0, size_t *r1, size_t *c);
/* tools.c: read tools / tool_choice / parallel_tool_calls of request j (FL_ERR_INVALID with err
 * set on bad input); *tools_out the tools to show (NULL: none); *schema_text (cJSON_free) what
 * constrains the output: a named function's JSON Schema, or for tool_choice "required" a GBNF
 * grammar (*is_grammar), else NULL. */
fl_status srv_tools_read(const struct cJSON *j, bool json_style, srv_tools *t, const struct cJSON **tools_out, char **schema_text,
                         bool *is_grammar, char *err, size_t errn);
/* tool_choice "auto": llama.cpp's lazy grammar for the calls (tools.c: the formats, where the
 * triggers fire) as *grammar (cJSON_free; NULL where t is not "auto") and trig[0, *n_trig) (at
 * most SRV_TOOLS_TRIGGERS; static texts), which look at the answer (lazy_after_think). */
#define SRV_TOOLS_TRIGGERS 2
/* vLLM's structural_tag ({"structures": [{"begin", "schema", "end"}], "triggers": [...]}) as a
 * GBNF grammar (*grammar, cJSON_free) whose triggers trig[0, *n_trig) (at most 16; st's texts)
 * start each structure, for a request with lazy_repeat; FL_ERR_INVALID with err, FL_ERR_NOMEM. */
fl_status srv_structural_tag(const struct cJSON *st, char **grammar, fl_grammar_trigger *trig, int32_t *n_trig, char *err, size_t errn);
fl_status srv_tools_lazy(const srv_tools *t, const struct cJSON *tools, char **grammar, fl_grammar_trigger *trig, int32_t *n_trig);
/* How many bytes of the output so far may stream as content (the rest may be a call); from: the
 * bytes already streamed, where no tag starts (the scan begins there). */
size_t srv_tools_hold(const srv_tools *t, const char *text, size_t n, size_t from);
/* The output's calls as OpenAI's tool_calls array (NULL: none; ids from seed), and in content
 * the text beside them (all of it where there are none; trimmed if trim). */
struct cJSON *srv_tools_parse(const srv_tools *t, const char *text, size_t n, uint64_t seed, bool trim, srv_buf *content);
/* The next piece of text[0..n) to hand out: HEADER, call *k's name text[*a, *e) (its index; its
 * arguments follow); ARGS, more of call *k's arguments text[*a, *e), raw as generated (their
 * concatenation is the value's JSON text); NONE: nothing until the text grows (final: the text is
 * whole; c->state tells whether it ended past the array (srv_calls_done) or went off the
 * pattern, its calls then to be read whole).  Resumes where the last call left off. */
srv_call_piece srv_calls_next(srv_call_scan *c, const char *text, size_t n, bool final, int32_t *k, size_t *a, size_t *e);
bool srv_calls_done(const srv_call_scan *c);
/* tool_choice "auto", streamed: the answer text[0, n) is content up to h (srv_tools_hold), and
 * may hold calls from there: 1 where they start there in one of the family's forms (*c then
 * reads them: srv_calls_next), 0 while the text does not yet say, -1 where it is no call's start. */
int srv_tools_auto_start(const srv_tools *t, const char *text, size_t n, size_t h, srv_call_scan *c);
bool srv_calls_off(const srv_call_scan *c);
/* A call's id as srv_tools_parse gives call idx of seed: "call_" + 24 hex digits (buf >= 32) */
void srv_tools_call_id(uint64_t seed, int idx, char *buf, size_t cap);
/* responses.c: OpenAI's Responses API over chat completions.  srv_resp_request translates
 * request j into a chat request (*chat) and the response's state (*rs); on failure *http is the
 * status (400 bad input, 404 an unknown previous_response_id, 503 no memory) and err says why.
 * srv_resp_chunk takes each chat.completion.chunk of the stream and appends its events to out
 * (or a whole chat.completion: its message reads as one delta); srv_resp_end appends the last event (or the
 * response object) and stores the response (s->mu held for both). */
typedef struct srv_resp srv_resp;
fl_status srv_resp_request(fl_server *s, const struct cJSON *j, struct cJSON **chat, srv_resp **rs, int *http, char *err, size_t n);
void srv_resp_chunk(srv_resp *rs, const struct cJSON *chunk, srv_buf *out);
void srv_resp_end(fl_server *s, srv_resp *rs, srv_buf *out);
void srv_resp_fail(srv_resp *rs); /* a chunk could not be made whole (out of memory): the response fails */
void srv_resp_free(srv_resp *rs);
/* GET /v1/responses/{id} (the response), DELETE (its deletion), GET .../input_items (a page of
 * them): the reply's JSON onto out; FL_ERR_INVALID where the store does not hold id. */
enum { SRV_RESP_GET, SRV_RESP_DELETE, SRV_RESP_ITEMS };
typedef struct srv_resp_page {
    int32_t limit;     /* 1..100 (default 20) */
    bool asc;          /* oldest first (default: newest first) */
    char after[80];    /* the page starts after this item ("": at the start) */
} srv_resp_page;
fl_status srv_resp_get(fl_server *s, const char *id, int what, const srv_resp_page *pg, srv_buf *out);
void srv_resp_store_free(fl_server *s);
/* messages.c: Anthropic's Messages API over chat completions.  srv_msgs_request translates
 * request j into a chat request (*chat) and, unless count_only (count_tokens: no reply to
 * make), the reply's state (*ms); FL_ERR_INVALID with err (a 400).  srv_msgs_chunk takes each
 * chat.completion.chunk (or the whole chat.completion), with the prompt's tokens and those the
 * prefix cache served; srv_msgs_end appends the last events (or the message) to out. */
typedef struct srv_msgs srv_msgs;
fl_status srv_msgs_request(fl_server *s, const struct cJSON *j, bool count_only, struct cJSON **chat, srv_msgs **ms, char *err, size_t n);
void srv_msgs_chunk(srv_msgs *ms, const struct cJSON *chunk, int32_t n_prompt, int32_t n_cached, srv_buf *out);
void srv_msgs_end(srv_msgs *ms, srv_buf *out);
void srv_msgs_fail(srv_msgs *ms); /* a chunk could not be made whole (out of memory): the message ends in an error */
void srv_msgs_free(srv_msgs *ms);
/* dialect.c: what those translations share.  srv_json_str: o's string field k (NULL: none);
 * srv_api_id: a new id "PREFIX_" + 32 hex digits (unique in the server and across its runs);
 * srv_event: {"type": type}; srv_event_append: event o as SSE with its type as the event's
 * name (all of it or nothing); srv_call_delta: tool_calls entry k of a chat delta (true where it starts a call, its id). */
const char *srv_json_str(const struct cJSON *o, const char *k);
bool srv_json_present(const struct cJSON *v); /* v is there and not null */
void srv_api_id(fl_server *s, const char *prefix, const void *salt, char *buf, size_t cap);
struct cJSON *srv_event(const char *type);
/* Whether no allocation of this thread failed since the last srv_event began: its event, built
 * since, is whole (cJSON's helpers leave out what they cannot make).  Built one at a time. */
bool srv_event_whole(void);
fl_status srv_event_append(srv_buf *out, struct cJSON *o);
typedef struct srv_call_piece_in {
    int32_t index;       /* the call's index in the chat output */
    const char *id, *name, *args; /* NULL where the piece has none */
} srv_call_piece_in;
bool srv_call_delta(const struct cJSON *tc, int32_t k, srv_call_piece_in *p);
/* child (owned) as parent's member key / array's last element; where that cannot be (no memory:
 * a parent that could not be made, or its item), child is freed; false then */
bool srv_add(struct cJSON *parent, const char *key, struct cJSON *child);
bool srv_push(struct cJSON *array, struct cJSON *child);
/* The JSON of o onto b (as an SSE data line when sse), made well-formed UTF-8 (api.c) */
fl_status srv_append_json(srv_buf *b, struct cJSON *o, bool sse);
/* util */
/* llama.cpp's /infill (infill.c): the prompt of a fill-in-the-middle request j (input_prefix,
 * input_suffix: strings or arrays of strings and ids; input_extra: [{filename, text}]; prompt: the
 * text the middle starts with) as a JSON array of token ids, laid out as llama.cpp lays it out:
 * the extra chunks (repository-level: [REP]myproject, [SEP]filename + text each, [SEP]filename),
 * then [BOS] PRE prefix prompt SUF suffix MID (spm: SUF suffix PRE prefix prompt MID), the prefix's
 * end and the suffix's start cut to 3/4 and 1/4 of n_batch, the chunks' end to what the context
 * leaves past n_batch and 2 x n_predict.  FL_ERR_UNSUPPORTED when the vocabulary has no FIM
 * tokens, FL_ERR_INVALID for malformed fields; *err says why. */
fl_status srv_infill_prompt(fl_engine *e, const struct cJSON *j, int32_t n_batch, int64_t n_predict, bool spm, struct cJSON **ids_out,
                            const char **err);
double srv_now(void);

#endif
