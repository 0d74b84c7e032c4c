#!/usr/bin/env bash
# make demo: start the stack, open an activity, fire a launch-night burst at
# it, and leave everything running so the operator page can be watched.
set -euo pipefail
cd "$(dirname "$0")/.."

addr=${ALLOT_HTTP_ADDR:-:8080}
url="http://localhost:${addr##*:}"
activity=${DEMO_ACTIVITY:-9001}
log=var/demo-stack.log
mkdir -p var

# devdb: a MySQL server answers (a private one under var/mysql if need be).
./bin/devdb -var ALLOT_MYSQL_DSN -- ./bin/stack >"$log" 2>&1 &
stack=$!
trap 'kill -INT $stack 2>/dev/null; wait $stack 2>/dev/null; echo "demo stopped."' EXIT INT TERM

for _ in $(seq 1 100); do
  if curl -fsS "$url/readyz" >/dev/null 2>&1; then break; fi
  if ! kill -0 $stack 2>/dev/null; then echo "the stack did not start; its log:"; cat "$log"; exit 1; fi
  sleep 0.1
done

cat <<MSG

  Operator page: $url/?activity=$activity
  (open it now; the burst starts in 5 seconds; stack log: $log)

MSG
sleep 5
# A waitlist burst first, so promotions show, then a flash-sale burst.
./bin/loadgen -url "$url" -activity "$activity" -capacity 200 -n 3000 -users 1500 -c 64 -mix join=6,cancel=3,claim=1 || true
./bin/loadgen -url "$url" -activity $((activity + 1)) -capacity 100 -n 20000 -users 18000 -c 256 -mix claim=1 || true

cat <<MSG

  Bursts done. Watch them at $url/?activity=$activity and $url/?activity=$((activity + 1)).
  Ctrl-C stops the stack.
MSG
wait $stack
