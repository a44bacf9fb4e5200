#!/usr/bin/env bash
# Quorum queues, hutch against RabbitMQ 3.10.8 on this machine (issue 7; docs/BENCHMARKS.md, "Quorum queues").
#
#   benchmarks/quorum_vs_rabbitmq.sh [OUT.jsonl]
#
# Needs: RabbitMQ 3.10.8 installed (rabbitmq-server, rabbitmqctl; run as root: the nodes run as the
# rabbitmq user), perf (fsync counts), the venv with pika and py-spy. Starts and stops its own brokers
# (benchmarks/quorum_bench.py: hutch on free ports, RabbitMQ on 5801-5803, data under /tmp/qqb) and appends
# one JSON object per measurement to OUT (default benchmarks/quorum_results-<date>.jsonl), then prints the
# tables. Environment: ROUNDS (default 5), RUN_SECONDS (default 30), FAILOVER_ROUNDS (default 10),
# HUTCH_SRC (run hutch from this source tree, e.g. a `git archive` of the commit measured), STEPS (default
# "throughput1 throughput3 fsyncs latency memory failover profile machine").
# About 80 minutes with the defaults (ROUNDS=5).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-benchmarks/quorum_results-$(date +%F).jsonl}
ROUNDS=${ROUNDS:-5}
RUN_SECONDS=${RUN_SECONDS:-30}
FAILOVER_ROUNDS=${FAILOVER_ROUNDS:-10}
STEPS=${STEPS:-"throughput1 throughput3 fsyncs latency memory failover profile machine"}
B=(.venv/bin/python benchmarks/quorum_bench.py)

for step in $STEPS; do
  echo "== $step ($(date -u +%H:%M:%S) UTC)" >&2
  case $step in
    throughput1) "${B[@]}" throughput --nodes 1 --rounds "$ROUNDS" --seconds "$RUN_SECONDS" --sizes 16,1000 >> "$OUT" ;;
    throughput3) "${B[@]}" throughput --nodes 3 --rounds "$ROUNDS" --seconds "$RUN_SECONDS" --sizes 16,1000 >> "$OUT" ;;
    fsyncs)
      "${B[@]}" fsyncs --nodes 1 --seconds 20 --sizes 16 >> "$OUT"
      "${B[@]}" fsyncs --nodes 3 --seconds 20 --sizes 16 >> "$OUT" ;;
    latency)
      "${B[@]}" latency --nodes 1 --rate 5000 --seconds "$RUN_SECONDS" --rounds 3 --sizes 16 >> "$OUT"
      "${B[@]}" latency --nodes 3 --rate 5000 --seconds "$RUN_SECONDS" --rounds 3 --sizes 16 >> "$OUT" ;;
    memory)
      "${B[@]}" memory --nodes 3 --count 1000000 --sizes 16 >> "$OUT"
      # the same with a 32 MiB Raft WAL on both (default 512 MiB): entries leave RAM at each WAL flush
      "${B[@]}" memory --nodes 3 --count 1000000 --sizes 16 --hutch-config "raft.wal_max_size_bytes = 33554432" \
        --rabbit-config "raft.wal_max_size_bytes = 33554432" >> "$OUT" ;;
    failover) "${B[@]}" failover --nodes 3 --rounds "$FAILOVER_ROUNDS" >> "$OUT" ;;
    profile) "${B[@]}" profile --nodes 3 --seconds 20 --sizes 16 --top 25 >> "$OUT" ;;
    machine) "${B[@]}" machine-bytes --count 1000000 >> "$OUT" ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
"${B[@]}" summary --results "$OUT"
