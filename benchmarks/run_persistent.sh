#!/usr/bin/env bash
# Persistent messages side by side (issue 4's scenario): 16-byte persistent messages to a durable
# classic queue, 1 -> 1, confirm window 1000, prefetch 1000, multi-ack 100.
#
#   benchmarks/run_persistent.sh [SECONDS] [ROUNDS]
#
# Needs a hutch node on $HUTCH_PORT (default 5673, with a data dir) and RabbitMQ on 5672. The durable
# queue "perf-durable" is (re)declared on both first, since hutch-perf declares a transient queue.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_RUN=${1:-15}
ROUNDS=${2:-2}
HUTCH_PORT=${HUTCH_PORT:-5673}
PY=${PY:-.venv/bin/python}
PERF=${PERF:-.venv/bin/hutch-perf}

for round in $(seq 1 "$ROUNDS"); do
  for broker in hutch rabbitmq; do
    if [ "$broker" = hutch ]; then port=$HUTCH_PORT; else port=5672; fi
    $PY - "$port" <<'PYEOF'
import sys
import pika
c = pika.BlockingConnection(pika.ConnectionParameters(port=int(sys.argv[1])))
ch = c.channel()
ch.queue_delete("perf-durable")
ch.queue_declare("perf-durable", durable=True)
c.close()
PYEOF
    line=$($PERF --uri "amqp://guest:guest@127.0.0.1:$port/%2F" -x 1 -y 1 -s 16 -c 1000 -q 1000 -A 100 \
           -f persistent -u perf-durable -z "$SECONDS_PER_RUN" --json 2>/dev/null | tail -n 1)
    echo "{\"round\": $round, \"broker\": \"$broker\", \"scenario\": \"persistent_16B\", \"result\": $line}"
  done
done
