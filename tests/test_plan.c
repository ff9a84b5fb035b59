/* Tests for src/plan: public arithmetic of the presets, exact GGUF bytes, config.json parsing,
 * KV types and windows, step buffers, training state, sharding, ZeRO, fitting (checked by
 * re-planning), the KV pool an engine gets from --mem. */
#include "test.h"
#include "kernels/matmul.h"

#include "core/dtype.h"
#include "core/status.h"
#include "formats/gguf.h"
#include "plan/plan.h"
#include "dist/zero.h"
#include "kernels/dispatch.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GiB 1073741824ull

static fl_model_shape shape(const char *preset) {
    fl_model_shape s;
    if (fl_plan_preset(preset, &s) != FL_OK) fail_msg("preset %s: %s", preset, fl_last_error());
    return s;
}

static fl_plan_result plan(const fl_model_shape *s, const fl_plan_input *in) {
    fl_plan_result r;
    if (fl_plan_compute(s, in, &r) != FL_OK) fail_msg("plan: %s", fl_last_error());
    return r;
}

/* Parameter counts of the published model cards (rounded as published) and the sums of the
 * shapes' matrices, which must agree to the published precision. */
static void test_preset_params(void **state) {
    (void)state;
    static const struct { const char *name; double billions, tol; } pub[] = {
        {"llama3-8b", 8.03, 0.005},      {"llama3-70b", 70.55, 0.05},   {"llama3.2-1b", 1.235, 0.01},
        {"llama3.2-3b", 3.21, 0.01},     {"mistral-7b", 7.24, 0.005},  {"mixtral-8x7b", 46.7, 0.05},
        {"qwen2.5-7b", 7.61, 0.01},      {"tinyllama-1.1b", 1.10, 0.005},
    };
    assert_int_equal(fl_plan_n_presets(), 8);
    for (size_t i = 0; i < sizeof pub / sizeof pub[0]; i++) {
        fl_model_shape s = shape(pub[i].name);
        CHECK_NEAR((double)fl_plan_n_params(&s) / 1e9, pub[i].billions, pub[i].tol);
    }
    /* Llama 3 8B by hand: 2 x 128256 x 4096 embeddings + output norm + 32 x (q, k, v, o, 3 ffn, 2 norms) */
    fl_model_shape s = shape("llama3-8b");
    int64_t layer = 4096ll * 4096 * 2 + 4096ll * 1024 * 2 + 3ll * 4096 * 14336 + 2 * 4096;
    assert_int_equal(fl_plan_n_params(&s), 2ll * 128256 * 4096 + 4096 + 32 * layer);
    fl_model_shape s1 = shape("LLAMA3.2-1B"); /* case-insensitive; tied output: no output matrix */
    assert_true(s1.tied_output);
    assert_int_equal(fl_plan_preset("llama-9", &s1), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "llama3-8b")); /* lists the known presets */
    fl_test_mem_zero();
}

/* "Llama 3 8B at F16 is ~16 GB of weights; KV for Llama 3 8B at 8K context, batch 1, f16 is 1 GiB" */
static void test_preset_public_arithmetic(void **state) {
    (void)state;
    fl_model_shape s = shape("llama3-8b");
    fl_plan_input in;
    fl_plan_input_default(&in, &s);
    in.n_ctx = 8192;
    fl_plan_result r = plan(&s, &in);
    /* f16 matrices + f32 norms (65 x 4096 x 4 bytes) */
    assert_int_equal(r.weights_total, 2ull * (uint64_t)fl_plan_n_params(&s) + 65ull * 4096 * 2);
    assert_true(r.weights_total > 16.0e9 && r.weights_total < 16.1e9);
    assert_int_equal(r.dev[0].bytes[FL_MEM_KV], GiB);
    assert_int_equal(r.kv_bytes_per_token, 2ull * 32 * 8 * 128 * 2);
    /* 70B: ~141 GB at f16, 320 KiB of KV per token */
    fl_model_shape s70 = shape("llama3-70b");
    fl_plan_input_default(&in, &s70);
    r = plan(&s70, &in);
    assert_true(r.weights_total > 141.0e9 && r.weights_total < 141.2e9);
    assert_int_equal(r.kv_bytes_per_token, 2ull * 80 * 8 * 128 * 2);
    /* true bits per weight: Q8_0 8.5, Q4_0 4.5, Q4_K 4.5, Q6_K 6.5625, NF4 ~4.127 */
    assert_int_equal(fl_plan_tensor_bytes(FL_TYPE_Q8_0, 4096, 1024), 4096ull * 1024 * 85 / 80);
    assert_int_equal(fl_plan_tensor_bytes(FL_TYPE_Q4_0, 4096, 1024), 4096ull * 1024 * 45 / 80);
    assert_int_equal(fl_plan_tensor_bytes(FL_TYPE_Q4_K, 4096, 1024), 4096ull * 1024 * 45 / 80);
    assert_int_equal(fl_plan_tensor_bytes(FL_TYPE_Q6_K, 4096, 1024), 4096ull * 1024 * 65625 / 80000);
    CHECK_NEAR(8.0 * (double)fl_plan_tensor_bytes(FL_TYPE_NF4, 4096, 4096) / (4096.0 * 4096), 4.127, 0.001);
    assert_int_equal(fl_plan_tensor_bytes(FL_TYPE_FP8_E4M3, 4096, 10), 40960 + 40); /* + f32 scale per row */
    assert_int_equal(fl_plan_tensor_bytes(FL_TYPE_F16, 4096, 3), 4096 * 3 * 2);
    /* Q4_K_M mix on Llama 3 8B: llama.cpp's files are 4.92 GB */
    fl_plan_parse_wtype("q4_K_M", &in.weights);
    uint64_t q4km = fl_plan_weights_bytes(&s, &in.weights, false);
    assert_true(q4km > 4.88e9 && q4km < 4.96e9);
    /* use_more_bits puts Q6_K on attn_v / ffn_down in 1/8 + 1/8 + every third layer between */
    int n_more = 0;
    for (int l = 0; l < 32; l++) n_more += fl_plan_role_type(&in.weights, FL_ROLE_FFN_DOWN, l, 32) == FL_TYPE_Q6_K;
    assert_int_equal(n_more, 4 + 4 + 8);
    assert_int_equal(fl_plan_role_type(&in.weights, FL_ROLE_OUTPUT, -1, 32), FL_TYPE_Q6_K);
    assert_int_equal(fl_plan_role_type(&in.weights, FL_ROLE_ATTN_Q, 0, 32), FL_TYPE_Q4_K);
    assert_int_equal(fl_plan_role_type(&in.weights, FL_ROLE_ATTN_NORM, 0, 32), FL_TYPE_F32);
    assert_int_equal(fl_plan_parse_wtype("q7_K_M", &in.weights), FL_ERR_INVALID);
    assert_int_equal(fl_plan_parse_wtype("i32", &in.weights), FL_ERR_INVALID);
    fl_test_mem_zero();
}

static uint64_t gguf_tensor_bytes(const char *path) {
    fl_gguf *g;
    if (fl_gguf_open(path, &g) != FL_OK) fail_msg("%s", fl_last_error());
    uint64_t t = 0;
    for (int64_t i = 0; i < fl_gguf_n_tensors(g); i++) t += fl_gguf_tensor_at(g, i)->size;
    fl_gguf_free(g);
    return t;
}

/* A GGUF-header plan carries the file's exact tensor bytes, and the formula computed from the
 * header's hyperparameters gives the same bytes for files of one block type. */
static void test_gguf_exact(void **state) {
    (void)state;
    NEED_SHARED();
    const char *path = FL_SHARED_PATH("models/stories260K.gguf");
    fl_model_shape s;
    assert_int_equal(fl_plan_shape_from_gguf(path, &s), FL_OK);
    assert_int_equal(s.n_layer, 5);
    assert_int_equal(s.n_embd, 64);
    assert_int_equal(s.n_head_kv, 4);
    assert_int_equal(s.head_dim, 8);
    assert_int_equal(s.n_vocab, 512);
    assert_int_equal(s.n_ff, 172);
    assert_false(s.tied_output);
    assert_true(s.has_weight_bytes);
    fl_plan_input in;
    fl_plan_input_default(&in, &s);
    assert_true(in.weights_from_file);
    fl_plan_result r = plan(&s, &in);
    uint64_t exact = gguf_tensor_bytes(path);
    assert_int_equal(r.weights_total, exact);
    assert_int_equal(r.dev[0].bytes[FL_MEM_WEIGHTS], exact);
    assert_int_equal(r.kv_bytes_per_token, 640);
    assert_int_equal(r.n_params, exact / 4);
    /* the same from the hyperparameters alone, all f32 */
    s.has_weight_bytes = false;
    fl_plan_parse_wtype("f32", &in.weights);
    assert_int_equal(fl_plan_weights_bytes(&s, &in.weights, false), exact);
    assert_int_equal((uint64_t)fl_plan_n_params(&s) * 4, exact);
    /* q8_0 KV needs head_dim % 32 == 0 */
    assert_int_equal(fl_plan_kv_bytes_per_token(&s, FL_TYPE_Q8_0, &(uint64_t){0}), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "head_dim"));
    /* synth256 files quantized with --pure: every matrix one type, norms f32 */
    static const struct { const char *file, *type; } pure[] = {
        {"F32", "f32"}, {"F16", "f16"}, {"BF16", "bf16"}, {"Q8_0", "q8_0"}, {"Q4_0", "q4_0"}, {"Q4_1", "q4_1"},
        {"Q5_0", "q5_0"}, {"Q5_1", "q5_1"}, {"Q2_K", "q2_K"}, {"Q3_K_M", "q3_K"}, {"Q4_K_M", "q4_K"},
        {"Q5_K_M", "q5_K"}, {"Q6_K", "q6_K"}, {"IQ4_NL", "iq4_nl"},
    };
    for (size_t i = 0; i < sizeof pure / sizeof pure[0]; i++) {
        char rel[128];
        snprintf(rel, sizeof rel, "models/synth256/synth256-%s.gguf", pure[i].file);
        fl_model_shape m;
        assert_int_equal(fl_plan_shape_from_gguf(FL_SHARED_PATH(rel), &m), FL_OK);
        fl_plan_wtype w;
        assert_int_equal(fl_plan_parse_wtype(pure[i].type, &w), FL_OK);
        uint64_t file = fl_plan_weights_bytes(&m, &w, true), formula = fl_plan_weights_bytes(&m, &w, false);
        if (file != formula || file != gguf_tensor_bytes(FL_SHARED_PATH(rel)))
            fail_msg("%s: file %llu, formula %llu", pure[i].file, (unsigned long long)file, (unsigned long long)formula);
        assert_int_equal(m.file_type, w.base);
    }
    /* a vocab-only header (Llama 2 7B hyperparameters, no tensors) is planned from its shape */
    fl_model_shape v;
    assert_int_equal(fl_plan_shape_from_gguf(FL_SHARED_PATH("vocab/ggml-vocab-llama-spm.gguf"), &v), FL_OK);
    assert_false(v.has_weight_bytes);
    CHECK_NEAR((double)fl_plan_n_params(&v) / 1e9, 6.74, 0.005); /* Llama 2 7B */
    fl_plan_input_default(&in, &v);
    assert_false(in.weights_from_file);
    fl_plan_result rr = plan(&v, &in);
    assert_int_equal(rr.kv_bytes_per_token, 2ull * 32 * 32 * 128 * 2);
    /* a header without layers cannot be planned, and says why */
    v.n_layer = 0;
    assert_int_equal(fl_plan_compute(&v, &in, &rr), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "layers"));
    fl_test_mem_zero();
}

static void test_config_json(void **state) {
    (void)state;
    char path[] = "/tmp/fl_test_plan_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *cfg = "{\n  \"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\",\n"
                      "  \"vocab_size\": 128256, \"hidden_size\": 4096, \"intermediate_size\": 14336,\n"
                      "  \"num_hidden_layers\": 32, \"num_attention_heads\": 32, \"num_key_value_heads\": 8,\n"
                      "  \"max_position_embeddings\": 8192, \"rope_theta\": 500000.0, \"tie_word_embeddings\": false,\n"
                      "  \"torch_dtype\": \"bfloat16\", \"rms_norm_eps\": 1e-05, \"sliding_window\": null\n}\n";
    assert_int_equal(write(fd, cfg, strlen(cfg)), (ssize_t)strlen(cfg));
    close(fd);
    fl_model_shape c, p = shape("llama3-8b");
    assert_int_equal(fl_plan_shape_from_config(path, &c), FL_OK);
    unlink(path);
    assert_string_equal(c.name, "llama");
    assert_int_equal(c.n_vocab, p.n_vocab);
    assert_int_equal(c.n_embd, p.n_embd);
    assert_int_equal(c.n_ff, p.n_ff);
    assert_int_equal(c.n_layer, p.n_layer);
    assert_int_equal(c.n_head_kv, 8);
    assert_int_equal(c.head_dim, 128); /* hidden / heads */
    assert_int_equal(c.n_ctx_train, 8192);
    assert_int_equal(c.sliding_window, 0);
    fl_plan_input in;
    fl_plan_input_default(&in, &c);
    fl_plan_result a = plan(&c, &in), b = plan(&p, &in);
    assert_int_equal(a.max_total, b.max_total);
    /* Mixtral-style MoE and a Qwen2 config (bias, window off unless use_sliding_window) */
    assert_int_equal(fl_plan_shape_from_config_str("{\"vocab_size\":32000,\"hidden_size\":4096,\"intermediate_size\":14336,"
                                                   "\"num_hidden_layers\":32,\"num_attention_heads\":32,\"num_key_value_heads\":8,"
                                                   "\"num_local_experts\":8,\"num_experts_per_tok\":2,\"model_type\":\"mixtral\"}", &c),
                     FL_OK);
    p = shape("mixtral-8x7b");
    assert_int_equal(fl_plan_n_params(&c), fl_plan_n_params(&p));
    assert_int_equal(fl_plan_shape_from_config_str("{\"vocab_size\":152064,\"hidden_size\":3584,\"intermediate_size\":18944,"
                                                   "\"num_hidden_layers\":28,\"num_attention_heads\":28,\"num_key_value_heads\":4,"
                                                   "\"sliding_window\":131072,\"use_sliding_window\":false,\"model_type\":\"qwen2\"}", &c),
                     FL_OK);
    p = shape("qwen2.5-7b");
    assert_int_equal(c.sliding_window, 0);
    assert_true(c.qkv_bias);
    assert_int_equal(fl_plan_n_params(&c), fl_plan_n_params(&p));
    /* errors name the problem */
    assert_int_equal(fl_plan_shape_from_config_str("{\"vocab_size\": 10}", &c), FL_ERR_FORMAT);
    assert_non_null(strstr(fl_last_error(), "hidden_size"));
    assert_int_equal(fl_plan_shape_from_config_str("{\"vocab_size\": -1, \"hidden_size\": 8}", &c), FL_ERR_FORMAT);
    assert_non_null(strstr(fl_last_error(), "vocab_size"));
    assert_int_equal(fl_plan_shape_from_config_str("{\"vocab_size\": 1.5}", &c), FL_ERR_FORMAT);
    assert_int_equal(fl_plan_shape_from_config_str("[1, 2", &c), FL_ERR_FORMAT);
    assert_non_null(strstr(fl_last_error(), "not valid JSON"));
    assert_int_equal(fl_plan_shape_from_config("/nonexistent/config.json", &c), FL_ERR_IO);
    fl_test_mem_zero();
}

static void test_kv_types_and_window(void **state) {
    (void)state;
    fl_model_shape s = shape("llama3-8b");
    uint64_t t;
    assert_int_equal(fl_plan_kv_bytes_per_token(&s, FL_TYPE_F32, &t), FL_OK);
    assert_int_equal(t, 2ull * 32 * 8 * 128 * 4);
    assert_int_equal(fl_plan_kv_bytes_per_token(&s, FL_TYPE_BF16, &t), FL_OK);
    assert_int_equal(t, 2ull * 32 * 8 * 128 * 2);
    assert_int_equal(fl_plan_kv_bytes_per_token(&s, FL_TYPE_Q8_0, &t), FL_OK);
    assert_int_equal(t, 2ull * 32 * 8 * 128 / 32 * 34);
    assert_int_equal(fl_plan_kv_bytes_per_token(&s, FL_TYPE_Q4_0, &t), FL_OK);
    assert_int_equal(t, 2ull * 32 * 8 * 128 / 32 * 18);
    assert_int_equal(fl_plan_kv_bytes_per_token(&s, FL_TYPE_FP8_E4M3, &t), FL_OK);
    assert_int_equal(t, 2ull * 32 * 8 * 128 + 2ull * 32 * 8 * 4 / 16); /* 1 B + a 4-byte scale per 16 tokens x head */
    assert_int_equal(fl_plan_kv_bytes_per_token(&s, FL_TYPE_Q4_K, &t), FL_ERR_INVALID);
    /* whole blocks per sequence: 17 tokens take 2 blocks of 16 */
    uint64_t kv;
    assert_int_equal(fl_plan_kv_bytes(&s, FL_TYPE_F16, 17, 3, 16, 1, 1, 0, 32, &kv), FL_OK);
    assert_int_equal(kv, 3ull * 32 * 131072);
    assert_int_equal(fl_plan_kv_bytes(&s, FL_TYPE_F16, 17, 1, 24, 1, 1, 0, 32, &kv), FL_ERR_INVALID); /* block % 16 */
    /* tp splits KV heads (8 / 2), sp splits tokens */
    assert_int_equal(fl_plan_kv_bytes(&s, FL_TYPE_F16, 8192, 1, 16, 2, 1, 0, 32, &kv), FL_OK);
    assert_int_equal(kv, GiB / 2);
    assert_int_equal(fl_plan_kv_bytes(&s, FL_TYPE_F16, 8192, 1, 16, 1, 4, 0, 32, &kv), FL_OK);
    assert_int_equal(kv, GiB / 4);
    assert_int_equal(fl_plan_kv_bytes(&s, FL_TYPE_F16, 8192, 1, 16, 16, 1, 0, 32, &kv), FL_OK);
    assert_int_equal(kv, GiB / 8); /* 8 KV heads over 16 ranks: one head each (replicated) */
    /* sliding window (Mistral 7B v0.1, 4096): a 32K context holds 4096/16 + 1 blocks per layer */
    fl_model_shape m = shape("mistral-7b");
    assert_int_equal(fl_plan_kv_bytes(&m, FL_TYPE_F16, 32768, 1, 16, 1, 1, 0, 32, &kv), FL_OK);
    assert_int_equal(kv, 32ull * (4096 / 16 + 1) * 16 * 2 * 8 * 128 * 2);
    assert_int_equal(fl_plan_kv_bytes(&m, FL_TYPE_F16, 1024, 1, 16, 1, 1, 0, 32, &kv), FL_OK);
    assert_int_equal(kv, 1024ull * 131072); /* below the window: everything */
    m.n_swa_layers = 16; /* half the layers windowed: the other half hold all 32K */
    assert_int_equal(fl_plan_kv_bytes(&m, FL_TYPE_F16, 32768, 1, 16, 1, 1, 0, 32, &kv), FL_OK);
    assert_int_equal(kv, 16ull * (4096 / 16 + 1) * 16 * 4096 + 16ull * 32768 * 4096);
    fl_test_mem_zero();
}

static void test_step_buffers(void **state) {
    (void)state;
    fl_model_shape s = shape("llama3-8b");
    fl_plan_buffers b;
    /* 512-token prefill chunk at 8K, 1 logits row, flash, 4 threads, q4_K weights, f16 KV */
    fl_plan_inference_buffers(&s, 512, 8192, 1, FL_PLAN_ATTN_FLASH, 4, 1, FL_TYPE_Q4_K, FL_TYPE_F16, &b);
    assert_int_equal(b.x, 512ull * 4096 * 4);
    assert_int_equal(b.q, 512ull * 4096 * 4);
    assert_int_equal(b.k, 512ull * 1024 * 4);
    assert_int_equal(b.hb, 512ull * 14336 * 4);
    assert_int_equal(b.scores, 0);
    assert_int_equal(b.logits, 128256ull * 4);
    assert_int_equal(b.router, 0);
    assert_int_equal(b.xl, 4096ull * 4);
    /* paged-attention workspace: 4 threads x (2 x 16 x 128 + 16 + 2 x 16 x 4 x 130) floats =
     * 332032 bytes, + the 512 f16-rounded query rows (f16 KV) of 4096 floats = 8720640 bytes,
     * grown by doubling from 64 KiB */
    assert_int_equal(b.tiles, 16777216);
    /* q4_K: on AVX-512 and AVX2 the int8 panel path (activations as below + one 16-row panel per
     * thread with its mins: 448 blocks x (576 + 64) bytes); otherwise 8 dequantized f32 rows per
     * thread */
    const uint64_t act8 = 512ull * 14336 + 4 * 512ull * 448 * 4 + 512ull * 448 * 8 + 2 * 512ull * 448 * 32;
    if (fl_amx_bf16_usable()) /* AMX-BF16 tiles (64 tokens or more): 512 tokens x 14336 bf16 activations,
                               * and per thread 32 panels of 16 x 1024 bf16 values (1 MiB) and an f32
                               * row of 1024 values */
        assert_int_equal(b.qact, 512ull * 14336 * 2 + 4ull * (32 * 16 * 1024 * 2 + 1024 * 4));
    else if (fl_amx_usable()) /* AMX-INT8 tiles instead: 32 token tiles x 448 blocks x 768 bytes, and per
                          * thread floor(512 KiB / panel) = 1 panel of 16 x 14336 codes + 448 x 16
                          * scales and mins */
        assert_int_equal(b.qact, act8 + 32ull * 448 * 768 + 4ull * (16 * 14336 + 448 * 128));
    else if (fl_isa_get() >= FL_ISA_AVX2)
        assert_int_equal(b.qact, act8 + 4ull * 448 * 640);
    else
        assert_int_equal(b.qact, 4ull * 8 * 14336 * 4);
    assert_int_equal(b.batch, 512ull * 17 + 16); /* tokens, positions, sequences, adapters: 4 bytes each; a logit flag;
                                                  * per logits row its request, position and drafts */
    assert_int_equal(b.act_total, b.x * 3 + b.q * 2 + b.k * 2 + b.hb * 2 + b.xl + b.logits);
    assert_int_equal(b.scratch_total, b.tiles + b.qact + b.batch);
    /* q8_0 / q4_0 weights: quantized activations [512][14336] (1 byte each, 3 x f32 and 2 x 32
     * bytes per 32-block) */
    fl_plan_buffers q;
    fl_plan_inference_buffers(&s, 512, 8192, 1, FL_PLAN_ATTN_FLASH, 4, 1, FL_TYPE_Q4_0, FL_TYPE_F16, &q);
    /* + on AVX2 and AVX-512, one repacked 16-row weight panel per thread: 448 blocks x 576 bytes */
    /* (AMX: the tiles and per thread 2 panels of 16 x 14336 codes + 448 x 16 scales) */
    /* (AMX-BF16: as for q4_K above, no 8-bit activations) */
    const uint64_t panels = fl_amx_usable() ? 32ull * 448 * 768 + 4ull * 2 * (16 * 14336 + 448 * 64)
                            : fl_isa_get() >= FL_ISA_AVX2 ? 4ull * 448 * 576 : 0;
    if (fl_amx_bf16_usable()) assert_int_equal(q.qact, b.qact);
    else assert_int_equal(q.qact, act8 + panels);
    /* a Q4_K_M mix: the largest workspace of its types; on AVX2 without AMX the Q6_K panels,
     * 448 blocks x (576 + 128) bytes per thread, are larger than Q4_K's */
    fl_plan_buffers mix, q6;
    const int32_t mix_types[2] = {FL_TYPE_Q4_K, FL_TYPE_Q6_K};
    fl_plan_inference_buffers_types(&s, 512, 8192, 1, FL_PLAN_ATTN_FLASH, 4, 1, mix_types, 2, FL_TYPE_F16, &mix);
    fl_plan_inference_buffers(&s, 512, 8192, 1, FL_PLAN_ATTN_FLASH, 4, 1, FL_TYPE_Q6_K, FL_TYPE_F16, &q6);
    assert_int_equal(mix.qact, q6.qact > b.qact ? q6.qact : b.qact);
    assert_int_equal(mix.scratch_total, mix.tiles + mix.qact + mix.batch);
    if (fl_isa_get() == FL_ISA_AVX2 && !fl_amx_usable()) {
        assert_int_equal(q6.qact, act8 + 4ull * 448 * 704);
        assert_true(mix.qact > b.qact);
    }
    /* and fl_plan_compute plans a q4_K_M model with it */
    fl_plan_input pin;
    fl_plan_input_default(&pin, &s);
    assert_int_equal(fl_plan_parse_wtype("q4_K_M", &pin.weights), FL_OK);
    pin.kv_type = FL_TYPE_F16;
    pin.n_ctx = 8192;
    pin.n_seq = 1;
    pin.n_prefill = 511;
    pin.attn = FL_PLAN_ATTN_FLASH;
    pin.n_threads = 4;
    const fl_plan_result pr = plan(&s, &pin);
    assert_int_equal(pr.buf.qact, mix.qact);
    /* naive attention keeps [n_head][n_tokens][n_ctx] scores */
    fl_plan_buffers n;
    fl_plan_inference_buffers(&s, 512, 8192, 1, FL_PLAN_ATTN_NAIVE, 4, 1, FL_TYPE_Q4_K, FL_TYPE_F16, &n);
    assert_int_equal(n.scores, 32ull * 512 * 8192 * 4);
    assert_int_equal(n.tiles, 0);
    assert_int_equal(fl_plan_inference_act_bytes(&s, 512, 8192, FL_PLAN_ATTN_NAIVE),
                     n.act_total - n.logits - n.xl + 512ull * 128256 * 4 + 512ull * 4096 * 4); /* every row's logits */
    /* one thread: the attention workspace (4 x (2·16·128 + 16 + 2·32·4·130) = 149568 bytes,
     * 32-row query tiles) rounds to 256 KiB; f16 weights round the 8 tokens' activations to
     * f16, and on the reference ISA (AVX2 and AVX-512 read the f16 rows as they are) dequantize 8
     * rows of the widest input */
    fl_plan_inference_buffers(&s, 8, 8192, 8, FL_PLAN_ATTN_FLASH, 1, 1, FL_TYPE_F16, FL_TYPE_Q8_0, &b);
    assert_int_equal(b.tiles, 262144);
    assert_int_equal(b.qact, 8ull * 14336 * 4 + (fl_isa_get() == FL_ISA_REF ? 8ull * 14336 * 4 : 0));
    /* MoE: router logits and n_expert_used x n_ff hidden */
    fl_model_shape x = shape("mixtral-8x7b");
    fl_plan_inference_buffers(&x, 4, 64, 4, FL_PLAN_ATTN_FLASH, 1, 2, FL_TYPE_F32, FL_TYPE_F16, &b);
    assert_int_equal(b.router, 4ull * 8 * 4);
    assert_int_equal(b.hb, 4ull * 14336 * 2 / 2 * 4); /* tp 2 */
    assert_int_equal(b.logits, 4ull * 16000 * 4);
    assert_int_equal(b.qact, 0);
    fl_test_mem_zero();
}

static void test_training(void **state) {
    (void)state;
    fl_model_shape s = shape("tinyllama-1.1b");
    const uint64_t P = (uint64_t)fl_plan_n_params(&s);
    fl_plan_input in;
    fl_plan_input_default(&in, &s);
    in.train = true;
    in.n_ctx = 1024;
    in.n_seq = 2;
    fl_plan_parse_wtype("f32", &in.weights);
    fl_plan_result a = plan(&s, &in);
    assert_int_equal(a.dev[0].bytes[FL_MEM_WEIGHTS], 4 * P);
    assert_int_equal(a.dev[0].bytes[FL_MEM_GRAD], 4 * P);
    assert_int_equal(a.dev[0].bytes[FL_MEM_OPTIM], 8 * P); /* fp32 m and v */
    assert_int_equal(a.dev[0].bytes[FL_MEM_KV], 0);
    in.optim = FL_PLAN_OPTIM_ADAMW8BIT;
    fl_plan_result b = plan(&s, &in);
    const uint64_t absmax = 2 * ((P + 255) / 256) * 4; /* an f32 absmax per block of 256, m and v */
    assert_int_equal(b.dev[0].bytes[FL_MEM_OPTIM], 2 * P + absmax);
    assert_int_equal(a.max_total - b.max_total, 6 * P - absmax);
    /* mixed precision as fitllm's trainer does it: f32 parameters, grads and activations, and an
     * f32 copy rounded to bf16 values for the forward (16-bit numerics, not 16-bit storage) */
    in.optim = FL_PLAN_OPTIM_ADAMW;
    fl_plan_parse_wtype("bf16", &in.weights);
    fl_plan_result m = plan(&s, &in);
    assert_int_equal(m.dev[0].bytes[FL_MEM_WEIGHTS], 8 * P);
    assert_int_equal(m.dev[0].bytes[FL_MEM_GRAD], 4 * P);
    assert_int_equal(m.dev[0].bytes[FL_MEM_OPTIM], 8 * P);
    assert_int_equal(m.dev[0].bytes[FL_MEM_ACT], a.dev[0].bytes[FL_MEM_ACT]);
    /* activations: all layers vs checkpoints every 2 layers (11 checkpoints + one 2-layer segment) */
    uint64_t act_all = m.dev[0].bytes[FL_MEM_ACT];
    in.ckpt_every = 2;
    fl_plan_result c = plan(&s, &in);
    uint64_t N = 2 * 1024, E = 2048, per = 4 * (4 * E + 2 * 2048 + 2 * 256 + 3 * 5632) + 8 + 4 * 32;
    uint64_t tail = N * (2 * E * 4 + 32000 * 4 + 16); /* final residual and norm, logits, 4 f32 per token */
    /* on one device the plan is the trainer's own layout: these bytes and its slot table (a few
     * KiB: a record of pointers per layer kept) */
    const uint64_t f_all = N * 22 * per + tail;
    if (!(act_all >= f_all && act_all - f_all < 8192)) fail_msg("activations %llu, formula %llu", (unsigned long long)act_all, (unsigned long long)f_all);
    /* (the segment's first layer reads its input from its checkpoint) */
    const uint64_t f_ck = N * 11 * E * 4 + N * 2 * per - N * E * 4 + tail, act_ck = c.dev[0].bytes[FL_MEM_ACT];
    if (!(act_ck >= f_ck && act_ck - f_ck < 8192)) fail_msg("checkpointed activations %llu, formula %llu", (unsigned long long)act_ck, (unsigned long long)f_ck);
    /* with the layers on two pipeline stages each is planned by the formula alone: the first
     * stage's 11 layers, no final norm or logits */
    in.ckpt_every = 0;
    in.pp = 2;
    fl_plan_result p2 = plan(&s, &in);
    assert_int_equal(p2.dev[0].bytes[FL_MEM_ACT], N * 11 * per);
    in.pp = 1;
    in.ckpt_every = 2;
    /* LoRA rank 16 on a frozen f32 base: adapters r (in + out) per matrix, their grads and AdamW
     * states; each token saves x A^T of the 7 matrices per layer; QLoRA: NF4 matrices (33 bytes
     * per 64 weights and an f32 per 256 blocks of a row) and the largest matrix as f32 scratch */
    in.ckpt_every = 0;
    fl_plan_parse_wtype("f32", &in.weights);
    fl_plan_result f32 = plan(&s, &in);
    in.lora_rank = 16;
    fl_plan_result lo = plan(&s, &in);
    const uint64_t io = (2048 + 2048) * 2 + (2048 + 256) * 2 + (2048 + 5632) * 3, ad = 22 * 16 * io * 4;
    assert_int_equal(lo.dev[0].bytes[FL_MEM_GRAD], ad);
    assert_int_equal(lo.dev[0].bytes[FL_MEM_OPTIM], 2 * ad);
    assert_int_equal(lo.dev[0].bytes[FL_MEM_WEIGHTS], 4 * P + ad);
    assert_int_equal(lo.dev[0].bytes[FL_MEM_ACT], f32.dev[0].bytes[FL_MEM_ACT] + N * 22 * 7 * 16 * 4);
    assert_int_equal(lo.dev[0].bytes[FL_MEM_SCRATCH], f32.dev[0].bytes[FL_MEM_SCRATCH] + N * 16 * 4);
    in.lora_nf4 = true;
    fl_plan_result q = plan(&s, &in);
    const uint64_t mats = 2048ull * 2048 * 2 + 2048ull * 256 * 2 + 2048ull * 5632 * 3;
    const uint64_t nf4 = 2048ull * (2048 / 64 * 33 + 4) * 2 + 256ull * (2048 / 64 * 33 + 4) * 2 + 5632ull * (2048 / 64 * 33 + 4) * 2 +
                         2048ull * (5632 / 64 * 33 + 4);
    assert_int_equal(q.dev[0].bytes[FL_MEM_WEIGHTS], 4 * P - 22 * mats * 4 + 22 * nf4 + ad);
    assert_int_equal(q.dev[0].bytes[FL_MEM_SCRATCH], lo.dev[0].bytes[FL_MEM_SCRATCH] + 2048ull * 5632 * 4);
    /* QLoRA data parallel with ZeRO 1 / 2 (the trainer's): the adapters are what is sharded */
    in.dp = 2;
    const uint64_t Ls = (uint64_t)fl_zero_stride(2, (int64_t)(ad / 4), 256);
    for (int k = 1; k <= 2; k++) {
        in.zero_stage = k;
        fl_plan_result zq = plan(&s, &in);
        assert_int_equal(zq.dev[0].bytes[FL_MEM_WEIGHTS], q.dev[0].bytes[FL_MEM_WEIGHTS]);
        assert_int_equal(zq.dev[0].bytes[FL_MEM_OPTIM], 8 * Ls);
        assert_int_equal(zq.dev[0].bytes[FL_MEM_GRAD], ad + (k == 2 ? 4 * Ls : 0));
        assert_int_equal(zq.dev[0].bytes[FL_MEM_COMM], 3 * (Ls < (1u << 20) ? Ls : (1u << 20)) * 4 + fl_comm_object_bytes());
        assert_int_equal(zq.dev[0].bytes[FL_MEM_ACT], q.dev[0].bytes[FL_MEM_ACT]);
    }
    fl_plan_result bad_lora;
    in.zero_stage = 0; /* over ranks only with the trainer's ZeRO */
    assert_int_equal(fl_plan_compute(&s, &in, &bad_lora), FL_ERR_INVALID);
    in.zero_stage = 3;
    assert_int_equal(fl_plan_compute(&s, &in, &bad_lora), FL_ERR_INVALID);
    in.zero_stage = 0;
    in.dp = 1;
    in.tp = 2; /* tensor parallel: refused */
    assert_int_equal(fl_plan_compute(&s, &in, &bad_lora), FL_ERR_INVALID);
    in.tp = 1;
    in.lora_rank = 0; /* NF4 without adapters */
    assert_int_equal(fl_plan_compute(&s, &in, &bad_lora), FL_ERR_INVALID);
    in.lora_nf4 = false;
    in.train = false;
    in.lora_rank = 4;
    assert_int_equal(fl_plan_compute(&s, &in, &bad_lora), FL_ERR_INVALID);
    in.train = true;
    in.lora_rank = 0;
    fl_plan_parse_wtype("bf16", &in.weights);
    /* ZeRO over 4 ranks.  1 and 2 as fitllm's trainer runs them (dist/zero.h): rank 0 keeps the
     * optimizer states of a shard of L parameters (ceil(P / 4) rounded up to 256), the whole
     * gradient (2: the summed shard and one bucket instead), the collectives' pieces of at most 2^20 floats per
     * rank and the communicator.  3 (the textbook; the trainer has none) also shards grads and
     * weights, plus a gather buffer of one layer. */
    in.ckpt_every = 0;
    in.dp = 4;
    fl_plan_result z[4];
    for (int k = 0; k < 4; k++) {
        in.zero_stage = k;
        z[k] = plan(&s, &in);
    }
    assert_int_equal(z[0].dev[0].bytes[FL_MEM_OPTIM], 8 * P);
    const uint64_t L = (uint64_t)fl_zero_stride(4, (int64_t)P, 256);
    assert_true(L >= P / 4 && L < P / 4 + 256 && L % 256 == 0);
    const uint64_t pieces = 5 * (L < ((uint64_t)1 << 20) ? L : ((uint64_t)1 << 20)) * 4 + fl_comm_object_bytes();
    for (int k = 1; k <= 2; k++) {
        assert_int_equal(z[k].dev[0].bytes[FL_MEM_OPTIM], 8 * L);
        /* 1: the whole gradient; 2: the summed shard and one bucket of the backward's, the
         * largest of output + output_norm (V C + C), a layer's nine tensors and token_embd */
        const uint64_t V = (uint64_t)s.n_vocab, C = 2048, lay = 2048ull * 2048 * 2 + 2048ull * 256 * 2 + 3ull * 2048 * 5632 + 2 * 2048;
        const uint64_t bucket = V * C + C > lay ? V * C + C : lay;
        assert_int_equal(z[k].dev[0].bytes[FL_MEM_GRAD], k == 1 ? 4 * P : 4 * bucket + 4 * L);
        assert_int_equal(z[k].dev[0].bytes[FL_MEM_COMM], pieces);
        assert_int_equal(z[k].dev[0].bytes[FL_MEM_WEIGHTS], 8 * P);
        assert_int_equal(z[k].dev[0].bytes[FL_MEM_MISC], z[0].dev[0].bytes[FL_MEM_MISC] + fl_zero_object_bytes());
    }
    assert_int_equal(z[3].dev[0].bytes[FL_MEM_OPTIM], 8 * P / 4);
    assert_int_equal(z[3].dev[0].bytes[FL_MEM_GRAD], 4 * P / 4);
    assert_int_equal(z[3].dev[0].bytes[FL_MEM_WEIGHTS], 8 * P / 4);
    uint64_t layer = 4 * (2048ull * 2048 * 2 + 2048ull * 256 * 2 + 3ull * 2048 * 5632 + 2 * 2048);
    assert_int_equal(z[3].dev[0].bytes[FL_MEM_COMM], layer);
    assert_int_equal(z[3].dev[0].bytes[FL_MEM_ACT], z[0].dev[0].bytes[FL_MEM_ACT]); /* ZeRO leaves activations alone */
    /* quantized weights cannot be trained */
    fl_plan_parse_wtype("q4_0", &in.weights);
    fl_plan_result bad;
    assert_int_equal(fl_plan_compute(&s, &in, &bad), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "training"));
    fl_test_mem_zero();
}

static void test_sharding(void **state) {
    (void)state;
    fl_model_shape s = shape("llama3-8b");
    fl_plan_input in;
    fl_plan_input_default(&in, &s);
    in.n_ctx = 8192;
    fl_plan_result one = plan(&s, &in);
    in.tp = 2;
    fl_plan_result tp = plan(&s, &in);
    /* matrices split in half, norms replicated */
    assert_int_equal(tp.dev[0].bytes[FL_MEM_WEIGHTS], (one.weights_total - 65ull * 4096 * 4) / 2 + 65ull * 4096 * 4);
    assert_int_equal(tp.dev[0].bytes[FL_MEM_KV], GiB / 2);
    in.tp = 3;
    assert_int_equal(fl_plan_compute(&s, &in, &tp), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "--tp 3"));
    /* pipeline: 4 stages of 8 layers, embeddings on the first, output on the last */
    in.tp = 1;
    in.pp = 4;
    fl_plan_result pp = plan(&s, &in);
    assert_int_equal(pp.n_dev, 4);
    uint64_t layer = 2 * (4096ull * 4096 * 2 + 4096ull * 1024 * 2 + 3ull * 4096 * 14336) + 2 * 4096 * 4;
    uint64_t embd = 128256ull * 4096 * 2;
    assert_int_equal(pp.dev[0].bytes[FL_MEM_WEIGHTS], 8 * layer + embd);
    assert_int_equal(pp.dev[1].bytes[FL_MEM_WEIGHTS], 8 * layer);
    assert_int_equal(pp.dev[3].bytes[FL_MEM_WEIGHTS], 8 * layer + embd + 4096 * 4);
    assert_int_equal(pp.dev[2].bytes[FL_MEM_KV], GiB / 4);
    assert_int_equal(pp.dev[3].layer_begin, 24);
    /* logits and the final-normed row on the last */
    assert_int_equal(pp.dev[1].bytes[FL_MEM_ACT], pp.dev[3].bytes[FL_MEM_ACT] - 128256ull * 4 - 4096ull * 4);
    assert_int_equal(pp.max_dev, 3);
    uint64_t sum = 0;
    for (int d = 0; d < 4; d++) sum += pp.dev[d].bytes[FL_MEM_WEIGHTS];
    assert_int_equal(sum, one.weights_total);
    /* sequence parallel splits KV and step tokens */
    in.pp = 1;
    in.sp = 2;
    fl_plan_result sp = plan(&s, &in);
    assert_int_equal(sp.dev[0].bytes[FL_MEM_KV], GiB / 2);
    assert_int_equal(sp.buf.x, 257ull * 4096 * 4); /* (512-token budget + 1 sequence row) / 2 */
    /* offload: the last 8 layers (weights and KV) on the host; or all KV on the host */
    in.sp = 1;
    in.offload_layers = 8;
    fl_plan_result off = plan(&s, &in);
    assert_int_equal(off.host[FL_MEM_WEIGHTS], 8 * layer);
    assert_int_equal(off.host[FL_MEM_KV], GiB / 4);
    assert_int_equal(off.dev[0].bytes[FL_MEM_WEIGHTS] + off.host[FL_MEM_WEIGHTS], one.weights_total);
    in.offload_layers = 0;
    in.offload_kv = true;
    off = plan(&s, &in);
    assert_int_equal(off.dev[0].bytes[FL_MEM_KV], 0);
    assert_int_equal(off.host_total, GiB);
    /* slack measured from the engine lands in MISC */
    in.offload_kv = false;
    in.slack_bytes = 1000;
    in.slack_frac = 0.5;
    fl_plan_result sl = plan(&s, &in);
    assert_int_equal(sl.dev[0].bytes[FL_MEM_MISC], 1000 + one.max_total / 2);
    fl_test_mem_zero();
}

static void test_fit(void **state) {
    (void)state;
    fl_model_shape s = shape("llama3-8b");
    fl_plan_input in;
    fl_plan_input_default(&in, &s);
    const uint64_t budget = 24 * GiB;
    /* maximum context at batch 2: it fits, one more block does not */
    in.n_seq = 2;
    int64_t ctx;
    assert_int_equal(fl_plan_fit_ctx(&s, &in, budget, &ctx), FL_OK);
    assert_int_equal(ctx % 16, 0);
    fl_plan_input t = in;
    t.n_ctx = ctx;
    assert_true(plan(&s, &t).max_total <= budget);
    t.n_ctx = ctx + 16;
    assert_true(plan(&s, &t).max_total > budget);
    assert_true(ctx > 20000 && ctx < 40000); /* ~ (24 - 16.1) GiB / 2 / 128 KiB */
    /* naive attention's scores grow with the context: less fits */
    t = in;
    t.attn = FL_PLAN_ATTN_NAIVE;
    int64_t ctx_naive;
    assert_int_equal(fl_plan_fit_ctx(&s, &t, budget, &ctx_naive), FL_OK);
    assert_true(ctx_naive < ctx);
    /* maximum concurrent sequences at 4K */
    in.n_ctx = 4096;
    int64_t nseq;
    assert_int_equal(fl_plan_fit_seq(&s, &in, budget, &nseq), FL_OK);
    t = in;
    t.n_seq = nseq;
    assert_true(plan(&s, &t).max_total <= budget);
    t.n_seq = nseq + 1;
    assert_true(plan(&s, &t).max_total > budget);
    /* least-lossy types at 10 GiB, ctx 32K, batch 2: the answer fits, nothing less lossy does */
    in.n_ctx = 32768;
    in.n_seq = 2;
    fl_plan_input best;
    assert_int_equal(fl_plan_fit_types(&s, &in, 10 * GiB, &best), FL_OK);
    assert_true(plan(&s, &best).max_total <= 10 * GiB);
    static const char *const order[] = {"f16", "q8_0", "q6_K", "q5_K_M", "q4_K_M", "q4_0", "q3_K", "q2_K"};
    static const int32_t kvs[] = {FL_TYPE_F16, FL_TYPE_Q8_0, FL_TYPE_FP8_E4M3, FL_TYPE_Q4_0};
    bool reached = false;
    for (int w = 0; w < 8 && !reached; w++)
        for (int k = 0; k < 4; k++) {
            t = in;
            fl_plan_parse_wtype(order[w], &t.weights);
            t.kv_type = kvs[k];
            if (!strcmp(order[w], best.weights.name) && kvs[k] == best.kv_type) {
                reached = true;
                break;
            }
            assert_true(plan(&s, &t).max_total > 10 * GiB);
        }
    assert_true(reached);
    /* nothing fits: says so, and by how much */
    fl_model_shape big = shape("llama3-70b");
    fl_plan_input_default(&in, &big);
    assert_int_equal(fl_plan_fit_types(&big, &in, 8 * GiB, &best), FL_ERR_BUDGET);
    assert_non_null(strstr(fl_last_error(), "nothing fits in 8.00 GiB"));
    assert_non_null(strstr(fl_last_error(), "more"));
    assert_int_equal(fl_plan_fit_ctx(&big, &in, 8 * GiB, &ctx), FL_ERR_BUDGET);
    assert_int_equal(fl_plan_fit_seq(&big, &in, 8 * GiB, &nseq), FL_ERR_BUDGET);
    fl_test_mem_zero();
}

/* --mem for the engine: KV pool = mem - the rest; refuse when the weights alone exceed it */
static void test_kv_pool(void **state) {
    (void)state;
    fl_model_shape s = shape("llama3-8b");
    fl_plan_input in;
    fl_plan_input_default(&in, &s);
    in.n_ctx = 8192;
    fl_plan_result r = plan(&s, &in);
    uint64_t kv;
    assert_int_equal(fl_plan_kv_pool_bytes(&s, &in, 24 * GiB, &kv), FL_OK);
    assert_int_equal(kv, 24 * GiB - (r.max_total - r.dev[0].bytes[FL_MEM_KV]));
    assert_int_equal(fl_plan_kv_pool_bytes(&s, &in, 8 * GiB, &kv), FL_ERR_BUDGET);
    assert_non_null(strstr(fl_last_error(), "the weights alone"));
    assert_int_equal(fl_plan_kv_pool_bytes(&s, &in, r.dev[0].bytes[FL_MEM_WEIGHTS] + 1000, &kv), FL_ERR_BUDGET);
    assert_non_null(strstr(fl_last_error(), "leaving nothing for the KV cache"));
    fl_test_mem_zero();
}

static void test_bad_inputs(void **state) {
    (void)state;
    fl_model_shape s = shape("tinyllama-1.1b");
    fl_plan_input in;
    fl_plan_result r;
    fl_plan_input_default(&in, &s);
    in.pp = 23;
    assert_int_equal(fl_plan_compute(&s, &in, &r), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "--pp 23"));
    fl_plan_input_default(&in, &s);
    in.zero_stage = 4;
    assert_int_equal(fl_plan_compute(&s, &in, &r), FL_ERR_INVALID);
    fl_plan_input_default(&in, &s);
    in.kv_type = FL_TYPE_Q4_K;
    assert_int_equal(fl_plan_compute(&s, &in, &r), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "KV type"));
    fl_plan_input_default(&in, &s);
    in.kv_block = 8;
    assert_int_equal(fl_plan_compute(&s, &in, &r), FL_ERR_INVALID);
    fl_plan_input_default(&in, &s);
    in.offload_layers = 23;
    assert_int_equal(fl_plan_compute(&s, &in, &r), FL_ERR_INVALID);
    /* absurd shapes are refused; absurd contexts saturate instead of wrapping into "fits" */
    fl_plan_input_default(&in, &s);
    fl_model_shape h = s;
    h.n_embd = 1ll << 40;
    assert_int_equal(fl_plan_compute(&h, &in, &r), FL_ERR_INVALID);
    assert_non_null(strstr(fl_last_error(), "out of range"));
    h = s;
    h.n_vocab = FL_PLAN_MAX_VOCAB;
    h.n_embd = h.n_ff = h.n_head = h.n_head_kv = h.head_dim = FL_PLAN_MAX_DIM;
    in.n_ctx = 1ll << 40;
    in.n_seq = 1ll << 20;
    in.n_prefill = 1ll << 40;
    assert_int_equal(fl_plan_compute(&h, &in, &r), FL_OK);
    assert_int_equal(r.max_total, UINT64_MAX);
    in.attn = FL_PLAN_ATTN_NAIVE;
    in.train = true;
    fl_plan_parse_wtype("f32", &in.weights);
    assert_int_equal(fl_plan_compute(&h, &in, &r), FL_OK);
    assert_int_equal(r.max_total, UINT64_MAX);
    fl_test_mem_zero();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_preset_params),
        cmocka_unit_test(test_preset_public_arithmetic),
        cmocka_unit_test(test_gguf_exact),
        cmocka_unit_test(test_config_json),
        cmocka_unit_test(test_kv_types_and_window),
        cmocka_unit_test(test_step_buffers),
        cmocka_unit_test(test_training),
        cmocka_unit_test(test_sharding),
        cmocka_unit_test(test_fit),
        cmocka_unit_test(test_kv_pool),
        cmocka_unit_test(test_bad_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
