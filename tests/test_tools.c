/* Tool calling (server/tools.c, chat.c): reading tools / tool_choice, the constraint each choice
 * builds (a named function's schema, "required"'s schema or GBNF grammar, run through the
 * engine's recognizers), what streams as content before a call, reading calls out of an output,
 * and the chat templates' tool turns. */
#include "test.h"

#include "engine/grammar.h"
#include "engine/json_schema.h"
#include "engine/triggers.h"
#include "server/server_int.h"

#include <cjson/cJSON.h>
#include <string.h>

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"d\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"unit\":{\"enum\":[\"c\",\"f\"]},\"days\":{\"type\":\"integer\"}},\"required\":[\"city\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"add\",\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\"},"
    "\"b\":{\"anyOf\":[{\"type\":\"number\"},{\"type\":\"null\"}]},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}},\"required\":[\"a\",\"b\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]";

/* read a request body; returns the status, err set */
static fl_status rd(const char *body, srv_tools *t, char **constraint, bool *gr, char *err) {
    cJSON *j = cJSON_Parse(body);
    assert_non_null(j);
    const cJSON *tools = NULL;
    fl_status st = srv_tools_read(j, false, t, &tools, constraint, gr, err, 200);
    cJSON_Delete(j);
    return st;
}

static char *with_tools(const char *rest) {
    static char b[4096];
    snprintf(b, sizeof b, "{\"tools\":%s%s}", TOOLS, rest);
    return b;
}

static void test_read(void **state) {
    (void)state;
    srv_tools t;
    char *c = NULL, err[200];
    bool gr;
    /* defaults: auto with tools, none without */
    assert_int_equal(rd(with_tools(""), &t, &c, &gr, err), FL_OK);
    assert_int_equal(t.mode, SRV_TOOLS_AUTO);
    assert_true(t.parallel);
    assert_null(c);
    assert_int_equal(rd("{}", &t, &c, &gr, err), FL_OK);
    assert_int_equal(t.mode, SRV_TOOLS_NONE);
    assert_int_equal(rd(with_tools(",\"tool_choice\":\"none\",\"parallel_tool_calls\":false"), &t, &c, &gr, err), FL_OK);
    assert_int_equal(t.mode, SRV_TOOLS_NONE);
    assert_false(t.parallel);
    /* a named function: its parameters schema, compiled by the engine's schema compiler */
    assert_int_equal(rd(with_tools(",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"add\"}}"), &t, &c, &gr, err), FL_OK);
    assert_int_equal(t.mode, SRV_TOOLS_NAMED);
    assert_string_equal(t.named, "add");
    assert_false(gr);
    assert_non_null(strstr(c, "\"required\":[\"a\",\"b\"]"));
    cJSON_free(c);
    c = NULL;
    /* a function without parameters: any object */
    assert_int_equal(rd(with_tools(",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"now\"}}"), &t, &c, &gr, err), FL_OK);
    assert_string_equal(c, "{\"type\":\"object\"}");
    cJSON_free(c);
    c = NULL;
    /* refusals, each with its reason */
    static const struct { const char *body, *msg; } bad[] = {
        {"{\"tools\":{}}", "'tools' must be an array"},
        {"{\"tools\":[{\"type\":\"code\",\"function\":{\"name\":\"x\"}}]}", "each tool must be"},
        {"{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]}", "1 to 64 letters"},
        {"{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"x\",\"parameters\":3}}]}", "'parameters' must be a JSON Schema"},
        {"{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"x\"}},{\"type\":\"function\",\"function\":{\"name\":\"x\"}}]}", "two tools are named 'x'"},
        {"{\"tool_choice\":\"required\"}", "needs 'tools'"},
        {"{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"x\"}}],\"tool_choice\":\"always\"}", "'tool_choice' must be"},
        {"{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"x\"}}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"y\"}}}", "names 'y'"},
        {"{\"parallel_tool_calls\":1}", "'parallel_tool_calls' must be a boolean"},
        {"{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"x\",\"parameters\":{\"properties\":{\"a\xa0\":{}}}}}]}", "valid UTF-8"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = 0;
        assert_int_equal(rd(bad[i].body, &t, &c, &gr, err), FL_ERR_INVALID);
        if (!strstr(err, bad[i].msg)) fail_msg("%s: '%s' lacks '%s'", bad[i].body, err, bad[i].msg);
        assert_null(c);
    }
}

/* "required" of one tool: a JSON Schema for an array of its calls; of several: a GBNF grammar
 * that takes each tool's calls with its parameters and nothing else */
static void test_required(void **state) {
    (void)state;
    srv_tools t;
    char *c = NULL, err[200];
    bool gr;
    const char *one = "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":"
                      "{\"x\":{\"type\":\"integer\",\"minimum\":1}},\"required\":[\"x\"]}}}],\"tool_choice\":\"required\",\"parallel_tool_calls\":false}";
    assert_int_equal(rd(one, &t, &c, &gr, err), FL_OK);
    assert_false(gr);
    fl_json_schema *js = NULL;
    assert_int_equal(fl_json_schema_compile(c, &js), FL_OK);
    fl_json_schema_free(js);
    assert_non_null(strstr(c, "\"maxItems\":1"));
    assert_non_null(strstr(c, "\"const\":\"f\""));
    cJSON_free(c);
    c = NULL;

    assert_int_equal(rd(with_tools(",\"tool_choice\":\"required\""), &t, &c, &gr, err), FL_OK);
    assert_true(gr);
    fl_grammar_guide *g = NULL;
    if (fl_grammar_guide_new(c, &g) != FL_OK) fail_msg("grammar refused: %s\n%s", fl_last_error(), c);
    fl_grammar_guide_free(g);
    static const struct { const char *text; int ok; } cases[] = {
        {"[{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}]", 1},
        {"[{\"name\":\"get_weather\",\"parameters\":{\"city\":\"Paris\",\"unit\":\"c\",\"days\":3}}]", 1},
        {"[{\"name\":\"get_weather\",\"parameters\":{\"city\":\"Paris\",\"days\":3}}]", 1},
        {"[{\"name\":\"get_weather\",\"parameters\":{\"city\":\"Paris\",\"unit\":\"k\"}}]", 0},  /* not in the enum */
        {"[{\"name\":\"get_weather\",\"parameters\":{\"unit\":\"c\"}}]", 0},                   /* city is required */
        {"[{\"name\":\"get_weather\",\"parameters\":{\"city\":\"Paris\",\"days\":3.5}}]", 0},  /* an integer */
        {"[{\"name\":\"add\",\"parameters\":{\"a\":1.5,\"b\":null}}, {\"name\":\"now\",\"parameters\":{}}]", 1},
        {"[{\"name\":\"add\",\"parameters\":{\"a\":1,\"b\":2,\"tags\":[\"x\",\"y\"]}}]", 1},
        {"[{\"name\":\"add\",\"parameters\":{\"a\":1,\"b\":\"2\"}}]", 0},                       /* b: a number or null */
        {"[{\"name\":\"sub\",\"parameters\":{}}]", 0},                                          /* no such tool */
        {"[]", 0},
        {"[{\"name\":\"now\",\"parameters\":{\"any\":[1,{\"k\":true}]}}]", 1},                   /* no schema: any object */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        assert_int_equal(fl_grammar_guide_new(c, &g), FL_OK);
        const size_t n = strlen(cases[i].text);
        const int ok = fl_grammar_guide_allows(g, cases[i].text, n) == 1 &&
                       fl_grammar_guide_feed(g, cases[i].text, n) == FL_OK && fl_grammar_guide_complete(g);
        fl_grammar_guide_free(g);
        if (ok != cases[i].ok) fail_msg("%s: %d, expected %d\n%s", cases[i].text, ok, cases[i].ok, c);
    }
    cJSON_free(c);
    c = NULL;
    /* an anyOf of more alternatives than a grammar rule takes here: any value */
    char body[8192];
    int o = snprintf(body, sizeof body, "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"p\",\"parameters\":{\"type\":\"object\","
                                        "\"properties\":{\"v\":{\"anyOf\":[");
    for (int k = 0; k < SRV_MAX_TOOLS + 1; k++) o += snprintf(body + o, sizeof body - (size_t)o, "%s{\"const\":%d}", k ? "," : "", k);
    snprintf(body + o, sizeof body - (size_t)o, "]}},\"required\":[\"v\"]}}},{\"type\":\"function\",\"function\":{\"name\":\"q\"}}],"
                                                "\"tool_choice\":\"required\"}");
    assert_int_equal(rd(body, &t, &c, &gr, err), FL_OK);
    assert_true(gr);
    assert_int_equal(fl_grammar_guide_new(c, &g), FL_OK);
    const char *wide = "[{\"name\":\"p\",\"parameters\":{\"v\":\"x\"}}]";
    assert_int_equal(fl_grammar_guide_allows(g, wide, strlen(wide)), 1);
    fl_grammar_guide_free(g);
    cJSON_free(c);
    c = NULL;
    /* without parallel calls: one */
    assert_int_equal(rd(with_tools(",\"tool_choice\":\"required\",\"parallel_tool_calls\":false"), &t, &c, &gr, err), FL_OK);
    assert_int_equal(fl_grammar_guide_new(c, &g), FL_OK);
    const char *two = "[{\"name\":\"now\",\"parameters\":{}},{\"name\":\"now\",\"parameters\":{}}]";
    assert_int_equal(fl_grammar_guide_allows(g, two, strlen(two)), 0);
    fl_grammar_guide_free(g);
    cJSON_free(c);
}

/* tool_choice "auto": the lazy grammar (srv_tools_lazy) fires where a call starts in the
 * family's formats, only in the answer, and from there takes the calls that srv_tools_parse reads
 * back, with the tools' schemas; text a call starts with in the reasoning stays free. */
static int lazy_accepts(const char *gbnf, const char *text) {
    fl_grammar_guide *g = NULL;
    assert_int_equal(fl_grammar_guide_new(gbnf, &g), FL_OK);
    const size_t n = strlen(text);
    const int ok = fl_grammar_guide_allows(g, text, n) == 1 && fl_grammar_guide_feed(g, text, n) == FL_OK && fl_grammar_guide_complete(g);
    fl_grammar_guide_free(g);
    return ok;
}

static void test_lazy(void **state) {
    (void)state;
    srv_tools t;
    char *c = NULL, err[200], *gbnf = NULL;
    bool gr;
    fl_grammar_trigger trig[SRV_TOOLS_TRIGGERS];
    int32_t nt = -1;
    cJSON *tools = cJSON_Parse(TOOLS);
    assert_non_null(tools);
    /* only "auto" has one */
    assert_int_equal(rd(with_tools(",\"tool_choice\":\"none\""), &t, &c, &gr, err), FL_OK);
    assert_int_equal(srv_tools_lazy(&t, tools, &gbnf, trig, &nt), FL_OK);
    assert_null(gbnf);
    assert_int_equal(nt, 0);
    static const struct { const char *text; int json, reasoning, open; int64_t at; } fire[] = {
        {"Sure, let me look that up.", 0, 0, 0, -1},
        {"Sure.\n<tool_call>", 0, 0, 0, 6},
        {"Sure.\n<tool_c", 0, 0, 0, -1},
        {"[TOOL_CALLS]", 0, 0, 0, 0},
        {"  [ {\"name\"", 0, 0, 0, 2},
        {"[1, 2]", 0, 0, 0, -1},
        {"{\"name\"", 0, 0, 0, -1},           /* a bare object is Llama 3's */
        {" {\"name\"", 1, 0, 0, 1},
        {"{\"answer\": 1}", 1, 0, 0, -1},
        {"Well: {\"name\"", 1, 0, 0, -1},     /* only at the answer's start */
        {"<think>I could write <tool_call> here</think>", 0, 1, 0, -1},
        {" <think>maybe <tool_call>", 0, 1, 0, -1},
        {"<think>a</think>\n<tool_call>", 0, 1, 0, 17},
        {"<tool_call>", 0, 1, 0, 0},          /* no reasoning in this output */
        {"<think>a</think> [TOOL_CALLS]", 0, 1, 0, 17},
        {"<think>a</think> {\"name\"", 1, 1, 0, 17},
        {"<think>{\"name\"", 1, 1, 0, -1},
        {"so <tool_call>", 0, 1, 1, -1},      /* the prompt opened the thinking */
        {"so</think><tool_call>", 0, 1, 1, 10},
        {"so</think>{\"name\"", 1, 1, 1, 10},
        {"so</think> [TOOL_CALLS]", 0, 1, 1, 11},
        {"<think>a</think>b</think><tool_call>", 0, 1, 0, 25}, /* (past the first </think>: the answer) */
        {"<think>a</thi", 0, 1, 0, -1},
        {"  <thinking> <tool_call>", 0, 1, 0, 13},               /* not <think> */
        {"ab\x9a{\"name\"", 1, 0, 0, -1},                       /* (a full pattern spans the whole output, invalid bytes and all) */
    };
    for (size_t i = 0; i < sizeof fire / sizeof *fire; i++) {
        t = (srv_tools){.mode = SRV_TOOLS_AUTO, .json_style = fire[i].json, .parallel = true};
        assert_int_equal(srv_tools_lazy(&t, tools, &gbnf, trig, &nt), FL_OK);
        assert_non_null(gbnf);
        assert_true(nt >= 1 && nt <= SRV_TOOLS_TRIGGERS);
        cJSON_free(gbnf);
        /* the text as tokens of 1, 2 and 5 bytes, and whole: where it fires */
        const size_t n = strlen(fire[i].text), steps[4] = {1, 2, 5, n};
        for (int k = 0; k < 4; k++) {
            fl_triggers *x = NULL;
            const int32_t after = !fire[i].reasoning ? 0 : fire[i].open ? 2 : 1;
            assert_int_equal(fl_triggers_new(trig, nt, 100, after, &x), FL_OK);
            int64_t at = -1;
            for (size_t m = 0; m < n && at < 0;) {
                const size_t step = m + steps[k] > n ? n - m : steps[k];
                m += step;
                at = fl_triggers_find(x, fire[i].text, m, step, 0);
            }
            fl_triggers_free(x);
            if (at != fire[i].at) fail_msg("%s (json %d, reasoning %d, open %d, %zu bytes a token): fires at %lld, expected %lld", fire[i].text,
                                           fire[i].json, fire[i].reasoning, fire[i].open, steps[k], (long long)at, (long long)fire[i].at);
        }
    }
    /* what the grammar takes from there; every text it takes is read back as calls */
    static const struct { const char *text; int json, parallel, ok, calls; } cases[] = {
        {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>", 0, 1, 1, 1},
        {"<tool_call>{\"name\":\"add\",\"parameters\":{\"a\":1,\"b\":null}}</tool_call>\n<tool_call>{\"name\":\"now\",\"arguments\":{}}</tool_call>", 0, 1, 1, 2},
        {"<tool_call>{\"name\":\"add\",\"parameters\":{\"a\":1,\"b\":null}}</tool_call>\n<tool_call>{\"name\":\"now\",\"arguments\":{}}</tool_call>", 0, 0, 0, 0},
        {"<tool_call>{\"name\":\"get_wether\",\"arguments\":{\"city\":\"Paris\"}}</tool_call>", 0, 1, 0, 0}, /* no such tool */
        {"<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"days\":\"3\"}}</tool_call>", 0, 1, 0, 0}, /* an integer */
        {"<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"unit\":\"c\"}}</tool_call>", 0, 1, 0, 0},  /* city is required */
        {"<tool_call>{\"name\":\"get_weather\",\"args\":{\"city\":\"Paris\"}}</tool_call>", 0, 1, 0, 0},
        {"[TOOL_CALLS] [{\"name\": \"now\", \"arguments\": {}}, {\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}]", 0, 1, 1, 2},
        {"[TOOL_CALLS] [{\"name\": \"now\", \"arguments\": {}}, {\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}]", 0, 0, 0, 0},
        {"[{\"name\":\"now\",\"parameters\":{\"any\":[1]}}]", 0, 0, 1, 1},
        {"{\"name\":\"now\",\"parameters\":{}}", 0, 1, 0, 0},
        {"{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}", 1, 1, 1, 1},
        {"{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}\n{\"name\": \"now\", \"parameters\": {}}", 1, 1, 1, 2},
        {"{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}\n{\"name\": \"now\", \"parameters\": {}}", 1, 0, 0, 0},
        {"{\"name\": \"add\", \"parameters\": {\"a\": \"1\", \"b\": 2}}", 1, 1, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        t = (srv_tools){.mode = SRV_TOOLS_AUTO, .json_style = cases[i].json, .parallel = cases[i].parallel};
        assert_int_equal(srv_tools_lazy(&t, tools, &gbnf, trig, &nt), FL_OK);
        const int ok = lazy_accepts(gbnf, cases[i].text);
        if (ok != cases[i].ok) fail_msg("%s (json %d, parallel %d): %d, expected %d\n%s", cases[i].text, cases[i].json, cases[i].parallel, ok,
                                        cases[i].ok, gbnf);
        cJSON_free(gbnf);
        if (!ok) continue;
        srv_buf content = {0};
        const char *pre = "Let me check.\n";
        char txt[512];
        snprintf(txt, sizeof txt, "%s%s", cases[i].text[0] == '<' ? pre : "", cases[i].text);
        cJSON *calls = srv_tools_parse(&t, txt, strlen(txt), 1, true, &content);
        if (cJSON_GetArraySize(calls) != cases[i].calls) fail_msg("%s: %d calls read", txt, cJSON_GetArraySize(calls));
        if (cases[i].text[0] == '<') assert_memory_equal(content.p, "Let me check.", content.len);
        else assert_int_equal(content.len, 0);
        cJSON_Delete(calls);
        srv_buf_free(&content);
    }
    cJSON_Delete(tools);
}

/* vLLM's structural_tag: each structure's begin, a value of its schema, its end; the triggers as
 * words; refusals */
static void test_structural_tag(void **state) {
    (void)state;
    char err[200], *gbnf = NULL;
    fl_grammar_trigger trig[FL_MAX_TRIGGERS];
    int32_t nt = 0;
    cJSON *st = cJSON_Parse("{\"structures\":[{\"begin\":\"<f=add>\",\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
                            "\"required\":[\"a\"]},\"end\":\"</f>\"},{\"begin\":\"<f=now>\",\"end\":\"\"}],\"triggers\":[\"<f=\"]}");
    assert_int_equal(srv_structural_tag(st, &gbnf, trig, &nt, err, sizeof err), FL_OK);
    assert_int_equal(nt, 1);
    assert_int_equal(trig[0].type, FL_TRIGGER_WORD);
    assert_string_equal(trig[0].value, "<f=");
    static const struct { const char *text; int ok; } cases[] = {
        {"<f=add>{\"a\": 3}</f>", 1}, {"<f=add> {\"a\":-3} </f>", 1}, {"<f=now>[1, \"x\"]", 1}, {"<f=now> {}", 1},
        {"<f=add>{\"a\": \"3\"}</f>", 0}, {"<f=add>{\"a\": 3}", 0}, {"<f=sub>{}</f>", 0}, {"<f=add>{\"a\": 3}</f>x", 0},
        {"<f=now>{} ", 0}, /* (no end: nothing after the value) */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        if (lazy_accepts(gbnf, cases[i].text) != cases[i].ok) fail_msg("%s: expected %d\n%s", cases[i].text, cases[i].ok, gbnf);
    cJSON_free(gbnf);
    cJSON_Delete(st);
    static const char *const bad[] = {
        "{\"structures\":[]}", "{\"structures\":[{\"begin\":\"x\",\"end\":\"y\"}]}", "{\"structures\":[{\"begin\":\"x\",\"end\":\"y\"}],\"triggers\":[\"z\"]}",
        "{\"structures\":[{\"begin\":\"x\",\"end\":\"y\",\"schema\":false}],\"triggers\":[\"x\"]}", "{\"structures\":[{\"begin\":\"\",\"end\":\"y\"}],\"triggers\":[\"x\"]}",
        "{\"structures\":[{\"begin\":\"x\",\"end\":\"y\"}],\"triggers\":[\"\"]}", "{\"format\":{}}", "[]"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cJSON *b = cJSON_Parse(bad[i]);
        assert_non_null(b);
        if (srv_structural_tag(b, &gbnf, trig, &nt, err, sizeof err) != FL_ERR_INVALID) fail_msg("%s: not refused", bad[i]);
        assert_null(gbnf);
        cJSON_Delete(b);
    }
}

static void test_hold(void **state) {
    (void)state;
    srv_tools t = {.mode = SRV_TOOLS_AUTO};
    static const struct { const char *text; size_t hold; bool json; } cases[] = {
        {"Hello", 5, false},
        {"Hello <tool", 6, false},
        {"Hello <tool_call>{\"na", 6, false},
        {"a < b and <br>", 14, false},
        {"x <", 2, false},
        {"  {\"name\"", 0, true},
        {"   ", 0, true},
        {"Hi {", 4, true},
        {"Hi <tool_call>", 3, true},
        {" [", 0, false},
        {"[TOOL_C", 0, false},
        {"[TOOL_CALLS][{\"name\"", 0, false},
        {"[ {", 0, false},
        {"[1] see", 7, false},
        {"[link](x) <tool_call>", 10, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        t.json_style = cases[i].json;
        assert_int_equal(srv_tools_hold(&t, cases[i].text, strlen(cases[i].text), 0), cases[i].hold);
    }
    t.mode = SRV_TOOLS_NONE;
    assert_int_equal(srv_tools_hold(&t, "<tool_call>", 11, 0), 11);
    t.mode = SRV_TOOLS_REQUIRED;
    assert_int_equal(srv_tools_hold(&t, "[{", 2, 0), 0);
    /* from: the scan starts where the bytes streamed end (a tag held there stays held) */
    t.mode = SRV_TOOLS_AUTO;
    assert_int_equal(srv_tools_hold(&t, "ab <tool_call>", 14, 3), 3);
    assert_int_equal(srv_tools_hold(&t, "ab <tool_call>", 14, 9), 14); /* (nothing starts after byte 9) */
}

/* parse text; expect the calls as "name args" joined by "|" (NULL: none) and the content */
static void expect(const srv_tools *t, const char *text, const char *calls, const char *content) {
    srv_buf c = {0}, got = {0};
    cJSON *a = srv_tools_parse(t, text, strlen(text), 7, true, &c);
    if (!calls) assert_null(a);
    else {
        assert_non_null(a);
        const cJSON *x;
        cJSON_ArrayForEach(x, a) {
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(x, "function");
            assert_string_equal(cJSON_GetObjectItemCaseSensitive(x, "type")->valuestring, "function");
            assert_int_equal(strncmp(cJSON_GetObjectItemCaseSensitive(x, "id")->valuestring, "call_", 5), 0);
            assert_int_equal(strlen(cJSON_GetObjectItemCaseSensitive(x, "id")->valuestring), 29);
            srv_buf_printf(&got, "%s%s %s", got.len ? "|" : "", cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring,
                           cJSON_GetObjectItemCaseSensitive(f, "arguments")->valuestring);
        }
        if (strcmp(got.p, calls)) fail_msg("%s: calls '%s', expected '%s'", text, got.p, calls);
    }
    srv_buf_append(&c, "", 0);
    if (strcmp(c.p ? c.p : "", content)) fail_msg("%s: content '%s', expected '%s'", text, c.p, content);
    cJSON_Delete(a);
    srv_buf_free(&c);
    srv_buf_free(&got);
}

static void test_parse(void **state) {
    (void)state;
    srv_tools t = {.mode = SRV_TOOLS_AUTO};
    expect(&t, "no calls here", NULL, "no calls here");
    expect(&t, "Sure.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>", "add {\"a\":1,\"b\":2}", "Sure.");
    /* two calls, arguments given as text, a last one the output ends in without its tag */
    expect(&t, "<tool_call>{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}</tool_call> and <tool_call>{\"name\":\"g\",\"parameters\":{}}",
           "f {\"x\":1}|g {}", "and");
    /* one block with two objects */
    expect(&t, "<tool_call>{\"name\":\"f\",\"arguments\":{}}\n{\"name\":\"g\",\"arguments\":{\"y\":[1]}}</tool_call>", "f {}|g {\"y\":[1]}", "");
    /* a block that is not a call stays content */
    expect(&t, "<tool_call>not json</tool_call>", NULL, "<tool_call>not json</tool_call>");
    expect(&t, "a <tool_call>{\"arguments\":{}}</tool_call> b <tool_call>{\"name\":\"h\"}</tool_call>", "h {}",
           "a <tool_call>{\"arguments\":{}}</tool_call> b");
    /* an array of calls, bare or after Mistral's [TOOL_CALLS]; an array that is not all calls is content */
    expect(&t, " [TOOL_CALLS] [{\"name\":\"f\",\"arguments\":{\"a\":1}},{\"name\":\"g\",\"arguments\":{}}]", "f {\"a\":1}|g {}", "");
    expect(&t, "[{\"name\":\"f\",\"parameters\":{}}]\n", "f {}", "");
    expect(&t, "[{\"name\":\"f\",\"parameters\":{}}, 3]", NULL, "[{\"name\":\"f\",\"parameters\":{}}, 3]");
    expect(&t, "[{\"name\":\"f\"}] and more", NULL, "[{\"name\":\"f\"}] and more");
    expect(&t, "[1] <tool_call>{\"name\":\"h\",\"arguments\":{}}</tool_call>", "h {}", "[1]");
    /* Llama 3: bare objects, one or several */
    t.json_style = true;
    expect(&t, " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "get_weather {\"city\":\"Paris\"}", "");
    expect(&t, "{\"name\":\"f\",\"parameters\":{}}; {\"name\":\"g\",\"parameters\":{\"z\":null}}", "f {}|g {\"z\":null}", "");
    expect(&t, "{\"city\": \"Paris\"}", NULL, "{\"city\": \"Paris\"}");
    expect(&t, "Sure <tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>", "f {}", "Sure");
    /* required: the array; cut short, the text as content */
    t = (srv_tools){.mode = SRV_TOOLS_REQUIRED};
    expect(&t, "[{\"name\":\"f\",\"parameters\":{\"a\":1}},{\"name\":\"g\",\"parameters\":{}}]", "f {\"a\":1}|g {}", "");
    expect(&t, "[{\"name\":\"f\",\"parameters\":{\"a\":", NULL, "[{\"name\":\"f\",\"parameters\":{\"a\":");
    /* a named function: the output is its arguments */
    t = (srv_tools){.mode = SRV_TOOLS_NAMED};
    strcpy(t.named, "f");
    expect(&t, " {\"a\": 1} ", "f {\"a\": 1}", "");
    /* none: content */
    t = (srv_tools){.mode = SRV_TOOLS_NONE};
    expect(&t, "<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>", NULL, "<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>");
    /* untrimmed content, as streaming reads it */
    t = (srv_tools){.mode = SRV_TOOLS_AUTO};
    srv_buf c = {0};
    const char *txt = "Sure.\n<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>\n", *call = txt + 6;
    cJSON *a = srv_tools_parse(&t, txt, strlen(txt), 7, false, &c);
    assert_non_null(a);
    assert_int_equal(c.len, 7);
    assert_memory_equal(c.p, "Sure.\n\n", 7);
    /* the ids: the same seed gives the same ones, another seed others */
    srv_buf c2 = {0};
    cJSON *b = srv_tools_parse(&t, call, strlen(call), 7, false, &c2);
    cJSON *d = srv_tools_parse(&t, call, strlen(call), 8, false, &c2);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(a->child, "id")->valuestring, cJSON_GetObjectItemCaseSensitive(b->child, "id")->valuestring);
    assert_string_not_equal(cJSON_GetObjectItemCaseSensitive(b->child, "id")->valuestring, cJSON_GetObjectItemCaseSensitive(d->child, "id")->valuestring);
    cJSON_Delete(a), cJSON_Delete(b), cJSON_Delete(d);
    srv_buf_free(&c), srv_buf_free(&c2);
}

/* the chat templates' tool turns: the preamble in the system turn (its own where the messages
 * have none), an assistant's calls, a tool's result */
static void render(const char *tmpl, const char *msgs, const char *tools, const char *want) {
    cJSON *m = cJSON_Parse(msgs), *t = tools ? cJSON_Parse(tools) : NULL;
    srv_buf out = {0};
    const char *err = NULL;
    assert_int_equal(srv_chat_render(tmpl, m, t, &out, &err), FL_OK);
    srv_buf_append(&out, "", 0);
    if (strcmp(out.p, want)) fail_msg("rendered:\n%s\nexpected:\n%s", out.p, want);
    srv_buf_free(&out);
    cJSON_Delete(m);
    cJSON_Delete(t);
}

static void test_render(void **state) {
    (void)state;
    const char *tools = "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]";
    const char *msgs = "[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":"
                       "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\","
                       "\"content\":\"42\"}]";
    render("{% ... <|im_start|> ... %}", msgs, tools,
           "<|im_start|>system\n# Tools\n\nYou can call the functions whose signatures are inside <tools></tools>, one per line:\n<tools>\n"
           "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}\n</tools>\n\nTo call one, write a JSON object with its name and arguments "
           "inside <tool_call></tool_call> tags:\n<tool_call>\n{\"name\": <function name>, \"arguments\": <arguments object>}\n</tool_call><|im_end|>\n"
           "<|im_start|>user\nhi<|im_end|>\n"
           "<|im_start|>assistant\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\":1}}\n</tool_call><|im_end|>\n"
           "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
    const char *sys_msgs = "[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"hi\"},"
                           "{\"role\":\"assistant\",\"content\":\"ok\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":{}}}]},"
                           "{\"role\":\"tool\",\"content\":\"42\"}]";
    render("<|start_header_id|>", sys_msgs, tools,
           "<|start_header_id|>system<|end_header_id|>\n\nBe brief.\n\nYou can call the functions below. To call one, answer with only a JSON "
           "object {\"name\": the function's name, \"parameters\": an object of its arguments}.\n\n{\"type\":\"function\",\"function\":{\"name\":\"f\"}}\n"
           "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
           "<|start_header_id|>assistant<|end_header_id|>\n\nok\n{\"name\": \"f\", \"parameters\": {}}<|eot_id|>"
           "<|start_header_id|>ipython<|end_header_id|>\n\n42<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    /* without tools, as before */
    render("<|im_start|>", "[{\"role\":\"user\",\"content\":\"hi\"}]", NULL, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    /* bad tool calls */
    cJSON *m = cJSON_Parse("[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"arguments\":\"{}\"}}]}]");
    srv_buf out = {0};
    const char *err = NULL;
    assert_int_equal(srv_chat_render("<|im_start|>", m, NULL, &out, &err), FL_ERR_INVALID);
    assert_non_null(strstr(err, "each tool call needs"));
    srv_buf_free(&out);
    cJSON_Delete(m);
}

static void render_fl(const char *tmpl, const char *msgs, unsigned flags, const char *want) {
    cJSON *m = cJSON_Parse(msgs);
    srv_buf out = {0};
    const char *err = NULL;
    assert_int_equal(srv_chat_render_ex(tmpl, m, NULL, flags, &out, &err), FL_OK);
    srv_buf_append(&out, "", 0);
    if (strcmp(out.p, want)) fail_msg("rendered (flags %u):\n%s\nexpected:\n%s", flags, out.p, want);
    srv_buf_free(&out);
    cJSON_Delete(m);
}

/* vLLM's add_generation_prompt false and continue_final_message: no generation prompt; the last
 * message, the assistant's, left open in each family's format (and, in R1's, with its thinking) */
static void test_render_continue(void **state) {
    (void)state;
    const char *ua = "[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"Once upon\"}]";
    const char *u = "[{\"role\":\"user\",\"content\":\"hi\"}]";
    const unsigned C = SRV_CHAT_CONTINUE | SRV_CHAT_NO_GEN_PROMPT;
    render_fl("<|im_start|>", ua, C, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nOnce upon");
    render_fl("<|im_start|>", ua, SRV_CHAT_NO_GEN_PROMPT, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nOnce upon<|im_end|>\n");
    render_fl("<|im_start|>", u, SRV_CHAT_NO_GEN_PROMPT, "<|im_start|>user\nhi<|im_end|>\n");
    render_fl("<|start_header_id|>", ua, C,
              "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nOnce upon");
    render_fl("<|user|> <|end|>", ua, C, "<|user|>\nhi<|end|>\n<|assistant|>\nOnce upon");
    render_fl("[INST]", ua, C, "[INST] hi [/INST] Once upon");
    render_fl(NULL, ua, C, "User: hi\nAssistant: Once upon");
    render_fl(NULL, u, 0, "User: hi\nAssistant:");
    const char *ds = "<\xEF\xBD\x9CUser\xEF\xBD\x9C> <\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>";
    render_fl(ds, "[{\"role\":\"user\",\"content\":\"1+1?\"},{\"role\":\"assistant\",\"content\":\"<think>\\nadd\\n</think>\\n\\n2\"}]", C,
              "<\xEF\xBD\x9CUser\xEF\xBD\x9C>1+1?<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C><think>\nadd\n</think>\n\n2");
    /* refused: both on; a last message that is not the assistant's */
    static const struct { const char *msgs; unsigned flags; const char *err; } bad[] = {
        {"[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"a\"}]", SRV_CHAT_CONTINUE, "cannot both be true"},
        {"[{\"role\":\"user\",\"content\":\"hi\"}]", SRV_CHAT_CONTINUE | SRV_CHAT_NO_GEN_PROMPT, "must be the assistant's"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cJSON *m = cJSON_Parse(bad[i].msgs);
        srv_buf out = {0};
        const char *err = NULL;
        assert_int_equal(srv_chat_render_ex("<|im_start|>", m, NULL, bad[i].flags, &out, &err), FL_ERR_INVALID);
        assert_non_null(strstr(err, bad[i].err));
        assert_int_equal(out.len, 0);
        srv_buf_free(&out);
        cJSON_Delete(m);
    }
}

/* Feed text to a call scan a byte at a time (and whole, in one go); collect "name=args;" per call
 * and return the scan's end state. */
/* The calls of text read piece by piece (bytewise: as it grows a byte at a time), names and
 * arguments into got as "name=args;..."; auto: tool_choice "auto" from h (srv_tools_auto_start),
 * else "required" (a zeroed scan).  1 past the array, -1 off the pattern, -2 no call starts
 * (auto), else 0. */
static int scan_calls(const srv_tools *aut, size_t h, const char *text, bool bytewise, char *got, size_t cap) {
    srv_call_scan c;
    memset(&c, 0, sizeof c);
    const size_t n = strlen(text);
    got[0] = 0;
    char args[8][256] = {{0}}, names[8][64] = {{0}};
    int32_t ncalls = 0;
    bool started = !aut;
    for (size_t m = bytewise ? 0 : n; m <= n; m++) {
        int32_t k;
        size_t a, e;
        srv_call_piece p;
        if (!started) {
            const int st = srv_tools_auto_start(aut, text, m, h, &c);
            if (st < 0) return -2;
            if (!(started = st > 0)) continue;
        }
        while ((p = srv_calls_next(&c, text, m, m == n, &k, &a, &e)) != SRV_CALL_NONE) {
            assert_true(k >= 0 && k < 8 && a <= e && e <= m);
            if (p == SRV_CALL_HEADER) {
                assert_int_equal(k, ncalls);
                ncalls++;
                snprintf(names[k], sizeof names[k], "%.*s", (int)(e - a), text + a);
            } else {
                assert_true(k == ncalls - 1);
                strncat(args[k], text + a, e - a);
            }
        }
    }
    if (!started) return -2;
    for (int32_t k = 0; k < ncalls; k++) {
        strncat(got, names[k], cap - strlen(got) - 1);
        strncat(got, "=", cap - strlen(got) - 1);
        strncat(got, args[k], cap - strlen(got) - 1);
        strncat(got, ";", cap - strlen(got) - 1);
    }
    return srv_calls_done(&c) ? 1 : srv_calls_off(&c) ? -1 : 0;
}

static int scan_all(const char *text, bool bytewise, char *got, size_t cap) { return scan_calls(NULL, 0, text, bytewise, got, cap); }

/* tool_choice "required" streamed: each call's name as soon as it is whole, its arguments as
 * they come (raw), byte by byte the same as whole; off the pattern, no more pieces */
static void test_calls_stream(void **state) {
    (void)state;
    static const struct { const char *text; int end; const char *want; } cases[] = {
        {"[{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris \\\"}{\", \"days\": [1, {\"x\": 2}]}}]", 1,
         "get_weather={\"city\": \"Paris \\\"}{\", \"days\": [1, {\"x\": 2}]};"},
        {" [ {\"name\":\"a\",\"parameters\":{}} , {\"name\": \"b\", \"arguments\": {\"q\": \"\xC3\xA9\"}} ] ", 1, "a={};b={\"q\": \"\xC3\xA9\"};"},
        {"[{\"name\": \"n\", \"parameters\": 12}]", 1, "n=12;"},
        {"[{\"name\": \"s\", \"parameters\": \"a,b}\"}]", 1, "s=\"a,b}\";"},
        {"[{\"name\": \"t\", \"parameters\": {\"a\": 1", 0, "t={\"a\": 1;"},                   /* cut by max_tokens */
        {"[{\"parameters\": {}, \"name\": \"x\"}]", -1, ""},                                   /* name second: off */
        {"{\"name\": \"x\"}", -1, ""},                                                         /* not an array */
        {"[{\"name\": \"x\", \"parameters\": {}}, 7]", -1, "x={};"},                           /* off after a call */
        {"[{\"name\": \"a\\\"b\", \"parameters\": {}}]", -1, ""},                             /* an escape in the name */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        for (int bw = 0; bw < 2; bw++) {
            char got[512];
            const int end = scan_all(cases[i].text, bw, got, sizeof got);
            if (end != cases[i].end || strcmp(got, cases[i].want))
                fail_msg("case %zu (%s): end %d '%s', expected %d '%s'", i, bw ? "bytewise" : "whole", end, got, cases[i].end, cases[i].want);
        }
    char id[40], id2[40];
    srv_tools_call_id(5, 1, id, sizeof id);
    srv_buf content = {0};
    srv_tools t = {.mode = SRV_TOOLS_REQUIRED};
    const char *two = "[{\"name\": \"a\", \"parameters\": {}}, {\"name\": \"b\", \"parameters\": {}}]";
    cJSON *calls = srv_tools_parse(&t, two, strlen(two), 5, false, &content);
    assert_non_null(calls);
    snprintf(id2, sizeof id2, "%s", cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(calls, 1), "id")->valuestring);
    assert_string_equal(id, id2); /* the streamed calls' ids are the reply's */
    cJSON_Delete(calls);
    srv_buf_free(&content);

    /* tool_choice "auto": from where the hold stops, the family's forms piece by piece; each
     * whole output's calls are the ones srv_tools_parse reads */
    static const struct { const char *text; int json, end; const char *want; } au[] = {
        {"Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", 0, 0,
         "get_weather={\"city\": \"Paris\"};"},
        {"<tool_call>{\"name\":\"a\",\"arguments\":{\"s\":\"</tool_call>\"}}</tool_call>\n<tool_call>{\"name\":\"b\",\"parameters\":7}</tool_call>", 0, 0,
         "a={\"s\":\"</tool_call>\"};b=7;"},
        {"[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": {\"x\": [1]}}]", 0, 1, "a={};b={\"x\": [1]};"},
        {" [{\"name\": \"a\", \"arguments\": {}}]", 0, 1, "a={};"},
        {"{\"name\": \"a\", \"parameters\": {\"k\": 1}}\n{\"name\": \"b\", \"parameters\": {}}", 1, 0, "a={\"k\": 1};b={};"},
        {"{\"name\": \"a\", \"parameters\": {}}", 0, -2, ""},            /* a bare object is Llama 3's */
        {"[1, 2]", 0, -2, ""},                                                   /* an array, of no calls */
        {"Well [{\"name\": \"a\", \"arguments\": {}}]", 0, -2, ""},        /* not at the answer's start */
        {"<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call> and more", 0, -1, "a={};"}, /* content after: off (whole at the end) */
        {"<tool_call>{\"arguments\": {}, \"name\": \"a\"}</tool_call>", 0, -1, ""},
    };
    for (size_t i = 0; i < sizeof au / sizeof *au; i++) {
        srv_tools ta = {.mode = SRV_TOOLS_AUTO, .json_style = au[i].json, .parallel = true};
        const size_t n = strlen(au[i].text), h = srv_tools_hold(&ta, au[i].text, n, 0);
        for (int bw = 0; bw < 2; bw++) {
            char got[512];
            const int end = scan_calls(&ta, h, au[i].text, bw, got, sizeof got);
            if (end != au[i].end || strcmp(got, au[i].want))
                fail_msg("auto case %zu (%s): end %d '%s', expected %d '%s'", i, bw ? "bytewise" : "whole", end, got, au[i].end, au[i].want);
        }
        if (au[i].end < 0) continue;
        cJSON *cl = srv_tools_parse(&ta, au[i].text, n, 5, true, &content);
        char got[512] = "";
        const cJSON *x;
        cJSON_ArrayForEach(x, cl) {
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(x, "function");
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s;", cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring);
        }
        char names[512] = "";
        for (const char *p = au[i].want, *q; (q = strchr(p, '=')); p = strchr(q, ';') ? strchr(q, ';') + 1 : q + strlen(q))
            snprintf(names + strlen(names), sizeof names - strlen(names), "%.*s;", (int)(q - p), p);
        if (strcmp(got, names)) fail_msg("auto case %zu: the reply reads %s, the stream %s", i, got, names);
        cJSON_Delete(cl);
    }
    srv_buf_free(&content);
}

/* where reasoning and answer are, whole and as a stream sees them */
/* srv_call_delta: a chat delta's tool_calls entry; its index where it is an integer in int32_t's
 * range, else the entry's place (fuzz_dialects found an index of 8.9e41 cast to int32_t) */
static void test_call_delta(void **state) {
    (void)state;
    const char *idx[] = {"0", "7", "2147483647", "-1", "2147483648", "8.888888888e41", "1.5", "\"3\"", "null", NULL};
    const int32_t want[] = {0, 7, 2147483647, 5, 5, 5, 5, 5, 5, 5};
    for (int i = 0; i < 10; i++) {
        char body[160];
        if (idx[i]) snprintf(body, sizeof body, "{\"index\":%s,\"id\":\"c1\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}", idx[i]);
        else snprintf(body, sizeof body, "{\"function\":{\"arguments\":\"{}\"}}");
        cJSON *tc = cJSON_Parse(body);
        assert_non_null(tc);
        srv_call_piece_in p;
        const bool starts = srv_call_delta(tc, 5, &p);
        if (p.index != want[i]) fail_msg("index %s: %d, want %d", idx[i] ? idx[i] : "(none)", (int)p.index, (int)want[i]);
        assert_true(starts == (idx[i] != NULL));
        assert_string_equal(p.args, "{}");
        cJSON_Delete(tc);
    }
}

static void test_think(void **state) {
    (void)state;
    static const struct { const char *t; bool open, final; srv_think want; size_t r0, r1, c; } cases[] = {
        {"<think>\nabc\n</think>\n\nYes.", false, true, SRV_THINK_DONE, 7, 12, 20},
        {"  <think>a</think>b", false, true, SRV_THINK_DONE, 9, 10, 18},
        {"Yes. <think>a</think>", false, true, SRV_THINK_NONE, 0, 0, 0},         /* not at the start: all answer */
        {"abc</think>Yes", true, true, SRV_THINK_DONE, 0, 3, 11},                 /* the prompt opened it */
        {"abc</think>Yes", false, true, SRV_THINK_NONE, 0, 0, 0},
        {"<think>abc", false, true, SRV_THINK_DONE, 7, 10, 10},                   /* never closed: all reasoning */
        {"abc", true, true, SRV_THINK_DONE, 0, 3, 3},
        /* streaming: not yet known, reasoning so far (a part of the closing tag held), decided */
        {"", false, false, SRV_THINK_UNDECIDED, 0, 0, 0},
        {" \n<thi", false, false, SRV_THINK_UNDECIDED, 0, 0, 0},
        {"<tho", false, false, SRV_THINK_NONE, 0, 0, 0},
        {"<think>ab</thi", false, false, SRV_THINK_IN, 7, 9, 0},
        {"<think>ab<", false, false, SRV_THINK_IN, 7, 9, 0},
        {"<think>a<b", false, false, SRV_THINK_IN, 7, 10, 0},
        {"ab</think>", true, false, SRV_THINK_DONE, 0, 2, 10},
        {"ab", true, false, SRV_THINK_IN, 0, 2, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t r0, r1, c;
        const srv_think th = srv_think_scan(cases[i].t, strlen(cases[i].t), cases[i].open, cases[i].final, 0, &r0, &r1, &c);
        if (th != cases[i].want || r0 != cases[i].r0 || r1 != cases[i].r1 || c != cases[i].c)
            fail_msg("'%s' (open %d, final %d): %d %zu %zu %zu, expected %d %zu %zu %zu", cases[i].t, cases[i].open, cases[i].final,
                     (int)th, r0, r1, c, (int)cases[i].want, cases[i].r0, cases[i].r1, cases[i].c);
    }
    /* DeepSeek-R1's template: the system text bare, the turns' markers, an earlier answer without
     * its thinking, the thinking opened for the answer */
    const char *ds = "{{bos_token}}... <\xEF\xBD\x9CUser\xEF\xBD\x9C> ... <\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>";
    assert_true(srv_chat_think_open(ds));
    assert_false(srv_chat_think_open("<|im_start|>"));
    render(ds, "[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"1+1?\"},"
               "{\"role\":\"assistant\",\"content\":\"<think>\\nadd\\n</think>\\n\\n2\"},{\"role\":\"user\",\"content\":\"2+2?\"}]", NULL,
           "Be brief.<\xEF\xBD\x9CUser\xEF\xBD\x9C>1+1?<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>2<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence"
           "\xEF\xBD\x9C><\xEF\xBD\x9CUser\xEF\xBD\x9C>2+2?<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C><think>\n");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_render_continue),
        cmocka_unit_test(test_calls_stream),
        cmocka_unit_test(test_read), cmocka_unit_test(test_required), cmocka_unit_test(test_lazy), cmocka_unit_test(test_structural_tag), cmocka_unit_test(test_hold),
        cmocka_unit_test(test_parse), cmocka_unit_test(test_render), cmocka_unit_test(test_think), cmocka_unit_test(test_call_delta),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
