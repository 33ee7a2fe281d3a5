#!/usr/bin/env bash
# Wait for a detached validate.sh and bring its light results back in the same call (a lent machine may go back
# soon after a call returns: results copied later are lost).
#   bash benchmarks/gpu/poll.sh W MAX_SECONDS
# Waits until W/DONE exists or MAX_SECONDS pass, printing each new step of W/**/steps.jsonl; then tars every
# json/jsonl/md/txt/log/csv under W (no engines, no ONNX) into $OUT/results.tgz.
W=${1:?work dir}; MAX=${2:-540}
end=$(( $(date +%s) + MAX )); seen=0
while :; do
  n=$(cat "$W"/steps.jsonl "$W"/*/steps.jsonl 2>/dev/null | wc -l)
  if [ "$n" -gt "$seen" ]; then
    cat "$W"/steps.jsonl "$W"/*/steps.jsonl 2>/dev/null | tail -n $((n - seen)) | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        s = json.loads(line)
    except ValueError:
        continue
    print("[%s] rc=%s %ss" % (s.get("step"), s.get("rc"), s.get("seconds", s.get("skipped", ""))), flush=True)
    if s.get("rc") not in (0, None):  # why, while the machine is still held: its log may not come back
        print("    " + (s.get("tail") or "")[-400:].replace("\n", "\n    "), flush=True)'
    seen=$n
  fi
  [ -f "$W/DONE" ] && break
  [ "$(date +%s)" -ge "$end" ] && break
  sleep 5
done
[ -f "$W/DONE" ] && echo "driver: DONE" || echo "driver: still running"
mkdir -p "${OUT:-/tmp/out}"
( cd "$W" && find . -type f \( -name '*.json' -o -name '*.jsonl' -o -name '*.md' -o -name '*.txt' -o -name 'log.*' \
    -o -name '*.csv' -o -name '*.log' \) -size -20M -print0 | tar -czf "${OUT:-/tmp/out}/results.tgz" --null -T - )
ls -la "${OUT:-/tmp/out}/results.tgz"
