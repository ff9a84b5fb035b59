/*
 * fuzz_dialects.c - libFuzzer target for the translations of OpenAI's Responses API and
 * Anthropic's Messages API onto chat completions (src/server/responses.c, messages.c,
 * dialect.c): the input is a selector byte, a request body, a NUL byte, then chat deltas (one
 * JSON object per line) as the chat machinery would stream them.
 *
 * Invariants checked on every input:
 *   - translating a body never fails but with FL_ERR_INVALID (a message set, status 400 or 404) or
 *     FL_ERR_NOMEM; a translated request is a chat request whose messages render in each
 *     template family or are refused with a message, and whose tools are read or refused;
 *   - whatever the deltas, the events streamed are SSE: an "event: NAME" line, then a data line
 *     whose JSON object's type is NAME; the Responses' sequence numbers count 0, 1, ...; every
 *     item or block opened is closed once, in order, and the stream ends with the API's last
 *     event (response.completed / incomplete / failed; message_stop or error);
 *   - the same deltas unstreamed give one JSON object, the response or message;
 *   - a stored response reads back as the object the request got, chains (previous_response_id)
 *     and deletes; the store stays under its limit.
 */
#include "server/server_int.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                                                                       \
    do {                                                                                                               \
        if (!(c)) __builtin_trap();                                                                                    \
    } while (0)

static const char *const TEMPLATES[] = {"<|im_start|>", "<|start_header_id|>", "[INST]", "<|user|>", "<｜User｜>", ""};

/* the chat request renders or is refused with a message */
static void check_chat(const cJSON *chat) {
    CHECK(cJSON_IsObject(chat));
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(chat, "messages");
    CHECK(cJSON_IsArray(msgs));
    for (size_t t = 0; t < sizeof TEMPLATES / sizeof *TEMPLATES; t++) {
        srv_tools td;
        memset(&td, 0, sizeof td);
        const cJSON *tools = NULL;
        char *schema = NULL, err[256] = "";
        bool gram = false;
        fl_status st = srv_tools_read(chat, t == 1, &td, &tools, &schema, &gram, err, sizeof err);
        CHECK(st == FL_OK || (st == FL_ERR_INVALID && err[0]) || st == FL_ERR_NOMEM);
        srv_buf out = {0};
        const char *e = NULL;
        st = srv_chat_render_ex(TEMPLATES[t], msgs, st == FL_OK ? tools : NULL, 0, &out, &e);
        CHECK(st == FL_OK || (st == FL_ERR_INVALID && e) || st == FL_ERR_NOMEM);
        srv_buf_free(&out);
        cJSON_free(schema);
    }
}

/* out holds SSE events: name lines matching their data's type; returns the last event's type
 * (static), checking the Responses' sequence numbers (resp) */
static const char *check_sse(const srv_buf *out, bool resp) {
    static char last[64];
    last[0] = 0;
    if (!out->len) return last;
    char *t = malloc(out->len + 1);
    memcpy(t, out->p, out->len + 1);
    int64_t seq = 0;
    char *save = NULL;
    for (char *ev = strtok_r(t, "\n", &save); ev; ev = strtok_r(NULL, "\n", &save)) {
        CHECK(!strncmp(ev, "event: ", 7));
        char *data = strtok_r(NULL, "\n", &save);
        CHECK(data && !strncmp(data, "data: ", 6));
        cJSON *o = cJSON_Parse(data + 6);
        CHECK(o);
        const char *type = srv_json_str(o, "type");
        CHECK(type && !strcmp(type, ev + 7));
        snprintf(last, sizeof last, "%s", type);
        if (resp) {
            const cJSON *sq = cJSON_GetObjectItemCaseSensitive(o, "sequence_number");
            CHECK(cJSON_IsNumber(sq) && sq->valuedouble == (double)seq++);
        }
        cJSON_Delete(o);
    }
    free(t);
    return last;
}

/* feed the deltas (lines of text) to a translator as chunks */
static cJSON *chunk_of(const char *line) {
    cJSON *d = cJSON_Parse(line);
    if (!cJSON_IsObject(d)) {
        cJSON_Delete(d);
        return NULL;
    }
    cJSON *o = cJSON_CreateObject(), *ch = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", "m");
    cJSON_AddItemToArray(ch, c);
    cJSON_AddNumberToObject(c, "index", 0);
    cJSON *fin = cJSON_DetachItemFromObjectCaseSensitive(d, "finish_reason");
    cJSON *u = cJSON_DetachItemFromObjectCaseSensitive(d, "usage");
    cJSON_AddItemToObject(c, "delta", d);
    cJSON_AddItemToObject(c, "finish_reason", fin ? fin : cJSON_CreateNull());
    if (u) cJSON_AddItemToObject(o, "usage", u);
    return o;
}

/* a and b the same JSON: cJSON_Compare, or else the same text printed (cJSON_Compare looks up
 * each key of a in b by its first occurrence, so an object with a key twice and two values, which
 * a request may carry and a response echo, differs from its own copy) */
static bool same_json(const cJSON *a, const cJSON *b) {
    if (cJSON_Compare(a, b, true)) return true;
    char *pa = cJSON_PrintUnformatted(a), *pb = cJSON_PrintUnformatted(b);
    const bool same = pa && pb && !strcmp(pa, pb);
    cJSON_free(pa);
    cJSON_free(pb);
    return same;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2 || size > 1 << 16) return 0;
    const uint8_t sel = data[0];
    const char *body = (const char *)data + 1;
    const size_t rest = size - 1, bn = strnlen(body, rest);
    char *deltas = malloc(rest - bn + 1);
    memcpy(deltas, body + (bn < rest ? bn + 1 : bn), rest - (bn < rest ? bn + 1 : bn));
    deltas[rest - (bn < rest ? bn + 1 : bn)] = 0;
    cJSON *j = cJSON_ParseWithLength(body, bn);
    static fl_server s; /* (the store persists across inputs, as a server's) */
    static bool init;
    if (!init) {
        pthread_mutex_init(&s.mu, NULL);
        s.p.responses_mem = 4096;
        s.p.max_tokens_limit = 4096;
        init = true;
    }
    char err[256] = "";
    cJSON *chat = NULL;
    if (sel & 2) { /* Anthropic's */
        srv_msgs *ms = NULL;
        fl_status st = srv_msgs_request(&s, j, (sel & 4) != 0, &chat, (sel & 4) ? NULL : &ms, err, sizeof err);
        CHECK(st == FL_OK || (st == FL_ERR_INVALID && err[0]) || st == FL_ERR_NOMEM);
        if (st == FL_OK) {
            check_chat(chat);
            if (ms) {
                srv_buf out = {0};
                char *save = NULL;
                for (char *l = strtok_r(deltas, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
                    cJSON *o = chunk_of(l);
                    if (o) srv_msgs_chunk(ms, o, 7, 3, &out);
                    cJSON_Delete(o);
                }
                srv_msgs_end(ms, &out);
                if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "stream"))) {
                    const char *last = check_sse(&out, false);
                    CHECK(!strcmp(last, "message_stop") || !strcmp(last, "error"));
                } else {
                    cJSON *o = cJSON_ParseWithLength(out.p ? out.p : "", out.len);
                    CHECK(o);
                    const char *type = srv_json_str(o, "type");
                    CHECK(type && (!strcmp(type, "message") || !strcmp(type, "error")));
                    cJSON_Delete(o);
                }
                srv_buf_free(&out);
                srv_msgs_free(ms);
            }
        }
    } else { /* OpenAI's Responses */
        srv_resp *rs = NULL;
        int http = 0;
        fl_status st = srv_resp_request(&s, j, &chat, &rs, &http, err, sizeof err);
        CHECK(st == FL_OK || (st == FL_ERR_INVALID && err[0] && (http == 400 || http == 404)) || st == FL_ERR_NOMEM);
        if (st == FL_OK) {
            check_chat(chat);
            srv_buf out = {0};
            char *save = NULL;
            const bool streamed = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "stream"));
            for (char *l = strtok_r(deltas, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
                cJSON *o = chunk_of(l);
                if (o) srv_resp_chunk(rs, o, &out);
                cJSON_Delete(o);
            }
            srv_resp_end(&s, rs, &out);
            cJSON *resp = NULL;
            if (streamed) {
                const char *last = check_sse(&out, true);
                CHECK(!strcmp(last, "response.completed") || !strcmp(last, "response.incomplete") || !strcmp(last, "response.failed"));
            } else {
                resp = cJSON_ParseWithLength(out.p ? out.p : "", out.len);
                CHECK(resp && !strcmp(srv_json_str(resp, "object"), "response"));
            }
            CHECK(s.resp_bytes <= 4096);
            /* what was kept reads back as the object given, and goes */
            const char *id = resp ? srv_json_str(resp, "id") : NULL;
            srv_buf got = {0};
            srv_resp_page pg = {.limit = 3, .asc = (sel & 8) != 0};
            if (id && srv_resp_get(&s, id, SRV_RESP_GET, &pg, &got) == FL_OK) {
                cJSON *g = cJSON_ParseWithLength(got.p, got.len);
                CHECK(g && same_json(g, resp));
                cJSON_Delete(g);
                got.len = 0;
                CHECK(srv_resp_get(&s, id, SRV_RESP_ITEMS, &pg, &got) == FL_OK);
                if (sel & 16) {
                    got.len = 0;
                    CHECK(srv_resp_get(&s, id, SRV_RESP_DELETE, &pg, &got) == FL_OK);
                    CHECK(srv_resp_get(&s, id, SRV_RESP_GET, &pg, &got) == FL_ERR_INVALID);
                }
            }
            srv_buf_free(&got);
            cJSON_Delete(resp);
            srv_buf_free(&out);
            srv_resp_free(rs);
        }
    }
    cJSON_Delete(chat);
    cJSON_Delete(j);
    free(deltas);
    return 0;
}
