# Sourced by the GPU drivers: `step NAME TIMEOUT_S CMD...` runs CMD under a timeout capped by $DEADLINE,
# logs it to $W/log.NAME and appends {step, rc, seconds, cmd, tail} to $W/steps.jsonl; a step whose
# deadline has passed is recorded as skipped. Drivers go on after a failed step.
step() {
  local name=$1 limit=$2; shift 2
  local left=$(( DEADLINE - $(date +%s) ))
  if [ "$left" -lt 20 ]; then
    printf '{"step": "%s", "rc": null, "skipped": "deadline"}\n' "$name" >> "$W/steps.jsonl"; return 1
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0=$(date +%s.%N) log="$W/log.$name"
  timeout "$limit" bash -c "$*" > "$log" 2>&1; local rc=$?
  local dt=$(python3 -c "print(round($(date +%s.%N) - $t0, 1))")
  python3 - "$name" "$rc" "$dt" "$*" "$log" >> "$W/steps.jsonl" <<'PY'
import json, sys
name, rc, dt, cmd, log = sys.argv[1:]
tail = open(log, errors="replace").read()[-1500:]
print(json.dumps({"step": name, "rc": int(rc), "seconds": float(dt), "cmd": cmd, "tail": tail}))
PY
  echo "[$name] rc=$rc ${dt}s"
  return $rc
}
