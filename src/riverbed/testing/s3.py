"""A real S3 server for tests, benchmarks and ``riverbed demo --durable s3``: a one-host
Ceph cluster (one monitor, one BlueStore OSD on a sparse file, one RADOS gateway), bound
to 127.0.0.1, keeping every object on disk under its data directory.

Why Ceph RGW: it is a production S3 server from Debian's own packages, keeps data across
restarts, and answers the one conditional write riverbed relies on (``If-None-Match:
*``) as AWS does (measured in ``../shared/FACTS.md``). It is ready in ~17 s from an
empty directory and ~5 s on a restart over the same one; tests start it once per
session.

Two settings it cannot do without, both learned the hard way: leave
``bluestore_block_path`` unset (mkfs fails on the symlink otherwise), and with
authentication off set ``ms mon client mode = crc`` (radosgw waits 300 s for cephx
otherwise).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Self

import httpx

from riverbed.testing.servers import ServerError, _require, _Server, _wait_until, free_port

REGION = "us-east-1"
_DAEMONS = ("client.rgw.a", "osd.0", "mon.a")  # stop order: the gateway first


def _port_pair() -> int:
    """A free port whose successor is free too (the monitor's v2 and v1 addresses)."""
    import socket

    for _ in range(100):
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise ServerError("no two consecutive free TCP ports found for the Ceph monitor")


class CephS3Server(_Server):
    """A Ceph RGW micro-cluster under ``data`` (a fresh temporary directory unless one
    is given; an existing one is restarted with its objects). ``env()`` gives the
    standard AWS variables that reach it."""

    def __init__(
        self, data: Path | None = None, *, block_size: str = "4G", address: str = "127.0.0.1"
    ) -> None:
        self._own = data is None
        self.address = address  # where the S3 endpoint listens (Ceph's own daemons: loopback)
        self.data = Path(data) if data is not None else Path(tempfile.mkdtemp(prefix="rb-s3-"))
        self.block_size = block_size
        self.conf = self.data / "ceph.conf"
        self.port = 0
        self.access_key = ""
        self.secret_key = ""

    # -- addresses and credentials -----------------------------------------------------

    @property
    def endpoint(self) -> str:
        return f"http://{self.address}:{self.port}"

    def env(self) -> dict[str, str]:
        """``AWS_ENDPOINT_URL``, the keys and the region: what a riverbed process (or any
        AWS SDK) needs to reach this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": REGION,
        }

    def create_bucket(self, name: str) -> None:
        """Create a bucket (no error if this server has it already)."""
        import pyarrow.fs as pafs

        fs = pafs.S3FileSystem(
            access_key=self.access_key,
            secret_key=self.secret_key,
            endpoint_override=self.endpoint,
            region=REGION,
            scheme="http",
            allow_bucket_creation=True,
        )
        fs.create_dir(name)

    # -- processes ---------------------------------------------------------------------

    def _pid(self, daemon: str) -> int | None:
        try:
            pid = int((self.data / "run" / f"{daemon}.pid").read_text().strip())
        except (OSError, ValueError):
            return None
        try:  # only ours: the pid's command line names our config
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        return pid if str(self.conf).encode() in cmdline else None

    def _ceph(self, *args: str, timeout: float = 60) -> str:
        result = subprocess.run(
            ["ceph", "-c", str(self.conf), "--connect-timeout", "30", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return result.stdout if result.returncode == 0 else ""

    def _run(self, *args: str) -> None:
        result = subprocess.run(args, capture_output=True, text=True, check=False, timeout=120)
        if result.returncode != 0:
            raise ServerError(
                f"{args[0]} failed:\n{result.stdout[-1500:]}\n{result.stderr[-1500:]}"
            )

    def _write_conf(self, mon_port: int, osd_low: int) -> None:
        d = self.data
        self.conf.write_text(
            f"""[global]
fsid = {uuid.uuid4()}
mon host = [v2:127.0.0.1:{mon_port},v1:127.0.0.1:{mon_port + 1}]
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind ipv4 = true
ms bind ipv6 = false
ms bind port min = {osd_low}
ms bind port max = {osd_low + 40}
auth cluster required = none
auth service required = none
auth client required = none
auth supported = none
ms mon client mode = crc
client mount timeout = 60
run dir = {d}/run
crash dir = {d}/crash
log file = {d}/log/$name.log
log to stderr = false
err to stderr = true
mon cluster log file = {d}/log/ceph.log
keyring = /dev/null
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon max pg per osd = 1000
mon warn on pool no redundancy = false
mon data avail warn = 2
mon data avail crit = 1

[mon]
mon data = {d}/mon/$cluster-$id
admin socket = {d}/run/$name.asok
pid file = {d}/run/$name.pid

[osd]
osd data = {d}/osd/$cluster-$id
osd objectstore = bluestore
bluestore block create = true
bluestore block size = {self.block_size}
bluestore fsck on mkfs = false
bluestore fsck on mount = false
osd memory target = 1G
admin socket = {d}/run/$name.asok
pid file = {d}/run/$name.pid

[client.rgw.a]
rgw data = {d}/rgw/$cluster-$id
rgw frontends = beast endpoint={self.address}:{self.port} tcp_nodelay=1
rgw thread pool size = 64
rgw enable usage log = true
rgw usage log tick interval = 1
rgw usage log flush threshold = 1
admin socket = {d}/run/$name.asok
pid file = {d}/run/$name.pid
"""
        )

    def start(self) -> Self:
        for binary in ("ceph-mon", "ceph-osd", "radosgw", "monmaptool", "ceph"):
            _require(binary, "radosgw ceph-mon ceph-osd ceph-common")
        fresh = not self.conf.exists()
        if fresh:
            for sub in ("mon", "osd/ceph-0", "rgw/ceph-rgw.a", "run", "log", "crash"):
                (self.data / sub).mkdir(parents=True, exist_ok=True)
            self.port = free_port()
            mon_port = _port_pair()
            self._write_conf(mon_port, free_port())
            fsid = next(
                line.split("=", 1)[1].strip()
                for line in self.conf.read_text().splitlines()
                if line.startswith("fsid")
            )
            monmap = self.data / "monmap"
            self._run(
                "monmaptool",
                "--create",
                "--clobber",
                "--enable-all-features",
                "--fsid",
                fsid,
                "--addv",
                "a",
                f"[v2:127.0.0.1:{mon_port},v1:127.0.0.1:{mon_port + 1}]",
                str(monmap),
            )
            self._run(
                "ceph-mon", "-c", str(self.conf), "-i", "a", "--mkfs", "--monmap", str(monmap)
            )
        else:
            for line in self.conf.read_text().splitlines():
                if line.startswith("rgw frontends"):
                    where = line.split("endpoint=")[1].split()[0]
                    self.address, port = where.rsplit(":", 1)
                    self.port = int(port)
        self._run("ceph-mon", "-c", str(self.conf), "-i", "a")
        _wait_until(lambda: bool(self._ceph("mon", "stat")), 60, "the Ceph monitor")
        if fresh:
            osd_uuid = str(uuid.uuid4())
            osd_id = self._ceph("osd", "new", osd_uuid).strip()
            if osd_id != "0":
                raise ServerError(f"ceph osd new answered {osd_id!r}, not 0")
            self._run("ceph-osd", "-c", str(self.conf), "-i", "0", "--mkfs", "--osd-uuid", osd_uuid)
        self._run("ceph-osd", "-c", str(self.conf), "-i", "0")
        _wait_until(
            lambda: "osd.0 up" in self._ceph("osd", "dump"),
            90,
            "the Ceph OSD",
            self.data / "log" / "osd.0.log",
        )
        self.start_gateway()
        credentials = self.data / "s3-credentials"
        if fresh or not credentials.exists():
            access, secret = secrets.token_hex(10).upper(), secrets.token_hex(20)
            self._run(
                "radosgw-admin",
                "-c",
                str(self.conf),
                "user",
                "create",
                "--uid=riverbed",
                "--display-name=riverbed tests",
                f"--access-key={access}",
                f"--secret-key={secret}",
            )
            credentials.write_text(f"{access}\n{secret}\n")
            credentials.chmod(0o600)
        self.access_key, self.secret_key = credentials.read_text().split()
        return self

    def usage(self) -> dict[str, dict[str, int]]:
        """Requests the server has served so far, per category (``put_obj``,
        ``get_obj``, ``list_bucket``, ``delete_obj``, …): ``ops`` and bytes
        ``received``/``sent`` — from the gateway's own usage log, so requests of every
        process count (Spark's Python workers included). The log is flushed every
        second: wait a second after the requests to count."""
        import json

        out = subprocess.run(
            ["radosgw-admin", "-c", str(self.conf), "usage", "show", "--uid=riverbed"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        totals: dict[str, dict[str, int]] = {}
        for entry in json.loads(out).get("entries", []):
            for bucket in entry.get("buckets", []):
                for cat in bucket.get("categories", []):
                    row = totals.setdefault(cat["category"], {"ops": 0, "received": 0, "sent": 0})
                    row["ops"] += int(cat.get("ops", 0))
                    row["received"] += int(cat.get("bytes_received", 0))
                    row["sent"] += int(cat.get("bytes_sent", 0))
        return totals

    def _answers(self) -> bool:
        try:
            httpx.get(self.endpoint, timeout=2)
        except httpx.HTTPError:
            return False
        return True

    def start_gateway(self) -> None:
        """Start the S3 gateway (after :meth:`stop_gateway`: the store comes back)."""
        self._run("radosgw", "-c", str(self.conf), "-n", "client.rgw.a")
        _wait_until(
            self._answers, 180, "the Ceph RADOS gateway", self.data / "log" / "client.rgw.a.log"
        )

    def stop_gateway(self) -> None:
        """Stop the S3 gateway only (SIGKILL): the endpoint refuses connections until
        :meth:`start_gateway`; the objects stay in the cluster."""
        pid = self._pid("client.rgw.a")
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _wait_until(lambda: not Path(f"/proc/{pid}").exists(), 20, "the gateway to exit")

    def pause_gateway(self, paused: bool = True) -> None:
        """SIGSTOP (or SIGCONT) the gateway: connections hang instead of failing."""
        pid = self._pid("client.rgw.a")
        if pid is not None:
            os.kill(pid, signal.SIGSTOP if paused else signal.SIGCONT)

    def stop(self) -> None:
        for daemon in _DAEMONS:
            pid = self._pid(daemon)
            if pid is None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 20
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self._own:
            shutil.rmtree(self.data, ignore_errors=True)


DEMO_BUCKET = "riverbed-demo"


@contextlib.contextmanager
def demo_bucket(home: Path, say: Callable[[str], None]) -> Iterator[str]:
    """A bucket for a demo's ``--durable s3``: the S3 server named by
    ``AWS_ENDPOINT_URL`` (bucket ``riverbed-demo``, which must exist), else the tests'
    own Ceph RGW started on loopback under ``home`` and stopped after. Yields a fresh
    location in it (``s3://riverbed-demo/<time>``); meanwhile the bucket's settings are
    in this process's environment — the demo's own reads need them and the processes it
    starts inherit them. ``say`` tells the user what was picked (never a key)."""
    run = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    if os.environ.get("AWS_ENDPOINT_URL"):
        say(f"S3 server: {os.environ['AWS_ENDPOINT_URL']} (AWS_ENDPOINT_URL)")
        yield f"s3://{DEMO_BUCKET}/{run}"
        return
    say("starting an S3 server on loopback (Ceph RGW, objects on disk; ~20 s)")
    with CephS3Server(home / "s3-server") as server:
        server.create_bucket(DEMO_BUCKET)
        say(f"S3 server: {server.endpoint}, bucket {DEMO_BUCKET}\n")
        saved = {k: os.environ.get(k) for k in server.env()}
        os.environ.update(server.env())
        try:
            yield f"s3://{DEMO_BUCKET}/{run}"
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


__all__ = ["DEMO_BUCKET", "REGION", "CephS3Server", "demo_bucket"]
