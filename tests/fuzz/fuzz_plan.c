/*
 * fuzz_plan.c - libFuzzer target for the planner's config.json reader and its arithmetic.
 *
 * The input is a config.json text.  When it parses, the shape is planned under a few inputs
 * chosen from the input's last bytes (tp, attention kind, training, ZeRO, KV type) and the
 * fitting functions run against a budget; every answer is checked by planning it again.
 * Any crash, sanitizer report (integer overflow included), tracked-memory leak or failed
 * invariant aborts.
 */
#include "core/alloc.h"
#include "core/dtype.h"
#include "core/status.h"
#include "plan/plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_plan: invariant failed: %s (%s)\n", what, fl_last_error());
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 1 << 16) return 0;
    char *txt = fl_alloc(FL_MEM_MISC, size + 1, 1);
    check(txt != NULL, "alloc");
    memcpy(txt, data, size);
    txt[size] = 0;
    fl_model_shape s;
    fl_status st = fl_plan_shape_from_config_str(txt, &s);
    fl_free(FL_MEM_MISC, txt, size + 1);
    if (st != FL_OK) {
        check(st < 0 && fl_last_error()[0], "failure has a message");
        check(fl_mem_all_zero(), "tracked memory back at zero");
        return 0;
    }
    uint8_t k = size ? data[size - 1] : 0, k2 = size > 1 ? data[size - 2] : 0;
    static const int32_t kvs[] = {FL_TYPE_F16, FL_TYPE_Q8_0, FL_TYPE_FP8_E4M3, FL_TYPE_Q4_0};
    fl_plan_input in;
    fl_plan_input_default(&in, &s);
    in.n_ctx = 1 + (k2 % 64) * 37;
    in.n_seq = 1 + (k >> 6);
    in.tp = 1 << (k & 3);
    in.pp = 1 + ((k >> 2) & 1);
    in.attn = (k >> 3) & 1 ? FL_PLAN_ATTN_NAIVE : FL_PLAN_ATTN_FLASH;
    in.kv_type = kvs[(k >> 4) & 3];
    if (k2 & 0x80) {
        in.train = true;
        fl_plan_parse_wtype(k2 & 0x40 ? "bf16" : "f32", &in.weights);
        in.dp = 4;
        in.zero_stage = k2 & 3;
        in.ckpt_every = (k2 >> 2) & 7;
    } else if (k2 & 0x40) {
        fl_plan_parse_wtype("q4_K_M", &in.weights);
    }
    fl_plan_result r;
    st = fl_plan_compute(&s, &in, &r);
    if (st == FL_OK) {
        uint64_t mx = 0;
        for (int32_t d = 0; d < r.n_dev; d++) {
            uint64_t t = 0;
            for (int c = 0; c < FL_MEM_COUNT; c++) t = t + r.dev[d].bytes[c] < t ? UINT64_MAX : t + r.dev[d].bytes[c];
            check(t == r.dev[d].total, "device total is the sum of its categories");
            if (t > mx) mx = t;
        }
        check(mx == r.max_total, "max_total is the fullest device");
        uint64_t budget = r.max_total / 2 + (uint64_t)k * 1000003u;
        uint64_t kv;
        (void)fl_plan_kv_pool_bytes(&s, &in, budget, &kv);
        if (!in.train) {
            int64_t ctx;
            if (fl_plan_fit_ctx(&s, &in, budget, &ctx) == FL_OK) {
                fl_plan_input t = in;
                t.n_ctx = ctx;
                check(fl_plan_compute(&s, &t, &r) == FL_OK && r.max_total <= budget, "fitted ctx fits");
            }
            fl_plan_input best;
            if (fl_plan_fit_types(&s, &in, budget, &best) == FL_OK)
                check(fl_plan_compute(&s, &best, &r) == FL_OK && r.max_total <= budget, "fitted types fit");
        }
    } else {
        check(st < 0 && fl_last_error()[0], "plan failure has a message");
    }
    check(fl_mem_all_zero(), "tracked memory back at zero");
    return 0;
}
