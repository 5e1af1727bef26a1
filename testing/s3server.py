"""A real S3 API server (moto's) on 127.0.0.1 for the bucket tests and benchmarks."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def running() -> Iterator[str]:
    """Start moto's server on a free loopback port; yield its endpoint URL; stop it."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def client_env(endpoint: str, secret: str = "testing-secret") -> dict[str, str]:
    """The environment a kernel-bootstrap child needs for the server at ``endpoint``."""
    return {
        "AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": secret,
        # Without credentials obstore asks the instance metadata service: keep that on
        # loopback, where nobody listens.
        "AWS_METADATA_ENDPOINT": f"http://127.0.0.1:{free_port()}",
    }


def make_bucket(endpoint: str, name: str) -> Any:
    """Create bucket ``name``; return a boto3 client for inspecting it."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing-secret")
    s3.create_bucket(Bucket=name)
    return s3
