/* Chat formatting: recognise the common template families from the GGUF's
 * tokenizer.chat_template text and render messages the way that family expects; anything else
 * gets a plain "User:/Assistant:" transcript.  The text is tokenized with special tokens parsed. */
#include "server/server_int.h"

#include <cjson/cJSON.h>
#include <string.h>

typedef enum { TMPL_PLAIN, TMPL_LLAMA2, TMPL_LLAMA3, TMPL_CHATML, TMPL_PHI3, TMPL_DEEPSEEK } tmpl_kind;

/* DeepSeek-R1's turn markers (fullwidth bars, U+2581 for the space) */
#define DS_USER "<\xEF\xBD\x9CUser\xEF\xBD\x9C>"
#define DS_ASSISTANT "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>"
#define DS_EOS "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"

static tmpl_kind detect(const char *t) {
    if (!t) return TMPL_PLAIN;
    if (strstr(t, "<|start_header_id|>")) return TMPL_LLAMA3;
    if (strstr(t, DS_USER) && strstr(t, DS_ASSISTANT)) return TMPL_DEEPSEEK;
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

bool srv_chat_json_tools(const char *tmpl) { return detect(tmpl) == TMPL_LLAMA3; }

bool srv_chat_think_open(const char *tmpl) { return detect(tmpl) == TMPL_DEEPSEEK; }

bool srv_chat_plain(const char *tmpl) { return detect(tmpl) == TMPL_PLAIN; }

/* A family's name as llama.cpp's --chat-template takes it, and the markers that detect() reads */
static const struct { const char *name, *text; } NAMED[] = {
    {"chatml", "<|im_start|>"}, {"llama2", "[INST]"}, {"llama3", "<|start_header_id|>"}, {"phi3", "<|user|><|end|>"},
    {"deepseek3", DS_USER DS_ASSISTANT}, {"deepseek-r1", DS_USER DS_ASSISTANT}, {"plain", "plain"},
};

const char *srv_chat_template_resolve(const char *arg, bool *known) {
    for (size_t i = 0; i < sizeof NAMED / sizeof *NAMED; i++)
        if (!strcmp(arg, NAMED[i].name)) {
            *known = true;
            return NAMED[i].text;
        }
    *known = detect(arg) != TMPL_PLAIN;
    return strpbrk(arg, "{<[") ? arg : NULL; /* template text (Jinja, or any with a family's markers) */
}

/* The tools as the system turn shows them: one JSON object per line, and how to call one in the
 * family's format (tools.c reads the calls back). */
static fl_status tools_preamble(tmpl_kind kind, const cJSON *tools, srv_buf *out) {
    fl_status st = kind == TMPL_LLAMA3
        ? srv_buf_printf(out, "You can call the functions below. To call one, answer with only a JSON object "
                              "{\"name\": the function's name, \"parameters\": an object of its arguments}.\n\n")
        : srv_buf_printf(out, "# Tools\n\nYou can call the functions whose signatures are inside <tools></tools>, one per line:\n<tools>\n");
    const cJSON *x;
    cJSON_ArrayForEach(x, tools) {
        char *t = cJSON_PrintUnformatted(x);
        if (!t) return FL_ERR_NOMEM;
        if (!st) st = srv_buf_printf(out, "%s\n", t);
        cJSON_free(t);
    }
    if (!st && kind != TMPL_LLAMA3)
        st = srv_buf_printf(out, "</tools>\n\nTo call one, write a JSON object with its name and arguments inside "
                                 "<tool_call></tool_call> tags:\n<tool_call>\n{\"name\": <function name>, \"arguments\": <arguments object>}\n</tool_call>");
    return st;
}

/* An assistant message's tool_calls after its content, as the family writes calls. */
static fl_status tool_calls_text(tmpl_kind kind, const cJSON *calls, srv_buf *c, const char **err) {
    if (!calls || cJSON_IsNull(calls)) return FL_OK;
    if (!cJSON_IsArray(calls)) {
        *err = "'tool_calls' must be an array";
        return FL_ERR_INVALID;
    }
    const cJSON *x;
    cJSON_ArrayForEach(x, calls) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(x, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name"), *a = cJSON_GetObjectItemCaseSensitive(f, "arguments");
        if (!cJSON_IsString(nm) || (a && !cJSON_IsString(a) && !cJSON_IsObject(a) && !cJSON_IsNull(a))) {
            *err = "each tool call needs 'function': {\"name\": ..., \"arguments\": JSON text}";
            return FL_ERR_INVALID;
        }
        char *printed = cJSON_IsObject(a) ? cJSON_PrintUnformatted(a) : NULL;
        const char *args = cJSON_IsString(a) ? a->valuestring : printed ? printed : "{}";
        fl_status st = FL_OK;
        if (c->len) st = srv_buf_append(c, "\n", 1);
        if (!st) st = kind == TMPL_LLAMA3 ? srv_buf_printf(c, "{\"name\": \"%s\", \"parameters\": %s}", nm->valuestring, args)
                                          : srv_buf_printf(c, "<tool_call>\n{\"name\": \"%s\", \"arguments\": %s}\n</tool_call>", nm->valuestring, args);
        cJSON_free(printed);
        if (st) return st;
    }
    return FL_OK;
}

/* One turn of role r with text txt in the family's format (Llama 2 keeps the system text in
 * sys for the first user turn). */
static fl_status emit_turn(tmpl_kind kind, const char *r, const char *txt, srv_buf *out, srv_buf *sys, bool *first_user) {
    fl_status st = FL_OK;
    switch (kind) {
    case TMPL_LLAMA3:
        st = srv_buf_printf(out, "<|start_header_id|>%s<|end_header_id|>\n\n%s<|eot_id|>", r, txt);
        break;
    case TMPL_CHATML: st = srv_buf_printf(out, "<|im_start|>%s\n%s<|im_end|>\n", r, txt); break;
    case TMPL_PHI3: st = srv_buf_printf(out, "<|%s|>\n%s<|end|>\n", r, txt); break;
    case TMPL_LLAMA2:
        if (!strcmp(r, "system")) {
            sys->len = 0;
            st = srv_buf_append(sys, txt, strlen(txt));
        } else if (!strcmp(r, "user")) {
            if (!*first_user) st = srv_buf_append(out, "<s>", 3);
            if (!st && *first_user && sys->len) st = srv_buf_printf(out, "[INST] <<SYS>>\n%s\n<</SYS>>\n\n%s [/INST]", sys->p, txt);
            else if (!st) st = srv_buf_printf(out, "[INST] %s [/INST]", txt);
            *first_user = false;
        } else {
            st = srv_buf_printf(out, " %s </s>", txt);
        }
        break;
    case TMPL_DEEPSEEK: /* the system text leads, bare; an assistant turn ends with the end of sentence */
        if (!strcmp(r, "system")) st = srv_buf_printf(out, "%s%s", out->len ? "\n\n" : "", txt);
        else if (!strcmp(r, "user")) st = srv_buf_printf(out, DS_USER "%s", txt);
        else st = srv_buf_printf(out, DS_ASSISTANT "%s" DS_EOS, txt);
        break;
    case TMPL_PLAIN:
        if (!strcmp(r, "system")) st = srv_buf_printf(out, "%s\n\n", txt);
        else st = srv_buf_printf(out, "%s: %s\n", !strcmp(r, "user") ? "User" : "Assistant", txt);
        break;
    }
    return st;
}

/* The final assistant message, open: its turn's start and its text, no end (continue_final_message). */
static fl_status emit_open(tmpl_kind kind, const char *txt, srv_buf *out) {
    switch (kind) {
    case TMPL_LLAMA3: return srv_buf_printf(out, "<|start_header_id|>assistant<|end_header_id|>\n\n%s", txt);
    case TMPL_CHATML: return srv_buf_printf(out, "<|im_start|>assistant\n%s", txt);
    case TMPL_PHI3: return srv_buf_printf(out, "<|assistant|>\n%s", txt);
    case TMPL_LLAMA2: return srv_buf_printf(out, " %s", txt);
    case TMPL_DEEPSEEK: return srv_buf_printf(out, DS_ASSISTANT "%s", txt);
    case TMPL_PLAIN: return srv_buf_printf(out, "Assistant: %s", txt);
    }
    return FL_OK;
}

fl_status srv_chat_render(const char *tmpl, const cJSON *messages, const cJSON *tools, srv_buf *out, const char **err) {
    return srv_chat_render_ex(tmpl, messages, tools, 0, out, err);
}

fl_status srv_chat_render_ex(const char *tmpl, const cJSON *messages, const cJSON *tools, unsigned flags, srv_buf *out, const char **err) {
    if (!cJSON_IsArray(messages) || cJSON_GetArraySize(messages) == 0) {
        *err = "'messages' must be a non-empty array";
        return FL_ERR_INVALID;
    }
    const bool cont = flags & SRV_CHAT_CONTINUE;
    if (cont && !(flags & SRV_CHAT_NO_GEN_PROMPT)) {
        *err = "'continue_final_message' and 'add_generation_prompt' cannot both be true";
        return FL_ERR_INVALID;
    }
    if (cont) {
        const cJSON *rl = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(messages, cJSON_GetArraySize(messages) - 1), "role");
        if (!cJSON_IsString(rl) || strcmp(rl->valuestring, "assistant")) {
            *err = "'continue_final_message': the last message must be the assistant's";
            return FL_ERR_INVALID;
        }
    }
    tmpl_kind kind = detect(tmpl);
    srv_buf c = {.misc = out->misc}, sys = {.misc = out->misc}, pre = {.misc = out->misc}; /* (charged as out is) */
    fl_status st = FL_OK;
    bool first_user = true;
    /* with tools: the first message's system text gets their preamble, or a system turn of its
     * own leads */
    const cJSON *m0 = messages->child, *r0 = cJSON_GetObjectItemCaseSensitive(m0, "role");
    const bool sys_first = cJSON_IsString(r0) && (!strcmp(r0->valuestring, "system") || !strcmp(r0->valuestring, "developer"));
    if (tools && (st = tools_preamble(kind, tools, &pre))) goto done;
    if (tools && !sys_first && (st = emit_turn(kind, "system", pre.p, out, &sys, &first_user))) goto done;
    const cJSON *m;
    cJSON_ArrayForEach(m, messages) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
            *err = "each message needs a string 'role'";
            st = FL_ERR_INVALID;
            goto done;
        }
        const char *r = role->valuestring;
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "developer") && strcmp(r, "tool")) {
            *err = "message role must be system, developer, user, assistant or tool";
            st = FL_ERR_INVALID;
            goto done;
        }
        if (!strcmp(r, "developer")) r = "system";
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!content && !strcmp(r, "assistant") && cJSON_GetObjectItemCaseSensitive(m, "tool_calls")) { /* calls may come without content */
            c.len = 0;
            if (c.p) c.p[0] = 0;
        } else if ((st = content_text(content, &c, err))) goto done;
        const bool open = cont && !m->next; /* the message the output continues */
        if (kind == TMPL_DEEPSEEK && !strcmp(r, "assistant") && c.p && !open) { /* an earlier answer without its thinking, as R1's template */
            const char *e = strstr(c.p, "</think>");
            if (e) {
                e += 8;
                while (*e == '\n' || *e == ' ') e++;
                memmove(c.p, e, strlen(e) + 1);
                c.len = strlen(c.p);
            }
        }
        if (!strcmp(r, "assistant") && (st = tool_calls_text(kind, cJSON_GetObjectItemCaseSensitive(m, "tool_calls"), &c, err))) goto done;
        if (m == messages->child && sys_first && pre.len) {
            if ((st = srv_buf_printf(&c, "%s%s", c.len ? "\n\n" : "", pre.p))) goto done;
        }
        if (!strcmp(r, "tool")) { /* a call's result: Llama 3's ipython turn; a tagged user turn elsewhere */
            srv_buf t = {.misc = out->misc};
            st = kind == TMPL_LLAMA3 ? srv_buf_append(&t, c.p ? c.p : "", c.len)
                                     : srv_buf_printf(&t, "<tool_response>\n%s\n</tool_response>", c.p ? c.p : "");
            if (!st) {
                c.len = 0;
                st = srv_buf_append(&c, t.p ? t.p : "", t.len);
            }
            srv_buf_free(&t);
            if (st) goto done;
            r = kind == TMPL_LLAMA3 ? "ipython" : "user";
        }
        if ((st = open ? emit_open(kind, c.p ? c.p : "", out) : emit_turn(kind, r, c.p ? c.p : "", out, &sys, &first_user))) goto done;
    }
    /* generation prompt */
    if (flags & SRV_CHAT_NO_GEN_PROMPT) goto done;
    switch (kind) {
    case TMPL_LLAMA3: st = srv_buf_append(out, "<|start_header_id|>assistant<|end_header_id|>\n\n", 47); break;
    case TMPL_CHATML: st = srv_buf_append(out, "<|im_start|>assistant\n", 22); break;
    case TMPL_PHI3: st = srv_buf_append(out, "<|assistant|>\n", 14); break;
    case TMPL_LLAMA2: break;
    case TMPL_DEEPSEEK: st = srv_buf_append(out, DS_ASSISTANT "<think>\n", sizeof DS_ASSISTANT - 1 + 8); break; /* (R1 thinks first) */
    case TMPL_PLAIN: st = srv_buf_append(out, "Assistant:", 10); break;
    }
done:
    srv_buf_free(&c);
    srv_buf_free(&sys);
    srv_buf_free(&pre);
    return st;
}
