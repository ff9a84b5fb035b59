/* `fitllm bench WHAT ...`: benchmarks that print JSON (speed and memory goals are shown here,
 * never by timed unit tests).  Each benchmark lives in cli/bench_<what>.c. */
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

typedef struct bench_entry {
    const char *name;
    const char *help;
    fl_cmd_fn fn;
} bench_entry;

/* One line per benchmark; keep alphabetical. */
static const bench_entry benches[] = {
    {"model", "prefill/decode tokens/s, decode GB/s vs bandwidth, prefill % of int8 peak", fl_bench_model},
    {"matmul", "GEMV GB/s and GEMM GOP/s vs measured bandwidth / int8 peak (TinyLlama shapes)", fl_bench_matmul},
    {"attention", "naive vs flash attention: time, GFLOP/s, peak memory vs n", fl_bench_attention},
    {"packing", "padded batch vs packed varlen attention: bytes and time", fl_bench_packing},
    {"tokenize", "tokenizer speed on a text file (-m VOCAB.gguf -f TEXT)", fl_bench_tokenize},
    {"kv", "paged KV cache: utilization, waste, sharing vs a contiguous reservation", fl_bench_kv},
    {"context", "long context: prefill/decode time and memory vs n_ctx (paged f16/fp8, flash/naive, --sp)", fl_bench_context},
    {"optim", "the optimizer step alone: AdamW, 8-bit AdamW, gradient norm (s/step, ns/param, GB/s)", fl_bench_optim},
    {"sgemm", "the trainer's f32 products: GFLOP/s vs measured fp32 peak (TinyLlama shapes)", fl_bench_sgemm},
    {"serve", "synthetic serving workload through the engine (paged vs --baseline static)", fl_bench_serve},
    {"train", "training memory/time vs activation checkpointing, 8-bit optimizer states, planner check", fl_bench_train},
    {NULL, NULL, NULL},
};

static void usage(FILE *out) {
    fprintf(out, "usage: fitllm bench WHAT [OPTIONS]   (fitllm bench WHAT --help for options)\n\nbenchmarks:\n");
    for (const bench_entry *b = benches; b->name; b++) fprintf(out, "  %-12s %s\n", b->name, b->help);
}

int fl_cmd_bench(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (const bench_entry *b = benches; b->name; b++)
        if (!strcmp(argv[1], b->name)) return b->fn(argc - 1, argv + 1);
    fprintf(stderr, "fitllm bench: unknown benchmark '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
