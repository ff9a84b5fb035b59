/* fitllm command-line entry: dispatches to subcommands (cli/cmd_*.c). */
#include "cli/cli.h"
#include "core/alloc.h"

#include <stdio.h>
#include <string.h>

static const fl_cli_command commands[] = {
    {"bench", "benchmarks that print JSON (attention, kv, model, serve, ...)", fl_cmd_bench},
    {"demo", "run a few dozen concurrent requests through the engine (random tiny model without -m)", fl_cmd_demo},
    {"inspect", "show a GGUF model's metadata, tensors and memory needs", fl_cmd_inspect},
    {"plan", "plan memory per device (weights, KV, activations, training, sharding); --fit, --table", fl_cmd_plan},
    {"quantize", "write a GGUF with weights quantized to Q8_0, Q4_0, ..., Q4_K_M", fl_cmd_quantize},
    {"synth", "write a llama-shaped GGUF with random weights (e.g. TinyLlama-1.1B shape)", fl_cmd_synth},
    {"serve", "OpenAI-compatible HTTP server (completions, chat, streaming, metrics)", fl_cmd_serve},
    {"perplexity", "perplexity of a model on a text file (llama.cpp's method), KL divergence", fl_cmd_perplexity},
    {"run", "generate text from a prompt", fl_cmd_run},
    {"chat", "chat with a model in the terminal (its chat template; earlier turns stay in the KV cache)", fl_cmd_chat},
    {"train", "train or fine-tune (LoRA/QLoRA) a model on a text file", fl_cmd_train},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *out) {
    fprintf(out, "usage: fitllm COMMAND [OPTIONS]\n\n"
                 "fitllm runs, serves and trains llama-family models in the memory you have.\n\n"
                 "commands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++) fprintf(out, "  %-12s %s\n", commands[i].name, commands[i].help);
    fprintf(out, "\n`fitllm COMMAND --help` lists each command's options.\n");
}

int main(int argc, char **argv) {
    fl_mem_install_cjson_hooks(); /* before any cJSON call: every JSON byte is charged */
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("fitllm 0.1.0\n");
        return 0;
    }
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "fitllm: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
