"""Build CastSQL's DuckDB extension (``castsql_live.cpp``) next to its source.

    python -m castsql.engine.native.build

Needs a C++17 compiler (``$CXX``, else ``c++`` or ``g++``) and, once, the two C
API headers of the installed DuckDB (``duckdb.h``, ``duckdb_extension.h``),
which its wheel lacks: they are read from DuckDB's source distribution on PyPI
(checked against the sha256 PyPI's index gives) and kept in ``include-<version>/``. Does
nothing when the built file matches the source, DuckDB's version and the
platform. Exits 0 without building where no compiler exists: CastSQL then
applies deletes without it. Exits 1 when a build was possible and failed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

import duckdb

from castsql.engine.native import BUILT, HERE, NAME, SOURCE

HEADERS = ("duckdb.h", "duckdb_extension.h")
CAPI_VERSION = "v1.2.0"  # the stable C API the source is written against
_STAMP = BUILT.with_suffix(".stamp")


def _platform() -> str:
    return duckdb.connect().execute("SELECT * FROM pragma_platform()").fetchone()[0]


def _compiler() -> str | None:
    for cxx in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if cxx and shutil.which(cxx):
            return cxx
    return None


def headers(version: str) -> Path:
    """The directory holding DuckDB ``version``'s C API headers, fetched once."""
    inc = HERE / f"include-{version}"
    if all((inc / h).exists() for h in HEADERS):
        return inc
    # PyPI's simple index (PEP 691, JSON): what pip itself reads.
    req = urllib.request.Request(
        "https://pypi.org/simple/duckdb/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        files = json.load(r)["files"]
    sdist = next((f for f in files if f["filename"] == f"duckdb-{version}.tar.gz"), None)
    if sdist is None:
        raise RuntimeError(f"PyPI lists no source distribution duckdb-{version}.tar.gz to read the C API headers from")
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / sdist["filename"]
        with urllib.request.urlopen(sdist["url"], timeout=300) as r, open(archive, "wb") as fh:
            shutil.copyfileobj(r, fh)
        digest = hashlib.sha256(archive.read_bytes()).hexdigest()
        if digest != sdist["hashes"]["sha256"]:
            raise RuntimeError(f"{sdist['filename']}: sha256 {digest} is not PyPI's {sdist['hashes']['sha256']}")
        # Extracted in the temporary directory and moved into place: a failed
        # fetch leaves nothing behind.
        part = Path(tmp) / "include"
        part.mkdir()
        with tarfile.open(archive) as tar:
            for m in tar.getmembers():
                if m.name.endswith(tuple(f"/src/include/{h}" for h in HEADERS)) and "/external/duckdb/" in m.name:
                    (part / Path(m.name).name).write_bytes(tar.extractfile(m).read())
        missing = [h for h in HEADERS if not (part / h).exists()]
        if missing:
            raise RuntimeError(f"{sdist['filename']} holds no {', '.join(missing)}")
        shutil.rmtree(inc, ignore_errors=True)
        shutil.move(str(part), inc)
    return inc


def footer(platform: str) -> bytes:
    """DuckDB's 512-byte extension footer: eight 32-byte fields, last first
    (magic "4", platform, C API version, extension version, ABI), then an
    empty signature (the extension is loaded with ``allow_unsigned_extensions``)."""
    fields = ["4", platform, CAPI_VERSION, "v1", "C_STRUCT", "", "", ""]
    return b"".join(f.encode().ljust(32, b"\0") for f in reversed(fields)) + b"\0" * 256


def build(force: bool = False) -> Path | None:
    """Build the extension if it is missing or stale; its path, or None without a compiler."""
    version, platform = duckdb.__version__, _platform()
    want = hashlib.sha256(SOURCE.read_bytes() + f"|{version}|{platform}".encode()).hexdigest()
    if not force and BUILT.exists() and _STAMP.exists() and _STAMP.read_text() == want:
        return BUILT
    cxx = _compiler()
    if cxx is None:
        return None
    inc = headers(version)
    tmp = BUILT.with_suffix(".part")
    cmd = [cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden", f"-I{inc}", str(SOURCE), "-o", str(tmp)]
    try:
        subprocess.run(cmd, check=True)
        with open(tmp, "ab") as fh:
            fh.write(footer(platform))
    except BaseException:
        tmp.unlink(missing_ok=True)  # the last good build, if any, stays as it was
        raise
    tmp.replace(BUILT)
    _STAMP.write_text(want)
    return BUILT


def main() -> int:
    try:
        path = build(force="--force" in sys.argv)
    except (OSError, RuntimeError, subprocess.CalledProcessError) as e:
        print(f"castsql: building {NAME} failed: {e}", file=sys.stderr)
        return 1
    if path is None:
        print(f"castsql: no C++ compiler: {NAME} not built; deletes use the slower anti-join", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
