"""Spark's own ``s3a://`` connector, for where Spark itself reads or writes a bucket.

riverbed moves its own objects through :mod:`riverbed.storage`; where *Spark* writes to
a bucket — the offset and commit logs of a Structured Streaming query whose checkpoint
is in a bucket — it does so through Hadoop's S3A connector (``hadoop-aws`` and the AWS
SDK v2 bundle), not through anything riverbed wrote. ``riverbed setup jars`` fetches
those jars from Maven Central into the jar cache (:mod:`riverbed.spark.jars`, at the
Hadoop version PySpark bundles); :func:`riverbed.spark.session` puts them on the
driver's class path and sets S3A from the same AWS settings chain riverbed's own
storage reads (:func:`riverbed.storage.s3.settings_from_env`).

No key or token is ever copied into Spark's configuration (Spark shows it in its UI
and logs): S3A finds them itself, in the same environment variables or profile files,
through its credential providers.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from riverbed.errors import RiverbedError
from riverbed.locations import is_local
from riverbed.spark.jars import ENV, jar_dir, jars
from riverbed.storage.s3 import settings_from_env

__all__ = ["S3AUnavailableError", "conf", "configure", "require", "to_s3a"]

# where S3A looks for credentials, in order: keys :func:`configure` set on a running
# session (from the chain riverbed's storage reads), the same places that chain reads
# (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_SESSION_TOKEN, then AWS_PROFILE's files),
# then the instance's role
_PROVIDERS = ",".join(
    (
        "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider",
        "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider",
        "software.amazon.awssdk.auth.credentials.ProfileCredentialsProvider",
        "org.apache.hadoop.fs.s3a.auth.IAMInstanceCredentialsProvider",
    )
)
_ANONYMOUS = "org.apache.hadoop.fs.s3a.AnonymousAWSCredentialsProvider"


class S3AUnavailableError(RiverbedError):
    """Spark was asked to use a bucket and the S3A jars are not in the jar cache."""


def require() -> None:
    """Raise :class:`S3AUnavailableError` (naming the fix) when the cache has no S3A."""
    if not jars():
        raise S3AUnavailableError(
            f"Spark needs Hadoop's S3A connector to use a bucket, and the jar cache "
            f"{jar_dir()} has no hadoop-aws jar: run `riverbed setup jars` (it fetches "
            f"hadoop-aws and the AWS SDK bundle from Maven Central), or set {ENV} to a "
            "directory that has them"
        )


def configure_for(spark: Any, location: str | Path) -> None:
    """:func:`configure` when Spark will write at ``location`` through ``s3a://`` (a
    bucket); nothing for a directory."""
    if not is_local(location):
        configure(spark)


def configure(spark: Any) -> None:
    """Set S3A on a running session from the AWS settings as they are *now*: the
    session may have started before they were set (a long-lived session, a test's), and
    its JVM reads only the environment it started with. The keys go into the session's
    Hadoop configuration in memory (never Spark's own settings; Spark redacts
    ``*.access.key``/``*.secret.key`` wherever it shows Hadoop's).
    Raises :class:`S3AUnavailableError` when the jars are not on its class path."""
    require()
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in conf().items():
        hadoop.set(key.removeprefix("spark.hadoop."), value)
    s = settings_from_env()
    for key, secret in (
        ("fs.s3a.access.key", s.access_key),
        ("fs.s3a.secret.key", s.secret_key),
        ("fs.s3a.session.token", s.session_token),
    ):
        if secret:
            hadoop.set(key, secret)
        else:
            hadoop.unset(key)


def to_s3a(url: str) -> str:
    """A bucket's ``s3://bucket/key`` as Hadoop names it (``s3a://bucket/key``); any
    other location unchanged."""
    if urlsplit(url).scheme != "s3":
        return url
    return "s3a://" + url.split("://", 1)[1]


def conf(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Spark settings (``spark.hadoop.fs.s3a.*``) for the bucket the AWS settings name:
    endpoint, region, path-style addressing (as riverbed's storage chooses it) and the
    credential providers — never a key."""
    s = settings_from_env(env)
    out = {
        "spark.hadoop.fs.s3a.endpoint.region": s.region,
        "spark.hadoop.fs.s3a.path.style.access": str(s.path_style).lower(),
        "spark.hadoop.fs.s3a.aws.credentials.provider": _ANONYMOUS if s.anonymous else _PROVIDERS,
    }
    if s.endpoint is not None:
        out["spark.hadoop.fs.s3a.endpoint"] = s.endpoint
        out["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(
            s.endpoint.startswith("https://")
        ).lower()
        # A server of one's own (not AWS): sign the whole payload in one piece. The SDK's
        # default over http is aws-chunked signing, which Ceph RGW 16 rejects for an
        # empty PUT (XAmzContentSHA256Mismatch on every directory marker); over https
        # this signer sends UNSIGNED-PAYLOAD, as AWS itself is used.
        out["spark.hadoop.fs.s3a.signing-algorithm"] = "AWS4UnsignedPayloadSignerType"
    return out
