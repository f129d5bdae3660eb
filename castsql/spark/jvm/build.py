"""Build ``castsql-spark.jar`` (the JVM half of ``format("castsql")``) next to
its sources::

    python -m castsql.spark.jvm.build

Compiles the ``*.java`` here with ``javac`` (Java 17 or newer) against the
installed PySpark's jars, and writes the jar with its service entry
(``META-INF/services/...DataSourceRegister``: Spark finds ``castsql`` by it).
Does nothing when the jar matches its sources and PySpark's version. Exits 0
without building where there is no ``javac`` or no PySpark: then
:func:`castsql.spark.register` registers the Python data source instead.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from castsql.spark.jvm import HERE, JAR, PROVIDER, SOURCES

STAMP = HERE / "castsql-spark.stamp"
SERVICE = "META-INF/services/org.apache.spark.sql.sources.DataSourceRegister"


def _pyspark() -> tuple[str, Path] | None:
    try:
        import pyspark
    except ImportError:
        return None
    return pyspark.__version__, Path(pyspark.__file__).parent / "jars"


def _stamp(version: str) -> str:
    h = hashlib.sha256(version.encode())
    for src in SOURCES:
        h.update(src.name.encode() + src.read_bytes())
    return h.hexdigest()


def build() -> int:
    spark = _pyspark()
    javac = shutil.which("javac")
    if spark is None or javac is None:
        what = "PySpark" if spark is None else "javac (a JDK)"
        print(f"castsql.spark.jvm.build: no {what}; format('castsql') uses the Python data source", file=sys.stderr)
        return 0
    version, jars = spark
    want = _stamp(version)
    if JAR.exists() and STAMP.exists() and STAMP.read_text() == want:
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "classes"
        cmd = [javac, "--release", "17", "-nowarn", "-Xlint:-path", "-d", str(out), "-cp", f"{jars}/*"]
        done = subprocess.run([*cmd, *map(str, SOURCES)], capture_output=True, text=True)
        if done.returncode != 0:
            print(f"castsql.spark.jvm.build: javac failed:\n{done.stderr}", file=sys.stderr)
            return 1
        part = JAR.with_suffix(".part")
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
            jar.writestr(SERVICE, PROVIDER + "\n")
            for f in sorted(out.rglob("*.class")):
                jar.write(f, f.relative_to(out).as_posix())
        part.replace(JAR)
    STAMP.write_text(want)
    print(f"castsql.spark.jvm.build: built {JAR.name} for PySpark {version}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(build())
