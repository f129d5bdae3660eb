"""The storage contract, on every backend: what the commit protocol and users
rely on (round trips, conditional writes, listing, races)."""

from __future__ import annotations

import ast
import dataclasses
import multiprocessing
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from stores import every_store  # noqa: F401 - on every store: local, S3, GCS, Azure

import castsql
from castsql.storage import ObjectNotFound, PreconditionFailed, S3Config, StorageError, open_storage
from castsql.storage.local import LocalStorage
from castsql.storage.uris import OBJECT_STORE_SCHEMES, SCHEMES, canonical_uri, scheme_of

# -- basics ------------------------------------------------------------------


def test_round_trip(storage):
    storage.put("a/b/obj.bin", b"\x00hello\xff")
    assert storage.get("a/b/obj.bin") == b"\x00hello\xff"
    assert storage.exists("a/b/obj.bin")
    storage.put("a/b/obj.bin", b"replaced")
    data, etag = storage.get_with_etag("a/b/obj.bin")
    assert data == b"replaced"
    assert etag and '"' not in etag


def test_a_hint_is_replaced_whole_and_seen_at_once(storage):
    storage.put_hint("meta/version-hint.text", b"1")
    storage.put_hint("meta/version-hint.text", b"12")
    assert storage.get("meta/version-hint.text") == b"12"
    assert [o.key for o in storage.list("meta/")] == ["meta/version-hint.text"]
    if isinstance(storage, LocalStorage):  # renamed over: no temporary left beside it
        assert os.listdir(Path(storage.root) / "meta") == ["version-hint.text"]


def test_empty_object(storage):
    etag = storage.put_if_absent("empty", b"")
    assert storage.get_with_etag("empty") == (b"", etag)
    assert storage.get_range("empty", 0, 10) == b""


def test_missing_key_is_named(storage):
    for read in (storage.get, storage.get_with_etag, lambda k: storage.get_range(k, 0, 4)):
        with pytest.raises(ObjectNotFound) as e:
            read("no/such/key")
        assert "no/such/key" in str(e.value)
        assert e.value.uri == storage.uri("no/such/key")
        assert isinstance(e.value, FileNotFoundError)
    assert not storage.exists("no/such/key")


def test_a_directory_is_not_an_object(storage):
    storage.put("dir/sub/x", b"x")
    assert not storage.exists("dir")
    assert not storage.exists("dir/sub")
    with pytest.raises(ObjectNotFound):
        storage.get("dir/sub")
    with pytest.raises(ObjectNotFound):
        storage.get_range("dir/sub", 0, 1)
    with pytest.raises(ObjectNotFound):
        storage.get_range("dir/sub/x/y", 0, 1)  # a file is not a directory either


def test_uri_and_child(storage):
    assert storage.uri("t1/x") == storage.root.rstrip("/") + "/t1/x"
    child = storage.child("t1")
    assert child.root == storage.uri("t1")
    child.put("x", b"via child")
    assert storage.get("t1/x") == b"via child"
    assert child.uri("x") == storage.uri("t1/x")


# -- conditional writes ------------------------------------------------------


def test_put_if_absent_only_once(storage):
    etag = storage.put_if_absent("ptr", b"first")
    assert storage.get_with_etag("ptr") == (b"first", etag)
    with pytest.raises(PreconditionFailed) as e:
        storage.put_if_absent("ptr", b"second")
    assert "ptr" in str(e.value)
    assert storage.get_with_etag("ptr") == (b"first", etag)


def test_put_if_match(storage):
    storage.put_if_absent("ptr", b"v1")
    _, etag1 = storage.get_with_etag("ptr")

    etag2 = storage.put_if_match("ptr", b"v2", etag1)
    assert etag2 != etag1
    assert storage.get_with_etag("ptr") == (b"v2", etag2)

    with pytest.raises(PreconditionFailed):  # stale ETag
        storage.put_if_match("ptr", b"v3-lost", etag1)
    assert storage.get_with_etag("ptr") == (b"v2", etag2)

    etag3 = storage.put_if_match("ptr", b"v3", etag2)
    assert storage.get_with_etag("ptr") == (b"v3", etag3)


def test_put_if_match_on_missing_key(storage):
    with pytest.raises(PreconditionFailed) as e:
        storage.put_if_match("nothing-here", b"x", "d41d8cd98f00b204e9800998ecf8427e")
    assert "nothing-here" in str(e.value)
    assert not storage.exists("nothing-here")


def test_put_if_match_after_delete(storage):
    etag = storage.put_if_absent("ptr", b"v1")
    storage.delete("ptr")
    with pytest.raises(PreconditionFailed):
        storage.put_if_match("ptr", b"v2", etag)
    assert not storage.exists("ptr")


def test_etags_track_content(storage, backend):
    a = storage.put_if_absent("a", b"same")
    b = storage.put_if_absent("b", b"same")
    c = storage.put_if_absent("c", b"other")
    if backend in ("gcs", "azure"):
        # There an ETag (a GCS generation) names one write, not the bytes.
        assert len({a, b, c}) == 3
    else:
        assert a == b != c
    # What the commit protocol relies on everywhere: a replaced object's old ETag no longer matches.
    d = storage.put_if_match("c", b"other", c)
    with pytest.raises(PreconditionFailed):
        storage.put_if_match("c", b"third", c if d != c else "0")
    assert storage.get_with_etag("c") == (b"other", d)


# -- ranges, listing, delete -------------------------------------------------


def test_get_range(storage):
    storage.put("r", b"0123456789")
    assert storage.get_range("r", 0, 4) == b"0123"
    assert storage.get_range("r", 3, 2) == b"34"
    assert storage.get_range("r", 8, 10) == b"89"  # short at the end
    assert storage.get_range("r", 10, 5) == b""
    assert storage.get_range("r", 25, 5) == b""
    assert storage.get_range("r", 2, 0) == b""


def test_list(storage):
    t0 = time.time()
    objects = {"a/1": b"1", "a/2": b"22", "a/b/3": b"333", "ab/4": b"4444", "b/5": b"55555", "top": b"t"}
    for key, data in objects.items():
        storage.put(key, data)

    everything = {o.key: o for o in storage.list()}
    assert set(everything) == set(objects)
    for key, info in everything.items():
        assert info.size == len(objects[key])
        assert abs(info.mtime - t0) < 300, info

    assert sorted(o.key for o in storage.list("a/")) == ["a/1", "a/2", "a/b/3"]
    assert sorted(o.key for o in storage.list("a")) == ["a/1", "a/2", "a/b/3", "ab/4"]
    assert sorted(o.key for o in storage.list("a/b")) == ["a/b/3"]
    assert [o.key for o in storage.list("zzz/")] == []
    assert [o.key for o in storage.list("nope")] == []


def test_list_is_confined_to_the_root(storage):
    t1, t2, t12 = storage.child("t1"), storage.child("t2"), storage.child("t12")
    t1.put("data/x", b"x")
    t1.put("_pointer", b"p")
    t2.put("data/y", b"y")
    t12.put("data/z", b"z")
    assert sorted(o.key for o in t1.list()) == ["_pointer", "data/x"]
    assert [o.key for o in t2.list("data/")] == ["data/y"]
    assert sorted(o.key for o in storage.list()) == ["t1/_pointer", "t1/data/x", "t12/data/z", "t2/data/y"]


def test_list_sees_new_and_deleted_objects(storage):
    """No listing cache: a list right after a write or delete reflects it."""
    assert list(storage.list("d/")) == []
    storage.put("d/x", b"x")
    assert [o.key for o in storage.list("d/")] == ["d/x"]
    storage.put("d/y", b"y")
    assert sorted(o.key for o in storage.list("d/")) == ["d/x", "d/y"]
    storage.delete("d/x")
    assert [o.key for o in storage.list("d/")] == ["d/y"]
    assert storage.exists("d/y") and not storage.exists("d/x")


def test_delete(storage):
    storage.put("gone", b"x")
    storage.delete("gone")
    assert not storage.exists("gone")
    with pytest.raises(ObjectNotFound):
        storage.get("gone")
    storage.delete("gone")  # again: fine
    storage.delete("never/existed")
    assert storage.put_if_absent("gone", b"back")  # the name is free again


# -- races -------------------------------------------------------------------


def _cas_increment(storage, key: str, rounds: int, start: threading.Barrier | None = None) -> int:
    """Read-ETag/compare-and-swap increments; returns how many of its swaps won."""
    if start is not None:
        start.wait()
    won = 0
    for _ in range(rounds):
        data, etag = storage.get_with_etag(key)
        try:
            storage.put_if_match(key, str(int(data) + 1).encode(), etag)
        except PreconditionFailed:
            continue
        won += 1
    return won


@pytest.mark.parametrize("threads", [8])
def test_cas_race_threads_loses_no_update(storage, threads):
    storage.put_if_absent("counter", b"0")
    rounds = 20
    barrier = threading.Barrier(threads)
    with ThreadPoolExecutor(threads) as pool:
        wins = list(pool.map(lambda _: _cas_increment(storage, "counter", rounds, barrier), range(threads)))
    total = sum(wins)
    assert int(storage.get("counter")) == total
    assert rounds <= total <= threads * rounds  # every round somebody wins


def test_create_race_has_one_winner(storage):
    threads = 8
    barrier = threading.Barrier(threads)

    def create(i: int) -> bool:
        barrier.wait()
        try:
            storage.put_if_absent("claimed", f"writer-{i}".encode())
        except PreconditionFailed:
            return False
        return True

    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(create, range(threads)))
    assert results.count(True) == 1
    assert storage.get("claimed") == f"writer-{results.index(True)}".encode()


def _process_worker(root: str, key: str, rounds: int, start, out) -> None:
    start.wait(30)
    out.put(_cas_increment(LocalStorage(root), key, rounds))


def test_local_cas_race_across_processes(tmp_path):
    """The flock-based compare-and-swap is safe between processes, not only threads."""
    storage = LocalStorage(tmp_path / "root")
    storage.put_if_absent("counter", b"0")
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs, rounds = 4, 40
    workers = [
        ctx.Process(target=_process_worker, args=(storage.root, "counter", rounds, start, out)) for _ in range(procs)
    ]
    for w in workers:
        w.start()
    start.set()
    wins = [out.get(timeout=120) for _ in workers]
    for w in workers:
        w.join(30)
        assert w.exitcode == 0
    assert int(storage.get("counter")) == sum(wins)
    assert sum(wins) >= rounds


@pytest.mark.parametrize("conditional", ["put_if_absent", "put_if_match"])
def test_readers_never_see_a_partial_object(storage, conditional):
    """Concurrent readers see nothing or a whole object, never a prefix of one."""
    size = 9 * 2**20  # more than one SeaweedFS chunk (4 MiB)
    old, new = b"o" * size, bytes(range(256)) * (size // 256)
    if conditional == "put_if_match":
        storage.put_if_absent("big", old)
    expect = {old, new} if conditional == "put_if_match" else {new}
    seen: set[int] = set()
    bad: list[str] = []
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            try:
                data = storage.get("big")
            except ObjectNotFound:
                seen.add(0)
                continue
            seen.add(len(data))
            if data not in expect:
                bad.append(f"read {len(data)} bytes that are neither the old nor the new object")
            for info in storage.list():
                if info.key != "big":
                    bad.append(f"listing shows {info.key}")

    readers = [threading.Thread(target=reader) for _ in range(3)]
    for r in readers:
        r.start()
    try:
        time.sleep(0.05)
        if conditional == "put_if_absent":
            storage.put_if_absent("big", new)
        else:
            storage.put_if_match("big", new, storage.get_with_etag("big")[1])
        time.sleep(0.1)
    finally:
        done.set()
        for r in readers:
            r.join()
    assert not bad, bad[:3]
    assert storage.get("big") == new
    assert size in seen  # readers did run against the finished object


# -- local specifics ---------------------------------------------------------


def test_local_keys_cannot_escape_the_root(tmp_path):
    storage = LocalStorage(tmp_path / "root")
    with pytest.raises(StorageError):
        storage.put("../outside", b"x")
    assert not (tmp_path / "outside").exists()


def test_local_failed_cas_leaves_no_temp_files(tmp_path):
    storage = LocalStorage(tmp_path / "root")
    storage.put_if_absent("p", b"1")
    with pytest.raises(PreconditionFailed):
        storage.put_if_match("p", b"2", "stale")
    with pytest.raises(PreconditionFailed):
        storage.put_if_absent("p", b"3")
    assert sorted(p.name for p in (tmp_path / "root").iterdir()) == ["p"]


# -- S3 specifics ------------------------------------------------------------


def test_s3_uri_forms():
    from castsql.storage.s3 import S3Storage, parse_s3_uri

    cfg = S3Config(endpoint_url="http://127.0.0.1:1", key="k", secret="s")
    assert parse_s3_uri("s3://b/x/y/") == ("b", "x/y")
    assert parse_s3_uri("s3a://b") == ("b", "")
    st = open_storage("s3a://bucket/wh/", s3=cfg)
    assert isinstance(st, S3Storage)
    assert st.root == "s3://bucket/wh"
    assert st.uri("t/_pointer") == "s3://bucket/wh/t/_pointer"
    assert st.child("t").root == "s3://bucket/wh/t"
    assert open_storage("s3://bucket", s3=cfg).uri("k") == "s3://bucket/k"
    assert st.config is cfg
    with pytest.raises(StorageError):
        parse_s3_uri("s3:///nobucket")


@pytest.mark.s3
def test_s3_conditional_puts_send_the_headers(s3_server, s3_root):
    """Create-only and CAS are the server's decision, not a check-then-put:
    the requests a proxy sees carry the conditions, and nothing else is asked."""
    from faultproxy import FaultProxy

    proxy = FaultProxy(s3_server.ports["s3"], rate=0)
    proxy.start()
    try:
        st = open_storage(s3_root, s3=dataclasses.replace(s3_server.config, endpoint_url=proxy.endpoint_url))
        etag = st.put_if_absent("x", b"1")
        st.put_if_match("x", b"2", etag)
        assert [m for m, _, _ in proxy.requests] == ["PUT", "PUT"]
        assert proxy.headers[0].get("if-none-match") == "*"
        assert proxy.headers[1].get("if-match") == f'"{etag}"'
    finally:
        proxy.stop()


@pytest.mark.s3
def test_s3_errors_name_the_uri_but_not_the_secret(s3_server, s3_root):
    cfg = s3_server.config
    missing_bucket = open_storage("s3://no-such-bucket-here/t", s3=cfg)
    with pytest.raises(StorageError, match=r"s3://no-such-bucket-here/t/x: .*bucket 'no-such-bucket-here' does not"):
        missing_bucket.get("x")
    with pytest.raises(StorageError, match="does not exist"):
        missing_bucket.put_if_absent("x", b"1")

    wrong = S3Config(endpoint_url=cfg.endpoint_url, key=cfg.key, secret="not-the-secret-" + "x" * 16)
    st = open_storage(s3_root, s3=wrong)
    with pytest.raises(StorageError) as e:
        st.put_if_absent("x", b"1")
    assert not isinstance(e.value, PreconditionFailed)
    assert s3_root in str(e.value)
    assert wrong.secret not in str(e.value) and cfg.secret not in str(e.value)
    assert wrong.secret not in repr(st) and wrong.secret not in repr(wrong)


def test_file_uris_in_every_spelling_are_the_local_path(tmp_path):
    """``file:/t`` is how Spark qualifies a path (``saveAsTable``, ``load``):
    it is the table at /t, not a directory named ``file:`` here."""
    root = str(tmp_path / "t")
    open_storage(root).put("k", b"v")
    for uri in (f"file:{root}", f"file://{root}", f"file://localhost{root}"):
        assert open_storage(uri).root == root
        assert open_storage(uri).get("k") == b"v"


@pytest.mark.parametrize(
    ("uri", "canonical"),
    [
        ("s3a://b/t/data/a.parquet", "s3://b/t/data/a.parquet"),
        ("S3A://b/t", "s3://b/t"),
        ("gcs://b/t", "gs://b/t"),
        ("azure://c/t", "az://c/t"),
        ("abfs://c/t", "az://c/t"),
        ("abfss://c@acct.dfs.core.windows.net/t/x", "az://c/t/x"),
        ("abfss://c@acct.dfs.core.windows.net", "az://c"),
        # canonical spellings, local paths and other schemes are left as written
        ("s3://b/t", "s3://b/t"),
        ("S3://b/t", "S3://b/t"),
        ("az://c@x/t", "az://c@x/t"),
        ("/tmp/t", "/tmp/t"),
        ("file:///tmp/t", "file:///tmp/t"),
        ("http://h/t", "http://h/t"),
    ],
)
def test_every_spelling_of_a_store_has_one_canonical_uri(uri, canonical):
    """Manifests and mirrors hold canonical URIs: these forms are on disk
    already, so the table that makes them must not change them."""
    assert canonical_uri(uri) == canonical


def test_every_spelling_of_a_store_opens_its_backend():
    for scheme in SCHEMES:
        for prefix in scheme.prefixes:
            assert scheme_of(prefix + "bucket/t") is scheme
    assert scheme_of("/tmp/t") is None and scheme_of("file:///t") is None and scheme_of("http://h/t") is None
    assert open_storage("s3a://bucket/t", s3=S3Config(endpoint_url="http://127.0.0.1:1")).root == "s3://bucket/t"
    with pytest.raises(StorageError, match=r"ftp://h/t: unsupported URI scheme \(use a local path, s3://bucket/prefix"):
        open_storage("ftp://h/t")


def test_only_storage_spells_a_uri_scheme():
    """Every other layer asks castsql.storage.uris (issue 55): a scheme spelt
    elsewhere is a second table that drifts from this one."""
    root = Path(castsql.__file__).parent
    spelt = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).parts[0] == "storage":
            continue
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        spelt += [
            f"{path.relative_to(root)}:{node.lineno} {node.value[:40]!r}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and node.value.startswith(OBJECT_STORE_SCHEMES)
        ]
    assert spelt == []


def test_a_local_key_cannot_leave_the_root_through_a_symbolic_link(tmp_path):
    """Keys are looked up below the root with a symlink check per component
    (not a resolve from "/"): a link leading out is refused wherever it sits,
    one leading to another place inside the root is followed."""
    root, outside = tmp_path / "t", tmp_path / "outside"
    (root / "data").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret").write_bytes(b"s")
    (root / "data" / "real").write_bytes(b"r")
    os.symlink(outside / "secret", root / "data" / "file-link")
    os.symlink(outside, root / "dir-link")
    os.symlink(root / "data" / "real", root / "data" / "inner-link")
    st = open_storage(str(root))
    for key in ("data/file-link", "dir-link/secret"):
        with pytest.raises(StorageError, match="escapes the storage root"):
            st.get(key)
    assert st.get("data/inner-link") == b"r"
    assert st.get("data/real") == b"r"
    with pytest.raises(ObjectNotFound):
        st.get("data/missing/deeper")


@pytest.mark.s3
def test_s3_keys_and_region_come_from_the_shared_aws_files(s3_server, s3_root, tmp_path, monkeypatch):
    """Without AWS_* keys in the environment, the profile AWS_PROFILE names in
    the AWS CLI's shared files gives them (and the region), as the AWS SDKs do."""
    cfg = s3_server.config
    (tmp_path / "credentials").write_text(
        f"[default]\naws_access_key_id = wrong\naws_secret_access_key = wrong\n\n"
        f"[team]\naws_access_key_id = {cfg.key}\naws_secret_access_key = {cfg.secret}\n"
    )
    (tmp_path / "config").write_text("[profile team]\nregion = eu-west-3\n")
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_PROFILE", "team")
    monkeypatch.setenv("AWS_ENDPOINT_URL", cfg.endpoint_url)
    found = S3Config.from_env()
    assert (found.key, found.secret, found.region) == (cfg.key, cfg.secret, "eu-west-3")
    st = open_storage(s3_root)
    st.put("x", b"1")
    assert st.get("x") == b"1"
    monkeypatch.setenv("AWS_PROFILE", "default")
    with pytest.raises(StorageError, match=r"access denied \(InvalidAccessKeyId\): .*403 Forbidden$"):
        open_storage(s3_root).get("x")  # the store's own reason, from its XML answer


def test_a_missing_aws_profile_or_a_broken_aws_file_is_named(tmp_path, monkeypatch):
    """As botocore's ProfileNotFound and ConfigParseError: named at once, not
    skipped (which sent the request on to the instance metadata service and
    blamed the S3 endpoint after its timeouts)."""
    (tmp_path / "credentials").write_text("[default]\naws_access_key_id = k\naws_secret_access_key = s\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_PROFILE", "nope")
    with pytest.raises(StorageError, match=r"AWS profile 'nope' not found \(.*credentials\)"):
        S3Config.from_env()
    monkeypatch.delenv("AWS_PROFILE")
    (tmp_path / "credentials").write_text("[default]\na = 1\n[default]\nb = 2\n")
    with pytest.raises(StorageError, match="credentials: not a readable AWS credentials file"):
        S3Config.from_env()


def test_half_a_key_pair_or_a_fractional_attempt_count_is_refused(monkeypatch, tmp_path):
    """As botocore: a key without its secret (or the reverse) is an error, not
    a silent fall back to the profile's identity; AWS_MAX_ATTEMPTS is a whole
    number (2.5 was taken as 2)."""
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    with pytest.raises(StorageError, match=r"\$AWS_ACCESS_KEY_ID is set but \$AWS_SECRET_ACCESS_KEY is not"):
        S3Config.from_env()
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    with pytest.raises(StorageError, match=r"\$AWS_SECRET_ACCESS_KEY is set but \$AWS_ACCESS_KEY_ID is not"):
        S3Config.from_env()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    for bad in ("2.5", "0", "-1", "three"):
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", bad)
        with pytest.raises(StorageError, match=r"\$AWS_MAX_ATTEMPTS must be a whole number of attempts"):
            S3Config.from_env()
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "5")
    assert S3Config.from_env().max_attempts == 5


@pytest.mark.s3
def test_an_s3_request_obstore_cannot_make_is_one_error(s3_server):
    """An endpoint that cannot be put in a URL makes obstore's
    signer panic (pyo3's PanicException, a BaseException): one StorageError
    naming the object, not a traceback."""
    bad = dataclasses.replace(s3_server.config, endpoint_url="not a url")
    with pytest.raises(StorageError, match=r"not a valid request|cannot reach S3"):
        open_storage("s3://bench/t", s3=bad).get("x")


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("s3://Bad_Bucket!/t", "'Bad_Bucket!' cannot be a bucket name"),
        ("s3://bu cket/t", "'bu cket' cannot be a bucket name"),
        ("gs://Upper/t", "'Upper' cannot be a bucket name (up to 222 lowercase"),
        ("az://under_score/t", "'under_score' cannot be a container name"),
        ("abfss://c_x@acct.dfs.core.windows.net/t", "'c_x' cannot be a container name"),
    ],
)
def test_a_bucket_name_no_store_could_hold_is_named_before_any_request(uri, message):
    """Stores answer such names with an access denied or a bad request that
    names neither the bucket nor the rule: the URI is refused as written."""
    with pytest.raises(StorageError, match=re.escape(f"{uri}: {message}")):
        open_storage(uri)


def test_overlapped_requests_nest_without_waiting_on_each_other():
    """The shared request threads: a call made from inside one (a table's
    freshness check inside a walk over tables) runs its items in turn
    instead of queueing behind the calls that wait for it; results keep
    their order, and errors reach the caller."""
    from castsql.storage.base import overlapped

    def inner(i: int) -> list[int]:
        time.sleep(0.001)
        return overlapped(lambda j: i * 10 + j, [0, 1, 2])

    got = overlapped(inner, list(range(40)))  # more outer items than threads
    assert got == [[i * 10, i * 10 + 1, i * 10 + 2] for i in range(40)]

    def boom(i: int) -> int:
        if i == 3:
            raise ValueError("item 3")
        return i

    with pytest.raises(ValueError, match="item 3"):
        overlapped(boom, list(range(8)))
    assert overlapped(lambda i: i, list(range(5))) == list(range(5))  # the pool survives an error


def test_overlapped_iter_stops_where_its_caller_stops():
    """A caller that stops early (a key check at its limit) on the shared
    request threads: the items it never reached are never started, and none
    still runs once it has gone on; results keep their order, and an error
    reaches the caller the same way."""
    import contextlib
    import threading

    from castsql.storage.base import overlapped, overlapped_iter

    lock = threading.Lock()
    started: list[int] = []
    finished: list[int] = []

    def item(i: int) -> int:
        with lock:
            started.append(i)
        time.sleep(0.01)
        with lock:
            finished.append(i)
        return i

    with contextlib.closing(overlapped_iter(item, list(range(2000)))) as results:
        assert [next(results), next(results), next(results)] == [0, 1, 2]
    with lock:
        assert sorted(started) == sorted(finished)  # nothing left running
        ran = len(started)
    assert ran < 2000
    time.sleep(0.05)
    assert len(started) == ran  # and nothing started after

    def boom(i: int) -> int:
        if i == 3:
            raise ValueError("item 3")
        return item(i)

    started.clear()
    finished.clear()
    with pytest.raises(ValueError, match="item 3"):
        list(overlapped_iter(boom, list(range(2000))))
    with lock:
        assert sorted(started) == sorted(finished) and len(started) < 1999
    assert list(overlapped_iter(lambda i: i * 2, [1, 2, 3])) == [2, 4, 6]
    assert overlapped(lambda i: [*overlapped_iter(lambda j: i + j, [0, 1])], [10, 20]) == [[10, 11], [20, 21]]


def test_every_local_file_system_error_is_a_storage_error_naming_the_object(tmp_path):
    """The local store mapped only a missing file; a name too long for the
    file system (what a 400-digit version asks for) came out as a raw
    OSError. Every call now raises StorageError naming the object."""
    st = open_storage(str(tmp_path / "t"))
    st.put("manifest/v00000000.json", b"v")
    key = "manifest/v" + "1" * 400 + ".json"
    calls = {
        "get": lambda: st.get(key),
        "get_with_etag": lambda: st.get_with_etag(key),
        "get_range": lambda: st.get_range(key, 0, 4),
        "exists": lambda: st.exists(key),
        "put": lambda: st.put(key, b"x"),
        "put_if_absent": lambda: st.put_if_absent(key, b"x"),
        "put_if_match": lambda: st.put_if_match(key, b"x", "etag"),
        "delete": lambda: st.delete(key),
        "list": lambda: list(st.list(key + "/")),
    }
    for name, call in calls.items():
        with pytest.raises(StorageError) as e:
            call()
        assert not isinstance(e.value, ObjectNotFound), name
        assert str(e.value).startswith(f"{st.root}/manifest/v111") and "name too long" in str(e.value), name
        assert "\n" not in str(e.value) and len(str(e.value)) < 300, name
    assert [o.key for o in st.list()] == ["manifest/v00000000.json"]


def test_a_data_file_path_never_leads_out_of_a_local_root(tmp_path):
    """What readers open for a data file (``data_uri``; DuckDB, pyarrow and
    Spark follow links): a file or a directory that is a symbolic link
    leading out of the root is refused naming the key; one that stays inside
    is the table's own business; a name listed later is looked up afresh."""
    root, outside = tmp_path / "t", tmp_path / "outside"
    (root / "data" / "h").mkdir(parents=True)
    outside.mkdir()
    (outside / "x.parquet").write_bytes(b"x")
    (root / "data" / "h" / "a.parquet").write_bytes(b"a")
    os.symlink(outside / "x.parquet", root / "data" / "h" / "out.parquet")
    os.symlink(root / "data" / "h" / "a.parquet", root / "data" / "h" / "in.parquet")
    os.symlink(outside, root / "data" / "dirlink")
    st = open_storage(str(root))
    uri = st.data_uris()
    assert uri("data/h/a.parquet") == f"{st.root}/data/h/a.parquet"
    assert uri("data/h/in.parquet") == f"{st.root}/data/h/in.parquet"
    assert uri("data/h/missing.parquet") == f"{st.root}/data/h/missing.parquet"  # the reader's error names it
    for key in ("data/h/out.parquet", "data/dirlink/x.parquet", "data/h/../../../outside/x.parquet"):
        with pytest.raises(StorageError, match=r"outside the table root|escapes the storage root") as e:
            uri(key)
        assert key.rsplit("/", 1)[-1] in str(e.value)
    # Listed once; a file added later (the next write of the same hour) is found, a link added later too.
    (root / "data" / "h" / "b.parquet").write_bytes(b"b")
    assert uri("data/h/b.parquet").endswith("/data/h/b.parquet")
    os.symlink(outside / "x.parquet", root / "data" / "h" / "late.parquet")
    with pytest.raises(StorageError, match="outside the table root"):
        uri("data/h/late.parquet")
