"""An S3 of our own for tests: moto's server in a child process on 127.0.0.1, buckets on it,
and record store URIs that carry its endpoint in the query (pyarrow's from_uri reads it)."""
from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import uuid

# moto checks no credentials; explicit ones keep the AWS SDK from searching for real ones
KEY, SECRET, REGION = "test", "test", "us-east-1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def moto_server(timeout_s: float = 30.0):
    """Yields the endpoint ("127.0.0.1:PORT") of a moto server running until the end."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto's server did not start on port {port}") from None
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def new_bucket(endpoint: str) -> str:
    from pyarrow import fs

    name = f"records-{uuid.uuid4().hex[:12]}"
    fs.S3FileSystem(access_key=KEY, secret_key=SECRET, region=REGION, scheme="http",
                    endpoint_override=endpoint, allow_bucket_creation=True).create_dir(name)
    return name


def s3_uri(endpoint: str, bucket: str, prefix: str = "records") -> str:
    return (f"s3://{KEY}:{SECRET}@{bucket}/{prefix}?endpoint_override={endpoint}"
            f"&scheme=http&region={REGION}")
