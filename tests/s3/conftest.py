"""A loopback S3 server for the S3 tests, started by the tests themselves.

``moto_server`` (PyPI ``moto[server]``, in the ``test`` extra; s3fs's own
test suite uses it) runs as a subprocess on 127.0.0.1 and a free port for
the whole session, answers the S3 protocol in memory, and is stopped at the
end. Nothing listens beyond loopback; every wait has a hard deadline. A
missing moto is a failure, never a skip: ``make test`` installs it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest

REGION = "us-east-1"
KEY, SECRET = "tilearray-test", "tilearray-test-secret"
BUCKET = "tilearray-test"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status < 500
    except OSError:
        return False


PORT = _free_port()
ENDPOINT = f"http://127.0.0.1:{PORT}"
ENV = {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_ENDPOINT_URL": ENDPOINT,
       "AWS_DEFAULT_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true"}
os.environ.update(ENV)
os.environ.pop("AWS_PROFILE", None)


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory):
    """``http://127.0.0.1:PORT`` of a moto S3 server holding bucket ``BUCKET``."""
    try:
        import moto.server  # noqa: F401
        import s3fs  # noqa: F401
    except ImportError as e:
        pytest.fail(f"the S3 tests need moto[server] and s3fs ({e}): pip install -e '.[test]' "
                    "(make test does)", pytrace=False)
    port, url = PORT, ENDPOINT
    log = tmp_path_factory.mktemp("moto") / "moto_server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not _answers(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"moto_server did not answer on {url} within 30 s (exit "
                            f"{proc.poll()}): {log.read_text()[-2000:]}", pytrace=False)
            time.sleep(0.1)
        import boto3

        boto3.client("s3", endpoint_url=url, region_name=REGION, aws_access_key_id=KEY,
                     aws_secret_access_key=SECRET).create_bucket(Bucket=BUCKET)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="session")
def storage_options(s3_endpoint):
    """What a user passes as ``storage_options=`` for their endpoint: explicit
    credentials and endpoint, which travel to the engine's worker processes
    with the pickled store (the session's engine started before any AWS_*
    variable was set)."""
    return {"key": KEY, "secret": SECRET, "endpoint_url": s3_endpoint,
            "client_kwargs": {"region_name": REGION}}


@pytest.fixture
def s3_url():
    """A fresh prefix of the bucket for one test: ``s3://BUCKET/<random>``."""
    return f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"


@pytest.fixture
def s3fs_fs(storage_options):
    """An s3fs filesystem on the server, to look at (and damage) objects directly."""
    import s3fs

    return s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False,
                             **storage_options)
