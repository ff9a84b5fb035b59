/* OpenAI's Responses API (POST /v1/responses; GET / DELETE /v1/responses/{id}, GET
 * /v1/responses/{id}/input_items), as vLLM and llama-server serve it, on top of chat completions.
 *
 * A request is translated into a chat request (srv_resp_request): `input` (a string, or message /
 * function_call / function_call_output / reasoning items) and the conversation of
 * `previous_response_id` become `messages`, `instructions` a leading system message (not carried
 * to later turns, as OpenAI's), `tools` (flat function tools) and `tool_choice` chat's nested
 * form, `text.format` `response_format`, `max_output_tokens` `max_tokens`, `top_logprobs`
 * `logprobs`.  The chat machinery then runs it unchanged (templates, tool calls, reasoning,
 * constraints), and its output is translated back: chat.completion.chunk deltas into the
 * Responses stream's events (srv_resp_chunk: reasoning, message and function_call items, each
 * added, its text or arguments as deltas, done), a chat.completion into one response object.
 *
 * The store: a response with `store` (the default) is kept, with its conversation, so a later
 * request can name it in previous_response_id and GET can read it back.  The store holds at
 * most --responses-mem bytes (charged to FL_MEM_NET: with --net-mem, at most a quarter of it);
 * past that the least recently used responses go first.  Guarded by the server's mutex. */
#include "server/server_int.h"
#include "core/alloc.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

enum { IT_NONE, IT_REASONING, IT_MESSAGE, IT_CALL };

struct srv_resp {
    char id[48];
    int64_t created_at;
    bool stream, store, started;
    cJSON *echo;        /* the request's fields the response repeats (instructions, tools, ...) */
    cJSON *conv;        /* the conversation without instructions: the earlier turns and this input (chat messages) */
    cJSON *items;       /* this request's input items, each with an id (input_items) */
    char model[128];    /* from the chat chunks */
    /* the translation */
    cJSON *output;      /* output items closed so far */
    int open;           /* the open item's kind (IT_*) */
    int32_t call_index; /* the open call's chat index */
    char item_id[64], call_id[64], call_name[128];
    srv_buf text;       /* the open item's text (reasoning, message) or arguments (call) */
    cJSON *lps;         /* the open message's logprobs */
    int32_t n_items;    /* items opened (their output_index) */
    int64_t seq;        /* sequence_number of the next event */
    char finish[16];    /* the chat finish reason ("": none yet) */
    char error[192];
    cJSON *usage;       /* the chat usage */
    fl_status failed;   /* no memory during the translation: the response fails */
};

typedef struct srv_resp_entry {
    struct srv_resp_entry *prev, *next; /* least recently used first */
    char id[48];
    char *response, *conv, *items;      /* JSON texts, in this block */
    size_t bytes;
} srv_resp_entry;

/* ---- ids ---- */

static void item_id(const srv_resp *rs, const char *prefix, int32_t k, char *buf, size_t cap) {
    const XXH128_hash_t h = XXH3_128bits_withSeed(rs->id, strlen(rs->id), (uint64_t)k + 1);
    snprintf(buf, cap, "%s_%016llx%016llx", prefix, (unsigned long long)h.high64, (unsigned long long)h.low64);
}

/* ---- the request ---- */

#define str_of srv_json_str

#define present srv_json_present

/* A message's content (a string, or parts) as chat content: a string, or text parts. */
static cJSON *content_of(const cJSON *c, const char *what, char *err, size_t n) {
    if (cJSON_IsString(c)) return cJSON_CreateString(c->valuestring);
    if (!cJSON_IsArray(c)) {
        snprintf(err, n, "%s: 'content' must be a string or an array of parts", what);
        return NULL;
    }
    cJSON *a = cJSON_CreateArray();
    const cJSON *p;
    cJSON_ArrayForEach(p, c) {
        const char *t = str_of(p, "type"), *txt = str_of(p, "text");
        if (t && (!strcmp(t, "input_text") || !strcmp(t, "output_text") || !strcmp(t, "text") || !strcmp(t, "summary_text") ||
                  !strcmp(t, "reasoning_text")) && txt) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddStringToObject(x, "type", "text");
            cJSON_AddStringToObject(x, "text", txt);
            srv_push(a, x);
        } else if (t && !strcmp(t, "refusal") && str_of(p, "refusal")) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddStringToObject(x, "type", "text");
            cJSON_AddStringToObject(x, "text", str_of(p, "refusal"));
            srv_push(a, x);
        } else {
            snprintf(err, n, "%s: content part type '%s' is not supported (this server's models read text: input_text, output_text)",
                     what, t ? t : "(none)");
            cJSON_Delete(a);
            return NULL;
        }
    }
    return a;
}

/* The conversation's last message if it is the assistant's (where a function_call joins it). */
static cJSON *last_assistant(cJSON *conv) {
    const int k = cJSON_GetArraySize(conv);
    cJSON *m = k ? cJSON_GetArrayItem(conv, k - 1) : NULL;
    const char *r = str_of(m, "role");
    return r && !strcmp(r, "assistant") ? m : NULL;
}

/* `input` onto conv (chat messages) and items (the input items, with ids). */
static fl_status read_input(srv_resp *rs, const cJSON *input, char *err, size_t n) {
    if (cJSON_IsString(input)) {
        cJSON *m = cJSON_CreateObject(), *it = cJSON_CreateObject(), *parts, *p;
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", input->valuestring);
        srv_push(rs->conv, m);
        char id[64];
        item_id(rs, "msg", -1, id, sizeof id);
        cJSON_AddStringToObject(it, "id", id);
        cJSON_AddStringToObject(it, "type", "message");
        cJSON_AddStringToObject(it, "role", "user");
        cJSON_AddStringToObject(it, "status", "completed");
        parts = cJSON_AddArrayToObject(it, "content");
        if (srv_push(parts, p = cJSON_CreateObject())) {
            cJSON_AddStringToObject(p, "type", "input_text");
            cJSON_AddStringToObject(p, "text", input->valuestring);
        }
        srv_push(rs->items, it);
        return FL_OK;
    }
    if (!cJSON_IsArray(input)) {
        snprintf(err, n, "'input' must be a string or an array of items");
        return FL_ERR_INVALID;
    }
    int32_t k = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, input) {
        char what[48];
        snprintf(what, sizeof what, "input[%d]", k);
        if (!cJSON_IsObject(x)) {
            snprintf(err, n, "%s must be an object", what);
            return FL_ERR_INVALID;
        }
        const char *type = str_of(x, "type"), *role = str_of(x, "role");
        if (!type && role) type = "message";
        if (!type) {
            snprintf(err, n, "%s needs a 'type' (or a 'role')", what);
            return FL_ERR_INVALID;
        }
        const char *prefix = "msg";
        if (!strcmp(type, "message")) {
            if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system") && strcmp(role, "developer"))) {
                snprintf(err, n, "%s: 'role' must be user, assistant, system or developer", what);
                return FL_ERR_INVALID;
            }
            cJSON *c = content_of(cJSON_GetObjectItemCaseSensitive(x, "content"), what, err, n);
            if (!c) return FL_ERR_INVALID;
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", role);
            srv_add(m, "content", c);
            srv_push(rs->conv, m);
        } else if (!strcmp(type, "function_call")) {
            const char *cid = str_of(x, "call_id"), *name = str_of(x, "name"), *args = str_of(x, "arguments");
            if (!cid || !name || !args) {
                snprintf(err, n, "%s: a function_call needs string 'call_id', 'name' and 'arguments'", what);
                return FL_ERR_INVALID;
            }
            cJSON *m = last_assistant(rs->conv);
            if (!m) {
                if (srv_push(rs->conv, m = cJSON_CreateObject())) {
                    cJSON_AddStringToObject(m, "role", "assistant");
                    cJSON_AddNullToObject(m, "content");
                } else {
                    return FL_ERR_NOMEM;
                }
            }
            cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
            if (!calls) calls = cJSON_AddArrayToObject(m, "tool_calls");
            cJSON *tc = cJSON_CreateObject(), *f;
            cJSON_AddStringToObject(tc, "id", cid);
            cJSON_AddStringToObject(tc, "type", "function");
            f = cJSON_AddObjectToObject(tc, "function");
            cJSON_AddStringToObject(f, "name", name);
            cJSON_AddStringToObject(f, "arguments", args);
            srv_push(calls, tc);
            prefix = "fc";
        } else if (!strcmp(type, "function_call_output")) {
            const char *cid = str_of(x, "call_id");
            const cJSON *out = cJSON_GetObjectItemCaseSensitive(x, "output");
            cJSON *c = cid && out ? content_of(out, what, err, n) : NULL;
            if (!c) {
                if (!cid || !out) snprintf(err, n, "%s: a function_call_output needs a string 'call_id' and an 'output'", what);
                return FL_ERR_INVALID;
            }
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", "tool");
            cJSON_AddStringToObject(m, "tool_call_id", cid);
            srv_add(m, "content", c);
            srv_push(rs->conv, m);
            prefix = "fco";
        } else if (!strcmp(type, "reasoning")) {
            prefix = "rs"; /* (the templates leave an earlier turn's reasoning out of the prompt) */
        } else {
            snprintf(err, n, "%s: item type '%s' is not supported (message, function_call, function_call_output, reasoning)", what, type);
            return FL_ERR_INVALID;
        }
        cJSON *it = cJSON_Duplicate(x, 1);
        if (!it) return FL_ERR_NOMEM;
        if (!cJSON_GetObjectItemCaseSensitive(it, "type")) cJSON_AddStringToObject(it, "type", type);
        if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(it, "id"))) {
            char id[64];
            item_id(rs, prefix, -2 - k, id, sizeof id);
            cJSON_DeleteItemFromObjectCaseSensitive(it, "id");
            cJSON_AddStringToObject(it, "id", id);
        }
        srv_push(rs->items, it);
        k++;
    }
    return FL_OK;
}

/* Responses' flat function tools -> chat's nested ones */
static cJSON *tools_of(const cJSON *tools, char *err, size_t n) {
    if (!cJSON_IsArray(tools)) {
        snprintf(err, n, "'tools' must be an array");
        return NULL;
    }
    cJSON *a = cJSON_CreateArray();
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const char *type = str_of(t, "type"), *name = str_of(t, "name");
        if (!type || strcmp(type, "function")) {
            snprintf(err, n, "tool type '%s' is not supported (function tools only: this server runs no built-in tools)", type ? type : "(none)");
            cJSON_Delete(a);
            return NULL;
        }
        if (!name) {
            snprintf(err, n, "a function tool needs a string 'name'");
            cJSON_Delete(a);
            return NULL;
        }
        cJSON *x = cJSON_CreateObject(), *f;
        cJSON_AddStringToObject(x, "type", "function");
        f = cJSON_AddObjectToObject(x, "function");
        cJSON_AddStringToObject(f, "name", name);
        static const char *const KEEP[] = {"description", "parameters", "strict"};
        for (size_t i = 0; i < 3; i++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(t, KEEP[i]);
            if (present(v)) srv_add(f, KEEP[i], cJSON_Duplicate(v, 1));
        }
        srv_push(a, x);
    }
    return a;
}

static cJSON *tool_choice_of(const cJSON *tc, char *err, size_t n) {
    if (cJSON_IsString(tc)) {
        if (strcmp(tc->valuestring, "auto") && strcmp(tc->valuestring, "none") && strcmp(tc->valuestring, "required")) {
            snprintf(err, n, "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}");
            return NULL;
        }
        return cJSON_CreateString(tc->valuestring);
    }
    const char *type = str_of(tc, "type"), *name = str_of(tc, "name");
    if (!type || strcmp(type, "function") || !name) {
        snprintf(err, n, "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...} (no built-in tools)");
        return NULL;
    }
    cJSON *o = cJSON_CreateObject(), *f;
    cJSON_AddStringToObject(o, "type", "function");
    f = cJSON_AddObjectToObject(o, "function");
    cJSON_AddStringToObject(f, "name", name);
    return o;
}

/* text.format -> response_format */
static fl_status format_of(const cJSON *text, cJSON *chat, char *err, size_t n) {
    if (!present(text)) return FL_OK;
    if (!cJSON_IsObject(text)) {
        snprintf(err, n, "'text' must be an object");
        return FL_ERR_INVALID;
    }
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(text, "format");
    if (!present(f)) return FL_OK;
    const char *type = str_of(f, "type");
    if (type && !strcmp(type, "text")) return FL_OK;
    cJSON *rf = cJSON_CreateObject();
    if (type && !strcmp(type, "json_object")) {
        cJSON_AddStringToObject(rf, "type", "json_object");
    } else if (type && !strcmp(type, "json_schema")) {
        const cJSON *schema = cJSON_GetObjectItemCaseSensitive(f, "schema");
        if (!present(schema)) {
            snprintf(err, n, "'text.format' of type json_schema needs a 'schema'");
            cJSON_Delete(rf);
            return FL_ERR_INVALID;
        }
        cJSON_AddStringToObject(rf, "type", "json_schema");
        cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
        cJSON_AddStringToObject(js, "name", str_of(f, "name") ? str_of(f, "name") : "response");
        srv_add(js, "schema", cJSON_Duplicate(schema, 1));
        const cJSON *strict = cJSON_GetObjectItemCaseSensitive(f, "strict");
        if (cJSON_IsBool(strict)) cJSON_AddBoolToObject(js, "strict", cJSON_IsTrue(strict));
    } else {
        snprintf(err, n, "'text.format' type must be text, json_object or json_schema");
        cJSON_Delete(rf);
        return FL_ERR_INVALID;
    }
    srv_add(chat, "response_format", rf);
    return FL_OK;
}

static srv_resp_entry *store_find(fl_server *s, const char *id) {
    for (srv_resp_entry *e = s->resp_first; e; e = e->next)
        if (!strcmp(e->id, id)) return e;
    return NULL;
}

static void store_unlink(fl_server *s, srv_resp_entry *e) {
    if (e->prev) e->prev->next = e->next;
    else s->resp_first = e->next;
    if (e->next) e->next->prev = e->prev;
    else s->resp_last = e->prev;
    e->prev = e->next = NULL;
}

static void store_push(fl_server *s, srv_resp_entry *e) { /* as the most recently used */
    e->prev = s->resp_last;
    e->next = NULL;
    if (s->resp_last) s->resp_last->next = e;
    else s->resp_first = e;
    s->resp_last = e;
}

static void store_drop(fl_server *s, srv_resp_entry *e) {
    store_unlink(s, e);
    s->resp_bytes -= e->bytes;
    s->resp_count--;
    fl_free(FL_MEM_NET, e, e->bytes);
}

void srv_resp_store_free(fl_server *s) {
    while (s->resp_first) store_drop(s, s->resp_first);
}

void srv_resp_free(srv_resp *rs) {
    if (!rs) return;
    cJSON_Delete(rs->echo);
    cJSON_Delete(rs->conv);
    cJSON_Delete(rs->items);
    cJSON_Delete(rs->output);
    cJSON_Delete(rs->lps);
    cJSON_Delete(rs->usage);
    srv_buf_free(&rs->text);
    fl_free(FL_MEM_NET, rs, sizeof *rs);
}

/* Fields copied to the chat request as they are (chat's sampling settings; vLLM takes these on
 * /v1/responses too) */
static const char *const SAME[] = {"model", "temperature", "top_p", "parallel_tool_calls", "top_k", "min_p", "seed", "stop",
                                   "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "ignore_eos",
                                   "min_tokens", "structured_outputs", "priority", "cache_salt", "reasoning_format", "lora",
                                   "skip_special_tokens", "bad_words", "allowed_token_ids"};

fl_status srv_resp_request(fl_server *s, const cJSON *j, cJSON **chat_out, srv_resp **out, int *http, char *err, size_t n) {
    *chat_out = NULL;
    *out = NULL;
    *http = 400;
    if (!cJSON_IsObject(j)) {
        snprintf(err, n, "the request body must be a JSON object");
        return FL_ERR_INVALID;
    }
    static const char *const NOT[] = {"background", "conversation", "prompt", "max_tool_calls", "stream_options"};
    for (size_t i = 0; i < sizeof NOT / sizeof *NOT; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, NOT[i]);
        if (present(v) && !cJSON_IsFalse(v)) {
            snprintf(err, n, "'%s' is not supported by this server", NOT[i]);
            return FL_ERR_INVALID;
        }
    }
    const cJSON *tr = cJSON_GetObjectItemCaseSensitive(j, "truncation");
    if (present(tr) && !(cJSON_IsString(tr) && !strcmp(tr->valuestring, "disabled"))) {
        snprintf(err, n, "'truncation' must be \"disabled\" (a conversation longer than the context is refused)");
        return FL_ERR_INVALID;
    }
    srv_resp *rs = fl_calloc(FL_MEM_NET, 1, sizeof *rs);
    cJSON *chat = cJSON_CreateObject();
    fl_status st = FL_ERR_NOMEM;
    if (!rs || !chat) goto fail;
    rs->created_at = (int64_t)time(NULL);
    srv_api_id(s, "resp", rs, rs->id, sizeof rs->id);
    if (!(rs->echo = cJSON_CreateObject()) || !(rs->conv = cJSON_CreateArray()) || !(rs->items = cJSON_CreateArray()) ||
        !(rs->output = cJSON_CreateArray()))
        goto fail;
    st = FL_ERR_INVALID;
    const cJSON *v;
    /* store, stream */
    v = cJSON_GetObjectItemCaseSensitive(j, "store");
    if (present(v) && !cJSON_IsBool(v)) { snprintf(err, n, "'store' must be a boolean"); goto fail; }
    rs->store = !cJSON_IsFalse(v);
    v = cJSON_GetObjectItemCaseSensitive(j, "stream");
    if (present(v) && !cJSON_IsBool(v)) { snprintf(err, n, "'stream' must be a boolean"); goto fail; }
    rs->stream = cJSON_IsTrue(v);
    if (rs->stream) {
        cJSON_AddTrueToObject(chat, "stream");
        cJSON_AddTrueToObject(cJSON_AddObjectToObject(chat, "stream_options"), "include_usage");
    }
    /* the earlier turns */
    const cJSON *prev = cJSON_GetObjectItemCaseSensitive(j, "previous_response_id");
    if (present(prev) && !cJSON_IsString(prev)) { snprintf(err, n, "'previous_response_id' must be a string"); goto fail; }
    if (cJSON_IsString(prev)) {
        pthread_mutex_lock(&s->mu);
        srv_resp_entry *e = store_find(s, prev->valuestring);
        cJSON *pc = NULL;
        if (e) {
            store_unlink(s, e); /* (used: the most recent) */
            store_push(s, e);
            pc = cJSON_Parse(e->conv);
        }
        pthread_mutex_unlock(&s->mu);
        if (!e) {
            *http = 404;
            snprintf(err, n, "Previous response with id '%.60s' not found (this server keeps %s; see --responses-mem)", prev->valuestring,
                     s->p.responses_mem ? "the most recently used responses that fit its store" : "no responses");
            goto fail;
        }
        if (!pc) { st = FL_ERR_NOMEM; goto fail; }
        cJSON_Delete(rs->conv);
        rs->conv = pc;
    }
    const cJSON *input = cJSON_GetObjectItemCaseSensitive(j, "input");
    if (!present(input)) { snprintf(err, n, "'input' is required"); goto fail; }
    if ((st = read_input(rs, input, err, n))) goto fail;
    st = FL_ERR_INVALID;
    /* the messages: the instructions (this request's only), then the conversation */
    const cJSON *ins = cJSON_GetObjectItemCaseSensitive(j, "instructions");
    if (present(ins) && !cJSON_IsString(ins)) { snprintf(err, n, "'instructions' must be a string"); goto fail; }
    cJSON *msgs = cJSON_AddArrayToObject(chat, "messages");
    if (cJSON_IsString(ins)) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", ins->valuestring);
        srv_push(msgs, m);
    }
    const cJSON *m;
    cJSON_ArrayForEach(m, rs->conv) srv_push(msgs, cJSON_Duplicate(m, 1));
    if (cJSON_GetArraySize(msgs) == 0) { snprintf(err, n, "'input' is empty"); goto fail; }
    for (size_t i = 0; i < sizeof SAME / sizeof *SAME; i++)
        if ((v = cJSON_GetObjectItemCaseSensitive(j, SAME[i]))) srv_add(chat, SAME[i], cJSON_Duplicate(v, 1));
    v = cJSON_GetObjectItemCaseSensitive(j, "max_output_tokens");
    if (present(v) && (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble != floor(v->valuedouble) || v->valuedouble > 1e9)) {
        snprintf(err, n, "'max_output_tokens' must be an integer of at least 1");
        goto fail;
    }
    if (present(v)) srv_add(chat, "max_tokens", cJSON_Duplicate(v, 1));
    /* logprobs: top_logprobs, or include's message.output_text.logprobs */
    bool lp = false;
    const cJSON *inc = cJSON_GetObjectItemCaseSensitive(j, "include");
    if (present(inc) && !cJSON_IsArray(inc)) { snprintf(err, n, "'include' must be an array of strings"); goto fail; }
    cJSON_ArrayForEach(v, inc) {
        if (!cJSON_IsString(v)) { snprintf(err, n, "'include' must be an array of strings"); goto fail; }
        lp |= !strcmp(v->valuestring, "message.output_text.logprobs");
    }
    const cJSON *tl = cJSON_GetObjectItemCaseSensitive(j, "top_logprobs");
    if (present(tl)) {
        if (!cJSON_IsNumber(tl)) { snprintf(err, n, "'top_logprobs' must be an integer"); goto fail; }
        srv_add(chat, "top_logprobs", cJSON_Duplicate(tl, 1));
        lp = true;
    }
    if (lp) cJSON_AddTrueToObject(chat, "logprobs");
    /* tools */
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(j, "tools"), *tc = cJSON_GetObjectItemCaseSensitive(j, "tool_choice");
    if (present(tools) && cJSON_GetArraySize(tools) > 0) {
        cJSON *t = tools_of(tools, err, n);
        if (!t) goto fail;
        srv_add(chat, "tools", t);
    } else if (present(tools) && !cJSON_IsArray(tools)) {
        snprintf(err, n, "'tools' must be an array");
        goto fail;
    }
    const bool no_tools = !cJSON_GetObjectItemCaseSensitive(chat, "tools");
    if (present(tc) && !(no_tools && cJSON_IsString(tc) && (!strcmp(tc->valuestring, "auto") || !strcmp(tc->valuestring, "none")))) {
        /* (without tools, "auto" and "none" are what there is: OpenAI takes them) */
        cJSON *c = tool_choice_of(tc, err, n);
        if (!c) goto fail;
        srv_add(chat, "tool_choice", c);
    }
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(j, "text");
    if ((st = format_of(text, chat, err, n))) goto fail;
    st = FL_ERR_INVALID;
    const cJSON *reas = cJSON_GetObjectItemCaseSensitive(j, "reasoning");
    if (present(reas) && !cJSON_IsObject(reas)) { snprintf(err, n, "'reasoning' must be an object"); goto fail; }
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(j, "metadata");
    if (present(meta) && (!cJSON_IsObject(meta) || cJSON_GetArraySize(meta) > 16)) {
        snprintf(err, n, "'metadata' must be an object of at most 16 strings");
        goto fail;
    }
    cJSON_ArrayForEach(v, meta) if (!cJSON_IsString(v)) { snprintf(err, n, "'metadata' must be an object of at most 16 strings"); goto fail; }
    /* what the response repeats */
    cJSON *e = rs->echo;
#define ECHO(key, dflt)                                                                                                  \
    do {                                                                                                                 \
        const cJSON *x_ = cJSON_GetObjectItemCaseSensitive(j, key);                                                      \
        srv_add(e, key, present(x_) ? cJSON_Duplicate(x_, 1) : (dflt));                                    \
    } while (0)
    ECHO("instructions", cJSON_CreateNull());
    ECHO("max_output_tokens", cJSON_CreateNull());
    cJSON_AddNullToObject(e, "max_tool_calls");
    ECHO("parallel_tool_calls", cJSON_CreateTrue());
    ECHO("previous_response_id", cJSON_CreateNull());
    if (present(reas)) {
        cJSON *r = cJSON_AddObjectToObject(e, "reasoning");
        const cJSON *ef = cJSON_GetObjectItemCaseSensitive(reas, "effort"), *su = cJSON_GetObjectItemCaseSensitive(reas, "summary");
        srv_add(r, "effort", present(ef) ? cJSON_Duplicate(ef, 1) : cJSON_CreateNull());
        srv_add(r, "summary", present(su) ? cJSON_Duplicate(su, 1) : cJSON_CreateNull());
    } else {
        cJSON *r = cJSON_AddObjectToObject(e, "reasoning");
        cJSON_AddNullToObject(r, "effort");
        cJSON_AddNullToObject(r, "summary");
    }
    cJSON_AddBoolToObject(e, "store", rs->store);
    ECHO("temperature", cJSON_CreateNumber(1.0));
    if (present(text)) {
        cJSON *t = cJSON_Duplicate(text, 1);
        if (t && !cJSON_GetObjectItemCaseSensitive(t, "format")) {
            cJSON *f = cJSON_AddObjectToObject(t, "format");
            cJSON_AddStringToObject(f, "type", "text");
        }
        srv_add(e, "text", t);
    } else {
        cJSON_AddStringToObject(cJSON_AddObjectToObject(cJSON_AddObjectToObject(e, "text"), "format"), "type", "text");
    }
    ECHO("tool_choice", cJSON_CreateString("auto"));
    ECHO("tools", cJSON_CreateArray());
    ECHO("top_logprobs", cJSON_CreateNumber(0));
    ECHO("top_p", cJSON_CreateNumber(1.0));
    cJSON_AddStringToObject(e, "truncation", "disabled");
    ECHO("user", cJSON_CreateNull());
    ECHO("metadata", cJSON_CreateObject());
#undef ECHO
    *chat_out = chat;
    *out = rs;
    return FL_OK;
fail:
    if (st == FL_ERR_NOMEM) {
        *http = 503;
        snprintf(err, n, "the server's buffers (--net-mem) are full; retry later");
    }
    cJSON_Delete(chat);
    srv_resp_free(rs);
    return st;
}

/* ---- the output: events and the response object ---- */

static void chunk_in(srv_resp *rs, const cJSON *chunk, srv_buf *out);

/* Send event o (streamed; else dropped) and free it. */
static void emit(srv_resp *rs, srv_buf *out, cJSON *o) {
    if (!o || !srv_event_whole()) {
        cJSON_Delete(o);
        rs->failed = FL_ERR_NOMEM;
        return;
    }
    if (rs->stream) {
        cJSON_AddNumberToObject(o, "sequence_number", (double)rs->seq++);
        if (srv_event_append(out, o)) rs->failed = FL_ERR_NOMEM;
    }
    cJSON_Delete(o);
}

/* usage in the Responses' shape from chat's */
static cJSON *usage_of(const cJSON *u) {
    cJSON *o = cJSON_CreateObject();
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens"), *ct = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
    const cJSON *ca = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens_details"), "cached_tokens");
    const cJSON *rt = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(u, "completion_tokens_details"), "reasoning_tokens");
    const double in = cJSON_IsNumber(pt) ? pt->valuedouble : 0, outn = cJSON_IsNumber(ct) ? ct->valuedouble : 0;
    cJSON_AddNumberToObject(o, "input_tokens", in);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(o, "input_tokens_details"), "cached_tokens", cJSON_IsNumber(ca) ? ca->valuedouble : 0);
    cJSON_AddNumberToObject(o, "output_tokens", outn);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(o, "output_tokens_details"), "reasoning_tokens", cJSON_IsNumber(rt) ? rt->valuedouble : 0);
    cJSON_AddNumberToObject(o, "total_tokens", in + outn);
    return o;
}

static const char *status_of(const srv_resp *rs) {
    if (rs->failed || !strcmp(rs->finish, "error")) return "failed";
    if (!strcmp(rs->finish, "abort")) return "cancelled";
    if (!strcmp(rs->finish, "length")) return "incomplete";
    return rs->finish[0] ? "completed" : "in_progress";
}

/* The response object as it stands (status from the finish; output: the closed items) */
static cJSON *response_of(const srv_resp *rs, const char *model) {
    cJSON *o = cJSON_CreateObject();
    const char *status = status_of(rs);
    cJSON_AddStringToObject(o, "id", rs->id);
    cJSON_AddStringToObject(o, "object", "response");
    cJSON_AddNumberToObject(o, "created_at", (double)rs->created_at);
    cJSON_AddStringToObject(o, "status", status);
    cJSON_AddFalseToObject(o, "background");
    if (!strcmp(status, "failed")) {
        cJSON *er = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(er, "code", "server_error");
        cJSON_AddStringToObject(er, "message", rs->failed ? "no memory for the response in the server's buffers (--net-mem)"
                                                : rs->error[0] ? rs->error : "the request failed");
    } else {
        cJSON_AddNullToObject(o, "error");
    }
    if (!strcmp(status, "incomplete")) cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "incomplete_details"), "reason", "max_output_tokens");
    else cJSON_AddNullToObject(o, "incomplete_details");
    cJSON_AddStringToObject(o, "model", model);
    srv_add(o, "output", cJSON_Duplicate(rs->output, 1));
    for (const cJSON *x = rs->echo->child; x; x = x->next) srv_add(o, x->string, cJSON_Duplicate(x, 1));
    if (rs->usage) srv_add(o, "usage", usage_of(rs->usage));
    else cJSON_AddNullToObject(o, "usage");
    return o;
}

static cJSON *text_part(const char *type, const char *text, const cJSON *lps) {
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", type);
    cJSON_AddStringToObject(p, "text", text);
    if (!strcmp(type, "output_text")) {
        cJSON_AddArrayToObject(p, "annotations");
        srv_add(p, "logprobs", lps ? cJSON_Duplicate(lps, 1) : cJSON_CreateArray());
    }
    return p;
}

/* The open item as it stands: whole (done) or as added (in progress, empty) */
static cJSON *open_item(const srv_resp *rs, bool done) {
    cJSON *it = cJSON_CreateObject();
    const char *txt = done && rs->text.p ? rs->text.p : "";
    const char *status = !done ? "in_progress" : !strcmp(rs->finish, "length") ? "incomplete" : "completed";
    switch (rs->open) {
    case IT_REASONING:
        cJSON_AddStringToObject(it, "id", rs->item_id);
        cJSON_AddStringToObject(it, "type", "reasoning");
        cJSON_AddArrayToObject(it, "summary");
        if (done) srv_push(cJSON_AddArrayToObject(it, "content"), text_part("reasoning_text", txt, NULL));
        else cJSON_AddArrayToObject(it, "content");
        cJSON_AddStringToObject(it, "status", status);
        break;
    case IT_MESSAGE:
        cJSON_AddStringToObject(it, "id", rs->item_id);
        cJSON_AddStringToObject(it, "type", "message");
        cJSON_AddStringToObject(it, "status", status);
        cJSON_AddStringToObject(it, "role", "assistant");
        if (done) srv_push(cJSON_AddArrayToObject(it, "content"), text_part("output_text", txt, rs->lps));
        else cJSON_AddArrayToObject(it, "content");
        break;
    case IT_CALL:
        cJSON_AddStringToObject(it, "id", rs->item_id);
        cJSON_AddStringToObject(it, "type", "function_call");
        cJSON_AddStringToObject(it, "status", status);
        cJSON_AddStringToObject(it, "arguments", txt);
        cJSON_AddStringToObject(it, "call_id", rs->call_id);
        cJSON_AddStringToObject(it, "name", rs->call_name);
        break;
    }
    return it;
}

static void add_index(cJSON *o, const srv_resp *rs, bool content) {
    cJSON_AddStringToObject(o, "item_id", rs->item_id);
    cJSON_AddNumberToObject(o, "output_index", rs->n_items - 1);
    if (content) cJSON_AddNumberToObject(o, "content_index", 0);
}

static void close_item(srv_resp *rs, srv_buf *out) {
    if (rs->open == IT_NONE) return;
    const char *txt = rs->text.p ? rs->text.p : "";
    cJSON *o;
    if (rs->open == IT_CALL) {
        o = srv_event("response.function_call_arguments.done");
        add_index(o, rs, false);
        cJSON_AddStringToObject(o, "name", rs->call_name);
        cJSON_AddStringToObject(o, "arguments", txt);
        emit(rs, out, o);
    } else {
        const bool msg = rs->open == IT_MESSAGE;
        o = srv_event(msg ? "response.output_text.done" : "response.reasoning_text.done");
        add_index(o, rs, true);
        cJSON_AddStringToObject(o, "text", txt);
        if (msg) srv_add(o, "logprobs", rs->lps ? cJSON_Duplicate(rs->lps, 1) : cJSON_CreateArray());
        emit(rs, out, o);
        o = srv_event("response.content_part.done");
        add_index(o, rs, true);
        srv_add(o, "part", text_part(msg ? "output_text" : "reasoning_text", txt, rs->lps));
        emit(rs, out, o);
    }
    cJSON *it = open_item(rs, true);
    o = srv_event("response.output_item.done");
    cJSON_AddNumberToObject(o, "output_index", rs->n_items - 1);
    srv_add(o, "item", cJSON_Duplicate(it, 1));
    emit(rs, out, o);
    if (!it || !srv_push(rs->output, it)) rs->failed = FL_ERR_NOMEM;
    rs->open = IT_NONE;
    srv_buf_free(&rs->text);
    cJSON_Delete(rs->lps);
    rs->lps = NULL;
}

static void open_new(srv_resp *rs, srv_buf *out, int kind) {
    close_item(rs, out);
    rs->open = kind;
    item_id(rs, kind == IT_CALL ? "fc" : kind == IT_MESSAGE ? "msg" : "rs", rs->n_items++, rs->item_id, sizeof rs->item_id);
    cJSON *o = srv_event("response.output_item.added");
    cJSON_AddNumberToObject(o, "output_index", rs->n_items - 1);
    srv_add(o, "item", open_item(rs, false));
    emit(rs, out, o);
    if (kind != IT_CALL) {
        o = srv_event("response.content_part.added");
        add_index(o, rs, true);
        srv_add(o, "part", text_part(kind == IT_MESSAGE ? "output_text" : "reasoning_text", "", NULL));
        emit(rs, out, o);
    }
}

/* more text of the open item's kind (opening one where another is open) */
static void add_text(srv_resp *rs, srv_buf *out, int kind, const char *t, const cJSON *lps) {
    if (rs->open != kind) open_new(rs, out, kind);
    if (srv_buf_append(&rs->text, t, strlen(t))) rs->failed = FL_ERR_NOMEM;
    cJSON *o = srv_event(kind == IT_MESSAGE ? "response.output_text.delta" : kind == IT_CALL ? "response.function_call_arguments.delta"
                                                                                         : "response.reasoning_text.delta");
    add_index(o, rs, kind != IT_CALL);
    cJSON_AddStringToObject(o, "delta", t);
    if (kind == IT_MESSAGE) {
        srv_add(o, "logprobs", lps ? cJSON_Duplicate(lps, 1) : cJSON_CreateArray());
        if (lps) {
            if (!rs->lps) rs->lps = cJSON_CreateArray();
            const cJSON *x;
            cJSON_ArrayForEach(x, lps) srv_push(rs->lps, cJSON_Duplicate(x, 1));
        }
    }
    emit(rs, out, o);
}

/* one chat delta (a chunk's, or a whole message's) */
static void feed(srv_resp *rs, srv_buf *out, const cJSON *d, const cJSON *lps) {
    const char *rc = str_of(d, "reasoning_content"), *c = str_of(d, "content");
    if (rc && *rc) add_text(rs, out, IT_REASONING, rc, NULL);
    if (c && *c) add_text(rs, out, IT_MESSAGE, c, lps);
    int32_t k = 0;
    const cJSON *tc;
    cJSON_ArrayForEach(tc, cJSON_GetObjectItemCaseSensitive(d, "tool_calls")) {
        srv_call_piece_in p;
        if (srv_call_delta(tc, k++, &p) || rs->open != IT_CALL || p.index != rs->call_index) {
            close_item(rs, out);
            rs->call_index = p.index;
            snprintf(rs->call_id, sizeof rs->call_id, "%s", p.id ? p.id : "");
            snprintf(rs->call_name, sizeof rs->call_name, "%s", p.name ? p.name : "");
            open_new(rs, out, IT_CALL);
        }
        if (p.args && *p.args) add_text(rs, out, IT_CALL, p.args, NULL);
    }
}

static void start(srv_resp *rs, srv_buf *out, const cJSON *chunk) {
    if (rs->started) return;
    rs->started = true;
    const char *model = str_of(chunk, "model");
    snprintf(rs->model, sizeof rs->model, "%s", model ? model : "");
    cJSON *o = srv_event("response.created"); /* (first: emit checks what was built since) */
    srv_add(o, "response", response_of(rs, rs->model));
    emit(rs, out, o);
    o = srv_event("response.in_progress");
    srv_add(o, "response", response_of(rs, rs->model));
    emit(rs, out, o);
}

void srv_resp_chunk(srv_resp *rs, const cJSON *chunk, srv_buf *out) {
    const size_t f0 = fl_mem_thread_failures();
    chunk_in(rs, chunk, out);
    if (fl_mem_thread_failures() != f0) rs->failed = FL_ERR_NOMEM; /* (a part may be missing: the response fails) */
}

static void chunk_in(srv_resp *rs, const cJSON *chunk, srv_buf *out) {
    start(rs, out, chunk);
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(chunk, "usage");
    if (cJSON_IsObject(u)) {
        cJSON_Delete(rs->usage);
        rs->usage = cJSON_Duplicate(u, 1);
    }
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(chunk, "choices"), 0);
    if (!c) return;
    const cJSON *lps = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c, "logprobs"), "content");
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(c, "delta");
    feed(rs, out, d ? d : cJSON_GetObjectItemCaseSensitive(c, "message"), cJSON_IsArray(lps) ? lps : NULL);
    const char *fin = str_of(c, "finish_reason"), *er = str_of(c, "error");
    if (fin) {
        snprintf(rs->finish, sizeof rs->finish, "%s", fin);
        if (er) snprintf(rs->error, sizeof rs->error, "%s", er);
        close_item(rs, out);
    }
}

/* The conversation this response ends, as chat messages: the input's, then the output's
 * assistant message (its text and calls; the reasoning left out, as the templates leave it). */
static cJSON *conv_after(const srv_resp *rs) {
    cJSON *c = cJSON_Duplicate(rs->conv, 1), *m = cJSON_CreateObject(), *calls = cJSON_CreateArray();
    srv_buf text = {0};
    const cJSON *it;
    cJSON_ArrayForEach(it, rs->output) {
        const char *type = str_of(it, "type");
        if (!strcmp(type, "message")) {
            const char *t = str_of(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(it, "content"), 0), "text");
            if (t) srv_buf_append(&text, t, strlen(t));
        } else if (!strcmp(type, "function_call")) {
            cJSON *tc = cJSON_CreateObject(), *f;
            cJSON_AddStringToObject(tc, "id", str_of(it, "call_id"));
            cJSON_AddStringToObject(tc, "type", "function");
            f = cJSON_AddObjectToObject(tc, "function");
            cJSON_AddStringToObject(f, "name", str_of(it, "name"));
            cJSON_AddStringToObject(f, "arguments", str_of(it, "arguments"));
            srv_push(calls, tc);
        }
    }
    cJSON_AddStringToObject(m, "role", "assistant");
    if (text.len || !cJSON_GetArraySize(calls)) cJSON_AddStringToObject(m, "content", text.p ? text.p : "");
    else cJSON_AddNullToObject(m, "content");
    if (cJSON_GetArraySize(calls)) srv_add(m, "tool_calls", calls);
    else cJSON_Delete(calls);
    srv_push(c, m);
    srv_buf_free(&text);
    return c;
}

/* Keep the response (s->mu held): its texts in one block, charged to NET; the least recently
 * used go while the store is over its limit or NET's budget refuses the block. */
static void store_put(fl_server *s, const srv_resp *rs, const char *resp_json) {
    size_t limit = (size_t)s->p.responses_mem;
    const size_t nb = fl_mem_budget(FL_MEM_NET);
    if (nb && limit > nb / 4) limit = nb / 4;
    if (!limit) return;
    cJSON *conv = conv_after(rs);
    srv_buf cb = {0}, ib = {0}; /* (well-formed UTF-8, as the replies: srv_append_json) */
    const bool ok = conv && !srv_append_json(&cb, conv, false) && !srv_append_json(&ib, rs->items, false);
    const char *ct = cb.p, *it = ib.p;
    cJSON_Delete(conv);
    if (ok) {
        const size_t nr = strlen(resp_json) + 1, nc = strlen(ct) + 1, ni = strlen(it) + 1, bytes = sizeof(srv_resp_entry) + nr + nc + ni;
        while (s->resp_first && s->resp_bytes + bytes > limit) store_drop(s, s->resp_first);
        srv_resp_entry *e = NULL;
        if (bytes <= limit)
            while (!(e = fl_alloc(FL_MEM_NET, bytes, 16)) && s->resp_first) store_drop(s, s->resp_first);
        if (e) {
            memset(e, 0, sizeof *e);
            snprintf(e->id, sizeof e->id, "%s", rs->id);
            e->response = (char *)(e + 1);
            e->conv = e->response + nr;
            e->items = e->conv + nc;
            memcpy(e->response, resp_json, nr);
            memcpy(e->conv, ct, nc);
            memcpy(e->items, it, ni);
            e->bytes = bytes;
            store_push(s, e);
            s->resp_bytes += bytes;
            s->resp_count++;
        }
    }
    srv_buf_free(&cb);
    srv_buf_free(&ib);
}

void srv_resp_fail(srv_resp *rs) {
    if (!rs->failed) rs->failed = FL_ERR_NOMEM;
}

void srv_resp_end(fl_server *s, srv_resp *rs, srv_buf *out) {
    size_t f0 = fl_mem_thread_failures();
    close_item(rs, out);
    if (fl_mem_thread_failures() != f0) rs->failed = FL_ERR_NOMEM;
    f0 = fl_mem_thread_failures();
    cJSON *r = response_of(rs, rs->model);
    if (fl_mem_thread_failures() != f0) { /* (a part missing: not this one, a failed one below) */
        rs->failed = FL_ERR_NOMEM;
        cJSON_Delete(r);
        r = NULL;
    }
    const char *status = status_of(rs);
    srv_buf t = {0}; /* kept as the reply gives it */
    if (r && rs->store && strcmp(status, "failed") && strcmp(status, "cancelled") && !srv_append_json(&t, r, false)) store_put(s, rs, t.p);
    srv_buf_free(&t);
    const bool failed_before = rs->failed;
    if (rs->stream && r) {
        cJSON *o = srv_event(!strcmp(status, "failed") ? "response.failed" : !strcmp(status, "incomplete") ? "response.incomplete"
                                                                                                       : "response.completed");
        srv_add(o, "response", r);
        emit(rs, out, o);
    } else if (r) {
        if (srv_append_json(out, r, false)) rs->failed = FL_ERR_NOMEM;
        cJSON_Delete(r);
    }
    if (!r || (rs->failed && !failed_before)) { /* no memory for the whole response: a short failed one, as fixed text */
        static const char MSG[] = "no memory for the response in the server's buffers (--net-mem); retry later";
        if (rs->stream)
            srv_buf_printf(out, "event: response.failed\ndata: {\"type\":\"response.failed\",\"sequence_number\":%lld,\"response\":{\"id\":\"%s\","
                                "\"object\":\"response\",\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"%s\"},\"output\":[]}}\n\n",
                           (long long)rs->seq++, rs->id, MSG);
        else
            srv_buf_printf(out, "{\"id\":\"%s\",\"object\":\"response\",\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"%s\"},"
                                "\"output\":[]}", rs->id, MSG);
    }
}

/* ---- the store's endpoints ---- */

fl_status srv_resp_get(fl_server *s, const char *id, int what, const srv_resp_page *pg, srv_buf *out) {
    pthread_mutex_lock(&s->mu);
    srv_resp_entry *e = store_find(s, id);
    fl_status st = FL_ERR_INVALID; /* (not found) */
    if (e && what == SRV_RESP_DELETE) {
        store_drop(s, e);
        st = srv_buf_printf(out, "{\"id\":\"%s\",\"object\":\"response.deleted\",\"deleted\":true}", id);
    } else if (e && what == SRV_RESP_GET) {
        st = srv_buf_append(out, e->response, strlen(e->response));
    } else if (e) { /* input_items: a page of them, newest first unless asc */
        cJSON *items = cJSON_Parse(e->items), *page = cJSON_CreateObject(), *data = cJSON_CreateArray();
        st = FL_ERR_NOMEM;
        if (items && page && data) {
            const int nit = cJSON_GetArraySize(items);
            int k = pg->asc ? 0 : nit - 1, taken = 0;
            const int step = pg->asc ? 1 : -1;
            if (pg->after[0]) { /* from the item after `after` */
                for (int q = k; q >= 0 && q < nit; q += step)
                    if (!strcmp(str_of(cJSON_GetArrayItem(items, q), "id") ? str_of(cJSON_GetArrayItem(items, q), "id") : "", pg->after)) {
                        k = q + step;
                        break;
                    }
            }
            for (; k >= 0 && k < nit && taken < pg->limit; k += step, taken++)
                srv_push(data, cJSON_Duplicate(cJSON_GetArrayItem(items, k), 1));
            const bool more = k >= 0 && k < nit;
            cJSON_AddStringToObject(page, "object", "list");
            srv_add(page, "data", data);
            data = NULL;
            const cJSON *d = cJSON_GetObjectItemCaseSensitive(page, "data");
            const int nd = cJSON_GetArraySize(d);
            if (nd) {
                cJSON_AddStringToObject(page, "first_id", str_of(cJSON_GetArrayItem(d, 0), "id"));
                cJSON_AddStringToObject(page, "last_id", str_of(cJSON_GetArrayItem(d, nd - 1), "id"));
            } else {
                cJSON_AddNullToObject(page, "first_id");
                cJSON_AddNullToObject(page, "last_id");
            }
            cJSON_AddBoolToObject(page, "has_more", more);
            st = srv_append_json(out, page, false);
        }
        cJSON_Delete(items);
        cJSON_Delete(page);
        cJSON_Delete(data);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}
