#!/usr/bin/env bash
# Run a published AMQP 0-9-1 client's own test suite against a broker, as its CI runs it
# (docs/compatibility.md "Client suites"). Not part of `make test`: it needs the clients' repositories and
# RabbitMQ's fixed ports.
#
#   tests/compat/run_amqp_client_suites.sh SUITE BROKER
#     SUITE   pika | pika-tls | aiormq | aio-pika | kombu | py-amqp | celery | celery-module
#     BROKER  rabbitmq  the broker already listening on localhost 5672 (guest/guest), used read-only
#             hutch     a fresh hutch node in a private network namespace (`unshare -n`, needs root) on
#                       5672 (and 5671 with TLS where the suite's CI has it), throw-away data directory
#
# Environment (defaults in brackets):
#   WORK           scratch directory for the checkouts, venvs and logs [/tmp/hutch-amqp-client-suites]
#   PIKA_GIT       [https://github.com/pika/pika]              PIKA_REF     [1.4.4]
#   AIORMQ_GIT     [https://github.com/mosquito/aiormq]        AIORMQ_REF   [6.9.3]
#   AIO_PIKA_GIT   [https://github.com/mosquito/aio-pika]      AIO_PIKA_REF [9.6.0]
#   KOMBU_GIT      [https://github.com/celery/kombu]           KOMBU_REF    [v5.6.2]
#   PY_AMQP_GIT    [https://github.com/celery/py-amqp]         PY_AMQP_REF  [v5.3.1]
#   CELERY_GIT     [https://github.com/celery/celery]          CELERY_REF   [v5.6.3]
#   HUTCH_SERVER   the hutch-server to run [the worktree's .venv/bin/hutch-server]
#   HUTCH_WORKERS  the node's --workers [2]
#   PYTEST_ARGS    extra arguments for the suite (e.g. -k NAME)
#   CELERY_MODULE  celery-module's integration module, as one job of celery's CI runs it (e.g. test_tasks.py);
#                  run_celery_modules.sh runs each module of its CI's matrix so
#
# The summary line of the suite is printed last; the whole log is in $WORK/SUITE-rabbitmq.log or
# $WORK/SUITE-hutch-wN.log (the node's own log beside it). The helpers are tests/compat/lib.sh's.
set -euo pipefail

suite=${1:?usage: $0 pika|pika-tls|aiormq|aio-pika|kombu|py-amqp|celery|celery-module rabbitmq|hutch}
broker=${2:?usage: $0 pika|pika-tls|aiormq|aio-pika|kombu|py-amqp|celery|celery-module rabbitmq|hutch}
WORK=${WORK:-/tmp/hutch-amqp-client-suites}
PIKA_GIT=${PIKA_GIT:-https://github.com/pika/pika}
PIKA_REF=${PIKA_REF:-1.4.4}
AIORMQ_GIT=${AIORMQ_GIT:-https://github.com/mosquito/aiormq}
AIORMQ_REF=${AIORMQ_REF:-6.9.3}
AIO_PIKA_GIT=${AIO_PIKA_GIT:-https://github.com/mosquito/aio-pika}
AIO_PIKA_REF=${AIO_PIKA_REF:-9.6.0}
KOMBU_GIT=${KOMBU_GIT:-https://github.com/celery/kombu}
KOMBU_REF=${KOMBU_REF:-v5.6.2}
PY_AMQP_GIT=${PY_AMQP_GIT:-https://github.com/celery/py-amqp}
PY_AMQP_REF=${PY_AMQP_REF:-v5.3.1}
CELERY_GIT=${CELERY_GIT:-https://github.com/celery/celery}
CELERY_REF=${CELERY_REF:-v5.6.3}
HUTCH_WORKERS=${HUTCH_WORKERS:-2}
export WORK PIKA_GIT PIKA_REF AIORMQ_GIT AIORMQ_REF AIO_PIKA_GIT AIO_PIKA_REF KOMBU_GIT KOMBU_REF \
    PY_AMQP_GIT PY_AMQP_REF CELERY_GIT CELERY_REF HUTCH_WORKERS
# shellcheck source=tests/compat/lib.sh
. "$(dirname "$0")/lib.sh"
compat_dir=$compat_here/tests/compat

venv() {  # venv NAME PIP-ARGS...: a throw-away venv for one suite, made once
    if [ ! -x "$WORK/venv-$1/bin/python" ]; then
        python3 -m venv "$WORK/venv-$1"
        "$WORK/venv-$1/bin/pip" install -q "${@:2}"
    fi
}

prepare() {
    case $suite in
    pika | pika-tls)  # its pyproject's hatch environment (less the linters)
        checkout "$WORK/pika" "$PIKA_GIT" "$PIKA_REF"
        venv pika -e "$WORK/pika" pytest pytest-timeout gevent tornado twisted ;;
    aiormq)  # its dev and uvloop dependency groups (less the linters), at its uv.lock's versions
        checkout "$WORK/aiormq" "$AIORMQ_GIT" "$AIORMQ_REF"
        venv aiormq -e "$WORK/aiormq" pytest==8.4.2 aiomisc==17.9.4 aiomisc-pytest==1.3.4 pytest-rst==0.1.5 \
            "uvloop>=0.22,<0.23" ;;
    aio-pika)  # its broker image is aiormq's (mosquito/aiormq-rabbitmq), hence aiormq's certificates
        checkout "$WORK/aio-pika" "$AIO_PIKA_GIT" "$AIO_PIKA_REF"
        checkout "$WORK/aiormq" "$AIORMQ_GIT" "$AIORMQ_REF"
        venv aio-pika -e "$WORK/aio-pika" aiomisc==18.0.6 aiomisc-pytest==2.0.0 pytest==9.0.2 pytest-rst==0.1.5 \
            shortuuid timeout-decorator setuptools "uvloop>=0.21,<0.22" ;;
    kombu)  # kombu on py-amqp, both from their checkouts
        checkout "$WORK/kombu" "$KOMBU_GIT" "$KOMBU_REF"
        checkout "$WORK/py-amqp" "$PY_AMQP_GIT" "$PY_AMQP_REF"
        venv kombu -e "$WORK/py-amqp" -e "$WORK/kombu" -r "$WORK/kombu/requirements/test.txt" \
            -r "$WORK/kombu/requirements/test-integration.txt" ;;
    celery | celery-module)  # on kombu and py-amqp from their checkouts; its integration requirements but the backends'
        checkout "$WORK/celery" "$CELERY_GIT" "$CELERY_REF"
        checkout "$WORK/kombu" "$KOMBU_GIT" "$KOMBU_REF"
        checkout "$WORK/py-amqp" "$PY_AMQP_GIT" "$PY_AMQP_REF"
        venv celery -e "$WORK/py-amqp" -e "$WORK/kombu" -e "$WORK/celery" pytest==8.4.2 pytest-celery \
            pytest-rerunfailures pytest-subtests pytest-timeout==2.4.0 pytest-click==1.1.0 pytest-order==1.3.0 \
            redis requests pydantic cryptography ;;
    py-amqp)
        checkout "$WORK/py-amqp" "$PY_AMQP_GIT" "$PY_AMQP_REF"
        venv py-amqp -e "$WORK/py-amqp" -r "$WORK/py-amqp/requirements/test.txt" \
            -r "$WORK/py-amqp/requirements/test-ci.txt" ;;
    *) echo "unknown suite $suite" >&2; exit 2 ;;
    esac
}

run_suite() {
    local py="$WORK/venv-${suite%-tls}/bin/python"
    if [ "$suite" = celery-module ]; then py="$WORK/venv-celery/bin/python"; fi
    case $suite in
    pika)  # as its Linux CI (`hatch run test`: pytest, unit and acceptance, no TLS)
        cd "$WORK/pika" && "$py" -m pytest -p no:cacheprovider -q -rfE --timeout 300 ${PYTEST_ARGS:-} ;;
    pika-tls)  # as its Windows CI's TLS half (`hatch run test -- --use-tls`: the acceptance tests on 5671)
        cd "$WORK/pika" && "$py" -m pytest -p no:cacheprovider -q -rfE --timeout 300 --use-tls ${PYTEST_ARGS:-} ;;
    aiormq)  # AMQP_URL is its conftest's switch from docker to a running broker (TLS on 5671)
        cd "$WORK/aiormq" && AMQP_URL=amqp://guest:guest@localhost:5672/ "$py" -m pytest -p no:cacheprovider \
            -q -rfE --aiomisc-test-timeout=120 tests ${PYTEST_ARGS:-} ;;
    aio-pika)  # its CI's command, with the AMQP_URL switch of aio_pika_amqp_url.py
        cd "$WORK/aio-pika" && AMQP_URL=amqp://guest:guest@localhost:5672/ PYTHONPATH="$compat_dir" \
            "$py" -m pytest -p no:cacheprovider -p aio_pika_amqp_url -q -rfE --doctest-modules \
            --aiomisc-test-timeout=120 tests ${PYTEST_ARGS:-} ;;
    kombu)  # tox's integration-py-amqp without -x (to count), on 2 processes, its py-amqp module only
        cd "$WORK/kombu" && "$py" -m pytest -p no:cacheprovider -q -rfE -E py-amqp \
            t/integration/test_py_amqp.py -n 2 --reruns 2 --reruns-delay 1 ${PYTEST_ARGS:-} ;;
    celery)  # tox's integration-rabbitmq (broker pyamqp://, backend rpc), without -x, 2 min a test; not
        # test_backend.py: the Azure Block Blob result backend, no broker
        cd "$WORK/celery" && TEST_BROKER=pyamqp:// TEST_BACKEND=rpc "$py" -m pytest -p no:cacheprovider -q -rfE \
            --timeout 120 t/integration --ignore t/integration/test_backend.py ${PYTEST_ARGS:-} ;;
    celery-module)  # one job of its CI's Integration-tests matrix: tox's integration-rabbitmq with `-k MODULE`
        # (`pytest -xsvv t/integration -k MODULE`), without -x and -s, with its job's 15 minutes as the timeout;
        # test_backend.py (the Azure Block Blob backend: the azure packages, an account) left out of the collection
        cd "$WORK/celery" && TEST_BROKER=pyamqp:// TEST_BACKEND=rpc "$py" -m pytest -p no:cacheprovider -q -rfE \
            --timeout 900 t/integration --ignore t/integration/test_backend.py \
            -k "${CELERY_MODULE:?CELERY_MODULE names the module}" ${PYTEST_ARGS:-} ;;
    py-amqp)  # tox's integration-rabbitmq, without -x
        cd "$WORK/py-amqp" && "$py" -m pytest -p no:cacheprovider -q -rfE -E rabbitmq t/integration -n 2 \
            ${PYTEST_ARGS:-} ;;
    esac
}

docker_files() {  # docker_files DOCKERFILE DIR: write the `RUN echo '…' > /etc/rabbitmq/…` files into DIR
    python3 - "$1" "$2" <<'EOF'
import os, re, sys
text = open(sys.argv[1]).read()
for body, path in re.findall(r"RUN echo '(.*?)' > (/etc/rabbitmq/\S+)", text, re.S):
    body = body.replace("\\n\\\n", "\n").replace("/etc/rabbitmq/ca/", sys.argv[2] + "/")
    with open(os.path.join(sys.argv[2], os.path.basename(path)), "w") as f:
        f.write(body + "\n")
EOF
}

hutch_config() {  # the TLS listener of the suite's own broker image, with its certificates
    case $suite in
    pika-tls)  # testdata/rabbitmq.conf.in, as its Windows CI writes it (verify_peer, peer cert required),
        # less `log.console = false` (hutch would honour it and the node's log is the runner's record)
        sed "s|PIKA_DIR|$WORK/pika|" "$WORK/pika/testdata/rabbitmq.conf.in" |
            grep -v -E '^log\.console =' ;;
    aiormq | aio-pika)  # aiormq's tests/certs/Dockerfile: RABBITMQ_SSL_* (fail_if_no_peer_cert false)
        local certs=$WORK/aiormq/tests/certs
        printf '%s\n' 'listeners.ssl.default = 5671' "ssl_options.cacertfile = $certs/ca.pem" \
            "ssl_options.certfile = $certs/server.pem" "ssl_options.keyfile = $certs/server.key" \
            'ssl_options.verify = verify_peer' 'ssl_options.fail_if_no_peer_cert = false' ;;
    py-amqp)  # its Dockerfile writes the certificates and rabbitmq.conf (verify_peer, peer cert required)
        local certs=$WORK/py-amqp-broker
        mkdir -p "$certs" && docker_files "$WORK/py-amqp/Dockerfile" "$certs"
        cat "$certs/rabbitmq.conf" ;;
    esac
}

compat_main "$0" "$suite" "$broker"
