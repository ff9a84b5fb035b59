/* JSON Schema constrained decoding: the compiler (engine/json_schema.c) and the recognizer in
 * schema mode (engine/json_fsm.c), checked against documents written by hand and against a
 * plain validator written here from the JSON Schema rules of the supported keywords. */
#include "test.h"

#include "engine/json_fsm.h"
#include "engine/json_schema.h"

#include <cjson/cJSON.h>
#include <regex.h>
#include <stdlib.h>
#include <string.h>

static fl_json_schema *compile_ok(const char *schema) {
    fl_json_schema *s = NULL;
    const fl_status st = fl_json_schema_compile(schema, &s);
    if (st != FL_OK) fail_msg("schema refused: %s: %s", schema, fl_last_error());
    return s;
}

/* 1 = the whole text is one complete value, 0 = a prefix only, -1 = rejected; the same answer
 * whatever the split into two feeds */
static int check(const fl_json_schema *s, const char *t) {
    const int32_t n = (int32_t)strlen(t);
    int first = 2;
    for (int32_t cut = 0; cut <= n; cut++) {
        fl_json_fsm f, g;
        fl_json_fsm_init_schema(&f, s);
        int r = -1;
        if (fl_json_fsm_feed(&f, t, cut)) {
            fl_json_fsm_copy(&g, &f); /* a copy carries on as the original */
            r = fl_json_fsm_feed(&g, t + cut, n - cut) ? fl_json_fsm_done(&g) : -1;
        }
        if (first == 2) first = r;
        if (r != first) fail_msg("'%s' split at %d answers %d, whole %d", t, cut, r, first);
    }
    return first;
}

typedef struct doc_case {
    const char *doc;
    int want;
} doc_case;

static void run_cases(const char *schema, const doc_case *c, size_t n) {
    fl_json_schema *s = compile_ok(schema);
    for (size_t i = 0; i < n; i++) {
        const int got = check(s, c[i].doc);
        if (got != c[i].want) fail_msg("schema %s\n  doc %s: %d, want %d", schema, c[i].doc, got, c[i].want);
    }
    fl_json_schema_free(s);
}
#define CASES(schema, ...)                                                       \
    do {                                                                         \
        const doc_case c_[] = {__VA_ARGS__};                                     \
        run_cases(schema, c_, sizeof c_ / sizeof *c_);                           \
    } while (0)

static void test_objects(void **state) {
    (void)state;
    const char *person = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
                         "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}},\"required\":[\"name\",\"age\"]}";
    /* the members in declared order (OpenAI's structured outputs, llama.cpp, xgrammar): an
     * optional one may be left out, a required one not */
    CASES(person, {"{\"name\":\"Al\",\"age\":3}", 1}, {"{\"age\":3,\"name\":\"Al\"}", -1}, {"{\"age\"", -1},
          {"{\"name\":\"Al\",\"tags\"", -1}, {"{\"name\":\"Al\",\"tags\":[],\"age\":3}", -1}, {"{\"name\":\"Al\",\"age\":3,\"tags\":[\"x\"]}", 1},
          {" {\"name\" : \"Al\" ,\n \"age\": 30, \"tags\": [\"a\", \"b\"]}", 1}, {"{\"name\":\"Al\",\"age\":3.5}", -1},
          {"{\"name\":\"Al\",\"age\":3e2}", -1}, {"{\"name\":\"Al\"}", -1}, {"{\"name\":\"Al\"", 0}, {"{}", -1},
          {"{\"nam\":1}", -1}, {"{\"names\":1}", -1}, {"{\"name\":1}", -1}, {"{\"name\":\"A\",\"name\":\"B\",\"age\":1}", -1},
          {"{\"name\":\"A\",\"age\":1,\"x\":1}", -1}, {"{\"name\":\"A\",\"age\":1,\"tags\":[1]}", -1},
          {"{\"name\":\"A\",\"age\":1,\"tags\":[]}", 1}, {"{\"na", 0}, {"{\"x", -1}, {"[]", -1}, {"\"s\"", -1},
          {"{\"name\":\"Al\",\"age\":-0}", 1}, {"{\"name\":\"Al\",\"age\":-", 0});
    /* every property given: no comma may follow */
    CASES("{\"properties\":{\"a\":{\"type\":\"boolean\"}}}", {"{\"a\":true}", 1}, {"{\"a\":true,", -1}, {"{}", 1},
          {"{\"a\":null}", -1}, {"{\"a\":false}", 1});
    /* additionalProperties: a schema for the others; true: anything; an object with no
     * properties takes any members */
    CASES("{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}},\"additionalProperties\":{\"type\":\"string\"}}",
          {"{\"id\":1,\"x\":\"y\",\"z\":\"w\"}", 1}, {"{\"x\":1}", -1}, {"{\"i\":\"d\",\"id\":2}", 1}, {"{\"id\":1,\"id\":2}", -1},
          {"{\"ids\":\"s\"}", 1}, {"{\"id\":\"s\"}", -1});
    CASES("{\"type\":\"object\"}", {"{\"a\":[1,{\"b\":null}],\"c\":\"d\"}", 1}, {"{}", 1}, {"[]", -1});
    CASES("{\"type\":\"object\",\"additionalProperties\":false}", {"{}", 1}, {"{\"a\":1}", -1}, {"{ }", 1});
    /* whitespace: one space, or one or two newlines and an indent of up to 20 */
    CASES("{\"type\":\"object\"}", {"\n{\n\n\t  \"a\" :\n 1 }", 1}, {"{  }", -1}, {"{\n\n\n}", -1}, {"{ \n}", -1}, {"{\t}", -1},
          {"{\n                    }", 1}, {"{\n                     }", -1}, {"{\r\n}", -1}, {"{\n \n}", -1});
    /* names with escapes must come in the escaped form the schema prints */
    CASES("{\"properties\":{\"a\\\"b\":{\"type\":\"null\"},\"\xc3\xa9\":{\"type\":\"null\"}},\"required\":[\"a\\\"b\"]}",
          {"{\"a\\\"b\":null}", 1}, {"{\"a\\\"b\":null,\"\xc3\xa9\":null}", 1}, {"{\"\xc3\xa9\":null,\"a\\\"b\":null}", -1},
          {"{\"ab\":null}", -1});
    /* optional members in order, any of them left out; with others allowed, these anywhere */
    CASES("{\"properties\":{\"a\":{\"type\":\"null\"},\"b\":{\"type\":\"null\"},\"c\":{\"type\":\"null\"}}}", {"{\"a\":null,\"c\":null}", 1},
          {"{\"b\":null,\"c\":null}", 1}, {"{\"c\":null,\"a\":null}", -1}, {"{\"c\":null,", -1}, {"{\"b\":null,\"b\"", -1});
    CASES("{\"properties\":{\"a\":{\"type\":\"null\"},\"b\":{\"type\":\"null\"}},\"additionalProperties\":true}",
          {"{\"x\":1,\"a\":null,\"y\":2,\"b\":null,\"z\":3}", 1}, {"{\"b\":null,\"a\":null}", -1});
    fl_test_mem_zero();
}

static void test_scalars(void **state) {
    (void)state;
#define W "{\"type\":\"object\",\"properties\":{\"v\":%s},\"required\":[\"v\"]}"
    char sch[512];
    snprintf(sch, sizeof sch, W, "{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}");
    CASES(sch, {"{\"v\":\"ab\"}", 1}, {"{\"v\":\"abc\"}", 1}, {"{\"v\":\"a\"}", -1}, {"{\"v\":\"abcd\"}", -1},
          {"{\"v\":\"\\n\\u00e9\"}", 1}, {"{\"v\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}", 1},
          {"{\"v\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80x\"}", -1});
    /* a surrogate only as a pair, high then low (cJSON, strict, refuses lone ones), in values,
     * keys and json_object's strings alike */
    snprintf(sch, sizeof sch, W, "{\"type\":\"string\"}");
    CASES(sch, {"{\"v\":\"\\ud83d\\ude00\"}", 1}, {"{\"v\":\"a\\uD83D\\uDE00b\"}", 1}, {"{\"v\":\"\\udc00\"}", -1},
          {"{\"v\":\"\\ud83d\"}", -1}, {"{\"v\":\"\\ud83dx\"}", -1}, {"{\"v\":\"\\ud83d\\u0041\"}", -1},
          {"{\"v\":\"\\ud83d\\ud83d\"}", -1}, {"{\"v\":\"\\ud83d\\n\"}", -1});
    CASES("{\"type\":\"object\",\"additionalProperties\":true}", {"{\"\\ud83d\\ude00\":1}", 1}, {"{\"\\uDadd\":1}", -1},
          {"{\"\\uDaddi\":1}", -1});
    CASES("{\"type\":\"object\",\"properties\":{\"\\ud83d\\ude00\":{\"type\":\"integer\"}},\"required\":[\"\\ud83d\\ude00\"]}",
          {"{\"\xf0\x9f\x98\x80\":1}", 1}, {"{\"\\ud83d\":1}", -1}); /* (a declared name is written as itself) */
    {
        fl_json_fsm f;
        fl_json_fsm_init(&f);
        static const char *const ok[] = {"{\"a\":\"\\ud800\\udfff\"}", "{\"\\udbff\\udc00\":[\"x\"]}"};
        static const char *const bad[] = {"{\"a\":\"\\udfff\"}", "{\"\\ud800\":1}", "{\"a\":[\"\\ud800a\"]}"};
        for (size_t i = 0; i < 2; i++) {
            fl_json_fsm_init(&f);
            assert_true(fl_json_fsm_feed(&f, ok[i], (int32_t)strlen(ok[i])) && fl_json_fsm_done(&f));
            cJSON *v = cJSON_Parse(ok[i]); /* and cJSON reads it */
            assert_non_null(v);
            cJSON_Delete(v);
        }
        for (size_t i = 0; i < 3; i++) {
            fl_json_fsm_init(&f);
            assert_false(fl_json_fsm_feed(&f, bad[i], (int32_t)strlen(bad[i])));
        }
    }
    snprintf(sch, sizeof sch, W, "{\"type\":\"integer\",\"minimum\":-5,\"exclusiveMaximum\":120}");
    CASES(sch, {"{\"v\":-5}", 1}, {"{\"v\":-6}", -1}, {"{\"v\":119}", 1}, {"{\"v\":120}", -1}, {"{\"v\":0}", 1},
          {"{\"v\":-0}", 1}, {"{\"v\":12}", 1}, {"{\"v\":1200", -1}, {"{\"v\":-50", -1}, {"{\"v\":-1}", 1}, {"{\"v\":05}", -1},
          {"{\"v\":1.5}", -1});
    snprintf(sch, sizeof sch, W, "{\"type\":\"integer\",\"minimum\":100}");
    CASES(sch, {"{\"v\":100}", 1}, {"{\"v\":99}", -1}, {"{\"v\":-", -1}, {"{\"v\":0", -1}, {"{\"v\":123456789012345678901}", 1},
          {"{\"v\":1", 0});
    snprintf(sch, sizeof sch, W, "{\"type\":\"integer\",\"maximum\":-10}");
    CASES(sch, {"{\"v\":-10}", 1}, {"{\"v\":-9}", -1}, {"{\"v\":1", -1}, {"{\"v\":-1", 0}, {"{\"v\":-100000}", 1});
    snprintf(sch, sizeof sch, W, "{\"enum\":[\"red\",\"green\",1,12,null,{\"a\":[true]}]}");
    CASES(sch, {"{\"v\":\"red\"}", 1}, {"{\"v\":\"gree\"}", -1}, {"{\"v\":1}", 1}, {"{\"v\":12}", 1}, {"{\"v\":123}", -1},
          {"{\"v\":null}", 1}, {"{\"v\":{\"a\":[true]}}", 1}, {"{\"v\":{\"a\": [true]}}", -1}, {"{\"v\":\"blue\"}", -1},
          {"{\"v\":1 }", 1}, {"{\"v\":2}", -1});
    snprintf(sch, sizeof sch, W, "{\"const\":\"x\"}");
    CASES(sch, {"{\"v\":\"x\"}", 1}, {"{\"v\":\"y\"}", -1});
    snprintf(sch, sizeof sch, W, "{\"type\":[\"number\",\"null\"]}");
    CASES(sch, {"{\"v\":1.5e3}", 1}, {"{\"v\":null}", 1}, {"{\"v\":true}", -1});
    snprintf(sch, sizeof sch, W, "{\"type\":\"string\",\"nullable\":true,\"format\":\"date\",\"description\":\"d\"}");
    CASES(sch, {"{\"v\":null}", 1}, {"{\"v\":\"2026-12-05\"}", 1}, {"{\"v\":0}", -1});
#undef W
    fl_test_mem_zero();
}

static void test_arrays_unions_refs(void **state) {
    (void)state;
    CASES("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}", {"[1]", 1}, {"[1,2,3]", 1},
          {"[]", -1}, {"[1,2,3,", -1}, {"[ 1 , 2 ]", 1}, {"[1,\"a\"]", -1}, {"{}", -1});
    CASES("{\"type\":\"array\",\"maxItems\":0}", {"[]", 1}, {"[1", -1});
    /* a union resolved by the first byte: pydantic's Optional and a string-or-object */
    CASES("{\"type\":\"object\",\"properties\":{\"x\":{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"null\"}]},"
          "\"y\":{\"oneOf\":[{\"type\":\"string\",\"maxLength\":1},{\"type\":\"object\",\"properties\":{\"z\":{\"type\":\"boolean\"}}}]}}}",
          {"{\"x\":null,\"y\":\"a\"}", 1}, {"{\"x\":5,\"y\":{\"z\":false}}", 1}, {"{\"y\":\"ab\"}", -1}, {"{\"x\":\"5\"}", -1});
    /* $defs and recursion: a tree of nodes */
    const char *tree = "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
                       "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\"]}},"
                       "\"$ref\":\"#/$defs/node\"}";
    CASES(tree, {"{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3,\"kids\":[{\"v\":4,\"kids\":[]}]}]}", 1}, {"{\"v\":1,\"kids\":[{}]}", -1},
          {"{\"v\":1,\"kids\":[{\"v\":2,\"x\":1}]}", -1});
    CASES("{\"type\":\"object\",\"properties\":{\"self\":{\"$ref\":\"#\"},\"n\":{\"allOf\":[{\"$ref\":\"#/definitions/n\"}]}},"
          "\"definitions\":{\"n\":{\"type\":\"integer\",\"maximum\":9}}}",
          {"{\"self\":{\"self\":{}},\"n\":9}", 1}, {"{\"n\":10}", -1}, {"{\"self\":{\"n\":1}}", 1});
    /* a nullable reference */
    CASES("{\"type\":\"object\",\"properties\":{\"p\":{\"$ref\":\"#/$defs/P\",\"nullable\":true}},\"$defs\":{\"P\":{\"enum\":[\"a\"]}}}",
          {"{\"p\":null}", 1}, {"{\"p\":\"a\"}", 1}, {"{\"p\":\"b\"}", -1});
    /* the root may be an array, a string, null or a boolean */
    CASES("{\"enum\":[\"yes\",\"no\"]}", {"\"yes\"", 1}, {" \"no\"", 1}, {"\"no\" ", -1}, {"\"maybe\"", -1});
    CASES("{\"type\":\"boolean\"}", {"true", 1}, {"false", 1}, {"null", -1});
    fl_test_mem_zero();
}

static void test_refused(void **state) {
    (void)state;
    static const struct {
        const char *schema, *msg;
    } R[] = {
        {"{\"type\":\"string\",\"pattern\":\"\\\\ba\"}", "'#': pattern at offset 0: assertions"},
        {"{\"type\":\"string\",\"pattern\":\"a$b\"}", "pattern at offset 1: assertions"},
        {"{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "backreferences"},
        {"{\"type\":\"string\",\"pattern\":\"a(b\"}", "pattern at offset 3: missing closing parenthesis"},
        {"{\"type\":\"string\",\"pattern\":\"(?<=a)b\"}", "pattern at offset 0: assertions"},
        {"{\"type\":\"object\",\"properties\":{\"s\":{\"pattern\":7}}}", "'#/properties/s': 'pattern' must be a string"},
        {"{\"type\":\"string\",\"pattern\":\"a\",\"format\":\"date\"}", "'pattern' with 'format' is not supported: date"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\",\"minimum\":0}}}", "#/properties/a"},
        {"{\"anyOf\":[{\"type\":\"object\"},{\"type\":\"object\",\"properties\":{}}]}", "both take a value of type object"},
        {"{\"type\":\"integer\"}", "bare number"},
        {"{\"$ref\":\"#/$defs/missing\"}", "does not resolve"},
        {"{\"$ref\":\"#\"}", "cycle"},
        {"{\"type\":\"objekt\"}", "unknown type: objekt"},
        {"{\"type\":\"object\",\"required\":[\"a\"]}", "not in 'properties': a"},
        {"{\"type\":\"array\",\"minItems\":2,\"maxItems\":1}", "minItems exceeds maxItems"},
        {"{\"type\":\"array\",\"maxItems\":-1}", "non-negative integer: maxItems"},
        {"{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\",\"minimum\":3,\"maximum\":2}}}", "no integer lies"},
        {"{\"enum\":[]}", "non-empty array"},
        {"{\"enum\":[\"a\",\"a\"]}", "a value twice"},
        {"[1]", "an object or true"},
        {"{\"type\":", "not valid JSON"},
        {"{\"allOf\":[{\"type\":\"object\"},{\"type\":\"object\"}]}", "one schema only"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":1e300}}}", "within +-10^15"},
    };
    for (size_t i = 0; i < sizeof R / sizeof *R; i++) {
        fl_json_schema *s = (fl_json_schema *)1;
        assert_int_equal(fl_json_schema_compile(R[i].schema, &s), FL_ERR_INVALID);
        assert_null(s);
        if (!strstr(fl_last_error(), R[i].msg)) fail_msg("%s: message '%s' lacks '%s'", R[i].schema, fl_last_error(), R[i].msg);
    }
    /* 64 properties are fine, 65 are not; so for enum values */
    char big[4096];
    for (int lim = 64; lim <= 65; lim++) {
        int k = sprintf(big, "{\"type\":\"object\",\"properties\":{");
        for (int i = 0; i < lim; i++) k += sprintf(big + k, "%s\"p%d\":{}", i ? "," : "", i);
        strcpy(big + k, "}}");
        fl_json_schema *s = NULL;
        assert_int_equal(fl_json_schema_compile(big, &s), lim == 64 ? FL_OK : FL_ERR_INVALID);
        if (lim == 64) {
            assert_int_equal(check(s, "{\"p0\":[],\"p63\":1}"), 1);
            assert_int_equal(check(s, "{\"p63\":1,\"p0\":[]}"), -1); /* (declared order) */
            fl_json_schema_free(s);
        }
    }
    fl_test_mem_zero();
}

/* ---- a plain validator for the supported keywords (independent of the compiler) ---- */

static const cJSON *v_resolve(const cJSON *doc, const char *ref) {
    const cJSON *x = doc;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", ref + 1);
    for (char *seg = strtok(buf, "/"); seg; seg = strtok(NULL, "/")) x = cJSON_GetObjectItemCaseSensitive(x, seg);
    return x;
}

static size_t utf8_chars(const char *s) {
    size_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static bool valid(const cJSON *doc, const cJSON *sch, const cJSON *v);

static bool valid_type(const char *t, const cJSON *v) {
    if (!strcmp(t, "object")) return cJSON_IsObject(v);
    if (!strcmp(t, "array")) return cJSON_IsArray(v);
    if (!strcmp(t, "string")) return cJSON_IsString(v);
    if (!strcmp(t, "number")) return cJSON_IsNumber(v);
    if (!strcmp(t, "integer")) return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    if (!strcmp(t, "boolean")) return cJSON_IsBool(v);
    return !strcmp(t, "null") && cJSON_IsNull(v);
}

static bool valid(const cJSON *doc, const cJSON *sch, const cJSON *v) {
    if (cJSON_IsTrue(sch)) return true;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(sch, "nullable")) && cJSON_IsNull(v)) return true;
    const cJSON *x;
    if ((x = cJSON_GetObjectItemCaseSensitive(sch, "$ref"))) return valid(doc, v_resolve(doc, x->valuestring), v);
    if ((x = cJSON_GetObjectItemCaseSensitive(sch, "allOf"))) return valid(doc, x->child, v);
    if ((x = cJSON_GetObjectItemCaseSensitive(sch, "anyOf")) || (x = cJSON_GetObjectItemCaseSensitive(sch, "oneOf"))) {
        int n = 0;
        for (const cJSON *a = x->child; a; a = a->next) n += valid(doc, a, v);
        return !strcmp(x->string, "anyOf") ? n >= 1 : n == 1;
    }
    if ((x = cJSON_GetObjectItemCaseSensitive(sch, "enum"))) {
        for (const cJSON *a = x->child; a; a = a->next)
            if (cJSON_Compare(a, v, true)) return true;
        return false;
    }
    if ((x = cJSON_GetObjectItemCaseSensitive(sch, "const"))) return cJSON_Compare(x, v, true);
    if ((x = cJSON_GetObjectItemCaseSensitive(sch, "type"))) {
        bool ok = false;
        if (cJSON_IsString(x)) ok = valid_type(x->valuestring, v);
        for (const cJSON *a = cJSON_IsArray(x) ? x->child : NULL; a; a = a->next) ok |= valid_type(a->valuestring, v);
        if (!ok) return false;
    }
    if (cJSON_IsObject(v)) {
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(sch, "properties"), *ap = cJSON_GetObjectItemCaseSensitive(sch, "additionalProperties");
        int last = -1; /* the declared members in declared order */
        for (const cJSON *m = v->child; m; m = m->next) {
            const cJSON *ps = props ? cJSON_GetObjectItemCaseSensitive(props, m->string) : NULL;
            if (ps) {
                int k = 0;
                for (const cJSON *q = props->child; q != ps; q = q->next) k++;
                if (k <= last) return false;
                last = k;
            }
            for (const cJSON *m2 = m->next; ps && m2; m2 = m2->next)
                if (!strcmp(m->string, m2->string)) return false; /* a declared member twice (others may repeat) */
            if (ps) {
                if (!valid(doc, ps, m)) return false;
            } else if (props && (!ap || cJSON_IsFalse(ap))) {
                return false; /* the compiler's reading of an absent additionalProperties */
            } else if (cJSON_IsFalse(ap) || (cJSON_IsObject(ap) && !valid(doc, ap, m))) {
                return false;
            }
        }
        for (const cJSON *r = (x = cJSON_GetObjectItemCaseSensitive(sch, "required")) ? x->child : NULL; r; r = r->next)
            if (!cJSON_GetObjectItemCaseSensitive(v, r->valuestring)) return false;
    }
    if (cJSON_IsArray(v)) {
        const int n = cJSON_GetArraySize(v);
        if ((x = cJSON_GetObjectItemCaseSensitive(sch, "minItems")) && n < x->valueint) return false;
        if ((x = cJSON_GetObjectItemCaseSensitive(sch, "maxItems")) && n > x->valueint) return false;
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(sch, "items");
        for (const cJSON *a = v->child; it && a; a = a->next)
            if (!valid(doc, it, a)) return false;
    }
    if (cJSON_IsString(v)) {
        const size_t n = utf8_chars(v->valuestring);
        if ((x = cJSON_GetObjectItemCaseSensitive(sch, "minLength")) && n < (size_t)x->valueint) return false;
        if ((x = cJSON_GetObjectItemCaseSensitive(sch, "maxLength")) && n > (size_t)x->valueint) return false;
        if ((x = cJSON_GetObjectItemCaseSensitive(sch, "pattern"))) { /* a whole match, by glibc's POSIX regex */
            char re_text[256];
            const char *pt = x->valuestring;
            size_t pl = strlen(pt);
            if (pt[0] == '^') pt++, pl--;
            if (pl && pt[pl - 1] == '$') pl--;
            snprintf(re_text, sizeof re_text, "^(%.*s)$", (int)pl, pt);
            regex_t re;
            assert_int_equal(regcomp(&re, re_text, REG_EXTENDED | REG_NOSUB), 0);
            const bool m = regexec(&re, v->valuestring, 0, NULL, 0) == 0;
            regfree(&re);
            if (!m) return false;
        }
    }
    if (cJSON_IsNumber(v)) {
        const double d = v->valuedouble;
        if ((x = cJSON_GetObjectItemCaseSensitive(sch, "minimum")) && d < x->valuedouble) return false;
        if ((x = cJSON_GetObjectItemCaseSensitive(sch, "maximum")) && d > x->valuedouble) return false;
        if ((x = cJSON_GetObjectItemCaseSensitive(sch, "exclusiveMinimum")) && d <= x->valuedouble) return false;
        if ((x = cJSON_GetObjectItemCaseSensitive(sch, "exclusiveMaximum")) && d >= x->valuedouble) return false;
    }
    return true;
}

/* a number cJSON reads and JSON does not: a '.' after a digit with no digit after it ("6.") */
static bool lax_number(const char *t) {
    for (const char *p = strchr(t, '.'); p; p = strchr(p + 1, '.'))
        if (p > t && p[-1] >= '0' && p[-1] <= '9' && !(p[1] >= '0' && p[1] <= '9')) return true;
    return false;
}

/* Random documents walked byte by byte through the recognizer (each byte drawn among those it
 * accepts next, closers favoured so most walks end): every complete one parses and the
 * validator accepts it; and documents the validator accepts or refuses, mutated from them, get
 * the same answer from the recognizer. */
static void test_random_walks(void **state) {
    (void)state;
    static const char *const S[] = {
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":6},\"age\":{\"type\":\"integer\",\"minimum\":0,"
        "\"maximum\":130},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"bc\",7,null]},\"maxItems\":3},\"ok\":{\"type\":\"boolean\"}},"
        "\"required\":[\"name\",\"age\"]}",
        "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"v\":{\"anyOf\":[{\"type\":\"integer\",\"exclusiveMinimum\":-3,\"maximum\":40},"
        "{\"type\":\"string\",\"minLength\":1,\"maxLength\":2},{\"type\":\"null\"}]},\"k\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/n\"},"
        "\"minItems\":1,\"maxItems\":2}},\"required\":[\"v\"]}},\"$ref\":\"#/$defs/n\"}",
        "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"}},\"additionalProperties\":{\"type\":[\"string\",\"boolean\"]}}",
        "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"q\":{\"const\":{\"a\":[1,\"b\"]}}}},\"minItems\":2}",
        "{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"pattern\":\"^[0-9]{2}-[a-c]+$\"},\"e\":{\"anyOf\":[{\"type\":"
        "\"string\",\"pattern\":\"x(y|zz)*\"},{\"type\":\"null\"}]}},\"required\":[\"d\"]}",
    };
    static const char ALPHA[] = "{}[]\",:-0123456789.eE+ \nabcdefghijklmnopqrstuvwxyzAB/"; /* (no backslash: test_scalars checks escapes) */
    const int nalpha = (int)sizeof ALPHA - 1;
    int total = 0;
    for (size_t si = 0; si < sizeof S / sizeof *S; si++) {
        fl_json_schema *s = compile_ok(S[si]);
        cJSON *doc = cJSON_Parse(S[si]);
        int complete = 0;
        srand(1234 + (unsigned)si);
        for (int walk = 0; walk < 300; walk++) {
            fl_json_fsm f, g;
            fl_json_fsm_init_schema(&f, s);
            char out[2048];
            int n = 0;
            while (n < 600 && !fl_json_fsm_done(&f)) {
                char ok[128];
                int nok = 0, nclose = 0;
                char closers[8];
                for (int i = 0; i < nalpha; i++) {
                    fl_json_fsm_copy(&g, &f);
                    if (fl_json_fsm_feed(&g, &ALPHA[i], 1)) {
                        ok[nok++] = ALPHA[i];
                        if (strchr("}]\"", ALPHA[i]) && nclose < 8) closers[nclose++] = ALPHA[i];
                    }
                }
                if (!nok) fail_msg("schema %zu: a dead end after '%.*s'", si, n, out);
                const char b = nclose && rand() % 3 == 0 ? closers[rand() % nclose] : ok[rand() % nok];
                assert_true(fl_json_fsm_feed(&f, &b, 1));
                out[n++] = b;
            }
            out[n] = 0;
            if (!fl_json_fsm_done(&f)) continue;
            complete++;
            cJSON *v = cJSON_ParseWithOpts(out, NULL, 1); /* (nothing after the value) */
            if (!v) fail_msg("schema %zu: the recognizer completed '%s', which cJSON does not parse", si, out);
            if (!valid(doc, doc, v)) fail_msg("schema %zu: the recognizer completed '%s', which the validator refuses", si, out);
            /* a one-byte change: the recognizer accepts it whole only where the validator does */
            char mut[2048];
            for (int m = 0; m < 8; m++) {
                strcpy(mut, out);
                mut[rand() % n] = ALPHA[rand() % nalpha];
                cJSON *w = cJSON_ParseWithOpts(mut, NULL, 1);
                const int r = check(s, mut);
                const bool vw = w && valid(doc, doc, w);
                /* the recognizer is stricter in whitespace and number form only where cJSON is lax */
                if (r == 1 && !vw) fail_msg("schema %zu: '%s' accepted, the validator refuses it", si, mut);
                if (vw && r != 1 && !strpbrk(mut, " \n") && !strstr(mut, "\\u") && !strstr(mut, "\\/") && !lax_number(mut))
                    fail_msg("schema %zu: '%s' refused (%d), the validator accepts it", si, mut, r);
                cJSON_Delete(w);
            }
            cJSON_Delete(v);
        }
        if (complete < 100) fail_msg("schema %zu: only %d of 300 walks completed", si, complete);
        total += complete;
        cJSON_Delete(doc);
        fl_json_schema_free(s);
    }
    assert_true(total >= 400);
    fl_test_mem_zero();
}

/* "pattern": a string value is one whole match of it, decoded (escapes are the characters they
 * stand for), checked at each character and at the closing quote */
static void test_patterns(void **state) {
    (void)state;
    CASES("{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"pattern\":\"^[0-9]{4}-[0-9]{2}-[0-9]{2}$\"}},\"required\":[\"d\"]}",
          {"{\"d\":\"2024-01-31\"}", 1}, {"{\"d\":\"2024-1-31\"}", -1}, {"{\"d\":\"2024-01-3\"}", -1}, {"{\"d\":\"2024-0", 0},
          {"{\"d\":\"20a", -1}, {"{\"d\":\"\\u0032024-01-31\"}", 1}, {"{\"d\":\"2024-01-31x\"}", -1});
    /* escapes stand for their characters; raw UTF-8 and \u escapes alike; a surrogate escape is refused */
    CASES("{\"type\":\"string\",\"pattern\":\"a\\\\nb\\\\t\"}", {"\"a\\nb\\t\"", 1}, {"\"a\\u000ab\\u0009\"", 1}, {"\"anb\\t\"", -1});
    CASES("{\"type\":\"string\",\"pattern\":\"[\u00e9\u00e8]+\"}", {"\"\\u00e9\u00e8\u00e9\"", 1}, {"\"\u00e9e\"", -1}, {"\"\"", -1});
    CASES("{\"type\":\"string\",\"pattern\":\".+\"}", {"\"\xf0\x9f\x98\x80\"", 1}, {"\"\\ud83d\\ude00\"", -1},
          {"\"\xf4\x8f\xbf\xbf\"", -1}, {"\"\\\"\\\\/\"", 1});
    CASES("{\"type\":\"string\",\"pattern\":\"a*\"}", {"\"\"", 1}, {"\"aaa\"", 1}, {"\"ab\"", -1});
    /* an escaped $ stays; with maxLength; in a union */
    CASES("{\"type\":\"string\",\"pattern\":\"^a\\\\$\"}", {"\"a$\"", 1}, {"\"a\"", -1});
    CASES("{\"type\":\"string\",\"pattern\":\"[ab]+\",\"maxLength\":3}", {"\"aba\"", 1}, {"\"abab\"", -1}, {"\"\"", -1});
    CASES("{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"string\",\"pattern\":\"x+\"},{\"type\":\"integer\"}]}}",
          {"[\"xx\",12,\"x\"]", 1}, {"[\"y\"]", -1}, {"[\"\"]", -1});
    /* formats held to their patterns (not calendar-checked); others, and on other types, annotations */
    CASES("{\"type\":\"string\",\"format\":\"date\"}", {"\"2024-12-31\"", 1}, {"\"2024-13-01\"", -1}, {"\"2024-1-01\"", -1},
          {"\"2024-02-30\"", 1});
    CASES("{\"type\":\"string\",\"format\":\"date-time\"}", {"\"2024-12-31T23:59:59Z\"", 1}, {"\"2024-12-31T23:59:59.123+05:30\"", 1},
          {"\"2024-12-31 23:59:59Z\"", -1}, {"\"2024-12-31T23:59:59\"", -1});
    CASES("{\"type\":\"string\",\"format\":\"time\"}", {"\"23:59:60Z\"", 1}, {"\"24:00:00Z\"", -1});
    CASES("{\"type\":\"string\",\"format\":\"uuid\"}", {"\"123e4567-e89b-12d3-a456-426614174000\"", 1},
          {"\"123e4567-e89b-12d3-a456-42661417400g\"", -1});
    CASES("{\"type\":\"string\",\"format\":\"ipv4\"}", {"\"192.168.0.255\"", 1}, {"\"256.1.1.1\"", -1}, {"\"1.2.3\"", -1},
          {"\"01.2.3.4\"", -1});
    CASES("{\"type\":\"string\",\"format\":\"email\"}", {"\"a.b+c@ex-1.co.uk\"", 1}, {"\"a@b\"", -1}, {"\"@b.c\"", -1});
    CASES("{\"type\":\"string\",\"format\":\"hostname\"}", {"\"any thing\"", 1});
    CASES("{\"type\":\"object\",\"properties\":{\"i\":{\"type\":\"integer\",\"format\":\"int32\"},"
          "\"d\":{\"type\":[\"string\",\"integer\"],\"format\":\"date\"}}}",
          {"{\"i\":5,\"d\":7}", 1}, {"{\"d\":\"2024-01-01\"}", 1}, {"{\"d\":\"x\"}", -1});
    /* the same answers as glibc's POSIX regex on every string of up to 4 characters over a small
     * alphabet (complete where a whole match, a prefix where some string of up to 6 starting with
     * it is one) */
    static const char *const pats[] = {"(ab|a0)+x?", "-?(0|1[01]*)(\\\\.[01]{1,2})?", "[^ab.]{1,2}(a|-)", "(x|ab|b0)*-?"};
    static const char AL[] = "ab01-.x";
    for (size_t p = 0; p < sizeof pats / sizeof *pats; p++) {
        char sch[256], re_text[128];
        snprintf(sch, sizeof sch, "{\"type\":\"string\",\"pattern\":\"%s\"}", pats[p]);
        fl_json_schema *s = compile_ok(sch);
        snprintf(re_text, sizeof re_text, "^(%s)$", pats[p]);
        for (char *q = re_text; (q = strstr(q, "\\\\")); q++) memmove(q, q + 1, strlen(q)); /* (JSON's \\ is one \) */
        regex_t re;
        assert_int_equal(regcomp(&re, re_text, REG_EXTENDED | REG_NOSUB), 0);
        int n_match = 0;
        for (int len = 0; len <= 4; len++) {
            int total = 1;
            for (int i = 0; i < len; i++) total *= 7;
            for (int v = 0; v < total; v++) {
                char t[8], doc[16];
                for (int i = 0, x = v; i < len; i++, x /= 7) t[i] = AL[x % 7];
                t[len] = 0;
                const bool full = regexec(&re, t, 0, NULL, 0) == 0;
                bool prefix = full;
                for (int ext = 1; ext <= 2 && !prefix; ext++) {
                    int te = 1;
                    for (int i = 0; i < ext; i++) te *= 7;
                    for (int w = 0; w < te && !prefix; w++) {
                        char u[8];
                        memcpy(u, t, (size_t)len);
                        for (int i = 0, x = w; i < ext; i++, x /= 7) u[len + i] = AL[x % 7];
                        u[len + ext] = 0;
                        prefix = regexec(&re, u, 0, NULL, 0) == 0;
                    }
                }
                snprintf(doc, sizeof doc, "\"%s\"", t);
                const int got = check(s, doc);
                if (got != (full ? 1 : -1)) fail_msg("pattern %s on '%s': %d, POSIX %d", pats[p], t, got, full);
                doc[len + 1] = 0; /* without the closing quote */
                const int open = check(s, doc);
                if (open != (prefix ? 0 : -1)) fail_msg("pattern %s on prefix '%s': %d, POSIX %d", pats[p], t, open, prefix);
                n_match += full;
            }
        }
        assert_true(n_match >= 3);
        regfree(&re);
        fl_json_schema_free(s);
    }
    fl_test_mem_zero();
}

static void test_out_of_memory(void **state) {
    (void)state;
    const char *sch = "{\"type\":\"object\",\"properties\":{\"a\":{\"enum\":[1,2]},\"b\":{\"type\":\"array\",\"items\":{\"$ref\":\"#\"}},"
                      "\"c\":{\"type\":\"string\",\"pattern\":\"[a-z]+\\\\d\"}}}";
    int ok = 0;
    for (int k = 0; k < 200 && !ok; k++) {
        fl_mem_fail_after(k);
        fl_json_schema *s = NULL;
        const fl_status st = fl_json_schema_compile(sch, &s);
        fl_mem_fail_after(-1);
        if (st == FL_OK) {
            ok = k + 1;
            assert_int_equal(check(s, "{\"b\":[{\"a\":2}]}"), 1);
            assert_int_equal(check(s, "{\"c\":\"ab7\"}"), 1);
            fl_json_schema_free(s);
        } else {
            assert_true(st == FL_ERR_NOMEM || st == FL_ERR_INVALID); /* (cJSON's parse failing reads as invalid) */
            assert_null(s);
        }
        fl_test_mem_zero();
    }
    assert_true(ok > 3);
}

/* guided_choice: exactly one of the texts, plain text (no quotes, whitespace is text); where a
 * complete choice is the prefix of a longer one the output may end there (may_end) or go on */
static void test_choices(void **state) {
    (void)state;
    const char *const ch[] = {"yes", "yes!", "no", " maybe so", "{\"a\":1}"};
    fl_json_schema *s;
    assert_int_equal(fl_json_schema_choices(ch, 5, &s), FL_OK);
    const struct {
        const char *t;
        int want, may_end;
    } C[] = {{"yes!", 1, 1}, {"no", 1, 1}, {" maybe so", 1, 1}, {"{\"a\":1}", 1, 1}, {"yes", 0, 1}, {"ye", 0, 0},
             {"", 0, 0}, {" maybe", 0, 0}, {"nope", -1, 0}, {"yes!!", -1, 0}, {"\"yes\"", -1, 0}, {" yes", -1, 0},
             {"no ", -1, 0}, {"maybe so", -1, 0}};
    for (size_t i = 0; i < sizeof C / sizeof *C; i++) {
        const int got = check(s, C[i].t);
        if (got != C[i].want) fail_msg("choice text '%s': %d, want %d", C[i].t, got, C[i].want);
        if (got >= 0) {
            fl_json_fsm f;
            fl_json_fsm_init_schema(&f, s);
            assert_true(fl_json_fsm_feed(&f, C[i].t, (int32_t)strlen(C[i].t)));
            if (fl_json_fsm_may_end(&f) != (C[i].may_end != 0)) fail_msg("choice text '%s': may_end %d", C[i].t, C[i].may_end);
        }
    }
    fl_json_schema_free(s);
    /* refused: none, an empty one, one twice, more than 64 */
    const char *const bad1[] = {"a", ""}, *const bad2[] = {"a", "b", "a"};
    assert_int_equal(fl_json_schema_choices(ch, 0, &s), FL_ERR_INVALID);
    assert_int_equal(fl_json_schema_choices(bad1, 2, &s), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "empty"));
    assert_int_equal(fl_json_schema_choices(bad2, 3, &s), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "twice"));
    char names[65][16];
    const char *many[65];
    for (int i = 0; i < 65; i++) {
        snprintf(names[i], sizeof names[i], "c%d", i);
        many[i] = names[i];
    }
    assert_int_equal(fl_json_schema_choices(many, 65, &s), FL_ERR_INVALID);
    assert_null(s);
    assert_int_equal(fl_json_schema_choices(many, 64, &s), FL_OK);
    assert_int_equal(check(s, "c63"), 1);
    assert_int_equal(check(s, "c6"), 0); /* (c60..c63 go on) */
    fl_json_schema_free(s);
    fl_test_mem_zero();
}

int main(void) {
    fl_mem_install_cjson_hooks();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_objects),       cmocka_unit_test(test_scalars),      cmocka_unit_test(test_arrays_unions_refs),
        cmocka_unit_test(test_refused),       cmocka_unit_test(test_random_walks), cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_choices),       cmocka_unit_test(test_patterns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
