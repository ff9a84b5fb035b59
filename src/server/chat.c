/* Chat formatting: recognise the common template families from the GGUF's
 * tokenizer.chat_template text and render messages the way that family expects; anything else
 * gets a plain "User:/Assistant:" transcript.  The text is tokenized with special tokens parsed. */
#include "server/server_int.h"

#include <cjson/cJSON.h>
#include <string.h>

typedef enum { TMPL_PLAIN, TMPL_LLAMA2, TMPL_LLAMA3, TMPL_CHATML, TMPL_PHI3 } tmpl_kind;

static tmpl_kind detect(const char *t) {
    if (!t) return TMPL_PLAIN;
    if (strstr(t, "<|start_header_id|>")) return TMPL_LLAMA3;
    if (strstr(t, "<|im_start|>")) return TMPL_CHATML;
    if (strstr(t, "<|user|>") && strstr(t, "<|end|>")) return TMPL_PHI3;
    if (strstr(t, "[INST]")) return TMPL_LLAMA2;
    return TMPL_PLAIN;
}

/* Content may be a string or an array of {type:"text", text:"..."} parts. */
static fl_status content_text(const cJSON *c, srv_buf *tmp, const char **err) {
    tmp->len = 0;
    if (cJSON_IsString(c)) return srv_buf_append(tmp, c->valuestring, strlen(c->valuestring));
    if (cJSON_IsNull(c)) return srv_buf_append(tmp, "", 0);
    if (cJSON_IsArray(c)) {
        const cJSON *part;
        cJSON_ArrayForEach(part, c) {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
            const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text)) {
                *err = "only text content parts are supported";
                return FL_ERR_INVALID;
            }
            if (srv_buf_append(tmp, text->valuestring, strlen(text->valuestring))) return FL_ERR_NOMEM;
        }
        return FL_OK;
    }
    *err = "'content' must be a string or an array of text parts";
    return FL_ERR_INVALID;
}

fl_status srv_chat_render(const char *tmpl, const cJSON *messages, srv_buf *out, const char **err) {
    if (!cJSON_IsArray(messages) || cJSON_GetArraySize(messages) == 0) {
        *err = "'messages' must be a non-empty array";
        return FL_ERR_INVALID;
    }
    tmpl_kind kind = detect(tmpl);
    srv_buf c = {0}, sys = {0};
    fl_status st = FL_OK;
    bool first_user = true;
    const cJSON *m;
    cJSON_ArrayForEach(m, messages) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
            *err = "each message needs a string 'role'";
            st = FL_ERR_INVALID;
            goto done;
        }
        const char *r = role->valuestring;
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "developer")) {
            *err = "message role must be system, developer, user or assistant";
            st = FL_ERR_INVALID;
            goto done;
        }
        if (!strcmp(r, "developer")) r = "system";
        if ((st = content_text(cJSON_GetObjectItemCaseSensitive(m, "content"), &c, err))) goto done;
        const char *txt = c.p ? c.p : "";
        switch (kind) {
        case TMPL_LLAMA3:
            st = srv_buf_printf(out, "<|start_header_id|>%s<|end_header_id|>\n\n%s<|eot_id|>", r, txt);
            break;
        case TMPL_CHATML: st = srv_buf_printf(out, "<|im_start|>%s\n%s<|im_end|>\n", r, txt); break;
        case TMPL_PHI3: st = srv_buf_printf(out, "<|%s|>\n%s<|end|>\n", r, txt); break;
        case TMPL_LLAMA2:
            if (!strcmp(r, "system")) {
                sys.len = 0;
                st = srv_buf_append(&sys, txt, strlen(txt));
            } else if (!strcmp(r, "user")) {
                if (!first_user) st = srv_buf_append(out, "<s>", 3);
                if (!st && first_user && sys.len) st = srv_buf_printf(out, "[INST] <<SYS>>\n%s\n<</SYS>>\n\n%s [/INST]", sys.p, txt);
                else if (!st) st = srv_buf_printf(out, "[INST] %s [/INST]", txt);
                first_user = false;
            } else {
                st = srv_buf_printf(out, " %s </s>", txt);
            }
            break;
        case TMPL_PLAIN:
            if (!strcmp(r, "system")) st = srv_buf_printf(out, "%s\n\n", txt);
            else st = srv_buf_printf(out, "%s: %s\n", !strcmp(r, "user") ? "User" : "Assistant", txt);
            break;
        }
        if (st) goto done;
    }
    /* generation prompt */
    switch (kind) {
    case TMPL_LLAMA3: st = srv_buf_append(out, "<|start_header_id|>assistant<|end_header_id|>\n\n", 47); break;
    case TMPL_CHATML: st = srv_buf_append(out, "<|im_start|>assistant\n", 22); break;
    case TMPL_PHI3: st = srv_buf_append(out, "<|assistant|>\n", 14); break;
    case TMPL_LLAMA2: break;
    case TMPL_PLAIN: st = srv_buf_append(out, "Assistant:", 10); break;
    }
done:
    srv_buf_free(&c);
    srv_buf_free(&sys);
    return st;
}
