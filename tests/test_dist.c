/* Communicator tests: run directly (single process) and under `mpirun -np 2/4` (tests/cli_mpi.sh). */
#include "test.h"
#include "dist/dist.h"

#include <string.h>

static fl_comm *g_comm;

static void test_collectives(void **state) {
    (void)state;
    fl_comm *c = g_comm;
    int r = fl_comm_rank(c), n = fl_comm_size(c);
    assert_true(r >= 0 && r < n);
    float v[5];
    for (int i = 0; i < 5; i++) v[i] = (float)(r + 1) * (i + 1);
    assert_int_equal(fl_comm_allreduce_sum_f32(c, v, 5), FL_OK);
    for (int i = 0; i < 5; i++) CHECK_NEAR(v[i], (double)n * (n + 1) / 2 * (i + 1), 1e-4);
    int32_t mine[2] = {r, 10 * r}, all[64];
    assert_int_equal(fl_comm_allgather(c, mine, all, sizeof mine), FL_OK);
    for (int k = 0; k < n; k++) {
        assert_int_equal(all[2 * k], k);
        assert_int_equal(all[2 * k + 1], 10 * k);
    }
    float send[3 * 16], recv[3];
    for (int k = 0; k < 3 * n; k++) send[k] = (float)(k + r);
    assert_int_equal(fl_comm_reduce_scatter_sum_f32(c, send, recv, 3), FL_OK);
    for (int i = 0; i < 3; i++) CHECK_NEAR(recv[i], (double)n * (3 * r + i) + (double)n * (n - 1) / 2, 1e-4);
    double b[2] = {r == 0 ? 3.5 : 0, r == 0 ? -1 : 0};
    assert_int_equal(fl_comm_bcast(c, b, sizeof b, 0), FL_OK);
    CHECK_NEAR(b[0], 3.5, 0);
    CHECK_NEAR(b[1], -1, 0);
    /* ring: pass my rank to the right, receive from the left */
    int32_t out = r, in = -1;
    assert_int_equal(fl_comm_sendrecv(c, &out, 4, (r + 1) % n, &in, 4, (r + n - 1) % n), FL_OK);
    assert_int_equal(in, (r + n - 1) % n);
    /* non-blocking ring, two messages in flight, matched in order */
    int32_t o2[2] = {100 + r, 200 + r}, i2[2] = {-1, -1};
    fl_comm_req q1, q2;
    assert_int_equal(fl_comm_isendrecv(c, &o2[0], 4, (r + 1) % n, &i2[0], 4, (r + n - 1) % n, &q1), FL_OK);
    assert_int_equal(fl_comm_isendrecv(c, &o2[1], 4, (r + 1) % n, &i2[1], 4, (r + n - 1) % n, &q2), FL_OK);
    assert_int_equal(fl_comm_wait(c, &q1), FL_OK);
    assert_int_equal(fl_comm_wait(c, &q2), FL_OK);
    assert_int_equal(i2[0], 100 + (r + n - 1) % n);
    assert_int_equal(i2[1], 200 + (r + n - 1) % n);
    /* plain send / receive: rank 0 -> rank 1 with sendrecv's -1 */
    if (n > 1 && r < 2) {
        int32_t x = r == 0 ? 42 : 0;
        assert_int_equal(r == 0 ? fl_comm_sendrecv(c, &x, 4, 1, NULL, 0, -1) : fl_comm_sendrecv(c, NULL, 0, -1, &x, 4, 0), FL_OK);
        assert_int_equal(x, 42);
    }
    assert_int_equal(fl_comm_barrier(c), FL_OK);
    if (n > 1) assert_true(fl_comm_bytes_sent(c) > 0);
}

int main(int argc, char **argv) {
    if (fl_comm_new(&argc, &argv, &g_comm) != FL_OK) {
        fprintf(stderr, "comm: %s\n", fl_last_error());
        return 1;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_collectives)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fl_comm_free(g_comm);
    return rc;
}
