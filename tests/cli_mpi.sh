#!/usr/bin/env bash
# Run the MPI-aware test programs under mpirun with 2 and 4 ranks (oversubscribed on 2 cores).
# Usage: cli_mpi.sh FITLLM_BIN SHARED_DIR
set -u
BIN=$(readlink -f "$1") # absolute: one test runs ranks in folders of their own
DIR=$(dirname "$BIN")
command -v mpirun >/dev/null || { echo "SKIP: mpirun not installed"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
# oversubscribed ranks must not busy-wait on each other
export OMPI_MCA_mpi_yield_when_idle=1
fails=0
for np in 2 4; do
  for t in "$DIR"/test_dist "$DIR"/test_tp "$DIR"/test_sp "$DIR"/test_pp "$DIR"/test_zero; do
    [ -x "$t" ] || continue
    if timeout 120 mpirun -np $np --oversubscribe --bind-to none "$t" >"$DIR/mpi_$(basename "$t")_$np.log" 2>&1; then
      echo "ok   - $(basename "$t") with $np ranks"
    else
      echo "FAIL - $(basename "$t") with $np ranks"; tail -20 "$DIR/mpi_$(basename "$t")_$np.log"; fails=$((fails+1))
    fi
  done
done
# the CLI: `mpirun -np N fitllm run --tp N` gives the one-process greedy tokens (stories260K)
MODEL=$(readlink -f "${2:-.}")/models/stories260K.gguf
if [ -f "$MODEL" ] && command -v python3 >/dev/null; then
  want=$("$BIN" run -m "$MODEL" -p "Once upon a time" -n 40 --temp 0 --json -t 1 | python3 -c "import json,sys; print(json.load(sys.stdin)['tokens'])")
  for np in 2 4; do
    got=$(timeout 120 mpirun -np $np --oversubscribe --bind-to none "$BIN" run --tp $np -m "$MODEL" -p "Once upon a time" -n 40 --temp 0 --json 2>"$DIR/mpi_run_$np.log" | python3 -c "import json,sys; print(json.load(sys.stdin)['tokens'])")
    if [ -n "$want" ] && [ "$got" = "$want" ]; then echo "ok   - fitllm run --tp $np equals one process"; else echo "FAIL - fitllm run --tp $np: $got vs $want"; fails=$((fails+1)); fi
  done
fi
# ZeRO data-parallel training: N ranks x grad_accum 1 follow the loss curve of one process with
# grad_accum N, each rank holds 1/N of the optimizer states, and rank 0's peak in each category is
# what `fitllm plan --train --dp N --zero S` predicts (weights, activations, grads, optimizer and
# comm to the byte; the workspace a bound within 1%: the plan gives the attention kernels' offsets
# room for a sequence per token, since packing puts several documents in a row)
if [ -f "$MODEL" ] && command -v python3 >/dev/null; then
  TXT=$(mktemp); head -c 60000 "${2}/data/war-and-peace.txt" >"$TXT"
  ARGS=(train --init tiny --tokenizer "$MODEL" -f "$TXT" -c 64 --batch 2 --steps 6 --lr 3e-3 --warmup 1 --eval-tokens 500 --json)
  TINY=$(mktemp --suffix .gguf)
  "$BIN" "${ARGS[@]}" --steps 1 -t 1 -o "$TINY" >/dev/null 2>&1 || { echo "FAIL - the tiny model for the plans"; fails=$((fails+1)); }
  curve() { python3 -c "import sys,json; ev=[json.loads(l) for l in sys.stdin]; print([round(d['loss'],5) for d in ev if d.get('event')=='step'], [d['optim_bytes'] for d in ev if d.get('event')=='done'][0])"; }
  # zcase NAME NP Z ONE-CURVE PLAN-MODEL "PLAN FLAGS" TRAIN ARGS...: N ranks against one process's curve and the plan
  zcase() {
    local name=$1 np=$2 z=$3 one=$4 pm=$5 pa=$6; shift 6
    local LOG="$DIR/mpi_zero_${name}_${np}_$z.jsonl" dp plan
    timeout 120 mpirun -np $np --oversubscribe --bind-to none "$BIN" "$@" --grad-accum 1 -t 1 --zero $z 2>"${LOG%.jsonl}.log" >"$LOG"
    dp=$(curve <"$LOG")
    plan=$("$BIN" plan -m "$pm" $pa -c 64 --batch 2 -t 1 --dp $np --zero $z --json 2>&1)
    if python3 - "$one" "$dp" "$np" "$LOG" "$plan" <<'PY'
import sys, ast, json
a, b, n = sys.argv[1].rsplit(" ", 1), sys.argv[2].rsplit(" ", 1), int(sys.argv[3])
la, lb = ast.literal_eval(a[0]), ast.literal_eval(b[0])
assert len(la) == 6 and len(lb) == 6, (la, lb)
assert all(abs(x - y) <= 1e-4 * abs(x) for x, y in zip(la, lb)), (la, lb)
ratio = int(a[1]) / int(b[1])
assert 0.9 * n <= ratio <= 1.1 * n, ("optimizer bytes per rank not 1/N", a[1], b[1])
got = [json.loads(l) for l in open(sys.argv[4]) if '"done"' in l][0]["peak_by_category"]
want = json.loads(sys.argv[5])["devices"][0]["bytes"]
for g, w in (("weights", "weights"), ("act", "activations"), ("grad", "grads"), ("optim", "optimizer"), ("comm", "comm")):
    assert got[g] == want[w], ("plan against measured", g, got[g], want[w])
assert got["scratch"] <= want["workspace"] <= 1.01 * got["scratch"], ("workspace", got["scratch"], want["workspace"])
PY
    then echo "ok   - train $name --zero $z on $np ranks: same loss curve, optimizer states / $np, rank 0's peaks as planned"
    else echo "FAIL - train $name --zero $z on $np ranks: $dp vs $one"; tail -3 "${LOG%.jsonl}.log"; fails=$((fails+1)); fi
  }
  for np in 2 4; do
    one=$("$BIN" "${ARGS[@]}" --grad-accum $np -t 1 2>/dev/null | curve)
    for z in 1 2; do zcase full $np $z "$one" "$TINY" "--train" "${ARGS[@]}"; done
    # stage 2 never holds the whole gradient (stage 1's): its shard and one bucket of the backward
    if python3 - "$DIR/mpi_zero_full_${np}_1.jsonl" "$DIR/mpi_zero_full_${np}_2.jsonl" "$np" <<'PY'
import sys, json
g1, g2 = ([json.loads(l) for l in open(f) if '"done"' in l][0]["peak_by_category"]["grad"] for f in sys.argv[1:3])
n = int(sys.argv[3])
assert g2 < g1 / n + g1 / 2, ("stage 2 grads", g2, "stage 1", g1)
print("grads: stage 1 %d, stage 2 %d bytes" % (g1, g2))
PY
    then echo "ok   - train full --zero 2 on $np ranks holds its shard and a bucket of the gradient, not the whole"
    else echo "FAIL - train full --zero 2 on $np ranks: gradient memory"; fails=$((fails+1)); fi
  done
  # stage 2 with 2 micro-batches a rank: each micro-batch's buckets summed into the shards as they
  # come; the curve of one process with 4
  one4=$("$BIN" "${ARGS[@]}" --grad-accum 4 -t 1 2>/dev/null | curve)
  ga=$(timeout 120 mpirun -np 2 --oversubscribe --bind-to none "$BIN" "${ARGS[@]}" --grad-accum 2 -t 1 --zero 2 2>"$DIR/mpi_zero_ga.log" | curve)
  if python3 - "$one4" "$ga" <<'PY'
import sys, ast
a, b = (ast.literal_eval(x.rsplit(" ", 1)[0]) for x in sys.argv[1:3])
assert len(a) == 6 and len(b) == 6 and all(abs(x - y) <= 1e-4 * abs(x) for x, y in zip(a, b)), (a, b)
PY
  then echo "ok   - train full --zero 2 --grad-accum 2 on 2 ranks: the loss curve of one process with --grad-accum 4"
  else echo "FAIL - train full --zero 2 --grad-accum 2: $ga vs $one4"; tail -3 "$DIR/mpi_zero_ga.log"; fails=$((fails+1)); fi
  # LoRA adapters (rank 4 on stories260K's frozen base): the shards are the adapters'; a run
  # stopped at step 3 and resumed repeats steps 4-6 bit for bit (the checkpoint holds the adapters)
  LA=(train -m "$MODEL" -f "$TXT" -c 64 --batch 2 --steps 6 --lr 3e-3 --warmup 1 --schedule constant --eval-tokens 500 --json --lora 4)
  one=$("$BIN" "${LA[@]}" --grad-accum 2 -t 1 2>/dev/null | curve)
  zcase lora 2 2 "$one" "$MODEL" "--train --lora-rank 4" "${LA[@]}"
  LT=$(mktemp -d)
  timeout 120 mpirun -np 2 --oversubscribe --bind-to none "$BIN" "${LA[@]}" -t 1 --zero 2 --steps 3 --save-every 3 -o "$LT/l.gguf" >/dev/null 2>"$LT/b.log"
  timeout 120 mpirun -np 2 --oversubscribe --bind-to none "$BIN" "${LA[@]}" -t 1 --zero 2 --resume "$LT/l.gguf.ckpt" >"$LT/c.jsonl" 2>"$LT/c.log"
  if python3 - "$DIR/mpi_zero_lora_2_2.jsonl" "$LT/c.jsonl" <<'PY'
import sys, json
full, res = ([(d["loss"], d["grad_norm"]) for d in map(json.loads, open(f)) if d.get("event") == "step"] for f in sys.argv[1:])
assert len(full) == 6 and res == full[3:], (full, res)
PY
  then echo "ok   - train lora --zero 2: stopped at step 3 and resumed, steps 4-6 bit for bit"
  else echo "FAIL - train lora --zero 2 resume"; tail -3 "$LT"/*.log; fails=$((fails+1)); fi
  rm -rf "$LT"
  rm -f "$TINY"
  # ZeRO checkpoints and fp16 loss scaling (8-bit AdamW: the shards start on its blocks; fp16
  # from a loss scale that overflows now and then). ZeRO-2 skips the steps one process skips, with
  # the same loss scales; a run stopped at step 3 and resumed on as
  # many ranks gives the uninterrupted run's steps 4-6 bit for bit, its checkpoint written in
  # 50000-byte pieces (so pieces straddle the shards); one process resuming it (grad-accum 2)
  # skips the same steps with the same loss scales and agrees to f32 summation order; 4 ranks
  # under ZeRO-1 resume it too.
  CK=(train --init tiny --tokenizer "$MODEL" -f "$TXT" -c 64 --batch 2 --lr 3e-3 --warmup 1 --schedule constant
      --eval-tokens 500 --json --optim adamw8bit --precision fp16 --loss-scale 3e6)
  T=$(mktemp -d)
  steps() { python3 -c "import sys,json; print(' '.join('%s/%s/%s/%g' % (d['loss'], d['grad_norm'], d['skipped'], d['loss_scale']) for d in map(json.loads, sys.stdin) if d.get('event')=='step'))"; }
  mrun() { local np=$1; shift; timeout 120 mpirun -np "$np" --oversubscribe --bind-to none "$BIN" "$@"; }
  ref=$("$BIN" "${CK[@]}" --steps 6 --grad-accum 2 -t 1 2>"$T/r.log" | steps)
  full=$(mrun 2 "${CK[@]}" --steps 6 --zero 2 2>"$T/a.log" | steps)
  FL_CKPT_PIECE=50000 timeout 120 mpirun -np 2 --oversubscribe --bind-to none -x FL_CKPT_PIECE "$BIN" "${CK[@]}" \
      --steps 3 --zero 2 --save-every 3 -o "$T/z.gguf" >/dev/null 2>"$T/b.log"
  same=$(mrun 2 "${CK[@]}" --steps 6 --zero 2 --resume "$T/z.gguf.ckpt" 2>"$T/c.log" | steps)
  one=$("$BIN" "${CK[@]}" --steps 6 --grad-accum 2 -t 1 --resume "$T/z.gguf.ckpt" 2>"$T/d.log" | steps)
  four=$(mrun 4 "${CK[@]}" --steps 6 --zero 1 --resume "$T/z.gguf.ckpt" 2>"$T/e.log" | steps)
  if python3 - "$ref" "$full" "$same" "$one" "$four" <<'PY'
import sys
ref, full, same, one, four = (a.split() for a in sys.argv[1:])
def close(a, b, what):
    assert len(a) == len(b), (what, a, b)
    for x, y in zip(a, b):
        (lx, gx, sx, cx), (ly, gy, sy, cy) = x.split("/"), y.split("/")
        assert sx == sy and cx == cy and abs(float(lx) - float(ly)) <= 1e-4 * float(lx), (what, a, b)
        assert (gx == gy == "None") or abs(float(gx) - float(gy)) <= 1e-3 * float(gx), ("grad norms", what, a, b)
assert len(ref) == 6 and len(full) == 6, (ref, full)
skips = [x.split("/")[2] for x in ref[3:]]
assert "True" in skips and "False" in skips, ("the test wants skipped and taken steps after the resume", ref)
close(ref, full, "ZeRO-2 fp16 against one process")
assert same == full[3:], ("resume on 2 ranks is not bit-identical", full, same)
close(ref[3:], one, "one process resuming the ZeRO checkpoint")
assert len(four) == 3 and all(0 < float(x.split("/")[0]) < 7 for x in four), ("4 ranks", four)
PY
  then echo "ok   - ZeRO checkpoints + fp16: resume bit-identical on 2 ranks (written in pieces), the same on one process, 4 ranks resume"
  else echo "FAIL - ZeRO checkpoints + fp16: $ref | $full | $same | $one | $four"; tail -3 "$T"/*.log; fails=$((fails+1)); fi
  # one rank reads a damaged copy (each rank runs in its own folder, the same relative path):
  # every rank fails, and rank 0, whose copy is good, says how many could not read it
  mkdir -p "$T/r0" "$T/r1"
  cp "$T/z.gguf.ckpt" "$T/r0/c.ckpt"
  head -c 100000 "$T/z.gguf.ckpt" > "$T/r1/c.ckpt"
  timeout 120 mpirun --oversubscribe --bind-to none -np 1 -wdir "$T/r0" "$BIN" "${CK[@]}" --steps 6 --zero 2 --resume c.ckpt : \
      -np 1 -wdir "$T/r1" "$BIN" "${CK[@]}" --steps 6 --zero 2 --resume c.ckpt >"$T/h.out" 2>"$T/h.log"
  rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "could not be read on 1 of 2 ranks" "$T/h.log" && ! grep -q '"event":"step"' "$T/h.out"
  then echo "ok   - ZeRO resume: a rank that cannot read the checkpoint fails them all (exit $rc)"
  else echo "FAIL - ZeRO resume with one damaged copy: exit $rc"; tail -5 "$T/h.log"; fails=$((fails+1)); fi
  rm -rf "$T"
  rm -f "$TXT"
fi
[ $fails = 0 ]
