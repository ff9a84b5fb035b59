/* What the translations of other APIs onto chat completions share (responses.c: OpenAI's
 * Responses API, messages.c: Anthropic's Messages API): ids, typed SSE events, and reading the
 * chat deltas' tool calls. */
#include "server/server_int.h"
#include "core/alloc.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

const char *srv_json_str(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

bool srv_json_present(const cJSON *v) { return v && !cJSON_IsNull(v); }

void srv_api_id(fl_server *s, const char *prefix, const void *salt, char *buf, size_t cap) {
    pthread_mutex_lock(&s->mu);
    const int64_t serial = ++s->next_local_id;
    pthread_mutex_unlock(&s->mu);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    const uint64_t seed[3] = {(uint64_t)serial, (uint64_t)ts.tv_sec, (uint64_t)ts.tv_nsec ^ (uint64_t)(uintptr_t)salt};
    const XXH128_hash_t h = XXH3_128bits(seed, sizeof seed);
    snprintf(buf, cap, "%s_%016llx%016llx", prefix, (unsigned long long)h.high64, (unsigned long long)h.low64);
}

static _Thread_local size_t event_f0; /* this thread's failed allocations when its last event began */

bool srv_event_whole(void) { return fl_mem_thread_failures() == event_f0; }

cJSON *srv_event(const char *type) {
    event_f0 = fl_mem_thread_failures();
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    return o;
}

fl_status srv_event_append(srv_buf *out, cJSON *o) {
    const char *t = srv_json_str(o, "type");
    srv_buf ev = {0}; /* the whole event, or nothing (a stream cut inside one would not parse) */
    fl_status st = srv_buf_printf(&ev, "event: %s\n", t ? t : "message");
    if (!st) st = srv_append_json(&ev, o, true);
    if (!st) st = srv_buf_append(out, ev.p, ev.len);
    srv_buf_free(&ev);
    return st;
}

bool srv_add(cJSON *parent, const char *key, cJSON *child) {
    if (!child) return false;
    if (parent && cJSON_AddItemToObject(parent, key, child)) return true;
    cJSON_Delete(child);
    return false;
}

bool srv_push(cJSON *array, cJSON *child) {
    if (!child) return false;
    if (array && cJSON_AddItemToArray(array, child)) return true;
    cJSON_Delete(child);
    return false;
}

bool srv_call_delta(const cJSON *tc, int32_t k, srv_call_piece_in *p) {
    const cJSON *ix = cJSON_GetObjectItemCaseSensitive(tc, "index"), *f = cJSON_GetObjectItemCaseSensitive(tc, "function");
    /* the delta's index where it is one (an integer in int32_t's range: a cast of anything else
     * is undefined; fuzz_dialects sent 8.9e41), else the entry's place k */
    const double v = cJSON_IsNumber(ix) ? ix->valuedouble : -1;
    p->index = v >= 0 && v <= INT32_MAX && v == floor(v) ? (int32_t)v : k;
    p->id = srv_json_str(tc, "id");
    p->name = srv_json_str(f, "name");
    p->args = srv_json_str(f, "arguments");
    return p->id != NULL; /* (a call's first piece carries its id) */
}
