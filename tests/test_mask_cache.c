/* The engine's token-mask cache (engine/mask_cache.c): kept masks come back bit for bit under
 * their keys, the least recently used is the one evicted, a key put again replaces its mask,
 * the allocation is what the plan counts, bad sizes are refused. */
#include "test.h"

#include "core/alloc.h"
#include "core/status.h"
#include "engine/mask_cache.h"

#include <string.h>

static void key_n(uint8_t key[16], int i) {
    memset(key, 0, 16);
    key[0] = (uint8_t)(i * 37); /* (several keys share a bucket: the low bits repeat every 8) */
    key[15] = (uint8_t)i;
}

static void fill(uint64_t *m, size_t words, int i) {
    for (size_t w = 0; w < words; w++) m[w] = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1) ^ w;
}

static void test_lru(void **state) {
    (void)state;
    const int32_t nv = 1000, n = 4;
    const size_t words = fl_mask_words(nv);
    assert_int_equal(words, 16);
    const size_t before = fl_mem_current(FL_MEM_MISC);
    fl_mask_cache *c;
    assert_int_equal(fl_mask_cache_new(n, nv, &c), FL_OK);
    assert_int_equal(fl_mem_current(FL_MEM_MISC) - before, fl_mask_cache_bytes(n, nv));
    uint8_t key[16];
    uint64_t want[16];
    for (int i = 0; i < n; i++) { /* keys 0..3 */
        key_n(key, i);
        assert_null(fl_mask_cache_get(c, key));
        fill(fl_mask_cache_work(c), words, i);
        fl_mask_cache_put(c, key);
    }
    key_n(key, 0); /* 0 is now the most recently used: 1 goes first */
    fill(want, words, 0);
    assert_memory_equal(fl_mask_cache_get(c, key), want, words * 8);
    for (int i = 4; i < 6; i++) { /* evict 1, then 2 */
        key_n(key, i);
        fill(fl_mask_cache_work(c), words, i);
        fl_mask_cache_put(c, key);
    }
    const int gone[] = {1, 2}, kept[] = {0, 3, 4, 5};
    for (int j = 0; j < 2; j++) {
        key_n(key, gone[j]);
        assert_null(fl_mask_cache_get(c, key));
    }
    for (int j = 0; j < 4; j++) {
        key_n(key, kept[j]);
        fill(want, words, kept[j]);
        const uint64_t *m = fl_mask_cache_get(c, key);
        assert_non_null(m);
        assert_memory_equal(m, want, words * 8);
    }
    key_n(key, 3); /* put again: the new mask, no eviction */
    fill(fl_mask_cache_work(c), words, 9);
    fl_mask_cache_put(c, key);
    fill(want, words, 9);
    assert_memory_equal(fl_mask_cache_get(c, key), want, words * 8);
    for (int j = 0; j < 4; j++) {
        key_n(key, kept[j]);
        assert_non_null(fl_mask_cache_get(c, key));
    }
    fl_mask_cache_stats st;
    fl_mask_cache_get_stats(c, &st);
    assert_int_equal(st.evictions, 2);
    assert_int_equal(st.n_kept, 4);
    assert_int_equal(st.n_masks, 4);
    assert_int_equal(st.hits, 1 + 4 + 1 + 4);
    assert_int_equal(st.misses, 4 + 2);
    fl_mask_cache_free(c);
    assert_int_equal(fl_mem_current(FL_MEM_MISC), before);
    fl_test_mem_zero();
}

/* many keys through a small cache: whatever is found is the mask put last under its key */
static void test_churn(void **state) {
    (void)state;
    const int32_t nv = 130, n = 7;
    const size_t words = fl_mask_words(nv);
    fl_mask_cache *c;
    assert_int_equal(fl_mask_cache_new(n, nv, &c), FL_OK);
    int last[64] = {0};
    uint64_t s = 12345, want[3];
    int found = 0;
    for (int step = 0; step < 5000; step++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        const int k = (int)(s >> 58); /* 0..63 */
        uint8_t key[16];
        key_n(key, k);
        const uint64_t *m = fl_mask_cache_get(c, key);
        if (m) {
            fill(want, words, last[k]);
            assert_memory_equal(m, want, words * 8);
            found++;
        }
        if (!m || step % 3 == 0) {
            last[k] = step;
            fill(fl_mask_cache_work(c), words, step);
            fl_mask_cache_put(c, key);
        }
    }
    fl_mask_cache_stats st;
    fl_mask_cache_get_stats(c, &st);
    assert_int_equal(st.hits, found);
    assert_true(found > 100 && st.evictions > 1000);
    fl_mask_cache_free(c);
    fl_test_mem_zero();
}

static void test_refused(void **state) {
    (void)state;
    fl_mask_cache *c = NULL;
    assert_int_equal(fl_mask_cache_new(0, 100, &c), FL_ERR_INVALID);
    assert_int_equal(fl_mask_cache_new(4, 0, &c), FL_ERR_INVALID);
    assert_null(c);
    assert_int_equal(fl_mask_cache_bytes(0, 32000), 0);
    fl_mem_fail_after(0);
    assert_int_equal(fl_mask_cache_new(4, 100, &c), FL_ERR_NOMEM);
    fl_mem_fail_after(-1);
    assert_null(c);
    fl_test_mem_zero();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lru),
        cmocka_unit_test(test_churn),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
