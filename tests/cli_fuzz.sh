#!/usr/bin/env bash
# Short libFuzzer runs inside the test suite: configures a separate clang build (FITLLM_FUZZ=ON:
# ASan + UBSan + coverage) beside the normal build, builds only the fuzz targets and runs
# fuzz_gguf for FL_FUZZ_SECONDS (default 30) on synthetic seeds plus the small shared models,
# then fuzz_plan (config.json + planner arithmetic), fuzz_tokenize (the tokenizers of the
# llama.cpp test vocabularies, seeded with their test strings), fuzz_json_fsm (the JSON
# recognizer of constrained decoding against a plain validator), fuzz_json_schema (JSON
# Schema compiled and followed), fuzz_regex (guided_regex's two matchers against each other) and
# fuzz_grammar (GBNF: pieces, keys, the vocabulary walk against a check per token), fuzz_tools
# (tool calling's requests, grammars, triggers and output reading, structural tags; the reasoning split)
# and fuzz_dialects (/v1/responses and /v1/messages: requests, their events, the store) for a third of that each.  Skips
# (77) when clang or libFuzzer is not installed.
# usage: cli_fuzz.sh FITLLM SHARED_DIR
set -uo pipefail
BIN="$1"; SHARED="$2"
SRC="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$(cd "$(dirname "$BIN")" && pwd)/fuzz"
SECS="${FL_FUZZ_SECONDS:-30}"
command -v clang >/dev/null || { echo "SKIP: clang not installed (scripts/setup.sh installs it)"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: python3 not found"; exit 77; }
echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }' >"/tmp/fl_fuzz_probe.$$.c"
if ! clang -fsanitize=fuzzer "/tmp/fl_fuzz_probe.$$.c" -o "/tmp/fl_fuzz_probe.$$" 2>/dev/null; then
    rm -f "/tmp/fl_fuzz_probe.$$"*; echo "SKIP: clang cannot link libFuzzer"; exit 77
fi
rm -f "/tmp/fl_fuzz_probe.$$"*

if [ ! -f "$OUT/build.ninja" ]; then
    CC=clang cmake -S "$SRC" -B "$OUT" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFITLLM_FUZZ=ON \
        -DFITLLM_MPI=OFF -DFL_SHARED_DIR="$SHARED" >"$OUT.cmake.log" 2>&1 || { cat "$OUT.cmake.log"; exit 1; }
fi
ninja -C "$OUT" fuzz_gguf fuzz_plan fuzz_tokenize fuzz_json_fsm fuzz_json_schema fuzz_regex fuzz_grammar fuzz_tools fuzz_dialects >"$OUT/ninja.log" 2>&1 || { cat "$OUT/ninja.log"; exit 1; }

rm -rf "$OUT/run"; mkdir -p "$OUT/run/seeds" "$OUT/run/artifacts"
python3 "$SRC/tests/fuzz/make_seeds.py" "$OUT/run/seeds"
for f in stories260K-q4_0.gguf stories260K-q8_0.gguf; do
    [ -f "$SHARED/models/$f" ] && cp "$SHARED/models/$f" "$OUT/run/seeds/"
done
run_fuzzer() { # name seconds corpus-dirs...
    local name="$1" secs="$2"; shift 2
    mkdir -p "$OUT/run/$name-corpus"
    "$OUT/$name" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$OUT/run/artifacts/" "$OUT/run/$name-corpus" "$@" >"$OUT/run/$name.log" 2>&1
    local rc=$?
    echo "$name:"; grep -E "^stat::(number_of_executed_units|average_exec_per_sec|new_units_added)" "$OUT/run/$name.log"
    if [ $rc -ne 0 ] || ls "$OUT/run/artifacts/"* >/dev/null 2>&1; then
        # kept apart: the next run starts by clearing run/
        local keep="$OUT/failed-$name-$(date +%Y%m%d-%H%M%S)"
        mkdir -p "$keep" && cp -r "$OUT/run/artifacts" "$OUT/run/$name.log" "$keep/" 2>/dev/null
        echo "FAIL: $name found a problem (exit $rc); reproduce with $OUT/$name $keep/artifacts/*" >&2
        grep -E "ERROR|SUMMARY|invariant|runtime error|timeout" "$OUT/run/$name.log" | head -20 >&2
        exit 1
    fi
}
run_fuzzer fuzz_gguf "$SECS" "$OUT/run/seeds"
run_fuzzer fuzz_plan $((SECS / 3 + 1)) "$SRC/tests/fuzz/plan_seeds"
# fuzz_tokenize: each seed is a selector byte (vocabulary and flags) and one llama.cpp test string
mkdir -p "$OUT/run/tok_seeds"
python3 - "$SHARED/vocab/ggml-vocab-llama-spm.gguf.inp" "$OUT/run/tok_seeds" <<'PY'
import sys
tests = open(sys.argv[1], encoding='utf-8').read().split('\n__ggml_vocab_test__\n')
for i, t in enumerate(tests):
    for sel in range(8):
        open('%s/t%02d_%d' % (sys.argv[2], i, sel), 'wb').write(bytes([sel]) + t.encode())
PY
FL_SHARED_DIR="$SHARED" run_fuzzer fuzz_tokenize $((SECS / 3 + 1)) "$OUT/run/tok_seeds"
# fuzz_json_fsm: the JSON-object recognizer of constrained decoding against a plain validator;
# each seed is a split byte and a document
mkdir -p "$OUT/run/json_seeds"
python3 - "$OUT/run/json_seeds" <<'PY'
import sys
docs = ['{}', ' {"a": [1, -2.5e+3, true, false, null, {"b": "x\\n\\u00e9 \u00e9"}]}', '{"k":"v","n":0}', '{"a":[[[]]]}',
        '{"a": 01}', '{"a": "\x01"}', '[1]', '{"a": 1,}', '{\n  "key": "value"\n}']
for i, d in enumerate(docs):
    open('%s/j%02d' % (sys.argv[1], i), 'wb').write(bytes([i * 3]) + d.encode())
PY
run_fuzzer fuzz_json_fsm $((SECS / 3 + 1)) "$OUT/run/json_seeds"
# fuzz_json_schema: JSON Schema compiled and followed; each seed is a split byte, a schema, a
# NUL byte and a document
mkdir -p "$OUT/run/schema_seeds"
python3 - "$OUT/run/schema_seeds" <<'PY'
import json, sys
pairs = [({"type": "object", "properties": {"a": {"type": "integer", "minimum": -5, "maximum": 99}, "b": {"enum": ["x", 1, None]}},
           "required": ["a"], "additionalProperties": False}, '{"a": 42, "b": "x"}'),
         ({"$defs": {"n": {"type": "object", "properties": {"k": {"type": "array", "items": {"$ref": "#/$defs/n"}, "maxItems": 2}}}},
           "$ref": "#/$defs/n"}, '{"k": [{}, {"k": []}]}'),
         ({"type": "array", "items": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "null"}, {"type": "number"}]}},
          '["ab", null, -1.5e3]'),
         ({"type": "object", "additionalProperties": {"type": "boolean"}, "properties": {"q\"": {"const": [1]}}}, '{"q\\"": [1], "z": true}'),
         ({"enum": ["yes", "no"]}, '"no"'), ({"type": "string", "pattern": "x"}, '"x"'),
         ({"type": "object", "properties": {"d": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}$"}}}, '{"d": "2024-\\u00301"}'),
         ({"type": "array", "items": {"type": "string", "pattern": "[^a]*\u00e9+(x|yy){1,3}", "maxLength": 9}}, '["b\\"\u00e9\\u00e9yyx"]')]
for i, (s, d) in enumerate(pairs):
    open('%s/s%02d' % (sys.argv[1], i), 'wb').write(bytes([i * 5]) + json.dumps(s).encode() + b'\0' + d.encode())
PY
run_fuzzer fuzz_json_schema $((SECS / 3 + 1)) "$OUT/run/schema_seeds"
# fuzz_regex: guided_regex's matchers; each seed is a split byte, a pattern, a NUL byte and a text
mkdir -p "$OUT/run/regex_seeds"
python3 - "$OUT/run/regex_seeds" <<'PY'
import sys
pairs = [(r"\(\d{3}\) \d{3}-\d{4}", "(555) 123-4567"), (r"(yes|no|maybe)[.!]?", "maybe!"), (r"[a-z]+@[a-z]+\.(com|org)", "ab@cd.org"),
         (r"(a|ab)(c|bcd)(d*)", "abcd"), ("caf.\u00e9*", "caf\u00e9\u00e9"), (r"(?x) a b+ # c", "abb"), (r"(a+)+b", "aaaaaaaaaaaaaaaaaaaac"),
         (r"\w+( \w+){0,3}", "one two"), (r"[^\d\s]{2,}x?", "ab x"),
         (r"\p{Lu}\p{Ll}+[^,]*", "Hello, x"), (r"(?:[a]+b?)*c{2,3}", "aabacc"), (r"x[^a]{1,3}\x{41}+", "xbbAA")]
for i, (p, t) in enumerate(pairs):
    open('%s/r%02d' % (sys.argv[1], i), 'wb').write(bytes([i * 7]) + p.encode() + b'\0' + t.encode())
PY
run_fuzzer fuzz_regex $((SECS / 3 + 1)) "$OUT/run/regex_seeds"
# fuzz_grammar: GBNF grammars; each seed is a split byte, a grammar, a NUL byte and a text
mkdir -p "$OUT/run/grammar_seeds"
python3 - "$OUT/run/grammar_seeds" <<'PY'
import sys
pairs = [('root ::= "(" root ")" root | ""', "(()())"),
         ('root ::= expr\nexpr ::= term ("+" term)*\nterm ::= [0-9]+ | "(" expr ")"', "(1+23)+4"),
         ('root ::= [a-c]{2,3} ("x" | "yz")* "."?', "abcyzx."),
         ('root ::= ("yes" | "no") [.!] (" " [A-Z] [a-z]+){0,4}', "yes. Ab Cd"),
         ('root ::= "\\"" ( [^"\\\\] | "\\\\" ["\\\\nt] )* "\\""  # a string', '"a\\"b\\n"'),
         ('root ::= x x\nx ::= "a"? [\\u03b1-\\u03c9]*', "a\u03b1\u03b2a"),
         ('root ::= . . "!" | [^a]+', "\u2713x!"),
         ('root ::= list\nlist ::= "[" (item ("," " "? item)*)? "]"\nitem ::= [0-9]{1,2} | list', "[1, [2,[]],34]"),
         ('root ::= ("a" | "a" "b" | "ab")+ "c"', "ababc"),
         ('root ::= a\na ::= b? "x"\nb ::= "y" | c\nc ::= "z"*', "zzx"),
         ('root ::= x x\nx ::= "a"? [\\u026b1-\\uA3c9]*', b"a\xce\xb1YYY\xcf\xb2a\xda")]  # (ends inside a character)
for i, (g, t) in enumerate(pairs):
    open('%s/g%02d' % (sys.argv[1], i), 'wb').write(bytes([i * 11]) + g.encode() + b'\0' + (t if isinstance(t, bytes) else t.encode()))
PY
run_fuzzer fuzz_grammar $((SECS / 3 + 1)) "$OUT/run/grammar_seeds"
# fuzz_tools: tool calling, the reasoning split and the chat templates' flags; each seed is a
# selector byte, a request body, a NUL byte and a model output
mkdir -p "$OUT/run/tools_seeds"
python3 - "$OUT/run/tools_seeds" <<'PY'
import json, sys
w = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"enum": ["c", "f"]}, "days": {"type": "integer"}}, "required": ["city"]}}}
a = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
    "a": {"type": "number"}, "b": {"anyOf": [{"type": "number"}, {"type": "null"}]}, "t": {"type": ["string", "array"], "items": {"const": 1}}},
    "required": ["a", "b"]}}}
bodies = [{"tools": [w, a], "tool_choice": "required"}, {"tools": [w], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
          {"tools": [w, a, {"type": "function", "function": {"name": "now"}}], "tool_choice": "required", "parallel_tool_calls": False},
          {"tools": [w, a]}, {"tools": [], "tool_choice": "none"}, {"tools": [w, w]},
          {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                        {"role": "assistant", "content": "<think>a</think>\n\nOnce", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}]},
          {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}, {"role": "tool", "content": "42"}]},
          {"tools": [w], "structural_tag": {"structures": [{"begin": "<f=get_weather>", "schema": w["function"]["parameters"], "end": "</f>"},
                                                           {"begin": "<f=now>", "end": ""}], "triggers": ["<f="]}}]
outs = ['Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>', '[{"name":"get_weather","parameters":{"city":"Paris"}}]',
        '{"name": "f", "parameters": {}}; {"name": "g", "parameters": {"x": [1]}}', '[TOOL_CALLS] [{"name":"f","arguments":{}}]',
        '<think>\nhmm <tool_call>\n</think>\n\nanswer', 'plain answer', '  <think>never closed', '{"a": 1}',
        '[ {"name": "a", "parameters": {"s": "x\\"}]"}}, {"name":"b","arguments":[1, "2"]} ]', '[{"name": "c", "parameters": 3}]',
        '<tool_call>{"name":"a","arguments":{"s":"</tool_call>"}}</tool_call>\n<tool_call>{"name":"b","parameters":7}</tool_call>',
        '<think>x</think><tool_call>{"name": "add", "arguments": {}}</tool_call> more']
for i, b in enumerate(bodies):
    for k, o in enumerate(outs):
        open('%s/t%d_%d' % (sys.argv[1], i, k), 'wb').write(bytes([(i * 37 + k * 11) & 255]) + json.dumps(b).encode() + b'\0' + o.encode())
PY
run_fuzzer fuzz_tools $((SECS / 3 + 1)) "$OUT/run/tools_seeds"
# fuzz_dialects: the Responses and Messages APIs' translations; each seed is a selector byte
# (bit 1: Anthropic's, 2: count_tokens, 3: input items ascending, 4: delete), a request body, a
# NUL byte and chat deltas, one JSON object a line
mkdir -p "$OUT/run/dialect_seeds"
python3 - "$OUT/run/dialect_seeds" <<'PY'
import json, sys
fn = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}
resp = [{"input": "hi", "max_output_tokens": 8}, {"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
         {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}, {"type": "function_call_output", "call_id": "c1", "output": "4"}],
         "instructions": "Be brief.", "tools": [fn], "tool_choice": "auto", "stream": True, "top_logprobs": 2},
        {"input": "x", "text": {"format": {"type": "json_schema", "schema": {"type": "object"}}}, "store": False, "stream": True},
        {"input": [{"type": "reasoning", "summary": []}, {"role": "assistant", "content": "ok"}], "previous_response_id": "resp_x"}]
msgs = [{"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "system": [{"type": "text", "text": "Be brief."}]},
        {"max_tokens": 8, "stream": True, "tools": [{"name": "f", "input_schema": fn["parameters"]}], "tool_choice": {"type": "any"},
         "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "thinking", "thinking": "t"},
                      {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}}]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "4"}, {"type": "text", "text": "so?"}]}]}]
deltas = ['{"role":"assistant"}\n{"reasoning_content":"hmm"}\n{"content":"Hel"}\n{"content":"lo","finish_reason":"stop"}\n{"usage":{"prompt_tokens":5,"completion_tokens":3}}',
          '{"tool_calls":[{"index":0,"id":"call_0123","type":"function","function":{"name":"f","arguments":""}}]}\n'
          '{"tool_calls":[{"index":0,"function":{"arguments":"{\\"a\\":"}}]}\n{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]}\n'
          '{"tool_calls":[{"index":1,"id":"call_4567","function":{"name":"g","arguments":"{}"}}],"finish_reason":"tool_calls"}',
          '{"content":"x"}\n{"finish_reason":"length"}', '{"content":"\\u00e9"}\n{"finish_reason":"error"}']
k = 0
for sel, bodies in [(0, resp), (2, msgs), (6, msgs), (24, resp)]:
    for b in bodies:
        for d in deltas:
            open('%s/d%03d' % (sys.argv[1], k), 'wb').write(bytes([sel]) + json.dumps(b).encode() + b'\0' + d.encode())
            k += 1
PY
run_fuzzer fuzz_dialects $((SECS / 3 + 1)) "$OUT/run/dialect_seeds"
echo "cli_fuzz: ran clean (fuzz_gguf ${SECS}s, fuzz_plan, fuzz_tokenize, fuzz_json_fsm, fuzz_json_schema, fuzz_regex, fuzz_grammar, fuzz_tools and fuzz_dialects $((SECS / 3 + 1))s each)"
