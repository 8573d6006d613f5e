"""Objects in an S3 bucket: ``s3://bucket/prefix``, through obstore (Rust's
``object_store``), chosen by measurement (docs/storage.md: 1.4-1.7x boto3's
small-object rates at a fifth to a seventh of its CPU per request, create-only writes
supported).

Where the server is and who riverbed is come from the standard AWS settings, in the
order AWS's own tools read them: ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``,
``AWS_REGION`` / ``AWS_DEFAULT_REGION``, then the profile ``AWS_PROFILE`` (default
``default``) in ``~/.aws/credentials`` and ``~/.aws/config``. Requests are path-style
(``endpoint/bucket/key``) when the endpoint is an IP address or ``localhost``, and when
``RIVERBED_S3_ADDRESSING=path``; virtual-hosted otherwise. With no credentials anywhere
riverbed stops with a message rather than asking a cloud metadata service.

Transient failures (5xx, ``SlowDown``, timeouts, refused connections) are retried with
full-jitter backoff for up to ``wait`` seconds (``RIVERBED_STORAGE_WAIT``, default 900):
an outage of the store stalls the caller, logged, instead of failing it. A missing
bucket, bad credentials or a refused permission fail at once with one line that says
which and what to do. Secrets never appear in a message: errors are cut to the S3 error
code and the request, and the keys are blanked out of anything that is shown.
"""

from __future__ import annotations

import builtins
import logging
import random
import re
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import obstore
from obstore.store import S3Store

from riverbed.config import storage_wait_s
from riverbed.storage.awschain import S3Settings, settings_from_env
from riverbed.storage.base import ObjectInfo, ObjectStore, check_key
from riverbed.storage.errors import (
    ObjectNotFoundError,
    StorageAccessError,
    StorageError,
    StorageUnavailableError,
    StorageValueError,
)
from riverbed.storage.retry import (
    ACCESS,
    EXISTS,
    MISSING,
    PAST_END,
    TRANSIENT,
    backoff,
    classify,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
PART = 16 * 1024 * 1024  # multipart part size, and the size above which files go in parts
RANGE = 8 * 1024 * 1024  # parallel range reads of large objects


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret blanked out, and the signature material an S3 error
    body may echo (``StringToSign``, ``CanonicalRequest``, ``Credential=``) removed."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    text = re.sub(r"<(StringToSign\w*|CanonicalRequest\w*|SignatureProvided)>.*?</\1>", "", text)
    return re.sub(r"(Credential|Signature)=[^,&\s]+", r"\1=***", text)


def _short(text: str) -> str:
    """An obstore error cut to its request and S3 error code (no XML body, no debug)."""
    first = text.split("Debug source:")[0].strip()
    code = re.search(r"<Code>(\w+)</Code>", first)
    first = re.sub(r":?\s*<\?xml.*", "", first, flags=re.S)
    return f"{first} ({code.group(1)})" if code else first


class S3ObjectStore(ObjectStore):
    def __init__(
        self,
        url: str,
        settings: S3Settings | None = None,
        *,
        wait: float | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc:
            raise StorageValueError(f"{url!r} is not an S3 location: write s3://<bucket>/<prefix>")
        if "@" in parts.netloc:  # the location is not echoed: it holds a secret
            raise StorageValueError(
                "an S3 location is s3://<bucket>/<prefix> only: take the credentials out "
                "of it (they come from the AWS settings, see docs/storage.md)"
            )
        if parts.query or parts.fragment:
            raise StorageValueError(
                f"an S3 location is s3://<bucket>/<prefix> only (options come from the "
                f"AWS settings, see docs/storage.md), not {url!r}"
            )
        self.bucket = parts.netloc
        self.prefix = parts.path.strip("/")
        self.url = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        self.settings = settings if settings is not None else settings_from_env()
        s = self.settings
        if not s.anonymous and not (s.access_key and s.secret_key):
            raise StorageAccessError(
                f"no AWS credentials for {self.url}: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (or a profile in ~/.aws/credentials with AWS_PROFILE)"
            )
        if wait is None:
            wait = storage_wait_s()
        self.wait = wait
        self._sleep = sleep
        where = s.endpoint or f"https://s3.{s.region}.amazonaws.com"
        self.where = f"{where} (bucket {self.bucket})"
        config: dict[str, Any] = {"region": s.region}
        if s.endpoint is not None:
            endpoint = s.endpoint.rstrip("/")
            if not s.path_style:
                scheme, _, host = endpoint.partition("://")
                endpoint = f"{scheme}://{self.bucket}.{host}"
            config["endpoint"] = endpoint
        config["virtual_hosted_style_request"] = not s.path_style
        if s.anonymous:
            config["skip_signature"] = True
        else:
            config["access_key_id"] = s.access_key
            config["secret_access_key"] = s.secret_key
            if s.session_token:
                config["session_token"] = s.session_token
        client: dict[str, Any] = {"timeout": "30s", "connect_timeout": "5s"}
        if (s.endpoint or "").startswith("http://"):
            client["allow_http"] = True
        self._store = S3Store(
            self.bucket,
            prefix=self.prefix or None,
            config=config,  # type: ignore[arg-type]  # a TypedDict built key by key
            client_options=client,  # type: ignore[arg-type]
            retry_config={"max_retries": 0, "retry_timeout": timedelta(seconds=30)},
        )

    # -- one request, retried ----------------------------------------------------------

    def _call(self, what: str, key: str, fn: Callable[[], T]) -> T:
        """Run one request; retry transient failures for up to ``self.wait`` seconds."""
        deadline = time.monotonic() + self.wait
        attempt = 0
        warned = 0.0
        while True:
            try:
                return fn()
            except Exception as exc:
                text = redact(str(exc), self.settings.secrets())
                kind = classify(text, type(exc).__name__)
                if kind == ACCESS:
                    raise StorageAccessError(self._access_message(text)) from None
                if kind in (MISSING, EXISTS, PAST_END):
                    raise
                if kind != TRANSIENT:
                    raise StorageError(f"{what} {key!r} in {self.url}: {_short(text)}") from None
                now = time.monotonic()
                if now >= deadline:
                    raise StorageUnavailableError(
                        f"the object store at {self.where} did not answer for {self.wait:.0f}s "
                        f"({_short(text)}); check that it is running and reachable, or raise "
                        "RIVERBED_STORAGE_WAIT to wait longer"
                    ) from None
                if now - warned >= 10:
                    log.warning(
                        "object store at %s: %s %s failed (%s); retrying for up to %.0fs more",
                        self.where,
                        what,
                        key,
                        _short(text),
                        deadline - now,
                    )
                    warned = now
                delay = backoff(attempt, random.random())  # noqa: S311 - jitter
                self._sleep(min(delay, max(0.0, deadline - now)))
                attempt += 1

    def _access_message(self, text: str) -> str:
        if "NoSuchBucket" in text:
            return (
                f"the bucket {self.bucket!r} does not exist at {self.where.split(' (')[0]}: "
                "create it, or fix the bucket in the location or AWS_ENDPOINT_URL"
            )
        if "InvalidAccessKeyId" in text:
            return (
                f"the object store at {self.where} does not know the access key: check "
                "AWS_ACCESS_KEY_ID (or the profile's aws_access_key_id)"
            )
        if "SignatureDoesNotMatch" in text:
            return (
                f"the object store at {self.where} rejected the signature: check "
                "AWS_SECRET_ACCESS_KEY (or the profile's aws_secret_access_key)"
            )
        if "InvalidBucketName" in text:
            return (
                f"{self.bucket!r} is not a valid bucket name "
                "(3-63 lowercase letters, digits, '-' and '.')"
            )
        return (
            f"the object store at {self.where} refused access ({_short(text)}): "
            "check the credentials and the bucket's permissions for this prefix"
        )

    def _missing(self, key: str) -> ObjectNotFoundError:
        return ObjectNotFoundError(f"no object {key!r} in {self.url}")

    # -- the interface -----------------------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        check_key(key)
        self._call("put", key, lambda: obstore.put(self._store, key, data, use_multipart=False))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        check_key(key)
        # single-part only: some servers (Ceph RGW 16) ignore If-None-Match on the
        # completion of a multipart upload
        try:
            self._call(
                "create",
                key,
                lambda: obstore.put(self._store, key, data, mode="create", use_multipart=False),
            )
        except Exception as exc:
            if classify(str(exc), type(exc).__name__) == EXISTS:
                return False
            raise
        return True

    def get(self, key: str) -> bytes:
        check_key(key)
        try:
            return self._call("get", key, lambda: bytes(obstore.get(self._store, key).bytes()))
        except Exception as exc:
            if classify(str(exc), type(exc).__name__) == MISSING:
                raise self._missing(key) from None
            raise

    def get_range(self, key: str, start: int, end: int) -> bytes:
        check_key(key)
        if end <= start:
            if not self.exists(key):
                raise self._missing(key)
            return b""
        # one request: the server cuts a range short at the object's end
        return self._ranged(
            key, lambda: bytes(obstore.get_range(self._store, key, start=start, end=end)), b""
        )

    def get_prefix(self, key: str, n: int) -> tuple[bytes, int]:
        check_key(key)
        if n <= 0:
            info = self.head(key)
            if info is None:
                raise self._missing(key)
            return b"", info.size

        def ranged() -> tuple[bytes, int]:
            result = obstore.get(self._store, key, options={"range": (0, n)})
            return bytes(result.bytes()), int(result.meta["size"])

        # one request: the answer to a ranged GET carries the object's size; an empty
        # object has no byte 0 (past its end)
        return self._ranged(key, ranged, (b"", 0))

    def _ranged(self, key: str, read: Callable[[], T], past_end: T) -> T:
        """A ranged read: ``past_end`` when the range starts after the object's end,
        :class:`ObjectNotFoundError` when there is no object."""
        try:
            return self._call("read", key, read)
        except Exception as exc:
            kind = classify(str(exc), type(exc).__name__)
            if kind == PAST_END:
                return past_end
            if kind == MISSING:
                raise self._missing(key) from None
            raise

    def head(self, key: str) -> ObjectInfo | None:
        check_key(key)
        try:
            meta = self._call("head", key, lambda: obstore.head(self._store, key))
        except Exception as exc:
            if classify(str(exc), type(exc).__name__) == MISSING:
                return None
            raise
        return ObjectInfo(key, int(meta["size"]), meta["last_modified"].timestamp())

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        # object_store lists by whole path segments: list the prefix's directory and
        # keep the keys that start with the prefix
        parent = prefix.rsplit("/", 1)[0] if "/" in prefix else None

        def listing() -> list[ObjectInfo]:
            found = []
            for batch in obstore.list(self._store, prefix=parent):
                for meta in batch:
                    if meta["path"].startswith(prefix):
                        modified = meta["last_modified"].timestamp()
                        found.append(ObjectInfo(meta["path"], int(meta["size"]), modified))
            return found

        return sorted(self._call("list", prefix, listing), key=lambda o: o.key)

    def entries(self, prefix: str = "", *, with_partial: bool = False) -> builtins.list[str]:
        # one delimited listing: the server answers with the "directories" themselves
        where = prefix.rstrip("/") or None
        listed = self._call(
            "list", prefix, lambda: obstore.list_with_delimiter(self._store, prefix=where)
        )
        names = {p.rstrip("/").rsplit("/", 1)[-1] for p in listed["common_prefixes"]}
        names |= {o["path"].rsplit("/", 1)[-1] for o in listed["objects"]}
        return sorted(n for n in names if n and not n.startswith("."))

    def move(self, src: str, dst: str) -> None:
        check_key(src)
        check_key(dst)
        try:  # a server-side copy: the bytes never leave the store
            self._call("copy", src, lambda: obstore.copy(self._store, src, dst))
        except Exception as exc:
            if classify(str(exc), type(exc).__name__) == MISSING:
                raise self._missing(src) from None
            raise
        self.delete(src)

    def delete(self, key: str) -> None:
        check_key(key)
        try:
            self._call("delete", key, lambda: obstore.delete(self._store, key))
        except Exception as exc:
            if classify(str(exc), type(exc).__name__) != MISSING:
                raise

    def delete_many(self, keys: Iterable[str]) -> None:
        batch = [check_key(k) for k in keys]
        for i in range(0, len(batch), 1000):  # DeleteObjects takes 1,000 keys a request
            chunk = batch[i : i + 1000]
            self._call("delete", chunk[0], lambda c=chunk: obstore.delete(self._store, c))  # type: ignore[misc]

    def put_file(self, key: str, path: Path) -> None:
        check_key(key)
        size = Path(path).stat().st_size
        self._call(
            "upload",
            key,
            lambda: obstore.put(
                self._store,
                key,
                Path(path),
                use_multipart=size > PART,
                chunk_size=PART,
                max_concurrency=4,
            ),
        )

    def get_file(self, key: str, path: Path) -> None:
        info = self.head(key)
        if info is None:
            raise self._missing(key)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.part")
        try:
            with open(tmp, "wb") as f:
                if info.size <= RANGE:
                    f.write(self.get(key))
                else:  # in parallel: obstore fetches the ranges concurrently
                    starts = list(range(0, info.size, RANGE))
                    ends = [min(info.size, s + RANGE) for s in starts]
                    parts = self._call(
                        "download",
                        key,
                        lambda: obstore.get_ranges(self._store, key, starts=starts, ends=ends),
                    )
                    for part in parts:
                        f.write(part)
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)

    def __repr__(self) -> str:
        return f"S3ObjectStore({self.url} at {self.where.split(' (')[0]})"


__all__ = ["S3ObjectStore", "S3Settings", "redact", "settings_from_env"]
