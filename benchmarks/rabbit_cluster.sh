#!/bin/sh
# A RabbitMQ cluster of three nodes on this machine, beside (not joined to) the one on 5672, for the
# 3-node stream figures of issue 23 (docs/BENCHMARKS.md, "Streams on three nodes").
#
#   sh benchmarks/rabbit_cluster.sh start DIR     # nodes rmq1..rmq3@HOST: AMQP 5681-5683, stream 5561-5563
#   sh benchmarks/rabbit_cluster.sh stop DIR
#
# Each node has its own data and log directories under DIR, the stream plugin enabled, no management
# listener (its collector would add CPU the hutch side does not pay) and its Erlang distribution port at
# 25681-25683 (epmd is shared with the node on 5672, which is not touched). Needs rabbitmq-server
# (Debian's package); as root the nodes run as the rabbitmq user, as Debian's wrapper runs its own node.
set -eu
cmd=${1:?start or stop}
dir=${2:?a directory for the nodes data}
host=$(hostname -s)
node_env() {
  i=$1
  printf 'stream.listeners.tcp.default = %s\nlisteners.tcp.default = %s\nloopback_users = none\n' \
    $((5560 + i)) $((5680 + i)) > "$dir/rmq$i/rabbitmq.conf"
  echo '[rabbitmq_stream].' > "$dir/rmq$i/enabled_plugins"
  echo "RABBITMQ_NODENAME=rmq$i@$host RABBITMQ_NODE_PORT=$((5680 + i)) RABBITMQ_DIST_PORT=$((25680 + i))" \
    "RABBITMQ_MNESIA_BASE=$dir/rmq$i/mnesia RABBITMQ_LOG_BASE=$dir/rmq$i/log" \
    "RABBITMQ_CONFIG_FILE=$dir/rmq$i/rabbitmq RABBITMQ_ENABLED_PLUGINS_FILE=$dir/rmq$i/enabled_plugins" \
    "RABBITMQ_PID_FILE=$dir/rmq$i/pid"
}
case $cmd in
start)
  mkdir -p "$dir"
  for i in 1 2 3; do mkdir -p "$dir/rmq$i/mnesia" "$dir/rmq$i/log"; node_env $i > "$dir/rmq$i/env"; done
  if [ "$(id -u)" = 0 ] && id -u rabbitmq >/dev/null 2>&1; then  # Debian's wrapper runs the server as rabbitmq
    chown -R rabbitmq "$dir"
    for i in 1 2 3; do su rabbitmq -s /bin/sh -c "env $(cat "$dir/rmq$i/env") /usr/lib/rabbitmq/bin/rabbitmq-server -detached"; done
  else
    for i in 1 2 3; do env $(cat "$dir/rmq$i/env") rabbitmq-server -detached; done
  fi
  for i in 1 2 3; do rabbitmqctl -n "rmq$i@$host" await_startup --timeout 120 >/dev/null; done
  for i in 2 3; do
    rabbitmqctl -n "rmq$i@$host" stop_app >/dev/null
    rabbitmqctl -n "rmq$i@$host" join_cluster "rmq1@$host" >/dev/null
    rabbitmqctl -n "rmq$i@$host" start_app >/dev/null
  done
  rabbitmqctl -n "rmq1@$host" cluster_status --formatter json | python3 -c \
    'import json,sys; s=json.load(sys.stdin); print("running:", " ".join(sorted(s["running_nodes"])))'
  for i in 1 2 3; do printf '%s ' "$(cat "$dir/rmq$i/pid")"; done; echo
  ;;
stop)
  for i in 1 2 3; do rabbitmqctl -n "rmq$i@$host" stop >/dev/null 2>&1 || true; done
  ;;
*) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac
