/*
 * cli.h - subcommands and the option parser they share.
 *
 * Each subcommand declares a table of fl_opt {long name, short char, kind, help} and calls
 * fl_args_parse(); unknown options and missing values are errors (exit 2), `--help` prints
 * every option from the table (so help can never drift from what is parsed).
 */
#ifndef FL_CLI_H
#define FL_CLI_H

#include <stdbool.h>
#include <stdint.h>

typedef int (*fl_cmd_fn)(int argc, char **argv);
typedef struct fl_cli_command {
    const char *name;
    const char *help;
    fl_cmd_fn fn;
} fl_cli_command;

typedef enum fl_opt_kind { FL_OPT_FLAG, FL_OPT_STR, FL_OPT_INT, FL_OPT_FLOAT, FL_OPT_BYTES } fl_opt_kind;

typedef struct fl_opt {
    const char *name;  /* long name without dashes, e.g. "model" */
    char short_name;   /* 'm' or 0 */
    fl_opt_kind kind;
    const char *help;  /* "MODEL  path of the GGUF model" (metavar first for non-flags) */
    /* filled by the parser */
    bool set;
    const char *str;
    int64_t i;
    double f;
} fl_opt;

/* Parse argv[1..] against opts (terminated by an entry with name == NULL).  Positional
 * arguments are collected in pos[] (up to max_pos).  Returns 0 on success, 1 if --help was
 * printed, 2 on an error (message on stderr).  argv[0] is the command name. */
int fl_args_parse(int argc, char **argv, fl_opt *opts, const char *usage_line, const char *about,
                  const char **pos, int max_pos, int *n_pos);
fl_opt *fl_args_get(fl_opt *opts, const char *name);
/* Parse "512", "4K", "1.5G", "64MiB" as bytes; returns -1 on error. */
int64_t fl_parse_bytes(const char *s);

int fl_cmd_inspect(int argc, char **argv);
int fl_cmd_bench(int argc, char **argv);
int fl_cmd_plan(int argc, char **argv);
int fl_cmd_quantize(int argc, char **argv);
int fl_cmd_synth(int argc, char **argv);
int fl_bench_model(int argc, char **argv);
int fl_bench_matmul(int argc, char **argv);
int fl_bench_sgemm(int argc, char **argv);
int fl_bench_optim(int argc, char **argv);
int fl_cmd_serve(int argc, char **argv);
int fl_cmd_run(int argc, char **argv);
int fl_cmd_chat(int argc, char **argv);
int fl_cmd_perplexity(int argc, char **argv);
/* cli/cmd_run.c helpers shared with perplexity: whole file (FL_MEM_MISC, free len + 1 bytes);
 * text -> ids with BOS (FL_MEM_MISC, free (*n + 1) * 4 bytes). */
#include "fitllm.h"
struct fl_tokenizer;
char *fl_cli_read_file(const char *path, size_t *len);
struct cJSON;
/* Print the JSON report o to stdout (one line, or indented) and delete it; returns 0.  Refused
 * (returns 1, the error set, and said on stderr as "fitllm CMD: ..." unless cmd is NULL) where
 * o is NULL or an allocation failed on this thread since fail0 (fl_mem_thread_failures() taken
 * before the report was begun): cJSON leaves out what it cannot allocate, and a report missing
 * fields must not pass for a whole one. */
int fl_cli_print_json(const char *cmd, struct cJSON *o, bool pretty, size_t fail0);
/* cJSON_AddItemToObject (key) or cJSON_AddItemToArray (key NULL) that deletes item where it
 * cannot be added (out of memory for the key, or o NULL): cJSON leaves it to the caller then. */
void fl_cli_json_add(struct cJSON *o, const char *key, struct cJSON *item);
/* The same with the allocator's report added as "memory", on one line. */
int fl_cli_print_json_with_memory(const char *cmd, struct cJSON *o, size_t fail0);
fl_status fl_cli_tokenize(const struct fl_tokenizer *tok, const char *text, size_t len, int32_t **ids, int64_t *n);
/* --lora FILE [--lora-scale S] of run and perplexity: their option entries, and the model
 * parameters that send every token through the adapter (*path and *scale hold what mp points
 * at, so they must outlive the load). */
#define FL_CLI_LORA_OPTS                                                                                                  \
    {"lora", 0, FL_OPT_STR, "FILE  apply a LoRA adapter at run time (fitllm train --lora writes OUT.lora.gguf; llama.cpp adapters too)"}, \
    {"lora-scale", 0, FL_OPT_FLOAT, "S  the adapter's scale (default 1)"}
/* The sampling options of run and chat (fl_sampler_params / fl_sampling_params fields). */
#define FL_CLI_SAMPLING_OPTS                                                                          \
    {"temp", 0, FL_OPT_FLOAT, "T  temperature (default 0.8; 0 = greedy)"},                            \
    {"top-k", 0, FL_OPT_INT, "K  keep the K most likely tokens (default 40; 0 = off)"},               \
    {"top-p", 0, FL_OPT_FLOAT, "P  nucleus sampling threshold (default 0.95; 1 = off)"},              \
    {"min-p", 0, FL_OPT_FLOAT, "M  drop tokens below M x the top probability (default 0.05)"},        \
    {"repeat-penalty", 0, FL_OPT_FLOAT, "R  repetition penalty (default 1 = off)"},                   \
    {"frequency-penalty", 0, FL_OPT_FLOAT, "F  frequency penalty (default 0)"},                       \
    {"presence-penalty", 0, FL_OPT_FLOAT, "P  presence penalty (default 0)"},                         \
    {"repeat-last-n", 0, FL_OPT_INT, "N  tokens the penalties look back at (default 64, -1 = all)"}
/* --chat-template NAME|TEXT and --chat-template-file FILE of serve and chat (llama.cpp's): their
 * option entries, and the template text they give (*out; NULL: the GGUF's).  A file's text is
 * FL_MEM_MISC in *owned (free *owned_len + 1 bytes).  Returns 0, or 2 after printing why. */
#define FL_CLI_CHAT_TEMPLATE_OPTS                                                                                         \
    {"chat-template", 0, FL_OPT_STR, "NAME|TEXT  the chat template in place of the GGUF's: chatml, llama2, llama3, phi3, deepseek3 (deepseek-r1), plain, or template text (its family is recognized by its markers, as the GGUF's)"}, \
    {"chat-template-file", 0, FL_OPT_STR, "FILE  as --chat-template, the template text read from FILE"}
int fl_cli_chat_template(fl_opt *opts, const char *cmd, char **owned, size_t *owned_len, const char **out);
/* --spec-ngram K [--spec-ngram-min N] [--spec-ngram-max N] [--spec-disable-by-batch-size N] of
 * serve, chat, bench serve, demo and run: speculative decoding by n-gram lookup
 * (fl_engine_params.spec_tokens), or with --model-draft FILE [--draft-max K] (not run) by a draft
 * model.  Sets ep's fields; returns 0, or 2 after printing why. */
#define FL_CLI_SPEC_OPTS                                                                                                  \
    {"spec-ngram", 0, FL_OPT_INT, "K  speculative decoding by n-gram lookup (vLLM's \"ngram\", llama.cpp's lookup decoding): a sequence whose last tokens occurred earlier in its prompt or output drafts up to K of the tokens that followed, and one step verifies them; the output stays the same (greedy or seeded), in fewer steps (default 0 = off; at most 16; paged KV only)"}, \
    {"spec-ngram-min", 0, FL_OPT_INT, "N  the shortest n-gram looked up (default 2)"},                                   \
    {"spec-ngram-max", 0, FL_OPT_INT, "N  the longest n-gram looked up (default 4, at most 16)"},                        \
    {"spec-disable-by-batch-size", 0, FL_OPT_INT, "N  no drafts in a step while more than N requests run (vLLM's disable_by_batch_size: a large batch is compute-bound, and a dropped draft costs what a decoded token does; default 0 = always)"}, \
    {"model-draft", 0, FL_OPT_STR, "FILE  speculative decoding with a draft model (llama.cpp's -md): a small GGUF with the same vocabulary drafts greedily, verified the same way (the same output); the engine's plan counts its weights, KV cache and buffers; not with --spec-ngram (run: the paged cache, without --context-shift or --tp)"}, \
    {"draft-max", 0, FL_OPT_INT, "K  with --model-draft: draft tokens per sequence per step (default 5, at most 16)"}, \
    {"draft-p-min", 0, FL_OPT_FLOAT, "P  with --model-draft: a draft stops at the first token the draft model gives less than P (llama.cpp's; default 0.75, 0 = never)"}
int fl_cli_spec_params(fl_opt *opts, const char *cmd, fl_engine_params *ep);
struct fl_model_params;
void fl_cli_lora_params(fl_opt *opts, const char **path, float *scale, struct fl_model_params *mp);
/* Whether writing out would replace one of the n input files (the same device and inode, so
 * links and other spellings of a path count; NULL inputs are skipped).  If so, prints
 * "fitllm CMD: OUT is the WHAT (IN); write the output elsewhere" and returns true.  A command
 * writes through a temporary file and a rename, so it would "work", and the input would be lost. */
bool fl_cli_overwrites_input(const char *cmd, const char *out, int n, const char *const inputs[], const char *const what[]);
/* benchmarks (cli/bench_*.c) */
int fl_bench_attention(int argc, char **argv);
int fl_bench_packing(int argc, char **argv);
int fl_bench_tokenize(int argc, char **argv);
int fl_bench_kv(int argc, char **argv);
int fl_bench_serve(int argc, char **argv);
int fl_bench_context(int argc, char **argv);
int fl_cmd_demo(int argc, char **argv);
int fl_cmd_plan(int argc, char **argv);
int fl_cmd_train(int argc, char **argv);
int fl_bench_train(int argc, char **argv);

/* fitllm plan --verify (cli/plan_verify.c): engine-exact plan vs the real engine's peaks. */
typedef struct fl_plan_verify_opts {
    const char *model, *weights, *kv_type;
    int32_t n_ctx, max_seqs, max_batch_tokens, kv_block, n_threads;
    int64_t mem;
    int32_t max_logprobs;   /* the engine's (-1: none): a second run checks the logprob records */
    const char *lora;       /* a LoRA adapter the engine applies (NULL: none) */
    int64_t guide_mem;      /* the engine's output constraints' budget (-1: its default) */
    int32_t embeddings;     /* the engine takes embedding requests: then max_seqs of them run after the generations */
    int32_t spec_tokens;    /* speculative decoding's drafts per sequence (0: off) */
    const char *draft;      /* its draft model (NULL: n-gram drafts) */
    int32_t lora_slots;     /* run-time adapter slots (their reservation: MAPPED, MISC bounds); with lora, each loads it */
    int32_t max_lora_rank;
} fl_plan_verify_opts;
int fl_plan_verify(const fl_plan_verify_opts *o);

#endif
