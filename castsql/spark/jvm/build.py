"""Build ``castsql-spark.jar`` (the JVM half of ``format("castsql")``)::

    python -m castsql.spark.jvm.build

Compiles the ``*.java`` here with ``javac`` (Java 17 or newer) against the
installed PySpark's jars, and writes the jar with its service entry
(``META-INF/services/...DataSourceRegister``: Spark finds ``castsql`` by it).
Does nothing when the jar matches its sources and PySpark's version. Exits 0
without building where there is no ``javac`` or no PySpark: then
:func:`castsql.spark.register` registers the Python data source instead.

``scripts/setup`` builds it next to the sources. An installed package (a
wheel, a read-only site-packages) has none there: :func:`locate`, called by
``register``, builds it once into the user's cache directory
(``$XDG_CACHE_HOME/castsql``, else ``~/.cache/castsql``) where a JDK exists,
named by the hash of its sources and PySpark's version, so an upgrade of
either builds a fresh one.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from castsql.spark.jvm import HERE, JAR, PROVIDER, SOURCES

STAMP = HERE / "castsql-spark.stamp"
SERVICE = "META-INF/services/org.apache.spark.sql.sources.DataSourceRegister"

log = logging.getLogger(__name__)


class BuildFailed(Exception):
    """javac refused the sources (its messages are the text)."""


def _pyspark() -> tuple[str, Path] | None:
    try:
        import pyspark
    except ImportError:
        return None
    return pyspark.__version__, Path(pyspark.__file__).parent / "jars"


@functools.cache  # the sources do not change under a running process
def _stamp(version: str) -> str:
    h = hashlib.sha256(version.encode())
    for src in SOURCES:
        h.update(src.name.encode() + src.read_bytes())
    return h.hexdigest()


def cache_dir() -> Path:
    """Where a jar built outside the package lies."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "castsql"


def _compile(javac: str, jars: Path, target: Path) -> None:
    """The jar at ``target``, written whole or not at all (a ``.part`` renamed
    into place: two processes building at once each end with a whole jar)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "classes"
        cmd = [javac, "--release", "17", "-nowarn", "-Xlint:-path", "-d", str(out), "-cp", f"{jars}/*"]
        done = subprocess.run([*cmd, *map(str, SOURCES)], capture_output=True, text=True)
        if done.returncode != 0:
            raise BuildFailed(done.stderr.strip())
        part = target.with_name(f"{target.name}.{os.getpid()}.part")
        try:
            with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as jar:
                jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
                jar.writestr(SERVICE, PROVIDER + "\n")
                for f in sorted(out.rglob("*.class")):
                    jar.write(f, f.relative_to(out).as_posix())
            part.replace(target)
        finally:
            part.unlink(missing_ok=True)


def locate() -> tuple[Path | None, str]:
    """The jar for the installed PySpark, built first where it is missing or
    stale and a JDK exists; else None and why (for the warning that
    ``format("castsql")`` is the Python data source).

    Example::

        >>> path, why = locate()                       # doctest: +SKIP
        >>> path.name                                  # doctest: +SKIP
        'castsql-spark.jar'
    """
    spark = _pyspark()
    if spark is None:
        return None, "PySpark is not installed"
    version, jars = spark
    want = _stamp(version)
    if _built_here(want):
        return JAR, ""
    cached = cache_dir() / f"castsql-spark-{want[:16]}.jar"
    if cached.exists() and _whole(cached):
        return cached, ""
    javac = shutil.which("javac")
    if javac is None:
        return None, "no JDK (javac 17+) to build castsql-spark.jar with: install one"
    log.warning("castsql: building castsql-spark.jar for PySpark %s into %s (once)", version, cached.parent)
    try:
        _compile(javac, jars, cached)
    except (BuildFailed, OSError) as e:
        return None, f"castsql-spark.jar could not be built: {e}"
    return cached, ""


def _built_here(want: str) -> bool:
    """Is the jar next to the sources whole and built from them (``want``, their stamp)?"""
    return JAR.exists() and STAMP.exists() and STAMP.read_text() == want and _whole(JAR)


def _whole(jar: Path) -> bool:
    """Is ``jar`` a jar this build wrote (a readable zip with the service entry)?
    One cut short or damaged by another tool is built again, not loaded."""
    try:
        st = jar.stat()
    except OSError:
        return False
    return _whole_as_of(jar, st.st_size, st.st_mtime_ns)


@functools.cache  # every castsql.spark.read asks: read the zip once per file version
def _whole_as_of(jar: Path, size: int, mtime_ns: int) -> bool:
    try:
        with zipfile.ZipFile(jar) as z:
            return SERVICE in z.namelist() and z.testzip() is None
    except (OSError, zipfile.BadZipFile):
        return False


def build() -> int:
    """``scripts/setup``'s build: the jar next to its sources."""
    spark = _pyspark()
    javac = shutil.which("javac")
    if spark is None or javac is None:
        what = "PySpark" if spark is None else "javac (a JDK)"
        print(f"castsql.spark.jvm.build: no {what}; format('castsql') uses the Python data source", file=sys.stderr)
        return 0
    version, jars = spark
    want = _stamp(version)
    if _built_here(want):
        return 0
    try:
        _compile(javac, jars, JAR)
    except BuildFailed as e:
        print(f"castsql.spark.jvm.build: javac failed:\n{e}", file=sys.stderr)
        return 1
    STAMP.write_text(want)
    print(f"castsql.spark.jvm.build: built {JAR.name} for PySpark {version}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(build())
