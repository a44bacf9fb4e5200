"""Fixtures of the Spark suite.

`spark` is one local Spark session (`local[2]`) for the whole run, with, where it can be built (javac),
the JVM reader's jar on its class path and the hutch data source registered by `hutch.spark.register`: so
`format("hutch")` reads streams with the JVM reader as a user's session does, `format("hutch-python")` with
the Python source, and `format("hutch-jvm")` names the JVM reader alone (`jvm_reader` fails a test that
needs it when it could not be built; `stream_format` runs a test on both paths); Spark starts in ~10 s, so every test
shares it. `stream_server` is a session-wide hutch
process with the stream protocol listener on (port 0), for the stream sink and the stream source's end
probe; `server` is that process too (tests use unique queue names). It *fails* (never skips) when Java or
PySpark is missing, so CI cannot go green without running these tests. `server` is the session-wide
`broker` is a pika connection to it.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from conftest import ServerInfo, start_server  # tests/conftest.py (tests/ is on sys.path)

from .helpers import Broker


def _require_java() -> None:
    java_home = os.environ.get("JAVA_HOME")
    if shutil.which("java") is None and not (java_home and os.path.exists(os.path.join(java_home, "bin", "java"))):
        pytest.fail("the Spark tests need Java 17+: `java` is not on PATH and JAVA_HOME is not set. Install a "
                    "JRE (e.g. `apt-get install openjdk-17-jre-headless`) or set JAVA_HOME.", pytrace=False)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    _require_java()
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        pytest.fail("the Spark tests need PySpark 4.2+ and pyarrow: pip install -e '.[test,spark]'",
                    pytrace=False)
    from hutch.spark import register
    from hutch.spark.jvm import JvmReaderUnavailable, jar_path

    try:
        jars = jar_path()
    except JvmReaderUnavailable as exc:  # the Python source's tests run; jvm_reader's fail with the reason
        _JVM_UNAVAILABLE.append(str(exc))
        jars = ""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("hutch-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.warehouse.dir", str(warehouse))
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.streaming.stopTimeout", "30s")
        # a test session's JVM does small jobs for a few minutes: C2's compilations and G1's threads cost
        # more CPU than they give back (test_write.py's JVM: 49 s of CPU against 25 s; docs/testing.md)
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
    )
    session = (builder.config("spark.jars", jars) if jars else builder).getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    _PATH.append(register(session))  # "jvm": format("hutch") reads streams with the JVM reader
    yield session
    session.stop()


_JVM_UNAVAILABLE: list[str] = []
_PATH: list[str] = []


@pytest.fixture
def jvm_reader(spark: Any) -> str:
    """The JVM reader's format name; fails (never skips) when its jar could not be built."""
    if _JVM_UNAVAILABLE:
        pytest.fail(f"the JVM reader's jar could not be built: {_JVM_UNAVAILABLE[0]}", pytrace=False)
    return "hutch-jvm"


@pytest.fixture(params=["hutch", "hutch-python"])
def stream_format(request: pytest.FixtureRequest, spark: Any) -> str:
    """The format a stream read test reads with: "hutch" (the JVM reader, as a user's session with the jar
    gets it: the test fails when the jar could not be built) and "hutch-python" (the Python source)."""
    if request.param == "hutch" and _PATH != ["jvm"]:
        pytest.fail(f"format('hutch') is not the JVM reader in this session ({_JVM_UNAVAILABLE or _PATH})",
                    pytrace=False)
    return str(request.param)


@pytest.fixture
def server(stream_server: ServerInfo) -> ServerInfo:
    return stream_server  # with the stream listener: a stream read's driver probes the end through it


@pytest.fixture
def broker(server: ServerInfo) -> Iterator[Broker]:
    b = Broker(server.amqp_port)
    yield b
    b.close()


@pytest.fixture(scope="session")
def stream_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    info = start_server(tmp_path_factory.mktemp("hutch-streams"), "--stream-port", "0")
    yield info
    info.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The Spark tests get 600 s instead of the suite's 120: the first one to ask for `spark` pays for the
    JVM's start inside its own timeout (100 s on a loaded 2-core machine, where the default fired inside a
    py4j call and broke the gateway for every Spark test after it). A test's own mark still wins."""
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.path).startswith(here) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(600))
