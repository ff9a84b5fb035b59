# Shared by the CLI tests that run `fitllm serve` (sourced; needs BIN and TMP): check counters and
# one server at a time.
fails=0; passes=0; PID=; URL=
ok() { passes=$((passes+1)); echo "ok   - $1"; }
bad() { fails=$((fails+1)); echo "FAIL - $1"; }
check() { if eval "$2"; then ok "$1"; else bad "$1"; fi; }
# srv_start MODEL ARGS... -> PID, URL (any free port, one thread; its log in $TMP/srv.log, emptied
# here first: the child's own redirection can come after the first look, which then read the
# port of the server before)
srv_start() {
  local m=$1; shift
  : > "$TMP/srv.log"
  "$BIN" serve -m "$m" --port 0 -t 1 "$@" 2>"$TMP/srv.log" &
  PID=$!; URL=
  for _ in $(seq 1 100); do
    port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$TMP/srv.log")
    [ -n "$port" ] && { URL=http://127.0.0.1:$port; return 0; }
    sleep 0.1
  done
  echo "server did not start:"; cat "$TMP/srv.log"; exit 1
}
srv_stop() { [ -n "$PID" ] && { kill "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; }; PID=; }
