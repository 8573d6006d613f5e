"""Which Python S3 client riverbed's storage layer uses: measured, not guessed.

Starts the tests' S3 server (a one-host Ceph RGW on loopback, riverbed.testing.s3) and
times four clients on it, one after the other, in one run:

* 4 KiB PUTs and GETs, one thread, for ``--seconds`` each: requests/s and CPU
  milliseconds per request in this process (user + system; the server's CPU is not
  counted);
* one 64 MiB PUT and GET: MB/s (each client's own large-object path: obstore's
  multipart ``put`` with a file, pyarrow's output stream, s3fs's ``put_file``, boto3's
  ``upload_file``);
* whether it can do a create-only write (``If-None-Match: *``) — the primitive the
  storage layer's fencing rests on — checked against the server, not the docs.

Usage::

    .venv/bin/python benchmarks/s3clients.py            # --seconds 5 --big-mib 64

The baseline in the same run: raw ``httpx`` GETs of the same 4 KiB object without
signing (anonymous read of a public object), the floor of one HTTP round trip here.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from riverbed.testing.s3 import REGION, CephS3Server

BUCKET = "rb-bench"


def rate(fn: Callable[[int], None], seconds: float) -> tuple[float, float]:
    """(requests/s, CPU ms per request) of calling ``fn(i)`` for ``seconds``."""
    start, cpu0 = time.perf_counter(), time.process_time()
    n = 0
    while time.perf_counter() - start < seconds:
        fn(n)
        n += 1
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
    return n / wall, cpu * 1000 / n


def mbps(fn: Callable[[], None], size: int) -> float:
    start = time.perf_counter()
    fn()
    return size / (time.perf_counter() - start) / 1e6


class Client:
    name = ""

    def put(self, key: str, data: bytes) -> None: ...
    def get(self, key: str) -> bytes: ...
    def put_file(self, key: str, path: Path) -> None: ...
    def get_file(self, key: str, path: Path) -> None: ...
    def create_only(self, key: str, data: bytes) -> str: ...


class Obstore(Client):
    name = "obstore 0.12 (Rust object_store)"

    def __init__(self, s: CephS3Server) -> None:
        import obstore
        from obstore.store import S3Store

        self.o = obstore
        self.store = S3Store(
            BUCKET,
            endpoint=s.endpoint,
            access_key_id=s.access_key,
            secret_access_key=s.secret_key,
            region=REGION,
            client_options={"allow_http": True},
        )

    def put(self, key: str, data: bytes) -> None:
        self.o.put(self.store, key, data)

    def get(self, key: str) -> bytes:
        return bytes(self.o.get(self.store, key).bytes())

    def put_file(self, key: str, path: Path) -> None:
        self.o.put(self.store, key, path, chunk_size=16 * 1024 * 1024, max_concurrency=4)

    def get_file(self, key: str, path: Path) -> None:
        size = self.o.head(self.store, key)["size"]
        step = 8 * 1024 * 1024
        starts = list(range(0, size, step))
        parts = self.o.get_ranges(
            self.store, key, starts=starts, ends=[min(size, s + step) for s in starts]
        )
        with open(path, "wb") as f:
            for part in parts:
                f.write(part)

    def create_only(self, key: str, data: bytes) -> str:
        self.o.put(self.store, key, data, mode="create")
        try:
            self.o.put(self.store, key, data, mode="create")
        except Exception as exc:  # AlreadyExistsError
            return f"yes ({type(exc).__name__})"
        return "no: the second create overwrote"


class PyArrow(Client):
    name = "pyarrow.fs.S3FileSystem (AWS C++ SDK)"

    def __init__(self, s: CephS3Server) -> None:
        import pyarrow.fs as pafs

        self.fs = pafs.S3FileSystem(
            access_key=s.access_key,
            secret_key=s.secret_key,
            endpoint_override=s.endpoint,
            region=REGION,
            scheme="http",
        )

    def put(self, key: str, data: bytes) -> None:
        with self.fs.open_output_stream(f"{BUCKET}/{key}") as f:
            f.write(data)

    def get(self, key: str) -> bytes:
        with self.fs.open_input_stream(f"{BUCKET}/{key}") as f:
            return bytes(f.read())

    def put_file(self, key: str, path: Path) -> None:
        with self.fs.open_output_stream(f"{BUCKET}/{key}") as out, open(path, "rb") as f:
            while chunk := f.read(8 * 1024 * 1024):
                out.write(chunk)

    def get_file(self, key: str, path: Path) -> None:
        with self.fs.open_input_stream(f"{BUCKET}/{key}") as src, open(path, "wb") as f:
            while chunk := src.read(8 * 1024 * 1024):
                f.write(chunk)

    def create_only(self, key: str, data: bytes) -> str:
        return "no: the filesystem API has no conditional write"


class S3fs(Client):
    name = "s3fs 2026.9 (aiobotocore)"

    def __init__(self, s: CephS3Server) -> None:
        import s3fs

        self.fs = s3fs.S3FileSystem(
            key=s.access_key,
            secret=s.secret_key,
            endpoint_url=s.endpoint,
            client_kwargs={"region_name": REGION},
            use_listings_cache=False,
        )

    def put(self, key: str, data: bytes) -> None:
        self.fs.pipe_file(f"{BUCKET}/{key}", data)

    def get(self, key: str) -> bytes:
        return bytes(self.fs.cat_file(f"{BUCKET}/{key}"))

    def put_file(self, key: str, path: Path) -> None:
        self.fs.put_file(str(path), f"{BUCKET}/{key}")

    def get_file(self, key: str, path: Path) -> None:
        self.fs.get_file(f"{BUCKET}/{key}", str(path))

    def create_only(self, key: str, data: bytes) -> str:
        self.fs.pipe_file(f"{BUCKET}/{key}", data, mode="create")
        try:
            self.fs.pipe_file(f"{BUCKET}/{key}", data, mode="create")
        except Exception as exc:
            return f"yes ({type(exc).__name__})"
        return "no: the second create overwrote"


class Boto3(Client):
    name = "boto3 1.43 (botocore)"

    def __init__(self, s: CephS3Server) -> None:
        import boto3

        self.c = boto3.client(
            "s3",
            endpoint_url=s.endpoint,
            aws_access_key_id=s.access_key,
            aws_secret_access_key=s.secret_key,
            region_name=REGION,
        )

    def put(self, key: str, data: bytes) -> None:
        self.c.put_object(Bucket=BUCKET, Key=key, Body=data)

    def get(self, key: str) -> bytes:
        return bytes(self.c.get_object(Bucket=BUCKET, Key=key)["Body"].read())

    def put_file(self, key: str, path: Path) -> None:
        self.c.upload_file(str(path), BUCKET, key)

    def get_file(self, key: str, path: Path) -> None:
        self.c.download_file(BUCKET, key, str(path))

    def create_only(self, key: str, data: bytes) -> str:
        self.c.put_object(Bucket=BUCKET, Key=key, Body=data, IfNoneMatch="*")
        try:
            self.c.put_object(Bucket=BUCKET, Key=key, Body=data, IfNoneMatch="*")
        except Exception as exc:
            return f"yes ({type(exc).__name__})"
        return "no: the second create overwrote"


def measure(
    client: Client, tag: str, small: bytes, src: Path, dst: Path, seconds: float
) -> tuple[Any, ...]:
    """One client's row: 4 KiB PUT and GET rates and CPU, large PUT and GET, create-only."""
    big = src.stat().st_size
    put_rate, put_cpu = rate(lambda i: client.put(f"{tag}/s{i % 64}", small), seconds)
    get_rate, get_cpu = rate(lambda i: client.get(f"{tag}/s{i % 64}"), seconds)
    up = mbps(lambda: client.put_file(f"{tag}/big", src), big)
    down = mbps(lambda: client.get_file(f"{tag}/big", dst), big)
    if dst.read_bytes() != src.read_bytes():
        raise SystemExit(f"{client.name}: the large object read back differs")
    create = client.create_only(f"{tag}/fence-{time.time_ns()}", b"x")
    return (client.name, put_rate, put_cpu, get_rate, get_cpu, up, down, create)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--big-mib", type=int, default=64)
    args = parser.parse_args()
    small = os.urandom(4096)
    big = args.big_mib * 1024 * 1024
    with CephS3Server() as server, tempfile.TemporaryDirectory() as tmp:
        server.create_bucket(BUCKET)
        src = Path(tmp) / "big"
        src.write_bytes(os.urandom(big))
        dst = Path(tmp) / "back"
        rows: list[tuple[Any, ...]] = []
        clients: list[Client] = [Obstore(server), PyArrow(server), S3fs(server), Boto3(server)]
        # A fresh cluster writes its first large objects slowly (BlueStore allocating
        # on its sparse file): fill that in before timing anyone.
        warm = Boto3(server)
        for i in range(3):
            warm.put_file(f"warm/{i}", src)
        failed: list[tuple[str, str]] = []
        for client in clients:
            tag = type(client).__name__.lower()
            try:
                client.put(f"{tag}/probe", small)  # connect once before timing
            except Exception as exc:  # a client this server cannot serve: say so
                failed.append((client.name, f"{type(exc).__name__}: {str(exc)[:160]}"))
                continue
            rows.append(measure(client, tag, small, src, dst, args.seconds))
            print(f"measured {client.name}", flush=True)
    print(f"\nCeph RGW 16.2 on 127.0.0.1, one thread, 4 KiB objects for {args.seconds:.0f} s each,")
    print(f"one {args.big_mib} MiB object; CPU is this process's (user + system) per request\n")
    head = (
        f"{'client':<40} {'PUT/s':>7} {'ms CPU':>7} {'GET/s':>7} {'ms CPU':>7} "
        f"{'big PUT MB/s':>12} {'big GET MB/s':>12}  create-only (If-None-Match: *)"
    )
    print(head)
    best_get = max(r[3] for r in rows)
    for name, pr, pc, gr, gc, up, down, create in rows:
        print(
            f"{name:<40} {pr:>7.0f} {pc:>7.2f} {gr:>7.0f} {gc:>7.2f} {up:>12.0f} {down:>12.0f}"
            f"  {create}"
        )
    for name, why in failed:
        print(f"{name:<40} fails on this server: {why}")
    print()
    for name, _pr, _pc, gr, *_ in rows:
        print(f"{name:<40} GET/s vs the best client: {gr / best_get:.2f}x")


if __name__ == "__main__":
    main()
