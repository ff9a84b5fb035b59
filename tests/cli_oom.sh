#!/bin/bash
# Out of memory at each allocation of a command in turn: FL_MEM_FAIL_AFTER=N makes the
# N+1-th allocation fail, and N runs from 0 until the process says no allocation failed.  Every
# run must exit 0 with exactly the output of a run without injection (a failure the command
# absorbed, such as a kernel falling back to its f32 path, may cost time, never output), or
# 1 with a message on stderr; never a crash, a hang, a sanitizer report or a debug build's
# size check, and never a JSON report with fields left out.  Commands with many allocations
# are swept with a stride that keeps each near 8 s (a sanitizer build is 5-10x slower).
# Args: path-to-fitllm shared-dir.
F="$1"; S="$2"
model="$S/models/stories260K.gguf"
[ -f "$model" ] || exit 77
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# the set of key paths of a JSON document (numbers vary run to run; the fields may not)
cat > "$T/keys.py" <<'PY'
import json, sys
def paths(o, p=""):
    out = set()
    if isinstance(o, dict):
        for k, v in o.items(): out |= {p + "/" + k} | paths(v, p + "/" + k)
    elif isinstance(o, list):
        out.add(p + "[]#%d" % len(o))
        for v in o: out |= paths(v, p + "[]")
    return out
try:
    a = paths(json.load(open(sys.argv[1])))
except Exception as e:
    print("not JSON:", e); sys.exit(1)
b = paths(json.load(open(sys.argv[2])))
if a != b: print("missing", sorted(b - a)[:4], "extra", sorted(a - b)[:4]); sys.exit(1)
PY

# sweep NAME CHECK OUTFILE -- ARGS...: CHECK is "text" (stdout equals the baseline's), "json"
# (the same key paths) or "file" (OUTFILE equals the baseline's)
sweep() {
    local name="$1" check="$2" out="$3"; shift 4
    local t0 t1 n=0 stride rc runs=0
    t0=$(date +%s%N)
    "$F" "$@" >"$T/base.out" 2>"$T/base.err" || { cat "$T/base.err"; fail "$name: the run without injection failed"; }
    t1=$(date +%s%N)
    [ "$check" = file ] && cp "$out" "$T/base.file"
    local total
    total=$(FL_MEM_FAIL_AFTER=100000000 "$F" "$@" 2>&1 >/dev/null | sed -n 's/.*no allocation failed (\([0-9]*\) allocations).*/\1/p')
    [ -n "$total" ] && [ "$total" -gt 0 ] || fail "$name: no allocation count at exit"
    local ms=$(( (t1 - t0) / 1000000 + 1 ))
    stride=${FL_OOM_STRIDE:-$(( total * ms / 8000 + 1 ))} # (FL_OOM_STRIDE=1: every allocation)
    for ((n = 0; n <= total; n += stride)); do
        [ "$check" = file ] && rm -f "$out"
        FL_MEM_FAIL_AFTER=$n timeout 120 "$F" "$@" >"$T/o.out" 2>"$T/o.err"; rc=$?
        runs=$((runs + 1))
        if grep -q -E "AddressSanitizer|LeakSanitizer|runtime error|fatal:" "$T/o.err" || [ $rc -gt 1 ]; then
            grep -m5 -E "ERROR|SUMMARY|runtime error|fatal|#[0-4] " "$T/o.err"
            fail "$name: FL_MEM_FAIL_AFTER=$n: exit $rc"
        fi
        if [ $rc -eq 1 ]; then
            grep -q -v "FL_MEM_FAIL_AFTER" "$T/o.err" || fail "$name: FL_MEM_FAIL_AFTER=$n: exit 1 without a message"
            continue
        fi
        case "$check" in
        text) cmp -s "$T/o.out" "$T/base.out" || fail "$name: FL_MEM_FAIL_AFTER=$n: exit 0, other output: $(head -c 200 "$T/o.out")" ;;
        json) r=$(python3 "$T/keys.py" "$T/o.out" "$T/base.out") || fail "$name: FL_MEM_FAIL_AFTER=$n: exit 0, $r" ;;
        file) cmp -s "$out" "$T/base.file" || fail "$name: FL_MEM_FAIL_AFTER=$n: exit 0, another $out" ;;
        esac
    done
    echo "$name: $total allocations, $runs runs (every ${stride})"
}

sweep "run" text - -- run -m "$model" -p "Once upon a time" -n 8 -t 2 --temp 0
sweep "run --json" json - -- run -m "$model" -p "Once upon a time" -n 8 -t 1 --temp 0 --json --kv-type q8_0
sweep "perplexity" json - -- perplexity -m "$model" -f "$S/data/tinystories_val.txt" -c 64 --chunks 2 -t 2 --json
sweep "quantize" file "$T/q.gguf" -- quantize "$model" "$T/q.gguf" Q4_K -t 2
sweep "inspect" json - -- inspect --json "$S/models/stories260K-q8_0.gguf"
sweep "plan" json - -- plan -m "$model" -c 256 --json
awk 'BEGIN{RS="\n\n"; ORS="\n\n"} NR<=20' "$S/data/tinystories_val.txt" > "$T/train.txt"
sweep "train" file "$T/trained.gguf" -- train -m "$model" -f "$T/train.txt" -c 64 --batch 2 --steps 2 -t 2 -o "$T/trained.gguf"
sweep "bench serve" json - -- bench serve -m "$model" -n 6 --max-seqs 3 --prompt-len 8:40 --gen-len 8 --kv-mem 1MiB -t 2 --json
exit 0
