#!/usr/bin/env bash
# Fsyncs per 1,000 confirmed persistent messages, hutch and RabbitMQ, in run_persistent.sh's scenario
# (16-byte persistent messages, durable classic queue, 1 -> 1, confirm window 1000, prefetch 1000,
# multi-ack 100).
#
#   benchmarks/fsyncs.sh [SECONDS]
#
# Reads `io_sync_count` from each broker's management API (/api/nodes) before and after the run:
# hutch counts its fdatasync calls there; RabbitMQ (rabbitmq_management plugin enabled) its file syncs.
# RabbitMQ refreshes the figure every 5 s, so the script waits 6 s before reading it.
# Needs hutch on $HUTCH_PORT / $HUTCH_MGMT_PORT (default 5673 / 15673) and RabbitMQ on 5672 / 15672.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_RUN=${1:-15}
HUTCH_PORT=${HUTCH_PORT:-5673}
HUTCH_MGMT_PORT=${HUTCH_MGMT_PORT:-15673}
PY=${PY:-.venv/bin/python}
PERF=${PERF:-.venv/bin/hutch-perf}

syncs() {
  curl -s -u guest:guest "http://127.0.0.1:$1/api/nodes" |
    $PY -c 'import json, sys; print(json.load(sys.stdin)[0].get("io_sync_count", 0))'
}

for broker in hutch rabbitmq; do
  if [ "$broker" = hutch ]; then port=$HUTCH_PORT; mport=$HUTCH_MGMT_PORT; else port=5672; mport=15672; fi
  $PY - "$port" <<'PYEOF'
import sys
import pika
c = pika.BlockingConnection(pika.ConnectionParameters(port=int(sys.argv[1])))
ch = c.channel()
ch.queue_delete("perf-durable")
ch.queue_declare("perf-durable", durable=True)
c.close()
PYEOF
  sleep 6
  before=$(syncs "$mport")
  line=$($PERF --uri "amqp://guest:guest@127.0.0.1:$port/%2F" -x 1 -y 1 -s 16 -c 1000 -q 1000 -A 100 \
         -f persistent -u perf-durable -z "$SECONDS_PER_RUN" --json 2>/dev/null | tail -n 1)
  sleep 6
  after=$(syncs "$mport")
  $PY - "$broker" "$before" "$after" "$line" <<'PYEOF'
import json
import sys
broker, before, after, line = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
confirmed = line["confirmed"]
print(json.dumps({"broker": broker, "scenario": "persistent_16B_fsyncs", "confirmed": confirmed,
                  "confirm_rate": line["confirm_rate"], "fsyncs": after - before,
                  "fsyncs_per_1000": round(1000 * (after - before) / max(confirmed, 1), 2)}))
PYEOF
done
