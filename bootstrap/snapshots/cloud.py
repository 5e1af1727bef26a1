"""The object-store client (obstore, from the ``cloud`` extra): built once, bounded, quiet.

obstore over boto3 and fsspec/s3fs: ~20 ms to import against ~210 ms and ~260 ms (this runs on
a cold start), a 5.6 MB wheel with one dependency against 17 MB (botocore) and 20 MB in 20
wheels, streaming reads and atomic multipart writes built in, and the same calls for s3://,
gs:// and az:// URLs.

Credentials and the endpoint come from the standard environment (``AWS_ACCESS_KEY_ID``,
``AWS_ENDPOINT_URL``, ``AWS_REGION``, ...), read by obstore itself; what it does not read, the
shared files ``~/.aws/credentials`` and ``~/.aws/config`` (``AWS_PROFILE``), is read here.
``AWS_ALLOW_HTTP=true`` allows a plain ``http://`` endpoint (a local S3-compatible store).
Every request is bounded by ``KERNEL_BOOTSTRAP_SNAPSHOT_TIMEOUT`` seconds: a store that does not
answer costs a warning, never a hang. Error text never carries a secret (:func:`describe`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Final, cast

from bootstrap.errors import BootstrapError, ConfigError

if TYPE_CHECKING:
    from obstore.store import ClientConfig, ObjectStore, RetryConfig, S3Config

EXTRA_HINT: Final = "pip install 'kernel-bootstrap[cloud]'"
TIMEOUT_ENV: Final = "KERNEL_BOOTSTRAP_SNAPSHOT_TIMEOUT"
DEFAULT_TIMEOUT: Final = 5.0
_SECRET_ENV: Final = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_TOKEN",
                      "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_KEY",
                      "GOOGLE_SERVICE_ACCOUNT_KEY")
_FILE_KEYS: Final = {"aws_access_key_id": "access_key_id",
                     "aws_secret_access_key": "secret_access_key",
                     "aws_session_token": "session_token"}


class Unavailable(BootstrapError):
    """The ``cloud`` extra is not installed."""


def require() -> None:
    """Raise :class:`Unavailable` (naming the extra) unless obstore can be imported."""
    try:
        import obstore  # noqa: F401  (only asking whether it imports)
    except ImportError:
        raise Unavailable(f"snapshots in a bucket need the cloud extra: {EXTRA_HINT}") from None


def timeout() -> float:
    """The bound on one request, in seconds (``KERNEL_BOOTSTRAP_SNAPSHOT_TIMEOUT``)."""
    raw = os.environ.get(TIMEOUT_ENV)
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 0 < value < 3600:
        raise ConfigError(f"{TIMEOUT_ENV} must be a number of seconds (0-3600), got {raw!r}")
    return value


# A whole download has no deadline of its own: one that keeps making progress may take as long
# as it needs (a healthy 90 s download used never to restore, and every sandbox then built and
# uploaded a new copy over the good one). What bounds it is the stall: no byte for the bound.
_NO_DEADLINE: Final = 24 * 3600.0


def connect(url: str, bound: float, *, streaming: bool = False) -> ObjectStore:
    """The store for ``url`` (``s3://BUCKET/PREFIX``; gs:// and az:// alike).

    Raises :class:`Unavailable` without obstore. Retries stay inside the bound: obstore's
    defaults (10 retries, up to 3 minutes) would let an unreachable store hold a cold start
    for minutes. Every read waits at most ``bound`` s for its next bytes; a request as a whole
    gets obstore's 30 s, or, ``streaming`` (a snapshot's download), as long as its body keeps
    coming: a body that dripped held a cold start for 30 s and more with a 2 s bound.
    """
    from datetime import timedelta

    require()
    from obstore.store import from_url

    bound_delta = timedelta(seconds=bound)
    client: ClientConfig = {"connect_timeout": bound_delta, "read_timeout": bound_delta}
    if streaming:
        client["timeout"] = timedelta(seconds=_NO_DEADLINE)
    if os.environ.get("AWS_ALLOW_HTTP", "").lower() in ("1", "true", "yes"):
        client["allow_http"] = True
    retry: RetryConfig = {"max_retries": 2, "retry_timeout": bound_delta,
                          "backoff": {"init_backoff": timedelta(milliseconds=100),
                                      "max_backoff": timedelta(seconds=1)}}
    s3: S3Config | None = None
    if url.startswith("s3://"):
        s3 = cast("S3Config", _aws_files())  # its keys are S3Config's (see _FILE_KEYS)
    return from_url(url, config=s3, client_options=client, retry_config=retry)


def _aws_files() -> dict[str, str]:
    """Credentials and region from the shared AWS files, where the environment has none.

    The environment wins, as it does for the AWS CLI: obstore reads it itself.
    """
    profile = os.environ.get("AWS_PROFILE") or os.environ.get("AWS_DEFAULT_PROFILE") or "default"
    found: dict[str, str] = {}
    if not os.environ.get("AWS_ACCESS_KEY_ID"):
        creds = _ini(os.environ.get("AWS_SHARED_CREDENTIALS_FILE"), "credentials", profile)
        found.update({ours: creds[key] for key, ours in _FILE_KEYS.items() if creds.get(key)})
    if not (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")):
        section = profile if profile == "default" else f"profile {profile}"
        region = _ini(os.environ.get("AWS_CONFIG_FILE"), "config", section).get("region")
        if region:
            found["region"] = region
    return found


def _ini(explicit: str | None, name: str, section: str) -> dict[str, str]:
    import configparser

    path = Path(explicit) if explicit else Path.home() / ".aws" / name
    parser = configparser.RawConfigParser()
    try:
        parser.read(path, encoding="utf-8")
    except (OSError, configparser.Error, UnicodeDecodeError):
        return {}  # an unreadable file is as good as none: the request then says why
    return dict(parser[section]) if parser.has_section(section) else {}


def has_credentials() -> bool:
    """Whether the environment or the shared files name static credentials (for hints only:
    an instance role or web identity needs none)."""
    return bool(os.environ.get("AWS_ACCESS_KEY_ID") or _aws_files().get("access_key_id"))


def describe(error: BaseException) -> str:
    """An error's first line, without any secret the environment or the files hold.

    obstore appends a multi-line debug dump after the first line; the first line says what
    failed (method, URL, retries) and is what a person needs.
    """
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    for secret in _secrets():
        text = text.replace(secret, "***")
    return text


def _secrets() -> list[str]:
    values = [os.environ.get(name, "") for name in _SECRET_ENV]
    values += [v for k, v in _aws_files().items() if k in ("secret_access_key", "session_token")]
    return [v for v in values if len(v) >= 4]
