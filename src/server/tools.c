/* Tool calling on /v1/chat/completions (OpenAI's tools / tool_choice / parallel_tool_calls).
 *
 * The tools are shown to the model in the system turn (chat.c, srv_chat_tools_preamble) in the
 * model family's format: Llama 3 calls a function with a bare {"name", "parameters"} object,
 * the others (ChatML / Hermes, and the families without a tool format of their own) with
 * {"name", "arguments"} inside <tool_call></tool_call> tags.
 *
 * tool_choice decides how the output is read and what constrains it:
 *   - "none": the output is content, not read for calls (the tools are still shown);
 *   - "auto" (the default with tools): the output is read for calls in the family's format
 *     (and, from any family, an output that is a JSON array of calls, as Mistral's after
 *     [TOOL_CALLS]); text outside them is the message's content.  Unless the request gives its
 *     own constraint, a lazy grammar holds a call to the tools' schemas once one starts
 *     (srv_tools_lazy);
 *   - {"type": "function", "function": {"name": N}}: the output is constrained to N's
 *     parameters schema and is that call's arguments;
 *   - "required": the output is constrained to a JSON array of one or more
 *     {"name", "parameters"} objects (at most one with parallel_tool_calls false).  With one
 *     tool, by the JSON Schema compiler (json_schema.h) with the tool's parameters schema;
 *     with several, by a GBNF grammar built from their schemas (required_grammar): the schema
 *     compiler resolves a union by the first byte of a value, and every call is an object.
 * A call's arguments are handed out as JSON text, as OpenAI's clients expect. */
#include "server/server_int.h"
#include "core/alloc.h"
#include "core/utf8.h"
#include "engine/triggers.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

static const char TAG_OPEN[] = "<tool_call>", TAG_CLOSE[] = "</tool_call>";
static const char MISTRAL_CALLS[] = "[TOOL_CALLS]"; /* Mistral's calls: this, then a JSON array of them */

/* OpenAI's function names: 1-64 of [a-zA-Z0-9_-] */
static bool name_ok(const char *n) {
    size_t k = 0;
    for (; n[k]; k++) {
        const char c = n[k];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) return false;
    }
    return k >= 1 && k <= 64;
}

static const cJSON *tool_fn(const cJSON *tool) { return cJSON_GetObjectItemCaseSensitive(tool, "function"); }

static const char *tool_name(const cJSON *tool) { return cJSON_GetObjectItemCaseSensitive(tool_fn(tool), "name")->valuestring; }

/* A JSON Schema as GBNF rules, for tool_choice "required" (a union of the tools' calls, which
 * the schema compiler cannot resolve): objects with their properties in the declared order (the
 * required ones, then each optional one), strings, integers, numbers, booleans, null, arrays of
 * items, enum / const, anyOf / oneOf (up to 64 alternatives) and lists of types; what it does not take (string
 * patterns, lengths, bounds, $ref) widens to any value of the type, or any JSON value. */
typedef struct gram {
    srv_buf b;
    int n_rules;
    fl_status st;
} gram;

static const char GRAM_BASE[] =
    "ws ::= \" \"?\n"
    "jvalue ::= jobject | jarray | jstring | jnumber | \"true\" | \"false\" | \"null\"\n"
    "jobject ::= \"{\" ws ( jstring ws \":\" ws jvalue ws ( \",\" ws jstring ws \":\" ws jvalue ws )* )? \"}\"\n"
    "jarray ::= \"[\" ws ( jvalue ws ( \",\" ws jvalue ws )* )? \"]\"\n"
    "jstring ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} ) )* \"\\\"\"\n"
    "jnumber ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?\n"
    "jinteger ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} )\n";

/* s as a GBNF literal */
static void gram_lit(gram *g, const char *s) {
    if (!g->st) g->st = srv_buf_append(&g->b, "\"", 1);
    for (; *s && !g->st; s++) {
        const unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') g->st = srv_buf_printf(&g->b, "\\%c", c);
        else if (c < 0x20) g->st = srv_buf_printf(&g->b, "\\x%02x", c);
        else g->st = srv_buf_append(&g->b, s, 1);
    }
    if (!g->st) g->st = srv_buf_append(&g->b, "\"", 1);
}

/* a JSON value printed as a literal */
static void gram_json_lit(gram *g, const cJSON *v) {
    char *p = cJSON_PrintUnformatted(v);
    if (!p) g->st = FL_ERR_NOMEM;
    else gram_lit(g, p);
    cJSON_free(p);
}

static int gram_schema(gram *g, const cJSON *sch, int depth);

/* the alternatives of a list of schemas as a new rule */
static int gram_alts(gram *g, const cJSON *list, int depth) {
    int ids[SRV_MAX_TOOLS], n = 0;
    const cJSON *x;
    const bool many = cJSON_GetArraySize(list) > SRV_MAX_TOOLS; /* (more: any JSON value) */
    if (!many) cJSON_ArrayForEach(x, list) ids[n++] = gram_schema(g, x, depth + 1);
    const int id = ++g->n_rules;
    if (many && !g->st) g->st = srv_buf_printf(&g->b, "r%d ::= jvalue\n", id);
    if (many) return id;
    if (!g->st) g->st = srv_buf_printf(&g->b, "r%d ::=", id);
    for (int k = 0; k < n && !g->st; k++) g->st = srv_buf_printf(&g->b, "%s r%d", k ? " |" : "", ids[k]);
    if (!g->st) g->st = srv_buf_append(&g->b, "\n", 1);
    return id;
}

/* schema sch as rule rN; N returned */
static int gram_schema(gram *g, const cJSON *sch, int depth) {
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(sch, "type"), *en = cJSON_GetObjectItemCaseSensitive(sch, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(sch, "const"), *any = cJSON_GetObjectItemCaseSensitive(sch, "anyOf");
    if (!any) any = cJSON_GetObjectItemCaseSensitive(sch, "oneOf");
    if (depth > 16 || !cJSON_IsObject(sch)) ty = NULL, en = cn = any = NULL;
    if (cJSON_IsArray(any) && cJSON_GetArraySize(any) > 0) return gram_alts(g, any, depth);
    if (cJSON_IsArray(ty) && cJSON_GetArraySize(ty) > 0) { /* a list of types: one schema each */
        cJSON *alts = cJSON_CreateArray();
        const cJSON *x;
        cJSON_ArrayForEach(x, ty) {
            cJSON *o = cJSON_Duplicate(sch, true);
            if (o) cJSON_ReplaceItemInObjectCaseSensitive(o, "type", cJSON_Duplicate(x, false));
            srv_push(alts, o);
        }
        const int id = alts ? gram_alts(g, alts, depth) : 0;
        if (!alts) g->st = FL_ERR_NOMEM;
        cJSON_Delete(alts);
        return id;
    }
    srv_buf body = {0};
    gram sub = {body, g->n_rules, FL_OK}; /* (the rules of the parts first, then this one) */
    const char *t = cJSON_IsString(ty) ? ty->valuestring : "";
    srv_buf line = {0};
    gram l = {line, 0, FL_OK};
    if (cn) gram_json_lit(&l, cn);
    else if (cJSON_IsArray(en) && cJSON_GetArraySize(en) > 0) {
        const cJSON *x;
        cJSON_ArrayForEach(x, en) {
            if (l.b.len && !l.st) l.st = srv_buf_append(&l.b, " | ", 3);
            gram_json_lit(&l, x);
        }
    } else if (!strcmp(t, "object")) {
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(sch, "properties"), *req = cJSON_GetObjectItemCaseSensitive(sch, "required");
        if (!cJSON_IsObject(props) || !props->child) l.st = srv_buf_append(&l.b, "jobject", 7);
        else {
            int nreq = 0, nopt = 0;
            l.st = srv_buf_append(&l.b, "\"{\" ws", 6);
            for (int pass = 0; pass < 2; pass++) { /* the required properties, then the optional ones */
                const cJSON *p;
                cJSON_ArrayForEach(p, props) {
                    bool r = false;
                    const cJSON *x;
                    if (cJSON_IsArray(req)) cJSON_ArrayForEach(x, req) r = r || (cJSON_IsString(x) && !strcmp(x->valuestring, p->string));
                    if (r != (pass == 0)) continue;
                    const int id = gram_schema(&sub, p, depth + 1);
                    const bool first = nreq + nopt == 0;
                    /* an optional one: "( , k: v )?"; where none is required, the first opens the list */
                    if (!l.st && !r) l.st = srv_buf_append(&l.b, " (", 2);
                    if (!l.st && !first) l.st = srv_buf_append(&l.b, " \",\" ws", 7);
                    if (!l.st) l.st = srv_buf_append(&l.b, " ", 1);
                    cJSON *ks = cJSON_CreateString(p->string);
                    if (ks) gram_json_lit(&l, ks);
                    else l.st = FL_ERR_NOMEM;
                    cJSON_Delete(ks);
                    if (!l.st) l.st = srv_buf_printf(&l.b, " ws \":\" ws r%d ws", id);
                    if (!l.st && !r) l.st = srv_buf_append(&l.b, nreq == 0 && first ? "" : " )?", nreq == 0 && first ? 0 : 3);
                    if (r) nreq++;
                    else nopt++;
                }
            }
            if (!l.st && nreq == 0 && nopt > 0) l.st = srv_buf_append(&l.b, " )?", 3); /* (the list that opened with the first) */
            if (!l.st) l.st = srv_buf_append(&l.b, " \"}\"", 4);
        }
    } else if (!strcmp(t, "array")) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(sch, "items");
        const int id = it ? gram_schema(&sub, it, depth + 1) : 0;
        if (id) l.st = srv_buf_printf(&l.b, "\"[\" ws ( r%d ws ( \",\" ws r%d ws )* )? \"]\"", id, id);
        else l.st = srv_buf_append(&l.b, "jarray", 6);
    } else if (!strcmp(t, "string")) l.st = srv_buf_append(&l.b, "jstring", 7);
    else if (!strcmp(t, "integer")) l.st = srv_buf_append(&l.b, "jinteger", 8);
    else if (!strcmp(t, "number")) l.st = srv_buf_append(&l.b, "jnumber", 7);
    else if (!strcmp(t, "boolean")) l.st = srv_buf_append(&l.b, "\"true\" | \"false\"", 16);
    else if (!strcmp(t, "null")) l.st = srv_buf_append(&l.b, "\"null\"", 6);
    else l.st = srv_buf_append(&l.b, "jvalue", 6);
    const int id = ++sub.n_rules;
    g->n_rules = sub.n_rules;
    if (!g->st) g->st = sub.st ? sub.st : l.st;
    if (!g->st && sub.b.len) g->st = srv_buf_append(&g->b, sub.b.p, sub.b.len);
    if (!g->st) g->st = srv_buf_printf(&g->b, "r%d ::= %s\n", id, l.b.p ? l.b.p : "jvalue");
    srv_buf_free(&sub.b);
    srv_buf_free(&l.b);
    return id;
}

/* Each tool's call as an alternative of *calls: {"name": N, KEY: N's parameters}, KEY a GBNF
 * expression for the key (the rules of the parameters in g) */
static void call_alts(gram *g, const cJSON *tools, const char *key, srv_buf *calls) {
    const cJSON *x;
    cJSON_ArrayForEach(x, tools) {
        const cJSON *pa = cJSON_GetObjectItemCaseSensitive(tool_fn(x), "parameters");
        const int id = pa && cJSON_IsObject(pa) ? gram_schema(g, pa, 0) : 0;
        if (!g->st) g->st = srv_buf_append(calls, calls->len ? " | " : "", calls->len ? 3 : 0);
        cJSON *nm = cJSON_CreateString(tool_name(x));
        gram c = {*calls, 0, g->st};
        if (!c.st) c.st = srv_buf_printf(&c.b, "%s", "\"{\" ws \"\\\"name\\\"\" ws \":\" ws ");
        if (nm) gram_json_lit(&c, nm);
        else c.st = FL_ERR_NOMEM;
        cJSON_Delete(nm);
        if (!c.st) {
            if (id) c.st = srv_buf_printf(&c.b, " ws \",\" ws %s ws \":\" ws r%d ws \"}\"", key, id);
            else c.st = srv_buf_printf(&c.b, " ws \",\" ws %s ws \":\" ws jobject ws \"}\"", key);
        }
        *calls = c.b;
        g->st = c.st;
    }
}

/* g's text as a string for the request (freed with cJSON_free, as the schema text) */
static fl_status gram_out(gram *g, char **out) {
    if (g->st) {
        srv_buf_free(&g->b);
        return g->st;
    }
    *out = cJSON_malloc(g->b.len + 1);
    if (*out) memcpy(*out, g->b.p, g->b.len + 1);
    srv_buf_free(&g->b);
    return *out ? FL_OK : FL_ERR_NOMEM;
}

/* tool_choice "required": a JSON array of one or more calls (one without parallel_tool_calls),
 * each {"name": one of the tools, "parameters": that tool's parameters} */
static fl_status required_grammar(const cJSON *tools, bool parallel, char **out) {
    gram g = {{0}, 0, FL_OK};
    srv_buf calls = {0};
    call_alts(&g, tools, "\"\\\"parameters\\\"\"", &calls);
    if (!g.st) g.st = srv_buf_printf(&g.b, "call ::= %s\n%s", calls.p, GRAM_BASE);
    if (!g.st) g.st = parallel ? srv_buf_printf(&g.b, "root ::= \"[\" ws call ws ( \",\" ws call ws )* \"]\"\n")
                               : srv_buf_printf(&g.b, "root ::= \"[\" ws call ws \"]\"\n");
    srv_buf_free(&calls);
    return gram_out(&g, out);
}

/* tool_choice "auto", as llama.cpp constrains it: a lazy grammar whose triggers are where a call
 * starts in the family's formats, the output free until then.  A call is {"name": a tool,
 * "arguments" or "parameters": its parameters}, as srv_tools_parse reads it; the grammar takes
 *   - <tool_call> call </tool_call> (several, spaces between, with parallel_tool_calls), anywhere
 *     in the answer (a word trigger);
 *   - at the answer's start: [TOOL_CALLS] [calls], or [calls] (one call without
 *     parallel_tool_calls); for Llama 3 also bare calls (several, spaces between) (a full
 *     pattern, anchored at the answer's start; with reasoning the engine's triggers look only
 *     past it: fl_request_params.lazy_after_think). */
fl_status srv_tools_lazy(const srv_tools *t, const cJSON *tools, char **grammar, fl_grammar_trigger *trig, int32_t *n_trig) {
    static const char *const START[2] = {
        "\\s*(\\[TOOL_CALLS\\][\\s\\S]*|\\[\\s*\\{\\s*\"name\"[\\s\\S]*)",
        "\\s*(\\{\\s*\"name\"[\\s\\S]*|\\[TOOL_CALLS\\][\\s\\S]*|\\[\\s*\\{\\s*\"name\"[\\s\\S]*)"};
    *grammar = NULL;
    *n_trig = 0;
    if (t->mode != SRV_TOOLS_AUTO || !cJSON_GetArraySize(tools)) return FL_OK;
    trig[(*n_trig)++] = (fl_grammar_trigger){FL_TRIGGER_PATTERN_FULL, START[t->json_style], -1};
    trig[(*n_trig)++] = (fl_grammar_trigger){FL_TRIGGER_WORD, TAG_OPEN, -1};
    gram g = {{0}, 0, FL_OK};
    srv_buf calls = {0};
    call_alts(&g, tools, "( \"\\\"arguments\\\"\" | \"\\\"parameters\\\"\" )", &calls);
    if (!g.st) g.st = srv_buf_printf(&g.b, "call ::= %s\n%stws ::= [ \\t\\n]{0,8}\n", calls.p, GRAM_BASE);
    if (!g.st) g.st = srv_buf_printf(&g.b, "tagged ::= \"<tool_call>\" tws call tws \"</tool_call>\"\n"
                                           "arr ::= \"[\" tws call tws %s\"]\"\n",
                                     t->parallel ? "( \",\" tws call tws )* " : "");
    if (!g.st) g.st = srv_buf_printf(&g.b, "root ::= tagged%s | \"[TOOL_CALLS]\" tws arr | arr%s\n", t->parallel ? " ( tws tagged )*" : "",
                                     !t->json_style ? "" : t->parallel ? " | call ( tws call )*" : " | call");
    srv_buf_free(&calls);
    return gram_out(&g, grammar);
}

/* v printed as JSON is valid UTF-8: 1, 0 not, -1 out of memory */
static int json_utf8(const cJSON *v) {
    char *all = cJSON_PrintUnformatted(v);
    if (!all) return -1;
    const bool ok = fl_utf8_is_valid(all, strlen(all));
    cJSON_free(all);
    return ok;
}

/* vLLM's structural_tag in its first form, {"structures": [{"begin", "schema", "end"}],
 * "triggers": [words]}: free text until a trigger appears; from there one structure, its begin
 * (which starts with the trigger), a JSON value of its schema (the GBNF "required" builds, spaces
 * of one around it), its end; then free text again (the engine's lazy_repeat).  The triggers'
 * texts are st's (kept by the caller until the request is added). */
fl_status srv_structural_tag(const cJSON *st, char **grammar, fl_grammar_trigger *trig, int32_t *n_trig, char *err, size_t errn) {
    *grammar = NULL;
    *n_trig = 0;
    const cJSON *ss = cJSON_GetObjectItemCaseSensitive(st, "structures"), *ts = cJSON_GetObjectItemCaseSensitive(st, "triggers"), *x;
    if (cJSON_IsObject(st) && cJSON_GetObjectItemCaseSensitive(st, "format")) {
        snprintf(err, errn, "structural_tag: the 'format' form is not supported ({\"structures\": [...], \"triggers\": [...]} is)");
        return FL_ERR_INVALID;
    }
    if (!cJSON_IsObject(st) || !cJSON_IsArray(ss) || cJSON_GetArraySize(ss) < 1 || cJSON_GetArraySize(ss) > SRV_MAX_TOOLS) {
        snprintf(err, errn, "structural_tag needs 'structures': 1..%d {\"begin\", \"schema\", \"end\"}", SRV_MAX_TOOLS);
        return FL_ERR_INVALID;
    }
    if (!cJSON_IsArray(ts) || cJSON_GetArraySize(ts) < 1 || cJSON_GetArraySize(ts) > FL_MAX_TRIGGERS) {
        snprintf(err, errn, "structural_tag needs 'triggers': 1..%d texts", FL_MAX_TRIGGERS);
        return FL_ERR_INVALID;
    }
    const int utf8 = json_utf8(st); /* (its texts and schemas become the grammar's literals) */
    if (utf8 < 0) return FL_ERR_NOMEM;
    if (!utf8) {
        snprintf(err, errn, "structural_tag must be valid UTF-8");
        return FL_ERR_INVALID;
    }
    cJSON_ArrayForEach(x, ts) {
        if (!cJSON_IsString(x) || !*x->valuestring || strlen(x->valuestring) > FL_TRIGGER_MAX_BYTES) {
            snprintf(err, errn, "structural_tag: each trigger is a text of 1..%d bytes", FL_TRIGGER_MAX_BYTES);
            return FL_ERR_INVALID;
        }
        trig[(*n_trig)++] = (fl_grammar_trigger){FL_TRIGGER_WORD, x->valuestring, -1};
    }
    gram g = {{0}, 0, FL_OK};
    srv_buf root = {0};
    int k = 0;
    cJSON_ArrayForEach(x, ss) {
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(x, "begin"), *e = cJSON_GetObjectItemCaseSensitive(x, "end");
        const cJSON *sch = cJSON_GetObjectItemCaseSensitive(x, "schema");
        const bool ok = cJSON_IsObject(x) && cJSON_IsString(b) && *b->valuestring && cJSON_IsString(e) && (!sch || cJSON_IsObject(sch) || cJSON_IsTrue(sch));
        bool reached = false;
        const cJSON *t;
        if (ok) cJSON_ArrayForEach(t, ts) reached = reached || !strncmp(b->valuestring, t->valuestring, strlen(t->valuestring));
        if (!ok || !reached) {
            snprintf(err, errn, !ok ? "structural_tag: structure %d must be {\"begin\": text, \"schema\": a JSON Schema, \"end\": text}"
                                    : "structural_tag: structure %d's begin starts with none of the triggers", k);
            srv_buf_free(&g.b);
            srv_buf_free(&root);
            return FL_ERR_INVALID;
        }
        const int id = sch && cJSON_IsObject(sch) ? gram_schema(&g, sch, 0) : 0;
        gram r = {root, 0, g.st};
        if (!r.st && k) r.st = srv_buf_append(&r.b, " | ", 3);
        gram_lit(&r, b->valuestring);
        if (!r.st) r.st = id ? srv_buf_printf(&r.b, " ws r%d", id) : srv_buf_printf(&r.b, " ws jvalue");
        if (!r.st && *e->valuestring) r.st = srv_buf_append(&r.b, " ws ", 4); /* (no end: free again right after the value) */
        if (*e->valuestring) gram_lit(&r, e->valuestring);
        root = r.b;
        g.st = r.st;
        k++;
    }
    if (!g.st) g.st = srv_buf_printf(&g.b, "%sroot ::= %s\n", GRAM_BASE, root.p);
    srv_buf_free(&root);
    return gram_out(&g, grammar);
}

fl_status srv_tools_read(const cJSON *j, bool json_style, srv_tools *t, const cJSON **tools_out, char **schema_text, bool *is_grammar,
                         char *err, size_t errn) {
    memset(t, 0, sizeof *t);
    *is_grammar = false;
    t->json_style = json_style;
    t->parallel = true;
    *tools_out = NULL;
    *schema_text = NULL;
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(j, "tools"), *tc = cJSON_GetObjectItemCaseSensitive(j, "tool_choice");
    const cJSON *ptc = cJSON_GetObjectItemCaseSensitive(j, "parallel_tool_calls");
    if (ptc && !cJSON_IsNull(ptc) && !cJSON_IsBool(ptc)) {
        snprintf(err, errn, "'parallel_tool_calls' must be a boolean");
        return FL_ERR_INVALID;
    }
    t->parallel = !cJSON_IsFalse(ptc);
    const bool have = tools && !cJSON_IsNull(tools);
    if (have) {
        if (!cJSON_IsArray(tools) || cJSON_GetArraySize(tools) > SRV_MAX_TOOLS) {
            snprintf(err, errn, "'tools' must be an array of at most %d tools", SRV_MAX_TOOLS);
            return FL_ERR_INVALID;
        }
        const cJSON *x;
        cJSON_ArrayForEach(x, tools) {
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(x, "type"), *fn = tool_fn(x);
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name"), *pa = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
            if (!cJSON_IsObject(x) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "function") || !cJSON_IsObject(fn)) {
                snprintf(err, errn, "each tool must be {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": {...}}}");
                return FL_ERR_INVALID;
            }
            if (!cJSON_IsString(nm) || !name_ok(nm->valuestring)) {
                snprintf(err, errn, "a tool's function name must be 1 to 64 letters, digits, '_' or '-'");
                return FL_ERR_INVALID;
            }
            if (pa && !cJSON_IsNull(pa) && !cJSON_IsObject(pa)) {
                snprintf(err, errn, "tool '%s': 'parameters' must be a JSON Schema object", nm->valuestring);
                return FL_ERR_INVALID;
            }
            for (const cJSON *y = tools->child; y != x; y = y->next)
                if (!strcmp(tool_name(y), nm->valuestring)) {
                    snprintf(err, errn, "two tools are named '%s'", nm->valuestring);
                    return FL_ERR_INVALID;
                }
        }
        const int utf8 = json_utf8(tools); /* (the prompt shows them, a grammar may spell them) */
        if (utf8 < 0) return FL_ERR_NOMEM;
        if (!utf8) {
            snprintf(err, errn, "'tools' must be valid UTF-8");
            return FL_ERR_INVALID;
        }
        if (cJSON_GetArraySize(tools) > 0) *tools_out = tools;
    }
    t->mode = *tools_out ? SRV_TOOLS_AUTO : SRV_TOOLS_NONE;
    if (!tc || cJSON_IsNull(tc)) return FL_OK;
    if (cJSON_IsString(tc) && !strcmp(tc->valuestring, "none")) {
        t->mode = SRV_TOOLS_NONE;
        return FL_OK;
    }
    const cJSON *named = NULL;
    if (cJSON_IsString(tc) && !strcmp(tc->valuestring, "auto")) t->mode = SRV_TOOLS_AUTO;
    else if (cJSON_IsString(tc) && !strcmp(tc->valuestring, "required")) t->mode = SRV_TOOLS_REQUIRED;
    else if (cJSON_IsObject(tc)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(tc, "type");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tc, "function"), "name");
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "function") || !cJSON_IsString(nm)) {
            snprintf(err, errn, "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
            return FL_ERR_INVALID;
        }
        const cJSON *x;
        if (*tools_out) cJSON_ArrayForEach(x, tools) if (!strcmp(tool_name(x), nm->valuestring)) named = x;
        if (!named) {
            snprintf(err, errn, "'tool_choice' names '%.64s', which is not in 'tools'", nm->valuestring);
            return FL_ERR_INVALID;
        }
        t->mode = SRV_TOOLS_NAMED;
        snprintf(t->named, sizeof t->named, "%s", nm->valuestring);
    } else {
        snprintf(err, errn, "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
        return FL_ERR_INVALID;
    }
    if (!*tools_out) {
        snprintf(err, errn, "'tool_choice' other than \"none\" needs 'tools'");
        return FL_ERR_INVALID;
    }
    if (t->mode == SRV_TOOLS_AUTO) return FL_OK;
    /* the constraint of "required" and of a named function */
    cJSON *sch = NULL;
    const size_t f0 = fl_mem_thread_failures(); /* (a schema a part short would constrain wrongly) */
    if (t->mode == SRV_TOOLS_NAMED) {
        const cJSON *pa = cJSON_GetObjectItemCaseSensitive(tool_fn(named), "parameters");
        if (pa && !cJSON_IsNull(pa)) {
            if (!(*schema_text = cJSON_PrintUnformatted(pa))) return FL_ERR_NOMEM;
            return FL_OK;
        }
        sch = cJSON_CreateObject(); /* no parameters: any object ({} as OpenAI's clients send) */
        if (sch) cJSON_AddStringToObject(sch, "type", "object");
    } else if (cJSON_GetArraySize(tools) > 1) { /* "required" of several: a union of objects, as a grammar */
        *is_grammar = true;
        return required_grammar(tools, t->parallel, schema_text);
    } else { /* "required" of one: [{"name": it, "parameters": its schema}, ...] */
        sch = cJSON_CreateObject();
        cJSON *it = cJSON_CreateObject(), *props = cJSON_CreateObject(), *req = cJSON_CreateArray();
        const cJSON *pa = cJSON_GetObjectItemCaseSensitive(tool_fn(tools->child), "parameters");
        cJSON *pc = pa && !cJSON_IsNull(pa) ? cJSON_Duplicate(pa, true) : cJSON_CreateObject();
        if (!sch || !it || !props || !req || !pc) {
            cJSON_Delete(sch), cJSON_Delete(it), cJSON_Delete(props), cJSON_Delete(req), cJSON_Delete(pc);
            return FL_ERR_NOMEM;
        }
        if (!pa || cJSON_IsNull(pa)) cJSON_AddStringToObject(pc, "type", "object");
        cJSON_AddStringToObject(sch, "type", "array");
        cJSON_AddNumberToObject(sch, "minItems", 1);
        if (!t->parallel) cJSON_AddNumberToObject(sch, "maxItems", 1);
        /* (each part whole before it joins its parent: a part that cannot join is freed) */
        cJSON_AddStringToObject(it, "type", "object");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(props, "name"), "const", tool_name(tools->child));
        srv_add(props, "parameters", pc);
        srv_add(it, "properties", props);
        srv_push(req, cJSON_CreateString("name"));
        srv_push(req, cJSON_CreateString("parameters"));
        srv_add(it, "required", req);
        cJSON_AddFalseToObject(it, "additionalProperties");
        srv_add(sch, "items", it);
    }
    if (sch && fl_mem_thread_failures() == f0) *schema_text = cJSON_PrintUnformatted(sch);
    cJSON_Delete(sch);
    return sch && *schema_text ? FL_OK : FL_ERR_NOMEM;
}

/* s[0..n) starts with pre, or (at its end) with a part of it */
static bool starts_partial(const char *s, size_t n, const char *pre) {
    const size_t m = strlen(pre);
    return !strncmp(s, pre, n < m ? n : m);
}

static size_t skip_ws(const char *s, size_t i, size_t n) {
    while (i < n && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r')) i++;
    return i;
}

size_t srv_tools_hold(const srv_tools *t, const char *text, size_t n, size_t from) {
    if (t->mode == SRV_TOOLS_NONE) return n;
    if (t->mode != SRV_TOOLS_AUTO) return 0; /* the output is the call */
    const size_t i0 = skip_ws(text, 0, n);
    if (t->json_style && (i0 == n || text[i0] == '{')) return 0; /* a bare object from the first byte that is not a space */
    if (i0 < n && starts_partial(text + i0, n - i0, MISTRAL_CALLS)) return 0; /* (a "[" alone too, until the next byte) */
    if (i0 < n && text[i0] == '[') { /* an array of calls: "[" then "{" */
        const size_t j = skip_ws(text, i0 + 1, n);
        if (j == n || text[j] == '{') return 0;
    }
    for (size_t i = from < n ? from : n; i < n; i++) /* up to a tag, or a part of one at the end */
        if (text[i] == '<' && starts_partial(text + i, n - i, TAG_OPEN)) return i;
    return n;
}

/* A call {"name": N, "arguments" or "parameters": A} into OpenAI's tool_calls entry: A as JSON
 * text (a string A as it is). NULL if o is not one. */
void srv_tools_call_id(uint64_t seed, int idx, char *buf, size_t cap) {
    const XXH128_hash_t h = XXH3_128bits_withSeed(&idx, sizeof idx, seed);
    snprintf(buf, cap, "call_%016llx%08llx", (unsigned long long)h.high64, (unsigned long long)(h.low64 & 0xFFFFFFFFu));
}

static cJSON *call_of(const cJSON *o, uint64_t seed, int idx) {
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(o, "name"), *a = cJSON_GetObjectItemCaseSensitive(o, "arguments");
    if (!a) a = cJSON_GetObjectItemCaseSensitive(o, "parameters");
    if (!cJSON_IsObject(o) || !cJSON_IsString(nm) || !*nm->valuestring) return NULL;
    char *args = !a ? NULL : cJSON_IsString(a) ? NULL : cJSON_PrintUnformatted(a);
    char id[40];
    srv_tools_call_id(seed, idx, id, sizeof id);
    cJSON *c = cJSON_CreateObject(), *f;
    cJSON_AddStringToObject(c, "id", id);
    cJSON_AddStringToObject(c, "type", "function");
    f = cJSON_AddObjectToObject(c, "function");
    cJSON_AddStringToObject(f, "name", nm->valuestring);
    cJSON_AddStringToObject(f, "arguments", cJSON_IsString(a) ? a->valuestring : args ? args : "{}");
    cJSON_free(args);
    return c;
}

/* Call objects from s[a] on (spaces between, and commas or semicolons after the first), to the
 * end of s[0..n) or, with tagged, to a closing tag (*b past it; n at the end): false where a value
 * is not a call, or there is none (calls maybe added). */
static bool read_calls(const char *s, size_t n, size_t a, bool tagged, cJSON *calls, uint64_t seed, size_t *b) {
    size_t j = a;
    int got = 0;
    for (;;) {
        while (j < n && (s[j] == ' ' || s[j] == '\n' || s[j] == '\t' || s[j] == '\r' || (got && (s[j] == ';' || s[j] == ',')))) j++;
        if (j == n || (tagged && n - j >= sizeof TAG_CLOSE - 1 && !memcmp(s + j, TAG_CLOSE, sizeof TAG_CLOSE - 1))) {
            *b = j == n ? n : j + sizeof TAG_CLOSE - 1;
            return got > 0;
        }
        const char *end = NULL;
        cJSON *o = cJSON_ParseWithLengthOpts(s + j, n - j, &end, false);
        cJSON *c = o ? call_of(o, seed, cJSON_GetArraySize(calls)) : NULL;
        cJSON_Delete(o);
        if (!c) return false;
        srv_push(calls, c);
        got++;
        j = (size_t)(end - s);
    }
}

/* s[0..n): one JSON array (spaces after it) of one or more call objects, added to calls (left
 * empty where it is not). */
static bool calls_of_array(const char *s, size_t n, cJSON *calls, uint64_t seed) {
    const char *end = NULL;
    cJSON *a = cJSON_ParseWithLengthOpts(s, n, &end, false);
    bool ok = cJSON_IsArray(a) && cJSON_GetArraySize(a) > 0 && skip_ws(s, (size_t)(end - s), n) == n;
    const cJSON *x;
    if (ok) cJSON_ArrayForEach(x, a) {
        cJSON *c = call_of(x, seed, cJSON_GetArraySize(calls));
        if (!c) { ok = false; break; }
        srv_push(calls, c);
    }
    cJSON_Delete(a);
    if (!ok)
        while (cJSON_GetArraySize(calls) > 0) cJSON_DeleteItemFromArray(calls, 0);
    return ok;
}

static void trim_into(srv_buf *out, const char *s, size_t n) {
    size_t a = skip_ws(s, 0, n);
    while (n > a && (s[n - 1] == ' ' || s[n - 1] == '\n' || s[n - 1] == '\t' || s[n - 1] == '\r')) n--;
    srv_buf_append(out, s + a, n - a);
}

cJSON *srv_tools_parse(const srv_tools *t, const char *text, size_t n, uint64_t seed, bool trim, srv_buf *content) {
    content->len = 0;
    if (t->mode == SRV_TOOLS_NONE) {
        srv_buf_append(content, text, n);
        return NULL;
    }
    cJSON *calls = cJSON_CreateArray();
    if (!calls) return NULL;
    if (t->mode == SRV_TOOLS_NAMED) { /* the output is the arguments */
        srv_buf args = {0};
        trim_into(&args, text, n);
        srv_buf_append(&args, "", 1);
        cJSON *o = cJSON_CreateObject(), *c = NULL;
        if (o && args.p) {
            cJSON_AddStringToObject(o, "name", t->named);
            cJSON_AddStringToObject(o, "arguments", args.p);
            c = call_of(o, seed, 0);
        }
        cJSON_Delete(o);
        srv_buf_free(&args);
        if (c) srv_push(calls, c);
        return calls;
    }
    if (t->mode == SRV_TOOLS_REQUIRED) { /* a JSON array of calls */
        if (calls_of_array(text, n, calls, seed)) return calls;
        cJSON_Delete(calls);
        srv_buf_append(content, text, n); /* cut short (max_tokens): what there is, as content */
        return NULL;
    }
    /* auto: an output that is a JSON array of calls (Mistral's, after [TOOL_CALLS]) */
    size_t i0 = skip_ws(text, 0, n);
    if (n - i0 >= sizeof MISTRAL_CALLS - 1 && !memcmp(text + i0, MISTRAL_CALLS, sizeof MISTRAL_CALLS - 1))
        i0 = skip_ws(text, i0 + sizeof MISTRAL_CALLS - 1, n);
    if (i0 < n && text[i0] == '[' && calls_of_array(text + i0, n - i0, calls, seed)) return calls;
    /* Llama 3's bare objects, or tagged calls with content around them */
    size_t b = 0;
    if (t->json_style && read_calls(text, n, 0, false, calls, seed, &b)) return calls;
    cJSON_Delete(calls);
    if (!(calls = cJSON_CreateArray())) return NULL;
    size_t i = 0;
    while (i < n) {
        const char *o = memmem(text + i, n - i, TAG_OPEN, sizeof TAG_OPEN - 1);
        if (!o) break;
        const size_t a = (size_t)(o - text) + sizeof TAG_OPEN - 1;
        const int before = cJSON_GetArraySize(calls);
        if (read_calls(text, n, a, true, calls, seed, &b)) { /* (its closing tag after the objects: one inside a string is theirs) */
            srv_buf_append(content, text + i, (size_t)(o - text) - i);
            i = b;
            continue;
        }
        while (cJSON_GetArraySize(calls) > before) cJSON_DeleteItemFromArray(calls, before);
        const char *cl = memmem(text + a, n - a, TAG_CLOSE, sizeof TAG_CLOSE - 1); /* not a call: the text stays content */
        const size_t e = cl ? (size_t)(cl - text) + sizeof TAG_CLOSE - 1 : n;
        srv_buf_append(content, text + i, e - i);
        i = e;
    }
    if (i < n) srv_buf_append(content, text + i, n - i);
    if (cJSON_GetArraySize(calls) == 0) {
        cJSON_Delete(calls);
        content->len = 0;
        srv_buf_append(content, text, n);
        return NULL;
    }
    if (!trim) return calls;
    srv_buf tr = {0}; /* the content beside the calls, trimmed */
    trim_into(&tr, content->p ? content->p : "", content->len);
    content->len = 0;
    srv_buf_append(content, tr.p ? tr.p : "", tr.len);
    srv_buf_free(&tr);
    return calls;
}

/* ---- "required" calls, piece by piece ----
 * The array [ {"name": N, "parameters": V} (, {...})* ] read as it grows: the states are where the
 * next byte that is not a space must be. */
enum { CS_OPEN, CS_OBJ, CS_NAME, CS_KEY, CS_ARGS, CS_END, CS_SEP, CS_DONE, CS_OFF,
       CS_TAG, CS_CLOSE, CS_BARE }; /* (tool_choice "auto": <tool_call> / </tool_call> next; the next bare object) */
enum { FORM_ARRAY, FORM_TAGGED, FORM_BARE }; /* srv_call_scan.form */

bool srv_calls_done(const srv_call_scan *c) { return c->state == CS_DONE; }
bool srv_calls_off(const srv_call_scan *c) { return c->state == CS_OFF; }

int srv_tools_auto_start(const srv_tools *t, const char *text, size_t n, size_t h, srv_call_scan *c) {
    const size_t i = skip_ws(text, h, n), m = n - i;
    if (i == n) return 0;
    const size_t lt = sizeof TAG_OPEN - 1, lm = sizeof MISTRAL_CALLS - 1;
    *c = (srv_call_scan){0};
    if (text[i] == '<') { /* a tag: once whole */
        if (m < lt) return starts_partial(text + i, m, TAG_OPEN) ? 0 : -1;
        if (memcmp(text + i, TAG_OPEN, lt)) return -1;
        c->form = FORM_TAGGED;
        c->state = CS_TAG;
        c->pos = i;
        return 1;
    }
    if (h > 0 && skip_ws(text, 0, n) < i) return -1; /* (the other forms start the answer) */
    if (text[i] == '[') { /* [TOOL_CALLS] then an array, or an array: once its "{" */
        size_t j = i;
        if (starts_partial(text + i, m, MISTRAL_CALLS)) {
            if (m < lm) return 0;
            j = i + lm;
        }
        const size_t k = skip_ws(text, j, n);
        if (k == n) return 0;
        if (text[k] != '[') return -1;
        const size_t o = skip_ws(text, k + 1, n);
        if (o == n) return 0;
        if (text[o] != '{') return -1;
        c->form = FORM_ARRAY;
        c->state = CS_OPEN;
        c->pos = k;
        return 1;
    }
    if (t->json_style && text[i] == '{') {
        c->form = FORM_BARE;
        c->state = CS_OBJ;
        c->pos = i;
        return 1;
    }
    return -1;
}

/* text[i..n) after spaces starts with lit: 1 (*i past it), -1 not, 0 not yet known */
static int expect(const char *text, size_t n, size_t *i, const char *lit) {
    size_t j = skip_ws(text, *i, n);
    const size_t m = strlen(lit);
    if (j + m > n) return j == n || starts_partial(text + j, n - j, lit) ? 0 : -1;
    if (memcmp(text + j, lit, m)) return -1;
    *i = j + m;
    return 1;
}

srv_call_piece srv_calls_next(srv_call_scan *c, const char *text, size_t n, bool final, int32_t *k, size_t *a, size_t *e) {
    for (;;) {
        size_t i = c->pos;
        int r;
        switch (c->state) {
        case CS_OPEN:
        case CS_OBJ:
        case CS_END:
            r = expect(text, n, &i, c->state == CS_OPEN ? "[" : c->state == CS_OBJ ? "{" : "}");
            if (r == 0) return SRV_CALL_NONE;
            if (r < 0) break;
            c->pos = i;
            c->state = c->state == CS_OPEN ? CS_OBJ : c->state == CS_OBJ ? CS_NAME
                     : c->form == FORM_TAGGED ? CS_CLOSE : c->form == FORM_BARE ? CS_BARE : CS_SEP;
            continue;
        case CS_TAG:
        case CS_CLOSE: /* (a tagged call's tags: spaces, then the tag; after a call's closing tag the next call, or the end) */
            if (c->state == CS_TAG && skip_ws(text, i, n) == n) return SRV_CALL_NONE;
            r = expect(text, n, &i, c->state == CS_TAG ? TAG_OPEN : TAG_CLOSE);
            if (r == 0) return SRV_CALL_NONE;
            if (r < 0) break;
            c->pos = i;
            c->state = c->state == CS_TAG ? CS_OBJ : CS_TAG;
            continue;
        case CS_BARE: { /* Llama 3's calls: spaces (or ; ,), then the next object, or the end */
            size_t j = i;
            while (j < n && (text[j] == ' ' || text[j] == '\n' || text[j] == '\t' || text[j] == '\r' || text[j] == ';' || text[j] == ',')) j++;
            if (j == n) return SRV_CALL_NONE;
            if (text[j] != '{') break;
            c->pos = j;
            c->state = CS_OBJ;
            continue;
        }
        case CS_SEP: {
            const size_t j = skip_ws(text, i, n);
            if (j == n) return SRV_CALL_NONE;
            c->pos = j + 1;
            c->state = text[j] == ',' ? CS_OBJ : text[j] == ']' ? CS_DONE : CS_OFF;
            continue;
        }
        case CS_NAME: { /* "name": "N" (a tool's name: no escapes) */
            if ((r = expect(text, n, &i, "\"name\"")) <= 0 || (r = expect(text, n, &i, ":")) <= 0 || (r = expect(text, n, &i, "\"")) <= 0) {
                if (r == 0) return SRV_CALL_NONE;
                break;
            }
            size_t q = i;
            while (q < n && text[q] != '"' && text[q] != '\\') q++;
            if (q == n) return SRV_CALL_NONE;
            if (text[q] == '\\' || q == i) break;
            *k = c->n_calls++;
            *a = i;
            *e = q;
            c->pos = q + 1;
            c->state = CS_KEY;
            return SRV_CALL_HEADER;
        }
        case CS_KEY: /* , "parameters" (or "arguments"): then the value's first byte */
            if ((r = expect(text, n, &i, ",")) <= 0) {
                if (r == 0) return SRV_CALL_NONE;
                break;
            }
            {
                const size_t i2 = i;
                r = expect(text, n, &i, "\"parameters\"");
                if (r < 0) {
                    i = i2;
                    r = expect(text, n, &i, "\"arguments\"");
                }
                if (r > 0) r = expect(text, n, &i, ":");
            }
            if (r == 0) return SRV_CALL_NONE;
            if (r < 0) break;
            i = skip_ws(text, i, n);
            if (i == n) return SRV_CALL_NONE;
            c->pos = c->sent = i;
            c->depth = 0;
            c->str = c->esc = false;
            c->scalar = text[i] != '{' && text[i] != '[' && text[i] != '"';
            c->state = CS_ARGS;
            continue;
        case CS_ARGS: { /* the value, to its end (nesting, strings, a bare scalar's delimiter) */
            bool end = false;
            for (; i < n && !end; i++) {
                const char ch = text[i];
                if (c->str) {
                    if (c->esc) c->esc = false;
                    else if (ch == '\\') c->esc = true;
                    else if (ch == '"') {
                        c->str = false;
                        end = c->depth == 0;
                    }
                } else if (c->scalar) {
                    if (ch == ' ' || ch == '\n' || ch == '\t' || ch == '\r' || ch == ',' || ch == '}' || ch == ']') {
                        end = true;
                        i--; /* (the delimiter is not the value's) */
                    }
                } else if (ch == '"') {
                    c->str = true;
                } else if (ch == '{' || ch == '[') {
                    c->depth++;
                } else if (ch == '}' || ch == ']') {
                    end = --c->depth == 0;
                    if (c->depth < 0) break;
                }
            }
            if (c->depth < 0) break;
            if (end || (final && c->scalar && i == n)) c->state = CS_END;
            c->pos = i;
            if (i > c->sent) {
                *k = c->n_calls - 1;
                *a = c->sent;
                *e = c->sent = i;
                return SRV_CALL_ARGS;
            }
            if (c->state == CS_END) continue;
            return SRV_CALL_NONE;
        }
        default: /* CS_DONE, CS_OFF */
            return SRV_CALL_NONE;
        }
        c->state = CS_OFF; /* (a break above: off the pattern) */
        return SRV_CALL_NONE;
    }
}
