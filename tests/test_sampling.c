/* Tests for src/engine/sampling.c: greedy, filters, penalties, seeded determinism. */
#include "test.h"

#include "engine/json_fsm.h"
#include "engine/sampling.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static fl_sampler_params plain(float temp) {
    fl_sampler_params p = fl_sampler_default_params();
    p.temp = temp;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    return p;
}

static void test_greedy(void **state) {
    (void)state;
    float l[5] = {0.1f, 2.0f, -1.0f, 1.99f, 0.0f};
    fl_sampler_params p = plain(0.0f);
    fl_sampler *s;
    assert_int_equal(fl_sampler_new(&p, 5, &s), FL_OK);
    assert_int_equal(fl_sample(s, l, 5, NULL, 0), 1);
    /* repetition penalty 2 on token 1 (logit 2 -> 1): token 3 wins */
    int32_t hist[2] = {1, 4};
    fl_sampler_free(s);
    p.repeat_penalty = 2.0f;
    assert_int_equal(fl_sampler_new(&p, 5, &s), FL_OK);
    assert_int_equal(fl_sample(s, l, 5, hist, 2), 3);
    /* window of 1 only sees token 4: token 1 wins again */
    fl_sampler_free(s);
    p.penalty_last_n = 1;
    assert_int_equal(fl_sampler_new(&p, 5, &s), FL_OK);
    assert_int_equal(fl_sample(s, l, 5, hist, 2), 1);
    fl_sampler_free(s);
    /* frequency + presence: token 1 seen 3 times: 2 - 3*0.1 - 0.5 = 1.2 < 1.99 */
    p = plain(0.0f);
    p.freq_penalty = 0.1f;
    p.presence_penalty = 0.5f;
    int32_t h3[3] = {1, 1, 1};
    assert_int_equal(fl_sampler_new(&p, 5, &s), FL_OK);
    assert_int_equal(fl_sample(s, l, 5, h3, 3), 3);
    /* frequency 0.003 only: 2 - 0.009 = 1.991 > 1.99 */
    fl_sampler_free(s);
    p.freq_penalty = 0.003f;
    p.presence_penalty = 0.0f;
    assert_int_equal(fl_sampler_new(&p, 5, &s), FL_OK);
    assert_int_equal(fl_sample(s, l, 5, h3, 3), 1);
    fl_sampler_free(s);
    p.repeat_penalty = 0.0f;
    assert_int_equal(fl_sampler_new(&p, 5, &s), FL_ERR_INVALID);
    fl_test_mem_zero();
}

/* Frequencies of n draws with params p over logits l[3]. */
static void draw(const fl_sampler_params *p, const float *l, int n, int *counts) {
    fl_sampler *s;
    assert_int_equal(fl_sampler_new(p, 3, &s), FL_OK);
    memset(counts, 0, 3 * sizeof *counts);
    for (int i = 0; i < n; i++) counts[fl_sample(s, l, 3, NULL, 0)]++;
    fl_sampler_free(s);
}

static void test_distribution_and_filters(void **state) {
    (void)state;
    const float l[3] = {logf(0.5f), logf(0.3f), logf(0.2f)};
    int c[3];
    const int n = 20000;
    fl_sampler_params p = plain(1.0f);
    p.seed = 7;
    draw(&p, l, n, c);
    CHECK_NEAR(c[0] / (double)n, 0.5, 0.02);
    CHECK_NEAR(c[1] / (double)n, 0.3, 0.02);
    CHECK_NEAR(c[2] / (double)n, 0.2, 0.02);
    /* temperature 0.5 squares the odds: 25:9:4 */
    p.temp = 0.5f;
    draw(&p, l, n, c);
    CHECK_NEAR(c[0] / (double)n, 25.0 / 38, 0.02);
    CHECK_NEAR(c[2] / (double)n, 4.0 / 38, 0.02);
    /* top-k 1 is greedy at any temperature */
    p = plain(5.0f);
    p.top_k = 1;
    draw(&p, l, 1000, c);
    assert_int_equal(c[0], 1000);
    /* top-p 0.6: 0.5 < 0.6 so {0, 1} kept, renormalized 5:3 */
    p = plain(1.0f);
    p.top_p = 0.6f;
    draw(&p, l, n, c);
    assert_int_equal(c[2], 0);
    CHECK_NEAR(c[0] / (double)n, 0.625, 0.02);
    /* top-p 0 keeps the best alone */
    p = plain(1.0f);
    p.top_p = 0.0f;
    draw(&p, l, 1000, c);
    assert_int_equal(c[0], 1000);
    /* min-p 0.5: threshold 0.25 keeps {0, 1} */
    p = plain(1.0f);
    p.min_p = 0.5f;
    draw(&p, l, n, c);
    assert_int_equal(c[2], 0);
    assert_true(c[1] > 0);
    fl_test_mem_zero();
}

static void test_seeded(void **state) {
    (void)state;
    float l[64];
    for (int i = 0; i < 64; i++) l[i] = sinf((float)i);
    fl_sampler_params p = plain(1.0f);
    p.seed = 1234;
    fl_sampler *a, *b;
    assert_int_equal(fl_sampler_new(&p, 64, &a), FL_OK);
    assert_int_equal(fl_sampler_new(&p, 64, &b), FL_OK);
    int32_t ta[100], tb[100];
    for (int i = 0; i < 100; i++) ta[i] = fl_sample(a, l, 64, NULL, 0), tb[i] = fl_sample(b, l, 64, NULL, 0);
    assert_memory_equal(ta, tb, sizeof ta);
    fl_sampler_reseed(b, 1235);
    int same = 0;
    for (int i = 0; i < 100; i++) same += fl_sample(b, l, 64, NULL, 0) == ta[i];
    assert_true(same < 50);
    /* reseeding restarts the stream */
    fl_sampler_reseed(a, 1234);
    for (int i = 0; i < 100; i++) assert_int_equal(fl_sample(a, l, 64, NULL, 0), ta[i]);
    /* uniform floats: mean 1/2, all in [0, 1) */
    double sum = 0;
    for (int i = 0; i < 10000; i++) {
        float u = fl_sampler_rand_float(a);
        assert_true(u >= 0.0f && u < 1.0f);
        sum += u;
    }
    CHECK_NEAR(sum / 10000, 0.5, 0.01);
    fl_sampler_free(a);
    fl_sampler_free(b);
    fl_test_mem_zero();
}

/* A 5000-token vocabulary: top-k keeps exactly the k best in (logit, then lowest id) order, also
 * through a three-way tie at the top; temperature alone draws every token at its softmax rate. */
static int cmp_desc(const void *a, const void *b, const float *l) {
    const int x = *(const int *)a, y = *(const int *)b;
    if (l[x] != l[y]) return l[x] > l[y] ? -1 : 1;
    return x - y;
}
static const float *g_l;
static int cmp_desc_g(const void *a, const void *b) { return cmp_desc(a, b, g_l); }

static void test_large_vocab(void **state) {
    (void)state;
    enum { V = 5000, DRAWS = 20000 };
    static float l[V];
    static int order[V], counts[V];
    for (int i = 0; i < V; i++) l[i] = 3.0f * sinf(0.37f * (float)i) + 0.001f * (float)(i % 7);
    l[100] = l[200] = l[4000] = 4.0f; /* the best three tie */
    g_l = l;
    for (int i = 0; i < V; i++) order[i] = i;
    qsort(order, V, sizeof *order, cmp_desc_g);
    assert_int_equal(order[0], 100);
    assert_int_equal(order[1], 200);
    assert_int_equal(order[2], 4000);
    fl_sampler *s;
    /* top-k 2 at a high temperature: only 100 and 200, about equally */
    fl_sampler_params p = plain(100.0f);
    p.top_k = 2;
    p.seed = 5;
    assert_int_equal(fl_sampler_new(&p, V, &s), FL_OK);
    memset(counts, 0, sizeof counts);
    for (int i = 0; i < 2000; i++) counts[fl_sample(s, l, V, NULL, 0)]++;
    assert_int_equal(counts[100] + counts[200], 2000);
    CHECK_NEAR(counts[100] / 2000.0, 0.5, 0.05);
    fl_sampler_free(s);
    /* top-k 40 at temperature 1: only the 40 best, the best at its renormalized rate */
    p = plain(1.0f);
    p.top_k = 40;
    p.seed = 6;
    assert_int_equal(fl_sampler_new(&p, V, &s), FL_OK);
    memset(counts, 0, sizeof counts);
    for (int i = 0; i < DRAWS; i++) counts[fl_sample(s, l, V, NULL, 0)]++;
    int inside = 0;
    double z = 0;
    for (int i = 0; i < 40; i++) {
        inside += counts[order[i]];
        z += exp((double)l[order[i]] - 4.0);
    }
    assert_int_equal(inside, DRAWS);
    CHECK_NEAR(counts[order[0]] / (double)DRAWS, 1.0 / z, 0.01);
    fl_sampler_free(s);
    /* top-p 0.5 and min-p 0.3 without top-k, nuclei of hundreds of tokens: the draws stay inside
     * the sorted prefix each rule keeps, and min-p keeps the best at its renormalized rate */
    double zall = 0;
    for (int i = 0; i < V; i++) zall += exp((double)l[i] - 4.0);
    int nucleus = 0;
    for (double cum = 0; nucleus < V && cum < 0.5;) cum += exp((double)l[order[nucleus++]] - 4.0) / zall;
    int kept = 0;
    while (kept < V && exp((double)l[order[kept]] - 4.0) >= 0.3) kept++;
    assert_true(nucleus > 256 && kept > 64); /* both past the first selections */
    for (int rule = 0; rule < 2; rule++) {
        p = plain(1.0f);
        if (rule == 0) p.top_p = 0.5f;
        else p.min_p = 0.3f;
        p.seed = 8 + (uint64_t)rule;
        assert_int_equal(fl_sampler_new(&p, V, &s), FL_OK);
        memset(counts, 0, sizeof counts);
        for (int i = 0; i < DRAWS; i++) counts[fl_sample(s, l, V, NULL, 0)]++;
        const int lim = (rule == 0 ? nucleus : kept) + 1; /* (+ 1: a boundary token f32 rounding may keep) */
        int in = 0;
        double zk = 0;
        for (int i = 0; i < lim; i++) {
            in += counts[order[i]];
            zk += exp((double)l[order[i]] - 4.0);
        }
        assert_int_equal(in, DRAWS);
        CHECK_NEAR((counts[100] + counts[200] + counts[4000]) / (double)DRAWS, 3.0 / zk, 0.01);
        fl_sampler_free(s);
    }
    /* temperature alone: the whole vocabulary at its softmax rates */
    p = plain(1.0f);
    p.seed = 7;
    assert_int_equal(fl_sampler_new(&p, V, &s), FL_OK);
    memset(counts, 0, sizeof counts);
    for (int i = 0; i < DRAWS; i++) counts[fl_sample(s, l, V, NULL, 0)]++;
    z = 0;
    for (int i = 0; i < V; i++) z += exp((double)l[i] - 4.0);
    int seen = 0;
    for (int i = 0; i < V; i++) seen += counts[i] > 0;
    CHECK_NEAR((counts[100] + counts[200] + counts[4000]) / (double)DRAWS, 3.0 / z, 0.01);
    assert_true(seen > 200); /* far more than any top-k above */
    fl_sampler_free(s);
    fl_test_mem_zero();
}

/* fl_logprobs against log softmax in double and a full sort: random logits of the 32000-token
 * size, ties, a -inf entry, k = 0; a NaN entry and k = n_vocab on 5 logits */
static void test_logprobs(void **state) {
    (void)state;
    enum { NV = 32000, K = FL_MAX_TOP_LOGPROBS };
    float *l = malloc(NV * sizeof *l);
    assert_non_null(l);
    uint32_t r = 12345;
    for (int i = 0; i < NV; i++) {
        r = r * 1664525u + 1013904223u;
        l[i] = (float)(r >> 8) / (float)(1u << 24) * 30.0f - 10.0f;
    }
    l[100] = l[200] = l[300] = 25.0f; /* a three-way tie at the top: ids in order */
    l[7] = -INFINITY;
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < NV; i++) mx = l[i] > mx ? l[i] : mx;
    for (int i = 0; i < NV; i++) sum += exp((double)l[i] - mx);
    const double lse2 = mx + log(sum);
    fl_token_logprob top[K];
    float lp;
    fl_logprobs(l, NV, 555, K, &lp, top);
    assert_true(fabs(lp - ((double)l[555] - lse2)) < 1e-5);
    assert_int_equal(top[0].token, 100);
    assert_int_equal(top[1].token, 200);
    assert_int_equal(top[2].token, 300);
    bool used[NV];
    memset(used, 0, sizeof used);
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int i = 0; i < NV; i++)
            if (!used[i] && (best < 0 || l[i] > l[best])) best = i;
        used[best] = true;
        assert_int_equal(top[k].token, best);
        assert_true(fabs(top[k].logprob - ((double)l[best] - lse2)) < 1e-5);
    }
    fl_logprobs(l, NV, 7, 0, &lp, top); /* k = 0: the token alone; -inf stays -inf */
    assert_true(isinf(lp) && lp < 0);
    /* a NaN logit is never listed before a number; all n_vocab listed with k = n_vocab */
    float small[5] = {1.0f, NAN, 3.0f, -INFINITY, 3.0f};
    fl_token_logprob t5[5];
    fl_logprobs(small, 5, 0, 5, &lp, t5);
    assert_int_equal(t5[0].token, 2);
    assert_int_equal(t5[1].token, 4);
    assert_int_equal(t5[2].token, 0);
    assert_true(t5[3].token == 1 || t5[3].token == 3);
    assert_true(t5[4].token == 1 || t5[4].token == 3);
    free(l);
}

/* logit biases: added before everything else; -100 bans a token in practice, +bias can win
 * greedy; biases outside the vocabulary or not finite are refused */
static void test_logit_bias(void **state) {
    (void)state;
    float l[5] = {0.1f, 2.0f, -1.0f, 1.99f, 0.0f};
    fl_logit_bias b[2] = {{1, -0.5f}, {4, 0.3f}};
    fl_sampler_params p = plain(0.0f);
    p.bias = b;
    p.n_bias = 1;
    fl_sampler *s;
    assert_int_equal(fl_sampler_new(&p, 5, &s), FL_OK);
    b[0].bias = 9.0f; /* copied at creation: changing the caller's array changes nothing */
    assert_int_equal(fl_sample(s, l, 5, NULL, 0), 3); /* 2 - 0.5 < 1.99 */
    fl_sampler_free(s);
    /* a token listed twice gets both */
    fl_logit_bias twice[2] = {{4, 1.5f}, {4, 1.0f}};
    p.bias = twice;
    p.n_bias = 2;
    assert_int_equal(fl_sampler_new(&p, 5, &s), FL_OK);
    assert_int_equal(fl_sample(s, l, 5, NULL, 0), 4); /* 0 + 2.5 > 2 */
    fl_sampler_free(s);
    /* sampling at temperature 1 never draws a token biased by -100 */
    fl_logit_bias ban = {1, -100.0f};
    p = plain(1.0f);
    p.bias = &ban;
    p.n_bias = 1;
    int counts[3];
    float l3[3] = {0.0f, 5.0f, 0.0f};
    fl_sampler *s3;
    assert_int_equal(fl_sampler_new(&p, 3, &s3), FL_OK);
    memset(counts, 0, sizeof counts);
    for (int i = 0; i < 4000; i++) counts[fl_sample(s3, l3, 3, NULL, 0)]++;
    fl_sampler_free(s3);
    assert_int_equal(counts[1], 0);
    assert_true(counts[0] > 1700 && counts[2] > 1700);
    /* the same with top-k 2 (the sorted path) */
    p.top_k = 2;
    assert_int_equal(fl_sampler_new(&p, 3, &s3), FL_OK);
    for (int i = 0; i < 1000; i++) assert_int_not_equal(fl_sample(s3, l3, 3, NULL, 0), 1);
    fl_sampler_free(s3);
    /* refused: a token outside the vocabulary, a NaN or infinite bias, a count without entries */
    fl_logit_bias bad[3] = {{5, 1.0f}, {0, NAN}, {0, INFINITY}};
    for (int i = 0; i < 3; i++) {
        p.bias = &bad[i];
        p.n_bias = 1;
        assert_int_equal(fl_sampler_new(&p, 5, &s), FL_ERR_INVALID);
    }
    p.bias = NULL;
    p.n_bias = 2;
    assert_int_equal(fl_sampler_new(&p, 5, &s), FL_ERR_INVALID);
    fl_test_mem_zero();
}

/* 1 = the whole text is accepted and completes the object, 0 = accepted as a prefix only,
 * -1 = rejected; the same answer whatever the split into two feeds */
static int json_check(const char *t) {
    const int32_t n = (int32_t)strlen(t);
    int first = 2;
    for (int32_t cut = 0; cut <= n; cut++) {
        fl_json_fsm f;
        fl_json_fsm_init(&f);
        int r = fl_json_fsm_feed(&f, t, cut) && fl_json_fsm_feed(&f, t + cut, n - cut) ? fl_json_fsm_done(&f) : -1;
        if (first == 2) first = r;
        assert_int_equal(r, first);
    }
    return first;
}

static void test_json_fsm(void **state) {
    (void)state;
    const char *done[] = {"{}", " \n{\"a\":1}", "{\"k\" : [ ] }", "{\"a\":[[],[{}]],\"b\":{\"c\":{}}}",
                          "{\"a\":[1,2.5,-0,-0.0e+5,1E3,10e-2,true,false,null]}",
                          "{\"s\":\"x\\n\\\"\\\\\\/\\b\\f\\r\\t\\u00e9\\uABcd \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"}"};
    for (size_t i = 0; i < sizeof done / sizeof *done; i++)
        if (json_check(done[i]) != 1) fail_msg("not accepted as a whole object: %s", done[i]);
    const char *prefix[] = {"", " ", "{", "{\"a\"", "{\"a\":", "{\"a\":1", "{\"a\":-", "{\"a\":1.", "{\"a\":1e+",
                            "{\"a\":\"\xe2\x82", "{\"a\":\"\\u00", "{\"a\":tr", "{\"a\":[1,", "{\"a\":{\"b\":[]"};
    for (size_t i = 0; i < sizeof prefix / sizeof *prefix; i++)
        if (json_check(prefix[i]) != 0) fail_msg("not a prefix: %s", prefix[i]);
    const char *bad[] = {"[]", "1", "\"a\"", "{a:1}", "{\"a\":01}", "{\"a\":1.}", "{\"a\":.5}", "{\"a\":+1}",
                         "{\"a\":tru}", "{\"a\":\"\x01\"}", "{\"a\":\"\\x\"}", "{\"a\":\"\\u12G4\"}", "{\"a\":1,}",
                         "{\"a\" 1}", "{}x", "{} ", "{\"a\":[1 2]}", "{\"a\":\"\xc0\x80\"}", "{\"a\":\"\xe2\x28\"}",
                         "{\"a\":1e}", "{\"a\":-}", "{\"a\":}", "{\"a\":[}", "{\"a\":{]}", "{\"a\":nul}", "{,}",
                         "{\"a\":1}}", "{\"a\":[1]]", "{\"a\":\"\xf5\x80\x80\x80\"}", "{\"a\":\"x\"\"y\"}", "{\"a\":1:2}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (json_check(bad[i]) != -1) fail_msg("accepted: %s", bad[i]);
    /* whitespace runs up to FL_JSON_MAX_WS inside, FL_JSON_MAX_WS_LEAD before the object */
    char buf[4 * FL_JSON_MAX_DEPTH + 64];
    for (int extra = 0; extra < 2; extra++) {
        buf[0] = '{';
        memset(buf + 1, '\n', FL_JSON_MAX_WS + extra);
        strcpy(buf + 1 + FL_JSON_MAX_WS + extra, "}");
        assert_int_equal(json_check(buf), extra ? -1 : 1);
        memset(buf, ' ', FL_JSON_MAX_WS_LEAD + extra);
        strcpy(buf + FL_JSON_MAX_WS_LEAD + extra, "{ }");
        assert_int_equal(json_check(buf), extra ? -1 : 1);
    }
    /* nesting up to FL_JSON_MAX_DEPTH: the object and depth - 1 arrays, then one more */
    for (int extra = 0; extra < 2; extra++) {
        int k = 0;
        buf[k++] = '{';
        k += sprintf(buf + k, "\"a\":");
        for (int d = 1; d < FL_JSON_MAX_DEPTH + extra; d++) buf[k++] = '[';
        for (int d = 1; d < FL_JSON_MAX_DEPTH + extra; d++) buf[k++] = ']';
        buf[k++] = '}';
        buf[k] = 0;
        assert_int_equal(json_check(buf), extra ? -1 : 1);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_distribution_and_filters),
        cmocka_unit_test(test_seeded),
        cmocka_unit_test(test_large_vocab),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_json_fsm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
