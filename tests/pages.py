"""A folder served over http on a free loopback port, as any static host serves a page that
``chargen export --web`` wrote (for the tests and benchmarks/web.py; ``python -m
http.server`` does the same by hand)."""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def static_server(folder: Path) -> Iterator[str]:
    """``folder`` over http; yields its address."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
