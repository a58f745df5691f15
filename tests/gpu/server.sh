# Sourced by the *_smoke.sh scripts. `start_server CMD...` runs an
# `ingot serve` command in the background with its log in $LOG, sets URL and
# PID, kills it on exit, and waits for /ready; a server that exits, or is not
# ready within $READY_TIMEOUT seconds (default 300), ends the script with its
# log instead of hanging the device call.
start_server() {
  LOG=$(mktemp)
  "$@" >"$LOG" 2>&1 &
  PID=$!
  trap 'kill $PID 2>/dev/null' EXIT
  local deadline=$((SECONDS + ${READY_TIMEOUT:-300}))
  URL=
  until [ -n "$URL" ] && curl -sf "$URL/ready" >/dev/null; do
    if ! kill -0 "$PID" 2>/dev/null || [ $SECONDS -ge $deadline ]; then
      echo "server did not start"; cat "$LOG"; exit 1
    fi
    URL=$(grep -o 'http://[0-9.:]*' "$LOG" | head -1)
    sleep 0.1
  done
}

# Stops the server started by start_server and waits for it.
stop_server() {
  kill "$PID" 2>/dev/null
  wait "$PID" 2>/dev/null
  trap - EXIT
}
