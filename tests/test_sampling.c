/* Tests for src/engine/sampling.c: greedy, filters, penalties, seeded determinism. */
#include "test.h"

#include "engine/sampling.h"

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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_distribution_and_filters),
        cmocka_unit_test(test_seeded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
