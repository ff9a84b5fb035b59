#!/bin/bash
# Size / quality / speed table of the weight types (docs/QUANT.md), from fitllm's own commands:
#   bits per weight  = fitllm inspect --json: weights_bytes * 8 / n_params
#   PPL, KL vs F32   = fitllm perplexity -c 128 --chunks 32 on ../shared/data/tinystories_val.txt,
#                      --kl-base against the F32 file of the same model
#   pp / tg tok/s    = fitllm bench model -p 128 -n 64 --json (2 threads)
# Usage: scripts/quant_table.sh [stories|synth]...   (default: both; prints Markdown rows)
# Environment: FITLLM (default build/fitllm), SHARED (default ../shared), FL_MATMUL_LLAMA etc.
set -euo pipefail
fitllm=${FITLLM:-build/fitllm}
shared=${SHARED:-../shared}
text="$shared/data/tinystories_val.txt"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# row NAME FILE BASE_KL: one Markdown table row
row() {
    local name=$1 file=$2 base=$3
    "$fitllm" inspect "$file" --json >"$tmp/i.json"
    "$fitllm" perplexity -m "$file" -f "$text" -c 128 --chunks 32 -t 2 --kl-base "$base" --json >"$tmp/p.json" 2>/dev/null
    "$fitllm" bench model -m "$file" -p 128 -n 64 -t 2 --stream-mib 64 --json >"$tmp/b.json" 2>/dev/null
    python3 - "$name" "$file" "$tmp/i.json" "$tmp/p.json" "$tmp/b.json" <<'PY'
import json, os, sys
name, path = sys.argv[1], sys.argv[2]
i, p, b = (json.load(open(f)) for f in sys.argv[3:6])
kl = p.get("kl", {"mean": 0.0, "p99": 0.0, "same_top": 1.0})
print(f"| {name} | {i['weights_bytes']['total'] * 8 / i['n_params']:.2f} | {os.path.getsize(path) / 1024:.0f} KiB "
      f"| {p['ppl']:.4f} ± {p['ppl_err']:.4f} | {kl['mean']:.5f} | {kl['p99']:.4f} | {100 * kl['same_top']:.1f}% "
      f"| {b['pp_tok_s']:.0f} | {b['tg_tok_s']:.0f} |")
PY
}

header() {
    echo "| $1 | bits/weight | file | PPL | KL mean | KL p99 | same top token | pp128 tok/s | tg tok/s |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
}

stories() {
    local m="$shared/models" base="$tmp/stories.kl"
    rm -f "$base"
    header "stories260K file"
    row "F32 (original)" "$m/stories260K.gguf" "$base"
    for t in f16 q8_0 q5_0 q4_0; do row "llama.cpp $t" "$m/stories260K-$t.gguf" "$base"; done
    for t in Q8_0 Q6_K Q5_1 Q5_0 Q4_1 Q4_0 IQ4_NL Q4_K_M; do
        "$fitllm" quantize "$m/stories260K.gguf" "$tmp/s-$t.gguf" "$t" -q >/dev/null
        row "fitllm quantize $t" "$tmp/s-$t.gguf" "$base"
    done
}

synth() {
    local m="$shared/models/synth256" base="$tmp/synth.kl"
    rm -f "$base"
    header "synth256 file (random weights)"
    for t in F32 F16 BF16 Q8_0 Q6_K Q5_K_M Q5_1 Q5_0 Q4_K_M Q4_1 Q4_0 IQ4_NL Q3_K_M Q2_K; do
        row "$t" "$m/synth256-$t.gguf" "$base"
    done
}

[ $# -gt 0 ] || set -- stories synth
for what in "$@"; do
    case "$what" in
    stories) stories; echo ;;
    synth) synth; echo ;;
    *) echo "unknown table '$what' (stories|synth)" >&2; exit 2 ;;
    esac
done
