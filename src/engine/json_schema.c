/* JSON Schema -> the node graph of constrained decoding (see json_schema.h). */
#include "engine/json_schema.h"
#include "engine/regex_guide.h"

#include "core/alloc.h"
#include "core/status.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_REF_HOPS 64 /* $ref -> $ref -> ... chains (a cycle of bare references never ends) */

typedef struct memo {
    const cJSON *sch;
    int32_t node;
} memo;

typedef struct cctx {
    fl_json_schema *s;
    const cJSON *doc;
    memo *memo;
    int32_t n_memo, cap_memo;
    int32_t any; /* the node of `true` / {} (created on first use) */
    char path[256];
} cctx;

static fl_status bad(const cctx *c, const char *fmt, const char *what) {
    return fl_set_error(FL_ERR_INVALID, "json_schema at '%s': %s%s", c->path[0] ? c->path : "#", fmt, what ? what : "");
}

static fl_status nomem(void) { return fl_set_error(FL_ERR_NOMEM, "json_schema: out of memory"); }

static bool grow(void **p, int32_t *cap, int32_t need, size_t elem) {
    if (need <= *cap) return true;
    int32_t nc = *cap ? *cap * 2 : 16;
    while (nc < need) nc *= 2;
    void *q = fl_realloc(FL_MEM_GUIDE, *p, (size_t)*cap * elem, (size_t)nc * elem, 0);
    if (!q) return false;
    *p = q;
    *cap = nc;
    return true;
}

static fl_status new_node(cctx *c, int32_t *out) {
    fl_json_schema *s = c->s;
    if (!grow((void **)&s->nodes, &s->cap_nodes, s->n_nodes + 1, sizeof *s->nodes)) return nomem();
    fl_js_node *n = &s->nodes[s->n_nodes];
    memset(n, 0, sizeof *n);
    for (int k = 0; k < FL_JS_NCLASS; k++) n->cls[k] = -1;
    n->addl = n->items = n->rx = -1;
    n->max_items = n->max_len = FL_JS_UNBOUNDED;
    *out = s->n_nodes++;
    return FL_OK;
}

/* a string of the schema (a property name or an enum text), len bytes */
static fl_status add_str(cctx *c, const char *p, size_t len, int32_t *out) {
    fl_json_schema *s = c->s;
    if (!grow((void **)&s->str, &s->cap_str, s->n_str + 1, sizeof *s->str)) return nomem();
    char *d = fl_alloc(FL_MEM_GUIDE, len + 1, 0);
    if (!d) return nomem();
    memcpy(d, p, len);
    d[len] = 0;
    s->str[s->n_str] = (fl_js_str){d, (uint32_t)len, -1};
    *out = s->n_str++;
    return FL_OK;
}

static fl_status remember(cctx *c, const cJSON *sch, int32_t node) {
    if (!grow((void **)&c->memo, &c->cap_memo, c->n_memo + 1, sizeof *c->memo)) return nomem();
    c->memo[c->n_memo++] = (memo){sch, node};
    return FL_OK;
}

static int32_t recall(const cctx *c, const cJSON *sch) {
    for (int32_t i = 0; i < c->n_memo; i++)
        if (c->memo[i].sch == sch) return c->memo[i].node;
    return -1;
}

/* the path, for messages: push appends "/seg" and returns the old length to pop back to */
static size_t push(cctx *c, const char *seg) {
    const size_t l = strlen(c->path);
    snprintf(c->path + l, sizeof c->path - l, "%s%s", l ? "/" : "#/", seg);
    return l;
}
static void pop(cctx *c, size_t l) { c->path[l] = 0; }

static fl_status any_node(cctx *c, int32_t *out) {
    if (c->any < 0) {
        int32_t n;
        fl_status st = new_node(c, &n);
        if (st != FL_OK) return st;
        for (int k = 0; k < FL_JS_NCLASS; k++) c->s->nodes[n].cls[k] = n;
        c->s->nodes[n].addl = c->s->nodes[n].items = n;
        c->any = n;
    }
    *out = c->any;
    return FL_OK;
}

/* JSON pointer "#", "#/a/b" (with ~0 ~1) into the document */
static const cJSON *resolve(const cctx *c, const char *ref) {
    if (ref[0] != '#') return NULL;
    const cJSON *x = c->doc;
    const char *p = ref + 1;
    while (*p) {
        if (*p != '/') return NULL;
        p++;
        char seg[128];
        size_t n = 0;
        while (*p && *p != '/') {
            char ch = *p++;
            if (ch == '~') {
                if (*p == '0') ch = '~';
                else if (*p == '1') ch = '/';
                else return NULL;
                p++;
            }
            if (n + 1 >= sizeof seg) return NULL;
            seg[n++] = ch;
        }
        seg[n] = 0;
        if (cJSON_IsObject(x)) x = cJSON_GetObjectItemCaseSensitive(x, seg);
        else if (cJSON_IsArray(x)) {
            char *end;
            const long i = strtol(seg, &end, 10);
            x = *seg && !*end && i >= 0 ? cJSON_GetArrayItem(x, (int)i) : NULL;
        } else return NULL;
        if (!x) return NULL;
    }
    return x;
}

static const char *const CLASS_NAME[FL_JS_NCLASS] = {"null", "boolean", "number", "string", "array", "object"};

static bool is_annotation(const char *k) {
    static const char *const A[] = {"title", "description", "default", "examples", "format", "$schema", "$id", "$comment",
                                    "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "$anchor"};
    for (size_t i = 0; i < sizeof A / sizeof *A; i++)
        if (!strcmp(k, A[i])) return true;
    return false;
}

/* a count keyword: a non-negative integer */
static fl_status count_kw(cctx *c, const cJSON *sch, const char *kw, uint32_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(sch, kw);
    if (!v) return FL_OK;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble != floor(v->valuedouble) || v->valuedouble >= 4e9)
        return bad(c, "must be a non-negative integer: ", kw);
    *out = (uint32_t)v->valuedouble;
    return FL_OK;
}

static fl_status compile(cctx *c, const cJSON *sch, int hops, int32_t *out);

/* anyOf / oneOf: each class of first byte to the one alternative that takes it */
static fl_status compile_union(cctx *c, const cJSON *alts, const char *kw, int32_t n) {
    if (!cJSON_IsArray(alts) || cJSON_GetArraySize(alts) == 0) return bad(c, "must be a non-empty array: ", kw);
    const size_t l0 = push(c, kw);
    int i = 0;
    const cJSON *a;
    cJSON_ArrayForEach(a, alts) {
        char idx[16];
        snprintf(idx, sizeof idx, "%d", i++);
        const size_t l1 = push(c, idx);
        int32_t m;
        fl_status st = compile(c, a, 0, &m);
        if (st != FL_OK) return st;
        for (int k = 0; k < FL_JS_NCLASS; k++) {
            const int32_t to = c->s->nodes[m].cls[k];
            if (to < 0) continue;
            int32_t *slot = &c->s->nodes[n].cls[k];
            if (*slot >= 0 && *slot != to) {
                pop(c, l1);
                return bad(c, "two alternatives both take a value of type ", CLASS_NAME[k]);
            }
            *slot = to;
        }
        pop(c, l1);
    }
    pop(c, l0);
    return FL_OK;
}

static fl_status compile_enum(cctx *c, const cJSON *vals, const char *kw, int32_t n) {
    if (!strcmp(kw, "enum") && (!cJSON_IsArray(vals) || cJSON_GetArraySize(vals) == 0))
        return bad(c, "'enum' must be a non-empty array", NULL);
    const int cnt = strcmp(kw, "enum") ? 1 : cJSON_GetArraySize(vals);
    if (cnt > FL_JS_MAX_ENUM) return bad(c, "'enum' has more values than supported (64)", NULL);
    c->s->nodes[n].e0 = c->s->n_str;
    for (int i = 0; i < cnt; i++) {
        const cJSON *v = cnt == 1 && strcmp(kw, "enum") ? vals : cJSON_GetArrayItem(vals, i);
        char *txt = cJSON_PrintUnformatted(v);
        if (!txt) return nomem();
        int32_t id;
        fl_status st = add_str(c, txt, strlen(txt), &id);
        const int k = fl_js_class_of_byte((unsigned char)txt[0]);
        cJSON_free(txt);
        if (st != FL_OK) return st;
        for (int32_t j = c->s->nodes[n].e0; j < id; j++)
            if (c->s->str[j].len == c->s->str[id].len && !memcmp(c->s->str[j].p, c->s->str[id].p, c->s->str[id].len))
                return bad(c, "'enum' lists a value twice", NULL);
        c->s->nodes[n].cls[k] = n;
        c->s->nodes[n].ne++;
    }
    return FL_OK;
}

static fl_status int_bound(cctx *c, const cJSON *sch, const char *kw, bool lower, bool exclusive, fl_js_node *nd) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(sch, kw);
    if (!v) return FL_OK;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || fabs(v->valuedouble) > (double)FL_JS_INT_LIMIT)
        return bad(c, "must be a number within +-10^15: ", kw);
    double x = v->valuedouble;
    int64_t b = lower ? (int64_t)ceil(x) : (int64_t)floor(x);
    if (exclusive && (double)b == x) b += lower ? 1 : -1;
    if (lower) {
        if (!nd->has_min || b > nd->min) nd->min = b;
        nd->has_min = 1;
    } else {
        if (!nd->has_max || b < nd->max) nd->max = b;
        nd->has_max = 1;
    }
    return FL_OK;
}

static fl_status compile_object(cctx *c, const cJSON *sch, int32_t n) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(sch, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(sch, "required");
    const cJSON *ap = cJSON_GetObjectItemCaseSensitive(sch, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return bad(c, "'properties' must be an object", NULL);
    const int np = props ? cJSON_GetArraySize(props) : 0;
    if (np > FL_JS_MAX_PROPS) return bad(c, "more properties than supported (64)", NULL);
    c->s->nodes[n].p0 = c->s->n_str;
    c->s->nodes[n].np = np;
    /* the names first (contiguous), then their schemas (which add strings of their own) */
    const cJSON *p;
    int32_t first = -1;
    cJSON_ArrayForEach(p, props) {
        cJSON *name = cJSON_CreateString(p->string);
        char *txt = name ? cJSON_PrintUnformatted(name) : NULL;
        cJSON_Delete(name);
        if (!txt) return nomem();
        int32_t id;
        fl_status st = add_str(c, txt + 1, strlen(txt) - 2, &id); /* without the quotes */
        cJSON_free(txt);
        if (st != FL_OK) return st;
        if (first < 0) first = id;
        for (int32_t j = first; j < id; j++)
            if (!strcmp(c->s->str[j].p, c->s->str[id].p)) return bad(c, "a property is declared twice: ", p->string);
    }
    int i = 0;
    const size_t l0 = push(c, "properties");
    cJSON_ArrayForEach(p, props) {
        const size_t l1 = push(c, p->string);
        int32_t m;
        fl_status st = compile(c, p, 0, &m);
        if (st != FL_OK) return st;
        c->s->str[c->s->nodes[n].p0 + i++].node = m;
        pop(c, l1);
    }
    pop(c, l0);
    if (req) {
        if (!cJSON_IsArray(req)) return bad(c, "'required' must be an array of names", NULL);
        const cJSON *r;
        cJSON_ArrayForEach(r, req) {
            if (!cJSON_IsString(r)) return bad(c, "'required' must be an array of names", NULL);
            int j = 0;
            for (p = props ? props->child : NULL; p && strcmp(p->string, r->valuestring); p = p->next) j++;
            if (!p) return bad(c, "a required property is not in 'properties': ", r->valuestring);
            c->s->nodes[n].required |= 1ull << j;
        }
    }
    int32_t addl = -1;
    if (cJSON_IsTrue(ap) || (!ap && !props)) {
        fl_status st = any_node(c, &addl);
        if (st != FL_OK) return st;
    } else if (cJSON_IsObject(ap)) {
        const size_t l1 = push(c, "additionalProperties");
        fl_status st = compile(c, ap, 0, &addl);
        if (st != FL_OK) return st;
        pop(c, l1);
    } else if (ap && !cJSON_IsFalse(ap)) {
        return bad(c, "'additionalProperties' must be a boolean or a schema", NULL);
    }
    c->s->nodes[n].addl = addl;
    return FL_OK;
}

static const char *const OBJ_KW[] = {"properties", "required", "additionalProperties", NULL};
static const char *const ARR_KW[] = {"items", "minItems", "maxItems", NULL};
static const char *const STR_KW[] = {"minLength", "maxLength", "pattern", NULL};
static const char *const INT_KW[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", NULL};

static bool in_list(const char *const *l, const char *k) {
    for (; *l; l++)
        if (!strcmp(*l, k)) return true;
    return false;
}

/* The formats a string is held to (RFC 3339's full-date, full-time and date-time; RFC 4122's
 * uuid; dotted-quad ipv4; a plain email address): each a pattern, as llama.cpp's grammars do for
 * the first four.  Other formats stay annotations. */
#define RE_DATE "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
#define RE_TIME "([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
#define RE_OCTET "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
static const struct {
    const char *name, *re;
} FORMATS[] = {
    {"date", RE_DATE},
    {"time", RE_TIME},
    {"date-time", RE_DATE "T" RE_TIME},
    {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
    {"ipv4", "(" RE_OCTET "\\.){3}" RE_OCTET},
    {"email", "[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\\.[A-Za-z0-9-]+)+"},
};

/* "pattern", or a "format" of FORMATS on a node that admits strings: node n's strings are each
 * one whole match (regex_guide.h fl_regex_str) */
static fl_status compile_pattern(cctx *c, const cJSON *sch, int32_t n) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(sch, "pattern"), *f = cJSON_GetObjectItemCaseSensitive(sch, "format");
    if (p && !cJSON_IsString(p)) return bad(c, "'pattern' must be a string", NULL);
    const char *re = p ? p->valuestring : NULL;
    if (cJSON_IsString(f) && c->s->nodes[n].cls[FL_JS_STR] == n)
        for (size_t i = 0; i < sizeof FORMATS / sizeof *FORMATS; i++)
            if (!strcmp(f->valuestring, FORMATS[i].name)) {
                if (re) return bad(c, "'pattern' with 'format' is not supported: ", f->valuestring);
                re = FORMATS[i].re;
            }
    if (!re) return FL_OK;
    fl_json_schema *s = c->s;
    if (!grow((void **)&s->rx, &s->cap_rx, s->n_rx + 1, sizeof *s->rx)) return nomem();
    fl_regex_str *x = NULL;
    const fl_status st = fl_regex_str_new(re, &x);
    if (st == FL_ERR_NOMEM) return nomem();
    if (st != FL_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", fl_last_error());
        return bad(c, "", msg);
    }
    s->rx[s->n_rx] = x;
    s->nodes[n].rx = s->n_rx++;
    return FL_OK;
}

static fl_status compile(cctx *c, const cJSON *sch, int hops, int32_t *out) {
    if (cJSON_IsTrue(sch)) return any_node(c, out);
    if (!cJSON_IsObject(sch)) return bad(c, "a schema must be an object or true", NULL);
    const int32_t known = recall(c, sch);
    if (known >= 0) {
        *out = known;
        return FL_OK;
    }
    /* which keywords are there */
    bool has_type = false, has_obj = false, has_arr = false, has_str = false, has_int = false;
    const cJSON *ref = NULL, *any = NULL, *one = NULL, *all = NULL, *en = NULL, *cn = NULL, *ty = NULL, *nullable = NULL;
    const cJSON *k;
    int n_valid = 0; /* keywords that constrain (not annotations) */
    cJSON_ArrayForEach(k, sch) {
        const char *kw = k->string;
        if (is_annotation(kw)) continue;
        n_valid++;
        if (!strcmp(kw, "$ref")) ref = k;
        else if (!strcmp(kw, "anyOf")) any = k;
        else if (!strcmp(kw, "oneOf")) one = k;
        else if (!strcmp(kw, "allOf")) all = k;
        else if (!strcmp(kw, "enum")) en = k;
        else if (!strcmp(kw, "const")) cn = k;
        else if (!strcmp(kw, "type")) ty = k, has_type = true;
        else if (!strcmp(kw, "nullable")) nullable = k;
        else if (in_list(OBJ_KW, kw)) has_obj = true;
        else if (in_list(ARR_KW, kw)) has_arr = true;
        else if (in_list(STR_KW, kw)) has_str = true;
        else if (in_list(INT_KW, kw)) has_int = true;
        else return bad(c, "keyword not supported: ", kw);
    }
    if (nullable && !cJSON_IsBool(nullable)) return bad(c, "'nullable' must be a boolean", NULL);
    const int n_comb = (ref != NULL) + (any != NULL) + (one != NULL) + (all != NULL);
    if (n_comb > 1 || (n_comb && n_valid - (nullable != NULL) > 1))
        return bad(c, "$ref, anyOf, oneOf and allOf are supported alone (beside annotations)", NULL);
    const bool is_nullable = nullable && cJSON_IsTrue(nullable);
    if (ref || all) {
        int32_t t;
        fl_status st;
        if (ref) {
            if (!cJSON_IsString(ref)) return bad(c, "'$ref' must be a string", NULL);
            if (hops >= MAX_REF_HOPS) return bad(c, "'$ref' chain too long (a cycle?): ", ref->valuestring);
            const cJSON *tg = resolve(c, ref->valuestring);
            if (!tg) return bad(c, "'$ref' does not resolve in this document: ", ref->valuestring);
            st = compile(c, tg, hops + 1, &t);
        } else {
            if (!cJSON_IsArray(all) || cJSON_GetArraySize(all) != 1) return bad(c, "'allOf' is supported with one schema only", NULL);
            const size_t l = push(c, "allOf/0");
            st = compile(c, all->child, hops + 1, &t);
            if (st == FL_OK) pop(c, l);
        }
        if (st != FL_OK) return st;
        if (is_nullable) { /* a node of its own: the target's classes, and null */
            int32_t n2, z;
            if ((st = new_node(c, &n2)) != FL_OK || (st = new_node(c, &z)) != FL_OK) return st;
            memcpy(c->s->nodes[n2].cls, c->s->nodes[t].cls, sizeof c->s->nodes[n2].cls);
            c->s->nodes[z].cls[FL_JS_NULL] = z;
            if (c->s->nodes[n2].cls[FL_JS_NULL] < 0) c->s->nodes[n2].cls[FL_JS_NULL] = z;
            t = n2;
        }
        *out = t;
        return remember(c, sch, t);
    }
    int32_t n;
    fl_status st = new_node(c, &n);
    if (st == FL_OK) st = remember(c, sch, n); /* before the children: a recursive $ref finds it */
    if (st != FL_OK) return st;
    *out = n;
    if (any || one) {
        st = compile_union(c, any ? any : one, any ? "anyOf" : "oneOf", n);
        if (st != FL_OK) return st;
    } else if (en || cn) {
        if (en && cn) return bad(c, "'enum' and 'const' together are not supported", NULL);
        st = compile_enum(c, en ? en : cn, en ? "enum" : "const", n);
        if (st != FL_OK) return st;
    } else {
        bool t_obj = false, t_arr = false, t_str = false, t_num = false, t_int = false, t_bool = false, t_null = false;
        if (has_type) {
            const cJSON *tl = cJSON_IsArray(ty) ? ty->child : ty, *t;
            if (!tl) return bad(c, "'type' must be a name or a non-empty list of names", NULL);
            for (t = tl; t; t = cJSON_IsArray(ty) ? t->next : NULL) {
                if (!cJSON_IsString(t)) return bad(c, "'type' must be a name or a list of names", NULL);
                const char *v = t->valuestring;
                if (!strcmp(v, "object")) t_obj = true;
                else if (!strcmp(v, "array")) t_arr = true;
                else if (!strcmp(v, "string")) t_str = true;
                else if (!strcmp(v, "number")) t_num = true;
                else if (!strcmp(v, "integer")) t_int = true;
                else if (!strcmp(v, "boolean")) t_bool = true;
                else if (!strcmp(v, "null")) t_null = true;
                else return bad(c, "unknown type: ", v);
            }
        } else if (has_obj || has_arr || has_str || has_int) {
            t_obj = has_obj, t_arr = has_arr, t_str = has_str, t_int = has_int;
        } else {
            t_obj = t_arr = t_str = t_num = t_bool = t_null = true; /* {}: any value */
        }
        if (has_int && t_num) return bad(c, "minimum / maximum are supported on integers only", NULL);
        fl_js_node *nd = &c->s->nodes[n];
        if (t_obj) nd->cls[FL_JS_OBJ] = n;
        if (t_arr) nd->cls[FL_JS_ARR] = n;
        if (t_str) nd->cls[FL_JS_STR] = n;
        if (t_num || t_int) nd->cls[FL_JS_NUM] = n;
        nd->integer = t_int && !t_num;
        if (t_bool) nd->cls[FL_JS_BOOL] = n;
        if (t_null) nd->cls[FL_JS_NULL] = n;
        if ((st = int_bound(c, sch, "minimum", true, false, nd)) != FL_OK || (st = int_bound(c, sch, "maximum", false, false, nd)) != FL_OK ||
            (st = int_bound(c, sch, "exclusiveMinimum", true, true, nd)) != FL_OK ||
            (st = int_bound(c, sch, "exclusiveMaximum", false, true, nd)) != FL_OK)
            return st;
        if (nd->has_min && nd->has_max && nd->min > nd->max) return bad(c, "no integer lies between the bounds", NULL);
        if ((st = count_kw(c, sch, "minItems", &nd->min_items)) != FL_OK || (st = count_kw(c, sch, "maxItems", &nd->max_items)) != FL_OK ||
            (st = count_kw(c, sch, "minLength", &nd->min_len)) != FL_OK || (st = count_kw(c, sch, "maxLength", &nd->max_len)) != FL_OK)
            return st;
        if (nd->min_items > nd->max_items) return bad(c, "minItems exceeds maxItems", NULL);
        if (nd->min_len > nd->max_len) return bad(c, "minLength exceeds maxLength", NULL);
        if ((st = compile_pattern(c, sch, n)) != FL_OK) return st;
        if (t_arr) {
            const cJSON *it = cJSON_GetObjectItemCaseSensitive(sch, "items");
            int32_t m;
            if (it) {
                if (cJSON_IsFalse(it)) return bad(c, "'items': false is not supported", NULL);
                const size_t l = push(c, "items");
                st = compile(c, it, 0, &m);
                if (st != FL_OK) return st;
                pop(c, l);
            } else if ((st = any_node(c, &m)) != FL_OK) {
                return st;
            }
            c->s->nodes[n].items = m;
        }
        if (t_obj && (st = compile_object(c, sch, n)) != FL_OK) return st;
    }
    if (is_nullable && c->s->nodes[n].cls[FL_JS_NULL] < 0) {
        int32_t z;
        if ((st = new_node(c, &z)) != FL_OK) return st;
        c->s->nodes[z].cls[FL_JS_NULL] = z;
        c->s->nodes[n].cls[FL_JS_NULL] = z;
    }
    bool some = false;
    for (int j = 0; j < FL_JS_NCLASS; j++) some |= c->s->nodes[*out].cls[j] >= 0;
    if (!some) return bad(c, "no value satisfies this schema", NULL);
    return FL_OK;
}

fl_status fl_json_schema_compile(const char *text, fl_json_schema **out) {
    *out = NULL;
    /* (cJSON's hooks are left as the process set them: installing them here would hand objects
     * a caller made with malloc to the tracked free) */
    const size_t f0 = fl_mem_thread_failures();
    cJSON *doc = cJSON_Parse(text);
    if (!doc) return fl_mem_thread_failures() != f0 ? nomem() : fl_set_error(FL_ERR_INVALID, "json_schema: not valid JSON");
    fl_json_schema *s = fl_alloc(FL_MEM_GUIDE, sizeof *s, 0);
    if (!s) {
        cJSON_Delete(doc);
        return nomem();
    }
    memset(s, 0, sizeof *s);
    cctx c = {.s = s, .doc = doc, .any = -1};
    fl_status st = compile(&c, doc, 0, &s->root);
    if (st == FL_OK && s->nodes[s->root].cls[FL_JS_NUM] >= 0)
        st = fl_set_error(FL_ERR_INVALID, "json_schema: the root must not admit a bare number (nothing would end it)");
    fl_free(FL_MEM_GUIDE, c.memo, (size_t)c.cap_memo * sizeof *c.memo);
    cJSON_Delete(doc);
    if (st != FL_OK) {
        fl_json_schema_free(s);
        return st;
    }
    *out = s;
    return FL_OK;
}

fl_status fl_json_schema_choices(const char *const *texts, int32_t n, fl_json_schema **out) {
    *out = NULL;
    if (n < 1 || n > FL_JS_MAX_ENUM) return fl_set_error(FL_ERR_INVALID, "guided_choice: 1 to %d choices (got %d)", FL_JS_MAX_ENUM, n);
    fl_json_schema *s = fl_alloc(FL_MEM_GUIDE, sizeof *s, 0);
    if (!s) return nomem();
    memset(s, 0, sizeof *s);
    s->raw = 1;
    cctx c = {.s = s, .any = -1};
    fl_status st = new_node(&c, &s->root);
    for (int32_t i = 0; i < n && !st; i++) {
        int32_t id;
        if (!texts[i] || !texts[i][0]) st = fl_set_error(FL_ERR_INVALID, "guided_choice: choice %d is empty", i);
        else if ((st = add_str(&c, texts[i], strlen(texts[i]), &id)) == FL_OK)
            for (int32_t j = 0; j < id && !st; j++)
                if (!strcmp(s->str[j].p, s->str[id].p)) st = fl_set_error(FL_ERR_INVALID, "guided_choice: '%.40s' is listed twice", texts[i]);
    }
    if (st) {
        fl_json_schema_free(s);
        return st;
    }
    s->nodes[s->root].e0 = 0;
    s->nodes[s->root].ne = n;
    *out = s;
    return FL_OK;
}

void fl_json_schema_free(fl_json_schema *s) {
    if (!s) return;
    for (int32_t i = 0; i < s->n_str; i++) fl_free(FL_MEM_GUIDE, s->str[i].p, s->str[i].len + 1);
    for (int32_t i = 0; i < s->n_rx; i++) fl_regex_str_free(s->rx[i]);
    fl_free(FL_MEM_GUIDE, s->rx, (size_t)s->cap_rx * sizeof *s->rx);
    fl_free(FL_MEM_GUIDE, s->str, (size_t)s->cap_str * sizeof *s->str);
    fl_free(FL_MEM_GUIDE, s->nodes, (size_t)s->cap_nodes * sizeof *s->nodes);
    fl_free(FL_MEM_GUIDE, s, sizeof *s);
}
