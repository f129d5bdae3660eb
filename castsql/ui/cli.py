"""``castsql ui URI [--port N] [--host 127.0.0.1] [--no-browser]``: serve the
UI until Ctrl-C.

Example::

    >>> main(["./demo-warehouse", "--no-browser", "--port", "0"])   # doctest: +SKIP
    CastSQL UI on ./demo-warehouse: http://127.0.0.1:40123/?token=…
    0
"""

from __future__ import annotations

import argparse
import contextlib
import sys

DEFAULT_PORT = 8642


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="castsql ui",
        description="A local, read-only web page of a warehouse's (or one table's) history, diffs, "
        "row histories, schemas and SQL. Every request needs the token in the printed URL.",
    )
    p.add_argument("uri", metavar="URI", help="a warehouse (directory or prefix of tables) or one table")
    p.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT}; 0: any free one)"
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--no-browser", action="store_true", help="print the URL, do not open a browser")
    return p


def main(argv: list[str]) -> int:
    """Serve the UI of ``argv``'s URI until SIGINT (Ctrl-C); 0 then, 1 when it cannot start."""
    args = parser().parse_args(argv)
    from castsql.errors import CastSQLError, one_line
    from castsql.ui.model import Warehouse
    from castsql.ui.server import make_server

    try:
        warehouse = Warehouse.open(args.uri)
    except Exception as e:  # storage, S3 set-up, DuckDB: whatever it is, one line (as the shell says it)
        prefix = "" if isinstance(e, CastSQLError | OSError) else f"{type(e).__name__}: "
        sys.stderr.write(f"Error: {prefix}{one_line(e)}\n")
        return 1
    try:
        server = make_server(warehouse, args.uri, args.host, args.port)
    except OSError as e:
        warehouse.close()
        sys.stderr.write(f"Error: cannot listen on {args.host}:{args.port}: {e.strerror or e}\n")
        return 1
    print(f"CastSQL UI on {args.uri}: {server.url}", flush=True)
    print("Ctrl-C stops it.", flush=True)
    import threading

    threading.Thread(target=warehouse.warm, name="castsql-ui-warm", daemon=True).start()
    if not args.no_browser:
        import webbrowser

        with contextlib.suppress(Exception):  # no browser here: the printed URL is enough
            webbrowser.open(server.url)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        warehouse.close()
    print("CastSQL UI stopped.", flush=True)
    return 0
