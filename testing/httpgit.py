"""Git over https for tests: the real ``git http-backend`` behind a small Python HTTPS server
on 127.0.0.1, with a throwaway self-signed certificate and, if asked, basic auth; and a server
that accepts TCP connections and never answers, the shape of a stalled host.

Clients trust the certificate through ``GIT_SSL_CAINFO`` (:attr:`HttpsGit.cainfo`).
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (needs the ``openssl`` command)."""
    openssl = shutil.which("openssl")
    assert openssl is not None, "openssl is needed to make a test certificate"
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


@dataclass
class HttpsGit:
    """What the server saw: each request's path and whether it carried the right credentials."""

    base: Path
    cainfo: Path
    port: int = 0
    auth: tuple[str, str] | None = None
    delay: float = 0.0  # before each answer: keeps git's children alive long enough to see
    requests: list[tuple[str, bool]] = field(default_factory=list)

    def url(self, name: str) -> str:
        return f"https://127.0.0.1:{self.port}/{name}"


def _read_body(handler: BaseHTTPRequestHandler) -> bytes:
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        body = b""
        while size := int(handler.rfile.readline().strip() or b"0", 16):
            body += handler.rfile.read(size)
            handler.rfile.readline()
        handler.rfile.readline()
        return body
    return handler.rfile.read(int(handler.headers.get("Content-Length") or 0))


def _cgi_env(served: HttpsGit, handler: BaseHTTPRequestHandler, size: int) -> dict[str, str]:
    path, _, query = handler.path.partition("?")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}  # HOME: the test's
    env |= {"GIT_PROJECT_ROOT": str(served.base),
           "GIT_HTTP_EXPORT_ALL": "1", "REQUEST_METHOD": handler.command, "PATH_INFO": path,
           "QUERY_STRING": query, "REMOTE_ADDR": "127.0.0.1", "REMOTE_USER": "test",
           "CONTENT_TYPE": handler.headers.get("Content-Type", ""),
           "CONTENT_LENGTH": str(size), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CONFIG_GLOBAL": os.devnull}
    if handler.headers.get("Git-Protocol"):
        env["GIT_PROTOCOL"] = handler.headers["Git-Protocol"]
    if handler.headers.get("Content-Encoding"):
        env["HTTP_CONTENT_ENCODING"] = handler.headers["Content-Encoding"]
    return env


def _handler(served: HttpsGit) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet: tests read stderr
            pass

        def _answer(self) -> None:
            body = _read_body(self)
            expected = "Basic " + base64.b64encode(":".join(served.auth).encode()).decode() \
                if served.auth else None
            ok = expected is None or self.headers.get("Authorization") == expected
            served.requests.append((self.path, ok))
            time.sleep(served.delay)
            if not ok:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="test"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            done = subprocess.run(["git", "http-backend"], input=body, capture_output=True,
                                  env=_cgi_env(served, self, len(body)), check=False)
            head, _, payload = done.stdout.partition(b"\r\n\r\n")
            headers = [line.split(":", 1) for line in head.decode().splitlines() if ":" in line]
            status = next((v.strip() for k, v in headers if k.lower() == "status"), "200 OK")
            self.send_response(int(status.split()[0]))
            for name, value in headers:
                if name.lower() not in ("status", "content-length"):
                    self.send_header(name, value.strip())
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = _answer
        do_POST = _answer

    return Handler


@contextlib.contextmanager
def https_git(base: Path, certs: Path, *, auth: tuple[str, str] | None = None,
              delay: float = 0.0) -> Iterator[HttpsGit]:
    """Serve the repositories under ``base`` at ``https://127.0.0.1:PORT/NAME`` (a thread of
    this process, stopped on leaving)."""
    cert, key = certificate(certs)
    served = HttpsGit(base, cert, auth=auth, delay=delay)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(served))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.daemon_threads = True
    served.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def silent_server() -> Iterator[int]:
    """A port on 127.0.0.1 that accepts connections and never sends a byte (a thread of this
    process, its sockets closed on leaving)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                accepted.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        for conn in accepted:
            conn.close()
        thread.join(timeout=5)
