#!/usr/bin/env bash
# `fitllm serve` out of memory at each allocation in turn (a stride of them: ~10 s, ~5 s with the
# first pass's requests all at once, ~4 s for a server with --embeddings, ~4 s for one with LoRA
# adapters, --lora-modules and --lora-slots): start-up, then a script
# of requests over every endpoint kind; each request answers as without injection or with a clean
# error, the server recovers, and it stops cleanly (tests/serve_oom.py).
# Usage: cli_serve_oom.sh FITLLM_BIN SHARED_DIR     (exit 77 = skipped)
MODEL=$2/models/stories260K.gguf
[ -f "$MODEL" ] || { echo "SKIP: $MODEL not found"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: python3 not installed"; exit 77; }
python3 "$(dirname "$0")/serve_oom.py" "$1" "$MODEL" 10 || exit 1
# the first pass's requests all at once (the error paths beside each other)
python3 "$(dirname "$0")/serve_oom.py" "$1" "$MODEL" 5 --concurrent || exit 1
# a server with --embeddings, under a script of embedding requests
python3 "$(dirname "$0")/serve_oom.py" "$1" "$MODEL" 4 --embeddings || exit 1
# a server with an adapter and a run-time slot: load, generate with both, unload
exec python3 "$(dirname "$0")/serve_oom.py" "$1" "$MODEL" 4 --lora
