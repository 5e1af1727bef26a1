"""Snapshots in a bucket: against a real S3 API server (moto's) on 127.0.0.1."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bootstrap.config import Bucket, config_from_dict
from bootstrap.errors import ConfigError
from bootstrap.snapshots.cloud import TIMEOUT_ENV
from testing import dripserver, s3server
from testing.s3server import free_port
from testing.world import World

pytest.importorskip("moto.server", reason="moto[server] is not installed (test extra)")
pytest.importorskip("obstore", reason="obstore is not installed (cloud extra)")
zstandard = pytest.importorskip("zstandard", reason="zstandard is not installed (cloud extra)")

SECRET = "testing-secret"  # the server accepts any; what matters is that none is logged
BOUND = 2  # KERNEL_BOOTSTRAP_SNAPSHOT_TIMEOUT for every test, seconds


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with s3server.running() as url:
        yield url


@pytest.fixture
def bucket(tmp_path: Path) -> str:
    return f"fleet-{tmp_path.name.lower().replace('_', '-')[-40:]}".rstrip("-")


@pytest.fixture
def s3(endpoint: str, bucket: str) -> Any:
    return s3server.make_bucket(endpoint, bucket)


class BucketWorld(World):
    """A World whose snapshots go to ``bucket`` on the test S3 server."""

    def __init__(self, root: Path, bucket: str) -> None:
        super().__init__(root)
        self.bucket = bucket


@pytest.fixture
def world(tmp_path: Path, endpoint: str, bucket: str, s3: Any) -> BucketWorld:
    w = BucketWorld(tmp_path, bucket)
    w.write_config(requirements=["requests>=2"], snapshots=f"s3://{bucket}/snaps")
    w.skill("alpha")
    w.skill("beta")
    w.env.update(s3server.client_env(endpoint, SECRET))
    w.env["KERNEL_BOOTSTRAP_SNAPSHOT_TIMEOUT"] = str(BOUND)
    return w


def objects(world: BucketWorld, s3: Any) -> list[str]:
    listed = s3.list_objects_v2(Bucket=world.bucket, Prefix="snaps/")
    return sorted(o["Key"] for o in listed.get("Contents", []))


def elsewhere(world: BucketWorld, name: str = "other", **extra: str) -> dict[str, str]:
    return {"KERNEL_BOOTSTRAP_VENV": str(world.root / name), **extra}


def imports(world: BucketWorld, venv: str, modules: str) -> bool:
    python = world.root / venv / "bin" / "python"
    return subprocess.run([str(python), "-c", f"import {modules}"], check=False).returncode == 0


def test_a_second_venv_path_restores_from_the_bucket(world: BucketWorld, s3: Any) -> None:
    world.ensure()
    [name] = objects(world, s3)
    head = s3.head_object(Bucket=world.bucket, Key=name)
    assert head["Metadata"]["kb-sha256"] and int(head["Metadata"]["kb-size"]) > 0
    body = s3.get_object(Bucket=world.bucket, Key=name)["Body"].read()
    assert body[:4] == b"\x28\xb5\x2f\xfd"  # zstd in a bucket
    world.clear_log()
    out = json.loads(world.ensure("--json", env=elsewhere(world)).stdout)
    assert out["action"] == "rebuild" and out["python"] == str(world.root / "other/bin/python")
    assert world.uv_calls() == []  # no `uv venv`, no runtime install, no skill install
    assert imports(world, "other", "alpha, beta, requests")
    status = json.loads(world.run("status", "--json", env=elsewhere(world)).stdout)
    assert status["ready"] is True and status["snapshot"]["exists"] is True
    assert status["snapshot"]["store"] == f"s3://{world.bucket}/snaps"


def put_back(world: BucketWorld, s3: Any, name: str, body: bytes, metadata: dict[str, str]) -> None:
    s3.put_object(Bucket=world.bucket, Key=name, Body=body,
                  Metadata=metadata)


# Each damage and the words its warning must hold.
DAMAGES = {
    "truncated": "truncated",  # half the object, the metadata as written
    "corrupted": "",  # one byte flipped in the middle: the reader or the digest refuses it
    # An intact body whose recorded digest differs: only the digest check can tell, and it
    # must, before the restored tree replaces anything.
    "wrong-digest": "sha256",
    "no-metadata": "no recorded size and digest",
    "garbage-recorded": "",  # garbage whose size and digest were recorded: the reader refuses
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_object_warns_by_name_and_builds(
        world: BucketWorld, s3: Any, damage: str) -> None:
    import hashlib

    world.ensure()
    [name] = objects(world, s3)
    got = s3.get_object(Bucket=world.bucket, Key=name)
    body, meta = bytearray(got["Body"].read()), got["Metadata"]
    if damage == "truncated":
        del body[len(body) // 2:]
    elif damage == "corrupted":
        body[len(body) // 2] ^= 0xFF
    elif damage == "no-metadata":
        meta = {}
    elif damage == "wrong-digest":
        meta = {**meta, "kb-sha256": hashlib.sha256(b"something else").hexdigest()}
    else:
        body = bytearray(b"\x00not a snapshot" * 500)
        meta = {**meta, "kb-size": str(len(body)), "kb-sha256": hashlib.sha256(body).hexdigest()}
    put_back(world, s3, name, bytes(body), meta)
    world.clear_log()
    result = world.ensure(env=elsewhere(world))
    assert f"s3://{world.bucket}/{name}" in result.stderr, result.stderr
    assert DAMAGES[damage] in result.stderr, result.stderr
    assert len(world.venv_calls()) == 1 and imports(world, "other", "alpha, requests")
    assert not list(world.root.glob(".other.stage-*"))
    # The build uploaded a good object again: the next sandbox restores.
    world.clear_log()
    world.ensure(env=elsewhere(world, "third"))
    assert world.venv_calls() == []


def test_a_plain_archive_in_the_bucket_still_restores(world: BucketWorld, s3: Any) -> None:
    import hashlib

    world.ensure()
    [name] = objects(world, s3)
    got = s3.get_object(Bucket=world.bucket, Key=name)
    plain = zstandard.ZstdDecompressor().decompressobj().decompress(got["Body"].read())
    assert plain[:4] != b"\x28\xb5\x2f\xfd"
    put_back(world, s3, name, plain, {"kb-size": str(len(plain)),
                                      "kb-sha256": hashlib.sha256(plain).hexdigest()})
    world.clear_log()
    world.ensure(env=elsewhere(world))
    assert world.uv_calls() == [] and imports(world, "other", "beta")


def silent_listener() -> socket.socket:
    """A socket that accepts connections (the kernel does) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock


@pytest.mark.parametrize("kind", ["nobody-listens", "never-answers"])
def test_an_unreachable_store_is_a_warning_within_the_bound_and_a_build(
        world: BucketWorld, kind: str) -> None:
    listener = silent_listener() if kind == "never-answers" else None
    port = listener.getsockname()[1] if listener else free_port()
    try:
        env = elsewhere(world, AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
        result = world.ensure(env=env)
        status = world.run("status", "--json", env=env)
    finally:
        if listener:
            listener.close()
    assert "bucket did not answer" in result.stderr, result.stderr
    assert f"s3://{world.bucket}/snaps" in result.stderr
    assert SECRET not in result.stderr
    assert imports(world, "other", "alpha, requests")
    # One bounded wait for the whole run: the upload after the build is skipped, not tried
    # (and waited for) again.
    assert result.stderr.count("bucket did not answer or refused") == 1, result.stderr
    assert "not uploaded: the bucket did not answer earlier in this run" in result.stderr
    assert json.loads(status.stdout)["snapshot"]["exists"] is None


def test_two_concurrent_restores_of_one_key(world: BucketWorld) -> None:
    world.ensure()
    world.clear_log()
    procs = [subprocess.Popen(world.command("ensure"), env={**world.env, **elsewhere(world, n)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in ("one", "two")]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1] for o in outs]
    assert world.uv_calls() == []
    assert imports(world, "one", "beta") and imports(world, "two", "beta")


def test_concurrent_writers_of_one_key_leave_one_whole_object(world: BucketWorld, s3: Any) -> None:
    procs = [subprocess.Popen(world.command("ensure"), env={**world.env, **elsewhere(world, n)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in ("one", "two", "three")]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [o[1] for o in outs]
    assert len(objects(world, s3)) == 1
    world.clear_log()
    world.ensure(env=elsewhere(world, "reader"))
    assert world.uv_calls() == [] and imports(world, "reader", "alpha, beta")


def test_list_and_prune_work_on_the_bucket(world: BucketWorld, s3: Any) -> None:
    world.ensure()
    time.sleep(1.1)  # S3 times are whole seconds: the second snapshot must be newer
    world.write_config(requirements=["requests>=2", "idna"],
                       snapshots=f"s3://{world.bucket}/snaps")
    world.ensure(env=elsewhere(world))
    listed = json.loads(world.run("snapshot", "list", "--json").stdout)
    assert listed["store"] == f"s3://{world.bucket}/snaps"
    assert len(listed["snapshots"]) == 2
    assert all(s["platform"].get("os") and s["bytes"] > 0 for s in listed["snapshots"])
    newest = max(listed["snapshots"], key=lambda s: s["created"])
    pruned = json.loads(world.run("snapshot", "prune", "--keep", "1", "--json").stdout)
    assert len(pruned["removed"]) == 1 and newest["path"] not in pruned["removed"]
    assert objects(world, s3) == [newest["path"].split("/", 3)[3]]
    assert world.run("snapshot", "prune", "--keep", "0").returncode == 0
    assert "no snapshots" in world.run("snapshot", "list").stdout


def test_list_and_prune_keep_to_the_stores_own_level_and_delete_what_they_list(
        world: BucketWorld, s3: Any) -> None:
    # With a copy of the newest snapshot under a nested prefix, prune --keep 1 deleted the
    # store's own newest object, kept the nested one and reported removing an object that
    # never existed (issue 22).
    world.ensure()
    [own] = objects(world, s3)
    name = own.split("/")[-1]
    b = world.bucket
    for copy in (f"snaps/{'b' * 40}.tar", f"snaps/team-b/{name}", "snaps/team-b/only-b.tar"):
        s3.copy_object(Bucket=b, Key=copy, CopySource={"Bucket": b, "Key": own})
    time.sleep(1.1)  # S3 times are whole seconds: the store's own snapshot must be the newest
    body = s3.get_object(Bucket=b, Key=own)
    s3.put_object(Bucket=b, Key=own, Body=body["Body"].read(), Metadata=body["Metadata"])
    listed = json.loads(world.run("snapshot", "list", "--json").stdout)
    assert sorted(s["path"] for s in listed["snapshots"]) == [
        f"s3://{b}/snaps/{'b' * 40}.tar", f"s3://{b}/{own}"]
    pruned = world.run("snapshot", "prune", "--keep", "1", "--json")
    assert pruned.returncode == 0, pruned.stderr
    assert json.loads(pruned.stdout)["removed"] == [f"s3://{b}/snaps/{'b' * 40}.tar"]
    assert objects(world, s3) == sorted([own, f"snaps/team-b/{name}", "snaps/team-b/only-b.tar"])


def test_without_credentials_a_warning_says_so_and_the_build_goes_on(world: BucketWorld) -> None:
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        world.env.pop(var)
    result = world.ensure()
    assert "no AWS credentials" in result.stderr, result.stderr
    assert world.imports("alpha")


def test_credentials_from_the_shared_file_are_used_and_never_logged(
        world: BucketWorld, s3: Any, tmp_path: Path) -> None:
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        world.env.pop(var)
    creds = tmp_path / "aws-credentials"
    creds.write_text(f"[fleet]\naws_access_key_id = testing\naws_secret_access_key = {SECRET}\n")
    world.env.update(AWS_SHARED_CREDENTIALS_FILE=str(creds), AWS_PROFILE="fleet")
    result = world.ensure("-v")
    assert len(objects(world, s3)) == 1 and SECRET not in result.stderr
    failed = world.ensure("-v", env=elsewhere(world, AWS_ENDPOINT_URL="http://127.0.0.1:1"))
    assert "did not answer" in failed.stderr and SECRET not in failed.stderr


def test_without_the_cloud_extra_a_warning_names_it_and_the_build_goes_on(
        world: BucketWorld, tmp_path: Path) -> None:
    blocker = tmp_path / "no-cloud"
    (blocker / "obstore").mkdir(parents=True)
    (blocker / "obstore" / "__init__.py").write_text("raise ImportError('not installed')\n")
    path = os.pathsep.join(p for p in (str(blocker), world.env.get("PYTHONPATH")) if p)
    result = world.ensure(env={"PYTHONPATH": path})
    assert "kernel-bootstrap[cloud]" in result.stderr and world.imports("alpha")
    listed = world.run("snapshot", "list", env={"PYTHONPATH": path})
    assert listed.returncode == 1 and "kernel-bootstrap[cloud]" in listed.stderr


@pytest.mark.parametrize(("value", "expected"), [
    ("s3://fleet/snaps", Bucket("s3://fleet/snaps")),
    ("s3://fleet/", Bucket("s3://fleet")),
    ("gs://fleet/a/b", Bucket("gs://fleet/a/b")),
    ("az://account/container", Bucket("az://account/container")),
    ("store", None),
])
def test_the_snapshots_key_takes_a_directory_or_a_bucket_url(
        tmp_path: Path, value: str, expected: Bucket | None) -> None:
    config = config_from_dict({"snapshots": value}, tmp_path / "kb.toml")
    assert config.snapshots == (expected if expected else tmp_path / "store")


@pytest.mark.parametrize("value", ["s3://", "ftp://fleet/snaps", "s3:///snaps"])
def test_a_url_that_is_no_bucket_is_a_config_error(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError, match="bucket URL"):
        config_from_dict({"snapshots": value}, tmp_path / "kb.toml")


def test_an_upload_names_the_object_and_leaves_no_temp_file(
        world: BucketWorld, tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    result = world.ensure("-v", env={"TMPDIR": str(scratch)})
    assert f"s3://{world.bucket}/snaps/" in result.stderr
    assert "snapshot uploaded" in result.stderr
    # The archive streams into the compressor: no plain archive is written anywhere first.
    assert "snapshot written" not in result.stderr and str(scratch) not in result.stderr
    assert list(scratch.iterdir()) == []


def unsafe_archive(key: str, platform: dict[str, str]) -> bytes:
    """A snapshot whose manifest matches but whose venv holds a link out of it."""
    import io
    import tarfile

    out = io.BytesIO()
    manifest = json.dumps({"key": key, "platform": platform, "format": 1}).encode()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo("kernel-bootstrap-snapshot.json")
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest))
        link = tarfile.TarInfo("venv/escape")
        link.type, link.linkname = tarfile.SYMTYPE, "../../outside"
        tar.addfile(link)
    return out.getvalue()


def test_an_object_with_an_unsafe_member_is_refused_by_the_vetting_reader(
        world: BucketWorld, s3: Any) -> None:
    import hashlib

    world.ensure()
    [name] = objects(world, s3)
    key = name.rsplit("/", 1)[1].removesuffix(".tar")
    platform = json.loads(s3.head_object(Bucket=world.bucket,
                                         Key=name)["Metadata"]["kb-platform"])
    body = zstandard.ZstdCompressor().compress(unsafe_archive(key, platform))
    put_back(world, s3, name, body, {"kb-size": str(len(body)),
                                     "kb-sha256": hashlib.sha256(body).hexdigest()})
    world.clear_log()
    result = world.ensure(env=elsewhere(world))
    url = f"s3://{world.bucket}/{name}"
    assert f"{url}: unsafe member 'venv/escape'" in result.stderr, result.stderr
    assert len(world.venv_calls()) == 1 and imports(world, "other", "alpha")
    assert not (world.root / "outside").exists()


def served_slowly(world: BucketWorld, s3: Any, **drip: Any) -> tuple[dripserver.Drip, str]:
    """The world's snapshot object, as a dripping server would send it; and its key."""
    world.ensure()
    [name] = objects(world, s3)
    got = s3.get_object(Bucket=world.bucket, Key=name)
    body = got["Body"].read()
    return dripserver.Drip(body, got["Metadata"], **drip), name.split("/")[-1]


def test_a_stalled_download_ends_within_the_bound_and_the_build_goes_on(
        world: BucketWorld, s3: Any) -> None:
    # Headers at once, then a trickle: held a cold start for 30 s with a 2 s bound, obstore's
    # own request timeout governing it (issue 22).
    drip, name = served_slowly(world, s3, piece=20, interval=0.1)  # 200 B/s: 30 s and more
    with dripserver.serving(drip) as url:
        env = elsewhere(world, AWS_ENDPOINT_URL=url)
        result = world.ensure(env=env)
    # Ended by our stall bound (its words below), once: not by obstore's 30 s, not retried.
    assert drip.gets == 1, result.stderr
    assert "the download stalled" in result.stderr and name in result.stderr
    assert imports(world, "other", "alpha, requests")  # built instead


def test_a_download_that_keeps_coming_finishes_however_long_it_takes(
        world: BucketWorld, s3: Any, endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from bootstrap.env.platform import Platform
    from bootstrap.snapshots.bucket import BucketStore

    world.ensure()
    [name] = objects(world, s3)
    meta = s3.head_object(Bucket=world.bucket, Key=name)["Metadata"]
    # Rewritten with incompressible bytes in it: enough to keep coming for longer than the bound.
    [site] = world.venv.glob("lib/python*/site-packages")
    (site / "padding.bin").write_bytes(os.urandom(640 * 1024))
    for key, value in {**s3server.client_env(endpoint, SECRET), TIMEOUT_ENV: str(BOUND)}.items():
        monkeypatch.setenv(key, value)
    store = BucketStore(f"s3://{world.bucket}/snaps")
    assert store.write(world.venv, name.split("/")[-1].removesuffix(".tar"),
                       Platform(**json.loads(meta["kb-platform"])))
    got = s3.get_object(Bucket=world.bucket, Key=name)
    drip = dripserver.Drip(got["Body"].read(), got["Metadata"], piece=160 * 1024,
                           interval=BOUND * 0.5)
    assert len(drip.body) / drip.piece * drip.interval > 1.5 * BOUND  # longer than the bound
    world.clear_log()
    with dripserver.serving(drip) as url:
        result = world.ensure(env=elsewhere(world, AWS_ENDPOINT_URL=url))
    assert "stalled" not in result.stderr and "broke off" not in result.stderr, result.stderr
    assert world.uv_calls() == [] and imports(world, "other", "alpha, beta")  # restored


def _connections(listener: socket.socket) -> int:
    """How many connections reached ``listener`` (the kernel queues them until accepted)."""
    listener.setblocking(False)
    count = 0
    while True:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1


def test_offline_never_contacts_the_bucket_and_builds_from_the_caches(
        world: BucketWorld, s3: Any) -> None:
    world.ensure()  # online: the bucket now holds a snapshot a rebuild elsewhere would restore
    assert len(objects(world, s3)) == 1
    listener = silent_listener()
    try:
        env = elsewhere(world, AWS_ENDPOINT_URL=f"http://127.0.0.1:{listener.getsockname()[1]}",
                        KERNEL_BOOTSTRAP_OFFLINE="1")
        world.clear_log()
        result = world.ensure(env=env)
        status = world.run("status", "--json", env=env)
        listed = world.run("snapshot", "list", env=env)
        reached = _connections(listener)
    finally:
        listener.close()
    assert reached == 0, result.stderr
    # Built from uv's cache, every call --offline, and said once why no snapshot was used.
    calls = world.uv_calls()
    assert calls and all("--offline" in c for c in calls if c[:1] == ["pip"]), calls
    assert imports(world, "other", "alpha, beta, requests")
    assert result.stderr.count("offline") >= 1 and "bucket" in result.stderr, result.stderr
    assert "did not answer" not in result.stderr
    assert json.loads(status.stdout)["snapshot"]["exists"] is None
    assert listed.returncode == 2 and "offline" in listed.stderr, listed.stderr
