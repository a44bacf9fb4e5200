#!/usr/bin/env bash
# celery's integration tests as its CI runs them: one job per module of its Integration-tests matrix
# (.github/workflows/python-package.yml at the release tag), each `tox -e integration-rabbitmq -- -k MODULE`
# against a broker of its own; here each against a fresh hutch node (or the host's RabbitMQ), through
# run_amqp_client_suites.sh's `celery-module` suite (docs/compatibility.md). Not test_backend.py: the Azure
# Block Blob result backend (the azure packages and an account; no broker).
#
#   tests/compat/run_celery_modules.sh BROKER      (BROKER: rabbitmq | hutch; HUTCH_WORKERS as there)
#
# One log per module, $WORK/celery-module-rabbitmq-MODULE.log or celery-module-hutch-wN-MODULE.log; the
# summary of each is printed.
set -uo pipefail
broker=${1:?usage: $0 rabbitmq|hutch}
here=$(dirname "$0")
modules="test_canvas.py test_dedup_chain_dispatch.py test_inspect.py test_loader.py
test_mem_leak_in_exception_handling.py test_quorum_queue_qos_cluster_simulation.py
test_rabbitmq_chord_unlock_routing.py test_rabbitmq_default_queue_type_fallback.py test_security.py
test_serialization.py test_tasks.py test_worker.py"
for module in $modules; do
    summary=$(CELERY_MODULE=$module LOG_TAG=${module%.py} "$here/run_amqp_client_suites.sh" celery-module "$broker" | tail -1)
    echo "$module: $summary"
done
