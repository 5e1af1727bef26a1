"""An object store on 127.0.0.1 that answers at once and then sends the body slowly: the shape
of a congested or failing bucket, for the snapshot time-bound tests.

It speaks just enough of the S3 API for one object: HEAD and GET of any path return the same
headers (size, ETag, the ``x-amz-meta-*`` metadata); a GET then sends ``piece`` bytes every
``interval`` seconds, and after ``stall_after`` bytes (if given) sends nothing more until the
client goes away or the server stops.
"""

from __future__ import annotations

import contextlib
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Drip:
    body: bytes
    metadata: dict[str, str]
    piece: int
    interval: float
    stall_after: int | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    gets: int = 0


def _handler(drip: Drip) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet: tests read stderr
            pass

        def _headers(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(drip.body)))
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("ETag", '"drip"')
            self.send_header("Last-Modified", formatdate(time.time(), usegmt=True))
            for name, value in drip.metadata.items():
                self.send_header(f"x-amz-meta-{name}", value)
            self.end_headers()

        def do_HEAD(self) -> None:
            self._headers()

        def do_GET(self) -> None:
            drip.gets += 1
            self._headers()
            sent = 0
            with contextlib.suppress(OSError):  # the client gave up: that is the point
                while sent < len(drip.body) and not drip.stop.is_set():
                    if drip.stall_after is not None and sent >= drip.stall_after:
                        drip.stop.wait(0.1)
                        continue
                    self.wfile.write(drip.body[sent:sent + drip.piece])
                    self.wfile.flush()
                    sent += drip.piece
                    drip.stop.wait(drip.interval)

    return Handler


@contextlib.contextmanager
def serving(drip: Drip, context: ssl.SSLContext | None = None) -> Iterator[str]:
    """Serve ``drip`` on a free loopback port (over TLS with ``context``); yield the endpoint
    URL; stop it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(drip))
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        scheme = "https" if context is not None else "http"
        yield f"{scheme}://127.0.0.1:{server.server_address[1]}"
    finally:
        drip.stop.set()
        server.shutdown()
        server.server_close()
