"""An HTTP proxy on 127.0.0.1 that injects faults between S3 clients and the
real S3 test server: 503 SlowDown answers, connections dropped before the
request is forwarded, connections dropped AFTER the server has acted (the
client never learns its write landed), and slow responses.

    proxy = FaultProxy(upstream_port, rate=0.1, seed=1); proxy.start(); ...; proxy.stop()
    proxy.counts  # faults injected by kind
    proxy.stall = lambda method, path: path.endswith(".parquet")  # accept, never answer, until stop()
    FaultProxy(upstream_port, rate=0, delay=0.02)  # no faults: every request 20 ms late, each one logged
    proxy.requests  # (method, path, Range header) of every request, in arrival order
    proxy.headers  # the headers of each of them (lower-case names), in the same order
    proxy.whole = {"/bucket/key": b"..."}  # GETs of it answered 200 with all of it, Range or not
    proxy.stall_answer = lambda method, path: ...  # forwarded, the server acts, its answer never comes back

SigV4 signs the Host header, so it is forwarded as the client sent it.
"""

from __future__ import annotations

import http.client
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FAULTS = ("error", "drop_before", "drop_after", "slow")
_SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


class FaultProxy:
    def __init__(
        self, upstream_port: int, *, rate: float, seed: int = 0, max_delay: float = 0.3, delay: float = 0.0
    ) -> None:
        self.upstream_port = upstream_port
        self.rate = rate
        self.max_delay = max_delay
        self.delay = delay  # added to every request: an object store's first-byte latency
        self.requests: list[tuple[str, str, str]] = []
        self.headers: list[dict[str, str]] = []
        self.counts: Counter[str] = Counter()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        # (method, path) -> True: the request is read and never answered (a stalled server).
        self.stall: Callable[[str, str], bool] | None = None
        # (method, path) -> True: forwarded (it lands), and its answer held until stop().
        self.stall_answer: Callable[[str, str], bool] | None = None
        self._released = threading.Event()
        # path -> the object's bytes: a server that ignores Range (answers its GETs itself).
        self.whole: dict[str, bytes] = {}

    @property
    def endpoint_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _pick(self) -> str | None:
        with self._lock:
            self.counts["requests"] += 1
            if self._rng.random() >= self.rate:
                return None
            fault = self._rng.choice(FAULTS)
            self.counts[fault] += 1
            return fault

    def start(self) -> None:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                # The answer's headers and body go out in two writes: with Nagle's
                # algorithm and the client's delayed ACK, the body waited ~40 ms,
                # which no store adds (every GET through the proxy paid it).
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def _reply(self, status: int, body: bytes, **headers: str) -> None:
                """An answer the proxy makes itself, without the server."""
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _held(self, rule: Callable[[str, str], bool] | None, counted: str) -> bool:
                """Whether ``rule`` holds this request: then it was held until stop()."""
                if rule is None or not rule(self.command, self.path):
                    return False
                with proxy._lock:
                    proxy.counts[counted] += 1
                proxy._released.wait()
                self.close_connection = True
                return True

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with proxy._lock:
                    proxy.requests.append((self.command, self.path, self.headers.get("Range") or ""))
                    proxy.headers.append({k.lower(): v for k, v in self.headers.items()})
                if proxy.delay:
                    time.sleep(proxy.delay)
                if self._held(proxy.stall, "stalled"):
                    return
                whole = proxy.whole.get(self.path.split("?", 1)[0]) if self.command == "GET" else None
                if whole is not None:
                    self._reply(200, whole, ETag='"whole"')
                    return
                fault = proxy._pick()
                if fault == "drop_before":
                    self.close_connection = True
                    self.connection.close()
                    return
                if fault == "error":
                    self._reply(503, _SLOWDOWN, **{"Content-Type": "application/xml"})
                    return
                if fault == "slow":
                    time.sleep(proxy._rng.uniform(0.05, proxy.max_delay))
                up = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=60)
                try:
                    up.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                    for k, v in self.headers.items():
                        up.putheader(k, v)
                    up.endheaders(body or None)
                    resp = up.getresponse()
                    data = resp.read()
                finally:
                    up.close()
                if self._held(proxy.stall_answer, "answer stalled"):
                    return
                if fault == "drop_after":  # the server acted; the client never hears of it
                    self.close_connection = True
                    self.connection.close()
                    return
                self.send_response(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                # A HEAD's body is empty, but its Content-Length is the object's size: pass it on
                # (a HEAD answered with 0 made DuckDB read whole objects without ranges).
                size = resp.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", size if size is not None else str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._released.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
