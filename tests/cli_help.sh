#!/usr/bin/env bash
# Every command listed by `fitllm --help` (and every benchmark listed by `fitllm bench --help`)
# answers --help with exit 0 and a "usage:" line, and rejects an unknown option with exit 2.
# Commands are discovered from the help output, never hard-coded.
# usage: cli_help.sh FITLLM SHARED_DIR
set -uo pipefail
BIN="$1"
fail=0
err() { echo "FAIL: $*" >&2; fail=1; }

# names listed under a "commands:" / "benchmarks:" heading: "  name   help text"
list_after() { awk -v h="$1" '$0 ~ "^"h":" {on=1; next} on && /^  [a-z]/ {print $1; seen=1; next} on && seen {on=0}'; }

top=$("$BIN" --help) || err "fitllm --help exited $?"
grep -q "usage:" <<<"$top" || err "fitllm --help prints no usage: line"
cmds=$(list_after commands <<<"$top")
[ -n "$cmds" ] || err "no commands found in fitllm --help"

check() { # check "label" args...
    local label="$1"; shift
    local out rc
    out=$("$BIN" "$@" --help 2>&1); rc=$?
    [ $rc -eq 0 ] || err "$label --help exited $rc"
    grep -q "usage:" <<<"$out" || err "$label --help prints no usage: line"
    out=$("$BIN" "$@" --no-such-option-xyz 2>&1 >/dev/null); rc=$?
    [ $rc -eq 2 ] || err "$label --no-such-option-xyz exited $rc, want 2"
    [ "$*" = bench ] || grep -q "^fitllm $*: unknown option '--no-such-option-xyz'" <<<"$out" || err "$label names itself otherwise: $out"
}

n=0
for c in $cmds; do
    check "fitllm $c" "$c"; n=$((n + 1))
    if [ "$c" = bench ]; then
        for b in $("$BIN" bench --help | list_after benchmarks); do
            check "fitllm bench $b" bench "$b"; n=$((n + 1))
        done
    fi
done
"$BIN" no-such-command >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || err "unknown command exited $rc, want 2"
"$BIN" >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || err "no command exited $rc, want 2"
echo "cli_help: checked $n commands/benchmarks"
exit $fail
