/* Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens), as llama-server and
 * vLLM serve it for Anthropic's clients (Claude Code and the SDKs), on top of chat completions.
 *
 * A request is translated into a chat request (srv_msgs_request): `system` (a string or text
 * blocks) becomes a system message; each message's content blocks become chat messages: text
 * blocks the message's text, an assistant's tool_use blocks its tool_calls (input as arguments
 * text), a user's tool_result blocks tool messages (ahead of its text), thinking blocks are left
 * out (as the templates leave an earlier turn's thinking); `tools` (name, description,
 * input_schema) and `tool_choice` (auto, any, tool, none) become chat's, `stop_sequences` stop.
 * The chat output comes back as Anthropic's: a message whose content blocks are thinking, text
 * and tool_use (input an object), stop_reason end_turn / max_tokens / stop_sequence / tool_use,
 * usage with the prefix cache's tokens as cache_read_input_tokens; streamed as message_start,
 * content_block_start / _delta (text_delta, thinking_delta, input_json_delta) / _stop,
 * message_delta, message_stop. */
#include "server/server_int.h"
#include "core/alloc.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <math.h>
#include <string.h>

enum { BL_NONE, BL_THINKING, BL_TEXT, BL_TOOL };

struct srv_msgs {
    char id[48];
    bool stream, started;
    char model[128];
    int open;             /* the open block's kind */
    int32_t n_blocks;     /* blocks opened (the open one's index is n_blocks - 1) */
    int32_t call_index;   /* the open tool_use's chat index */
    char call_id[64], call_name[128];
    srv_buf text;         /* the open block's text, thinking or input JSON */
    cJSON *content;       /* the blocks closed so far */
    char finish[16], stop_seq[256], error[192];
    bool has_stop_seq;
    int32_t in_tokens, cached, out_tokens;
    fl_status failed;
};

#define str_of srv_json_str

#define present srv_json_present

void srv_msgs_free(srv_msgs *ms) {
    if (!ms) return;
    cJSON_Delete(ms->content);
    srv_buf_free(&ms->text);
    fl_free(FL_MEM_NET, ms, sizeof *ms);
}

/* text blocks (or a string) joined by sep into b; false with err on another block type */
static bool text_of(const cJSON *c, const char *sep, const char *what, srv_buf *b, char *err, size_t n) {
    if (cJSON_IsString(c)) return srv_buf_append(b, c->valuestring, strlen(c->valuestring)) == FL_OK;
    if (!cJSON_IsArray(c)) {
        snprintf(err, n, "%s must be a string or an array of text blocks", what);
        return false;
    }
    const cJSON *x;
    cJSON_ArrayForEach(x, c) {
        const char *t = str_of(x, "type"), *txt = str_of(x, "text");
        if (!t || strcmp(t, "text") || !txt) {
            snprintf(err, n, "%s: block type '%s' is not supported here (text)", what, t ? t : "(none)");
            return false;
        }
        if ((b->len && srv_buf_append(b, sep, strlen(sep))) || srv_buf_append(b, txt, strlen(txt))) return false;
    }
    return true;
}

static cJSON *message(const char *role, const char *content) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    if (content) cJSON_AddStringToObject(m, "content", content);
    else cJSON_AddNullToObject(m, "content");
    return m;
}

/* one Anthropic message onto msgs (chat messages) */
static fl_status read_message(const cJSON *m, int k, cJSON *msgs, char *err, size_t n) {
    char what[48];
    snprintf(what, sizeof what, "messages[%d]", k);
    const char *role = str_of(m, "role");
    if (!cJSON_IsObject(m) || !role || (strcmp(role, "user") && strcmp(role, "assistant"))) {
        snprintf(err, n, "%s: 'role' must be user or assistant", what);
        return FL_ERR_INVALID;
    }
    const bool user = !strcmp(role, "user");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (cJSON_IsString(c)) {
        srv_push(msgs, message(role, c->valuestring));
        return FL_OK;
    }
    if (!cJSON_IsArray(c)) {
        snprintf(err, n, "%s: 'content' must be a string or an array of blocks", what);
        return FL_ERR_INVALID;
    }
    srv_buf text = {0};
    cJSON *calls = NULL;
    fl_status st = FL_ERR_INVALID;
    const cJSON *b;
    cJSON_ArrayForEach(b, c) {
        const char *t = str_of(b, "type");
        if (t && !strcmp(t, "text") && str_of(b, "text")) {
            if (srv_buf_append(&text, str_of(b, "text"), strlen(str_of(b, "text")))) { st = FL_ERR_NOMEM; goto out; }
        } else if (t && !user && !strcmp(t, "tool_use")) {
            const char *id = str_of(b, "id"), *name = str_of(b, "name");
            const cJSON *in = cJSON_GetObjectItemCaseSensitive(b, "input");
            if (!id || !name || !cJSON_IsObject(in)) {
                snprintf(err, n, "%s: a tool_use block needs string 'id' and 'name' and an object 'input'", what);
                goto out;
            }
            char *args = cJSON_PrintUnformatted(in);
            if (!args) { st = FL_ERR_NOMEM; goto out; }
            cJSON *tc = cJSON_CreateObject(), *f;
            cJSON_AddStringToObject(tc, "id", id);
            cJSON_AddStringToObject(tc, "type", "function");
            f = cJSON_AddObjectToObject(tc, "function");
            cJSON_AddStringToObject(f, "name", name);
            cJSON_AddStringToObject(f, "arguments", args);
            cJSON_free(args);
            if (!calls) calls = cJSON_CreateArray();
            srv_push(calls, tc);
        } else if (t && user && !strcmp(t, "tool_result")) {
            const char *id = str_of(b, "tool_use_id");
            const cJSON *rc = cJSON_GetObjectItemCaseSensitive(b, "content");
            srv_buf r = {0};
            if (!id || (present(rc) && !text_of(rc, "\n", "a tool_result's content", &r, err, n))) {
                if (!id) snprintf(err, n, "%s: a tool_result block needs a string 'tool_use_id'", what);
                srv_buf_free(&r);
                goto out;
            }
            cJSON *tm = message("tool", r.p ? r.p : "");
            cJSON_AddStringToObject(tm, "tool_call_id", id);
            srv_push(msgs, tm); /* (the results answer the calls before; the text follows them) */
            srv_buf_free(&r);
        } else if (t && !user && (!strcmp(t, "thinking") || !strcmp(t, "redacted_thinking"))) {
            /* left out, as the templates leave an earlier turn's thinking */
        } else {
            snprintf(err, n, "%s: %s content block type '%s' is not supported (text%s)", what, role, t ? t : "(none)",
                     user ? ", tool_result" : ", tool_use, thinking");
            goto out;
        }
    }
    if (text.len || calls || !cJSON_GetArraySize(c)) {
        cJSON *mm = message(role, text.len || !calls ? (text.p ? text.p : "") : NULL);
        if (calls) srv_add(mm, "tool_calls", calls);
        calls = NULL;
        srv_push(msgs, mm);
    }
    st = FL_OK;
out:
    cJSON_Delete(calls);
    srv_buf_free(&text);
    return st;
}

/* Fields copied as they are */
static const char *const SAME[] = {"model", "temperature", "top_p", "top_k", "stream", "min_p", "seed", "presence_penalty",
                                   "frequency_penalty", "repetition_penalty", "structured_outputs", "priority", "reasoning_format"};

fl_status srv_msgs_request(fl_server *s, const cJSON *j, bool count_only, cJSON **chat_out, srv_msgs **out, char *err, size_t n) {
    *chat_out = NULL;
    if (out) *out = NULL;
    if (!cJSON_IsObject(j)) {
        snprintf(err, n, "the request body must be a JSON object");
        return FL_ERR_INVALID;
    }
    srv_msgs *ms = count_only ? NULL : fl_calloc(FL_MEM_NET, 1, sizeof *ms);
    cJSON *chat = cJSON_CreateObject();
    fl_status st = FL_ERR_NOMEM;
    if ((!count_only && !ms) || !chat) goto fail;
    st = FL_ERR_INVALID;
    const cJSON *v;
    cJSON *msgs = cJSON_AddArrayToObject(chat, "messages");
    const cJSON *sys = cJSON_GetObjectItemCaseSensitive(j, "system");
    if (present(sys)) {
        srv_buf b = {0};
        if (!text_of(sys, "\n", "'system'", &b, err, n)) {
            srv_buf_free(&b);
            goto fail;
        }
        srv_push(msgs, message("system", b.p ? b.p : ""));
        srv_buf_free(&b);
    }
    const cJSON *ml = cJSON_GetObjectItemCaseSensitive(j, "messages");
    if (!cJSON_IsArray(ml) || !cJSON_GetArraySize(ml)) {
        snprintf(err, n, "'messages' must be a non-empty array");
        goto fail;
    }
    int k = 0;
    cJSON_ArrayForEach(v, ml) if ((st = read_message(v, k++, msgs, err, n))) goto fail;
    st = FL_ERR_INVALID;
    for (size_t i = 0; i < sizeof SAME / sizeof *SAME; i++)
        if ((v = cJSON_GetObjectItemCaseSensitive(j, SAME[i]))) srv_add(chat, SAME[i], cJSON_Duplicate(v, 1));
    v = cJSON_GetObjectItemCaseSensitive(j, "max_tokens");
    if (!count_only && !present(v)) { snprintf(err, n, "'max_tokens' is required"); goto fail; }
    if (present(v) && (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble != floor(v->valuedouble))) {
        snprintf(err, n, "'max_tokens' must be an integer of at least 1");
        goto fail;
    }
    /* (clients ask for more than a context holds, 32000 and up: as many as the server gives) */
    if (present(v)) cJSON_AddNumberToObject(chat, "max_tokens", v->valuedouble < s->p.max_tokens_limit ? v->valuedouble : s->p.max_tokens_limit);
    v = cJSON_GetObjectItemCaseSensitive(j, "stop_sequences");
    if (present(v)) srv_add(chat, "stop", cJSON_Duplicate(v, 1));
    /* tools */
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(j, "tools"), *t;
    if (present(tools) && !cJSON_IsArray(tools)) { snprintf(err, n, "'tools' must be an array"); goto fail; }
    if (cJSON_GetArraySize(tools)) {
        cJSON *a = cJSON_AddArrayToObject(chat, "tools");
        cJSON_ArrayForEach(t, tools) {
            const char *type = str_of(t, "type"), *name = str_of(t, "name");
            if ((type && strcmp(type, "custom")) || !name) {
                snprintf(err, n, "tool '%s' is not supported (custom tools with a 'name' and an 'input_schema' only: this server runs no server tools)",
                         type ? type : name ? name : "(none)");
                goto fail;
            }
            cJSON *x = cJSON_CreateObject(), *f;
            cJSON_AddStringToObject(x, "type", "function");
            f = cJSON_AddObjectToObject(x, "function");
            cJSON_AddStringToObject(f, "name", name);
            if (str_of(t, "description")) cJSON_AddStringToObject(f, "description", str_of(t, "description"));
            const cJSON *sch = cJSON_GetObjectItemCaseSensitive(t, "input_schema");
            if (present(sch)) srv_add(f, "parameters", cJSON_Duplicate(sch, 1));
            srv_push(a, x);
        }
    }
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(j, "tool_choice");
    if (present(tc)) {
        const char *type = str_of(tc, "type");
        if (!type || (strcmp(type, "auto") && strcmp(type, "any") && strcmp(type, "tool") && strcmp(type, "none")) ||
            (!strcmp(type, "tool") && !str_of(tc, "name"))) {
            snprintf(err, n, "'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"none\"} or {\"type\": \"tool\", \"name\": ...}");
            goto fail;
        }
        if (!strcmp(type, "tool")) {
            cJSON *o = cJSON_AddObjectToObject(chat, "tool_choice"), *f;
            cJSON_AddStringToObject(o, "type", "function");
            f = cJSON_AddObjectToObject(o, "function");
            cJSON_AddStringToObject(f, "name", str_of(tc, "name"));
        } else if (cJSON_GetArraySize(tools) || !strcmp(type, "any")) {
            cJSON_AddStringToObject(chat, "tool_choice", !strcmp(type, "any") ? "required" : type);
        }
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(tc, "disable_parallel_tool_use"))) cJSON_AddFalseToObject(chat, "parallel_tool_calls");
    }
    const cJSON *th = cJSON_GetObjectItemCaseSensitive(j, "thinking");
    if (present(th) && (!cJSON_IsObject(th) || !str_of(th, "type"))) {
        snprintf(err, n, "'thinking' must be {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": \"disabled\"}");
        goto fail;
    }
    if (ms) {
        v = cJSON_GetObjectItemCaseSensitive(j, "stream");
        ms->stream = cJSON_IsTrue(v);
        if (ms->stream) cJSON_AddTrueToObject(cJSON_AddObjectToObject(chat, "stream_options"), "include_usage");
        if (!(ms->content = cJSON_CreateArray())) { st = FL_ERR_NOMEM; goto fail; }
        srv_api_id(s, "msg", ms, ms->id, sizeof ms->id);
        *out = ms;
    }
    *chat_out = chat;
    return FL_OK;
fail:
    if (st == FL_ERR_NOMEM) snprintf(err, n, "the server's buffers (--net-mem) are full; retry later");
    cJSON_Delete(chat);
    srv_msgs_free(ms);
    return st;
}

/* ---- the output ---- */

static void end_out(srv_msgs *ms, srv_buf *out);

static void emit(srv_msgs *ms, srv_buf *out, cJSON *o) {
    if (!o || !srv_event_whole()) {
        cJSON_Delete(o);
        ms->failed = FL_ERR_NOMEM;
        return;
    }
    if (ms->stream && srv_event_append(out, o)) ms->failed = FL_ERR_NOMEM;
    cJSON_Delete(o);
}

static cJSON *usage_of(const srv_msgs *ms) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "input_tokens", ms->in_tokens - ms->cached);
    cJSON_AddNumberToObject(u, "cache_creation_input_tokens", 0);
    cJSON_AddNumberToObject(u, "cache_read_input_tokens", ms->cached);
    cJSON_AddNumberToObject(u, "output_tokens", ms->out_tokens);
    return u;
}

static const char *stop_reason(const srv_msgs *ms) {
    if (!strcmp(ms->finish, "length")) return "max_tokens";
    if (!strcmp(ms->finish, "tool_calls")) return "tool_use";
    return ms->has_stop_seq ? "stop_sequence" : "end_turn";
}

/* the message object: the blocks so far, the stop reason once finished */
static cJSON *message_of(const srv_msgs *ms, bool fin) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", ms->id);
    cJSON_AddStringToObject(o, "type", "message");
    cJSON_AddStringToObject(o, "role", "assistant");
    cJSON_AddStringToObject(o, "model", ms->model);
    srv_add(o, "content", fin ? cJSON_Duplicate(ms->content, 1) : cJSON_CreateArray());
    if (fin) cJSON_AddStringToObject(o, "stop_reason", stop_reason(ms));
    else cJSON_AddNullToObject(o, "stop_reason");
    if (fin && ms->has_stop_seq) cJSON_AddStringToObject(o, "stop_sequence", ms->stop_seq);
    else cJSON_AddNullToObject(o, "stop_sequence");
    srv_add(o, "usage", usage_of(ms));
    return o;
}

/* the open block, empty (as started) or whole */
static cJSON *block(const srv_msgs *ms, bool whole) {
    cJSON *b = cJSON_CreateObject();
    const char *txt = whole && ms->text.p ? ms->text.p : "";
    switch (ms->open) {
    case BL_THINKING:
        cJSON_AddStringToObject(b, "type", "thinking");
        cJSON_AddStringToObject(b, "thinking", txt);
        cJSON_AddStringToObject(b, "signature", "");
        break;
    case BL_TEXT:
        cJSON_AddStringToObject(b, "type", "text");
        cJSON_AddStringToObject(b, "text", txt);
        break;
    case BL_TOOL: {
        cJSON_AddStringToObject(b, "type", "tool_use");
        cJSON_AddStringToObject(b, "id", ms->call_id);
        cJSON_AddStringToObject(b, "name", ms->call_name);
        cJSON *in = whole ? cJSON_Parse(txt) : NULL; /* (the arguments: a JSON object, as the calls' grammar makes them) */
        if (!cJSON_IsObject(in)) {
            cJSON_Delete(in);
            in = cJSON_CreateObject();
        }
        srv_add(b, "input", in);
        break;
    }
    }
    return b;
}

static void close_block(srv_msgs *ms, srv_buf *out) {
    if (ms->open == BL_NONE) return;
    cJSON *o = srv_event("content_block_stop");
    cJSON_AddNumberToObject(o, "index", ms->n_blocks - 1);
    emit(ms, out, o);
    cJSON *b = block(ms, true);
    if (!b || !srv_push(ms->content, b)) ms->failed = FL_ERR_NOMEM;
    ms->open = BL_NONE;
    srv_buf_free(&ms->text);
}

static void open_block(srv_msgs *ms, srv_buf *out, int kind) {
    close_block(ms, out);
    ms->open = kind;
    ms->n_blocks++;
    cJSON *o = srv_event("content_block_start");
    cJSON_AddNumberToObject(o, "index", ms->n_blocks - 1);
    srv_add(o, "content_block", block(ms, false));
    emit(ms, out, o);
}

static void add_text(srv_msgs *ms, srv_buf *out, int kind, const char *t) {
    if (ms->open != kind) open_block(ms, out, kind);
    if (srv_buf_append(&ms->text, t, strlen(t))) ms->failed = FL_ERR_NOMEM;
    cJSON *o = srv_event("content_block_delta"), *d;
    cJSON_AddNumberToObject(o, "index", ms->n_blocks - 1);
    d = cJSON_AddObjectToObject(o, "delta");
    cJSON_AddStringToObject(d, "type", kind == BL_TEXT ? "text_delta" : kind == BL_THINKING ? "thinking_delta" : "input_json_delta");
    cJSON_AddStringToObject(d, kind == BL_TEXT ? "text" : kind == BL_THINKING ? "thinking" : "partial_json", t);
    emit(ms, out, o);
}

static void chunk_in(srv_msgs *ms, const cJSON *chunk, int32_t n_prompt, int32_t n_cached, srv_buf *out);

void srv_msgs_chunk(srv_msgs *ms, const cJSON *chunk, int32_t n_prompt, int32_t n_cached, srv_buf *out) {
    const size_t f0 = fl_mem_thread_failures();
    chunk_in(ms, chunk, n_prompt, n_cached, out);
    if (fl_mem_thread_failures() != f0) ms->failed = FL_ERR_NOMEM; /* (a part may be missing: the reply fails) */
}

static void chunk_in(srv_msgs *ms, const cJSON *chunk, int32_t n_prompt, int32_t n_cached, srv_buf *out) {
    ms->in_tokens = n_prompt;
    ms->cached = n_cached;
    if (!ms->started) {
        ms->started = true;
        snprintf(ms->model, sizeof ms->model, "%s", str_of(chunk, "model") ? str_of(chunk, "model") : "");
        cJSON *o = srv_event("message_start");
        srv_add(o, "message", message_of(ms, false));
        emit(ms, out, o);
    }
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(chunk, "usage"), *x = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
    if (cJSON_IsNumber(x)) ms->out_tokens = (int32_t)x->valuedouble;
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(chunk, "choices"), 0);
    if (!c) return;
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(c, "delta");
    if (!d) d = cJSON_GetObjectItemCaseSensitive(c, "message");
    const char *rc = str_of(d, "reasoning_content"), *tx = str_of(d, "content");
    if (rc && *rc) add_text(ms, out, BL_THINKING, rc);
    if (tx && *tx) add_text(ms, out, BL_TEXT, tx);
    int32_t k = 0;
    const cJSON *tc;
    cJSON_ArrayForEach(tc, cJSON_GetObjectItemCaseSensitive(d, "tool_calls")) {
        srv_call_piece_in p;
        if (srv_call_delta(tc, k++, &p) || ms->open != BL_TOOL || p.index != ms->call_index) {
            close_block(ms, out);
            ms->call_index = p.index;
            snprintf(ms->call_id, sizeof ms->call_id, "toolu_%s", p.id && !strncmp(p.id, "call_", 5) ? p.id + 5 : p.id ? p.id : "");
            snprintf(ms->call_name, sizeof ms->call_name, "%s", p.name ? p.name : "");
            open_block(ms, out, BL_TOOL);
        }
        if (p.args && *p.args) add_text(ms, out, BL_TOOL, p.args);
    }
    const char *fin = str_of(c, "finish_reason");
    if (fin) {
        snprintf(ms->finish, sizeof ms->finish, "%s", fin);
        const char *sr = str_of(c, "stop_reason"), *er = str_of(c, "error");
        ms->has_stop_seq = sr && !strcmp(fin, "stop");
        if (sr) snprintf(ms->stop_seq, sizeof ms->stop_seq, "%s", sr);
        if (er) snprintf(ms->error, sizeof ms->error, "%s", er);
        close_block(ms, out);
    }
}

void srv_msgs_fail(srv_msgs *ms) {
    if (!ms->failed) ms->failed = FL_ERR_NOMEM;
}

void srv_msgs_end(srv_msgs *ms, srv_buf *out) {
    const size_t f0 = fl_mem_thread_failures();
    close_block(ms, out);
    if (fl_mem_thread_failures() != f0) ms->failed = FL_ERR_NOMEM;
    const size_t f1 = fl_mem_thread_failures(), n0 = out->len;
    end_out(ms, out);
    if (fl_mem_thread_failures() != f1) { /* no memory for the end as made: a fixed error in its place */
        out->len = n0;
        if (out->p) out->p[n0] = 0;
        static const char MSG[] = "no memory for the reply in the server's buffers (--net-mem); retry later";
        if (ms->stream) srv_buf_printf(out, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"%s\"}}\n\n", MSG);
        else srv_buf_printf(out, "{\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"%s\"}}", MSG);
    }
}

static void end_out(srv_msgs *ms, srv_buf *out) {
    const bool failed = ms->failed || !strcmp(ms->finish, "error") || !strcmp(ms->finish, "abort");
    if (failed) { /* the answer went out as a 200: an error event (streamed) or body ends it */
        cJSON *o = srv_event("error"), *e;
        e = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(e, "type", "api_error");
        cJSON_AddStringToObject(e, "message", ms->failed ? "no memory for the reply in the server's buffers (--net-mem)"
                                              : ms->error[0] ? ms->error : "the request failed");
        if (ms->stream) emit(ms, out, o);
        else {
            srv_append_json(out, o, false);
            cJSON_Delete(o);
        }
    } else if (ms->stream) {
        cJSON *o = srv_event("message_delta"), *d;
        d = cJSON_AddObjectToObject(o, "delta");
        cJSON_AddStringToObject(d, "stop_reason", stop_reason(ms));
        if (ms->has_stop_seq) cJSON_AddStringToObject(d, "stop_sequence", ms->stop_seq);
        else cJSON_AddNullToObject(d, "stop_sequence");
        srv_add(o, "usage", usage_of(ms));
        emit(ms, out, o);
        emit(ms, out, srv_event("message_stop"));
    } else {
        cJSON *o = message_of(ms, true);
        if (!o || srv_append_json(out, o, false)) ms->failed = FL_ERR_NOMEM;
        cJSON_Delete(o);
    }
}
