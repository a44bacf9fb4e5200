"""Points aio-pika's own test suite at a running broker named by AMQP_URL (its conftest has no switch).

aio-pika 9.6.0's tests/conftest.py starts RabbitMQ in docker for every run; aiormq's conftest reads
AMQP_URL instead, and this module gives aio-pika's the same switch without editing its checkout.
Loaded with `-p aio_pika_amqp_url` (tests/compat on PYTHONPATH, the checkout the working directory),
pytest imports it before the suite's conftest, so the conftest's `from .docker_client import …` takes
the stand-ins put into its tests/docker_client.py here: `check_docker_available` answers without a
docker daemon and `DockerClient.run` returns the broker of AMQP_URL in place of a new container.
Used by tests/compat/run_amqp_client_suites.sh only; it is not part of hutch's own suite.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

import tests.docker_client as suite_docker  # aio-pika's tests package, from its checkout

_url = urlsplit(os.environ["AMQP_URL"])


class ExistingBroker:
    """What the suite's conftest asks of its docker client, answered by the broker at AMQP_URL."""

    def __init__(self, docker_host_info: object = None) -> None:
        self.docker_host_info = docker_host_info

    def run(self, image: str, ports: list[str], environment: dict[str, str] | None = None) -> Any:
        host = _url.hostname or "localhost"
        amqp_port = _url.port or 5672
        return suite_docker.ContainerInfo(
            id="existing-broker",
            host=host,
            ports={"5672/tcp": amqp_port, "5671/tcp": 5671, "15672/tcp": 15672},
        )

    def kill(self, container_id: str) -> None:
        """The broker is not the suite's to stop."""

    def remove(self, container_id: str) -> None:
        """Nor to remove."""


suite_docker.check_docker_available = lambda: None
suite_docker.DockerClient = ExistingBroker  # type: ignore[misc]
