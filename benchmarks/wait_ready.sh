# Sourced by the serve benchmark scripts: wait_ready PORT returns once the server on PORT is
# ready and its idle warm-up is done (or IDLE_WAIT_S, default 300, seconds after ready), printing
# its state.
wait_ready() {
  local state stage done total
  for second in $(seq 1 900); do
    state=$(curl -s "http://127.0.0.1:$1/readyz" | python3 -c "
import json, sys
progress = json.load(sys.stdin).get('progress', {})
background = progress.get('background', {})
print(progress.get('stage'), background.get('done'), background.get('total'))" 2>/dev/null || true)
    read -r stage done total <<< "${state:-none 0 1}"
    if [ "$stage" = ready ] && { [ "$done" = "$total" ] || [ "$second" -gt "${IDLE_WAIT_S:-300}" ]; }; then
      echo "port $1: $state (stage, idle programs done / total) after $second s"; return
    fi
    sleep 1
  done
}
