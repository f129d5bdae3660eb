"""Build CastSQL's DuckDB extensions next to their sources.

    python -m castsql.engine.duckdb.native.build

- ``castsql_live`` (``castsql_live.cpp``): the bitmaps of deleted positions
  and the ``"castsql/live"`` filter, on DuckDB's stable C extension API;
- ``castsql_scan`` (``castsql_scan.cpp``): ``"castsql/parquet"``, DuckDB's
  Parquet reader skipping those positions itself, on DuckDB's C++ API, linked
  to the installed DuckDB's Python module and to ``castsql_live``.

Needs a C++17 compiler (``$CXX``, else ``c++`` or ``g++``) and, once, the
installed DuckDB's headers, which its wheel lacks: they are read from DuckDB's
source distribution on PyPI (checked against the sha256 PyPI's index gives)
and kept in ``include-<version>/``. Does nothing when the built files match
their sources, DuckDB's version and the platform. Exits 0 without building
where no compiler exists: CastSQL then applies deletes with an anti-join.
Exits 1 when ``castsql_live`` could be built and was not. A failed
``castsql_scan`` (DuckDB's C++ API changes between versions) is reported and
leaves ``castsql_live``'s filter in use.
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

from castsql.engine.duckdb.native import BUILT, HERE, NAME, SCAN_BUILT, SCAN_NAME, SCAN_SOURCE, SOURCE

# Present once the whole include tree is: the C API headers and the C++ ones.
HEADERS = ("duckdb.h", "duckdb_extension.h", "duckdb.hpp", "duckdb/common/multi_file/multi_file_reader.hpp")
CAPI_VERSION = "v1.2.0"  # the stable C API castsql_live.cpp is written against


def _platform() -> str:
    return duckdb.connect().execute("SELECT * FROM pragma_platform()").fetchall()[0][0]


def _compiler() -> str | None:
    for cxx in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if cxx and shutil.which(cxx):
            return cxx
    return None


def headers(version: str) -> Path:
    """The directory holding DuckDB ``version``'s headers (its ``src/include``), fetched once."""
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
                head, sep, rel = m.name.partition("/external/duckdb/src/include/")
                if sep and "/" not in head and m.isfile() and ".." not in Path(rel).parts:
                    (part / rel).parent.mkdir(parents=True, exist_ok=True)
                    member = tar.extractfile(m)
                    assert member is not None  # m.isfile()
                    (part / rel).write_bytes(member.read())
        missing = [h for h in HEADERS if not (part / h).exists()]
        if missing:
            raise RuntimeError(f"{sdist['filename']} holds no {', '.join(missing)}")
        shutil.rmtree(inc, ignore_errors=True)
        shutil.move(str(part), inc)
    return inc


def footer(platform: str, abi: str = "C_STRUCT") -> bytes:
    """DuckDB's 512-byte extension footer: eight 32-byte fields, last first
    (magic "4", platform, API version, extension version, ABI), then an empty
    signature (the extensions are loaded with ``allow_unsigned_extensions``).
    A C API extension names the C API version it needs; a C++ one, the exact
    DuckDB version it was compiled for (DuckDB refuses any other)."""
    api = CAPI_VERSION if abi == "C_STRUCT" else f"v{duckdb.__version__}"
    fields = ["4", platform, api, "v1", abi, "", "", ""]
    return b"".join(f.encode().ljust(32, b"\0") for f in reversed(fields)) + b"\0" * 256


def _duckdb_module() -> Path:
    """The installed DuckDB's Python module: the library holding DuckDB's C++
    symbols, which castsql_scan links to (loaded ``RTLD_LOCAL``, they are not
    visible to a library that does not name it)."""
    import _duckdb

    return Path(_duckdb.__file__).resolve()


def _compile(target: Path, stamp: str, cmd: list[str], abi: str, platform: str) -> Path:
    """Run ``cmd`` (writing ``target``'s ``.part``), add the footer, move it in place."""
    tmp = target.with_suffix(".part")
    try:
        subprocess.run([*cmd, "-o", str(tmp)], check=True)
        with open(tmp, "ab") as fh:
            fh.write(footer(platform, abi))
    except BaseException:
        tmp.unlink(missing_ok=True)  # the last good build, if any, stays as it was
        raise
    tmp.replace(target)
    target.with_suffix(".stamp").write_text(stamp)
    return target


def _fresh(target: Path, stamp: str) -> bool:
    s = target.with_suffix(".stamp")
    return target.exists() and s.exists() and s.read_text() == stamp


def build(force: bool = False) -> Path | None:
    """Build ``castsql_live`` if it is missing or stale; its path, or None without a compiler."""
    version, platform = duckdb.__version__, _platform()
    want = hashlib.sha256(SOURCE.read_bytes() + f"|{version}|{platform}".encode()).hexdigest()
    if not force and _fresh(BUILT, want):
        return BUILT
    cxx = _compiler()
    if cxx is None:
        return None
    inc = headers(version)
    # The soname lets castsql_scan name it, and the loader find it already loaded.
    cmd = [cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden", f"-Wl,-soname,{BUILT.name}"]
    return _compile(BUILT, want, [*cmd, f"-I{inc}", str(SOURCE)], "C_STRUCT", platform)


def build_scan(force: bool = False) -> Path | None:
    """Build ``castsql_scan`` (after :func:`build`) if it is missing or stale;
    its path, or None without a compiler or ``castsql_live``."""
    version, platform, module = duckdb.__version__, _platform(), _duckdb_module()
    if not BUILT.exists():
        return None
    key = SCAN_SOURCE.read_bytes() + BUILT.read_bytes() + f"|{version}|{platform}|{module}".encode()
    want = hashlib.sha256(key).hexdigest()
    if not force and _fresh(SCAN_BUILT, want):
        return SCAN_BUILT
    cxx = _compiler()
    if cxx is None:
        return None
    inc = headers(version)
    cmd = [cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden", f"-I{inc}", str(SCAN_SOURCE)]
    # DuckDB's symbols from its Python module, the bitmaps from castsql_live;
    # both are found where they are (rpath) and reused as already loaded.
    cmd += [f"-L{module.parent}", f"-l:{module.name}", f"-Wl,-rpath,{module.parent}"]
    cmd += [f"-L{HERE}", f"-l:{BUILT.name}", "-Wl,-rpath,$ORIGIN"]
    return _compile(SCAN_BUILT, want, cmd, "CPP", platform)


def main() -> int:
    force = "--force" in sys.argv
    try:
        path = build(force=force)
    except (OSError, RuntimeError, subprocess.CalledProcessError) as e:
        print(f"castsql: building {NAME} failed: {e}", file=sys.stderr)
        return 1
    if path is None:
        print(f"castsql: no C++ compiler: {NAME} not built; deletes use the slower anti-join", file=sys.stderr)
        return 0
    try:
        build_scan(force=force)
    except (OSError, RuntimeError, subprocess.CalledProcessError) as e:
        print(f"castsql: building {SCAN_NAME} failed ({e}); deletes use {NAME}'s filter", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
