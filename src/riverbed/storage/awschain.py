"""The AWS settings chain as riverbed reads it — the standard variables (``AWS_*``) and
profiles every AWS tool reads, and riverbed's own bucket settings (riverbed.config) —
for every client of a bucket: riverbed's (:mod:`riverbed.storage.s3`) and Spark's S3A
(:mod:`riverbed.spark.s3a`). Light to import: no S3 client here. See
:mod:`riverbed.storage.s3` for the order of the chain."""

from __future__ import annotations

import configparser
import contextlib
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from riverbed.config import inherited, inherited_environment
from riverbed.storage.errors import StorageValueError

__all__ = ["S3Settings", "bucket_environment", "checksums_when_required", "settings_from_env"]


@dataclass(frozen=True)
class S3Settings:
    """Where the bucket's server is and how to sign for it (never printed whole:
    ``repr`` leaves the keys out)."""

    endpoint: str | None
    region: str
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    path_style: bool = True
    anonymous: bool = False

    def secrets(self) -> list[str]:
        return [s for s in (self.access_key, self.secret_key, self.session_token) if s]


def _profile(env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The profile's credentials and config sections (empty when there are none)."""
    name = env.get("AWS_PROFILE", "default")
    home = Path(env.get("HOME", str(Path.home())))
    creds_file = Path(env.get("AWS_SHARED_CREDENTIALS_FILE", home / ".aws" / "credentials"))
    config_file = Path(env.get("AWS_CONFIG_FILE", home / ".aws" / "config"))
    creds: dict[str, str] = {}
    config: dict[str, str] = {}
    for path, section, out in (
        (creds_file, name, creds),
        (config_file, name if name == "default" else f"profile {name}", config),
    ):
        parser = configparser.ConfigParser()
        with contextlib.suppress(OSError, configparser.Error):
            parser.read(path)
            if parser.has_section(section):
                out.update(parser[section])
    if name != "default" and not creds and not config and "AWS_PROFILE" in env:
        raise StorageValueError(
            f"AWS_PROFILE={name!r} names no profile in {creds_file} or {config_file}: "
            "add it there or unset AWS_PROFILE"
        )
    return creds, config


def _literal_host(endpoint: str) -> bool:
    host = urlsplit(endpoint).hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def settings_from_env(env: Mapping[str, str] | None = None) -> S3Settings:
    """The AWS settings chain (see the module doc) as riverbed reads it."""
    env = os.environ if env is None else env
    creds, config = _profile(env)
    endpoint = (
        env.get("AWS_ENDPOINT_URL_S3")
        or env.get("AWS_ENDPOINT_URL")
        or config.get("endpoint_url")
        or None
    )
    if endpoint is not None and urlsplit(endpoint).scheme not in ("http", "https"):
        raise StorageValueError(
            f"the S3 endpoint {endpoint!r} is not an http:// or https:// URL: fix "
            "AWS_ENDPOINT_URL (for example http://127.0.0.1:7480)"
        )
    addressing = inherited("RIVERBED_S3_ADDRESSING", env).lower()
    if addressing not in ("", "path", "virtual"):
        raise StorageValueError(
            f"RIVERBED_S3_ADDRESSING={addressing!r}: use 'path' or 'virtual' (or leave it unset)"
        )
    # path-style for an endpoint at an IP address or localhost (no DNS name per
    # bucket there), virtual-hosted otherwise unless RIVERBED_S3_ADDRESSING=path
    path_style = addressing == "path" or (
        addressing == "" and endpoint is not None and _literal_host(endpoint)
    )
    anonymous = env.get("AWS_SKIP_SIGNATURE", "").lower() in ("1", "true")
    return S3Settings(
        endpoint=endpoint,
        region=env.get("AWS_REGION")
        or env.get("AWS_DEFAULT_REGION")
        or config.get("region")
        or "us-east-1",
        access_key=env.get("AWS_ACCESS_KEY_ID") or creds.get("aws_access_key_id"),
        secret_key=env.get("AWS_SECRET_ACCESS_KEY") or creds.get("aws_secret_access_key"),
        session_token=env.get("AWS_SESSION_TOKEN") or creds.get("aws_session_token"),
        path_style=path_style,
        anonymous=anonymous,
    )


def bucket_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of the AWS settings chain set here (``AWS_*``) and riverbed's
    inherited bucket settings (riverbed.config): what another process needs to reach a
    bucket as this one does. Holds secrets: never print or log it."""
    env = os.environ if env is None else env
    aws = {k: v for k, v in env.items() if k.startswith("AWS_")}
    ours = {k: v for k, v in inherited_environment(env).items() if k in _BUCKET_SETTINGS}
    return aws | ours


_BUCKET_SETTINGS = ("RIVERBED_S3_ADDRESSING", "RIVERBED_STORAGE_WAIT")


CHECKSUMS = "AWS_REQUEST_CHECKSUM_CALCULATION"


def checksums_when_required(settings: S3Settings) -> None:
    """For a server of one's own (an endpoint that is not AWS): ask the AWS SDKs in this
    process for request checksums only where an operation requires them. Their default
    since 2025 — every upload ``aws-chunked`` with a trailing CRC — is refused by servers
    older than it (Ceph RGW 16 answers each part upload of pyarrow's S3 client, behind
    pyiceberg, with ``411 MissingContentLength``). ``AWS_REQUEST_CHECKSUM_CALCULATION`` is
    the SDKs' own setting: one the user set is kept."""
    endpoint = settings.endpoint or ""
    if endpoint and ".amazonaws.com" not in endpoint:
        os.environ.setdefault(CHECKSUMS, "WHEN_REQUIRED")
