"""The JVM reader of hutch streams: its jar, built on first use into a cache.

Owns: `jar_path()` - the jar of the Java sources beside this module (`java/hutch/spark/jvm/*.java`: Spark
DataSource V2 providers, `HutchStreamProvider` under the short name `hutch-jvm` (stream reads only) and
`HutchProvider` under `hutch` (stream reads in the JVM, the rest handed to the Python source registered
as `hutch-python`: `hutch.spark.register` sets that up)),
compiled with the machine's `javac` against the jars of the installed PySpark and cached under
`$HUTCH_SPARK_JVM_CACHE` (default `~/.cache/hutch/spark-jvm`) by a digest of the sources and the PySpark
version, so a changed source or another Spark builds a new jar - and `JvmReaderUnavailable`, raised with
the reason when it cannot be built (no `javac`, no PySpark). The Python source (`format("hutch-python")`,
and `format("hutch")` without the jar) needs none of this and works wherever the jar cannot be built.

Why on first use and not at `pip install`: an editable install (CI's `make setup`) runs no build step for
Java, a wheel built without javac would silently lack it, and the jar must match the PySpark it runs in
(installed after hutch, perhaps); the first `jar_path()` of a machine pays for one `javac` (10-20 s),
every later one finds the jar.

Rules: the build is atomic (compiled in a temporary directory, the jar written beside its final name and
renamed), so concurrent first uses (pytest -n 2) at worst build twice and never read a partial jar;
`javac` runs with a deadline (`BUILD_TIMEOUT_S`); nothing here runs at import time.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

SOURCES = Path(__file__).resolve().parent / "java"
PACKAGE = "hutch/spark/jvm"
SHORT_NAME = "hutch-jvm"
PROVIDER = "hutch.spark.jvm.HutchStreamProvider"
ROUTER = "hutch.spark.jvm.HutchProvider"  # format("hutch") when the jar is on the session's class path
BUILD_TIMEOUT_S = 300
_SERVICES = "META-INF/services/org.apache.spark.sql.sources.DataSourceRegister"


class JvmReaderUnavailable(RuntimeError):
    """The JVM reader's jar cannot be built here (the reason says why); the Python source still works."""


def _javac() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.path.exists(os.path.join(java_home, "bin", "javac")):
        return os.path.join(java_home, "bin", "javac")
    found = shutil.which("javac")
    if found is None:
        raise JvmReaderUnavailable("the JVM reader (format 'hutch-jvm') is built with javac (a JDK 17+), which is "
                                   "not on PATH and not in JAVA_HOME; format('hutch') reads streams without it")
    return found


def _spark_jars() -> tuple[Path, str]:
    try:
        import pyspark
    except ImportError:
        raise JvmReaderUnavailable("the JVM reader needs PySpark: pip install 'hutch[spark]'") from None
    jars = Path(pyspark.__file__).resolve().parent / "jars"
    if not jars.is_dir():
        raise JvmReaderUnavailable(f"PySpark's jars are not at {jars} (a PySpark without its JVM part?)")
    return jars, str(pyspark.__version__)


def sources() -> list[Path]:
    return sorted((SOURCES / PACKAGE).glob("*.java"))


def _digest(spark_version: str) -> str:
    h = hashlib.sha256(spark_version.encode())
    for path in sources():
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def cache_dir() -> Path:
    return Path(os.environ.get("HUTCH_SPARK_JVM_CACHE") or Path.home() / ".cache" / "hutch" / "spark-jvm")


def jar_path() -> str:
    """The path of the JVM reader's jar (built now if this PySpark has no jar of these sources yet), for
    `SparkSession.builder.config("spark.jars", ...)`. Raises JvmReaderUnavailable."""
    jars, version = _spark_jars()
    out = cache_dir() / f"hutch-spark-jvm-{_digest(version)}.jar"
    if out.exists():
        return str(out)
    javac = _javac()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".build-") as tmp:
        classes = Path(tmp) / "classes"
        cmd = [javac, "--release", "17", "-nowarn", "-encoding", "UTF-8", "-cp", f"{jars}{os.sep}*",
               "-d", str(classes), *map(str, sources())]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise JvmReaderUnavailable(f"javac did not finish within {BUILD_TIMEOUT_S} s") from None
        if done.returncode != 0:
            raise JvmReaderUnavailable(f"javac failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        partial = Path(tmp) / out.name
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nCreated-By: hutch\n\n")
            z.writestr(_SERVICES, PROVIDER + "\n" + ROUTER + "\n")
            for cls in sorted(classes.rglob("*.class")):
                z.write(cls, cls.relative_to(classes).as_posix())
        os.replace(partial, out)
    return str(out)


__all__ = ["PROVIDER", "ROUTER", "SHORT_NAME", "JvmReaderUnavailable", "cache_dir", "jar_path", "sources"]
