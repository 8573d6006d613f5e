"""Spark's own s3a:// (riverbed.spark.s3a): the jar cache matches PySpark's Hadoop, and
S3A's settings follow the AWS chain riverbed's storage reads — without a key in them."""

from __future__ import annotations

from pathlib import Path

import pyspark
import pytest
from hypothesis import given
from hypothesis import strategies as st

from riverbed.spark import jars, s3a
from riverbed.storage.errors import StorageValueError

KEYS = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE1234", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG"}


@pytest.mark.setup
def test_the_jar_cache_has_hadoop_aws_at_pysparks_hadoop_version() -> None:
    bundled = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar"))
    assert bundled, "PySpark bundles no hadoop-client-api jar"
    version = bundled[0].name.removeprefix("hadoop-client-api-").removesuffix(".jar")
    names = [p.name for p in jars.jars()]
    assert f"hadoop-aws-{version}.jar" in names, names
    assert any(n.startswith("bundle-") for n in names), "no AWS SDK bundle beside hadoop-aws"


def test_without_hadoop_aws_a_bucket_asks_for_setup_jars(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "other.jar").write_bytes(b"")
    monkeypatch.setenv(jars.ENV, str(tmp_path))
    assert jars.jars() == []
    with pytest.raises(s3a.S3AUnavailableError, match="riverbed setup jars"):
        s3a.require()


hosts = st.sampled_from(["127.0.0.1", "localhost", "10.1.2.3", "[::1]", "s3.example.org"])


@given(host=hosts, port=st.integers(1, 65535), https=st.booleans(), keys=st.booleans())
def test_s3a_settings_follow_the_endpoint_and_never_hold_a_key(
    host: str, port: int, https: bool, keys: bool
) -> None:
    endpoint = f"{'https' if https else 'http'}://{host}:{port}"
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_REGION": "eu-west-3", "HOME": "/nonexistent"}
    conf = s3a.conf(env | (KEYS if keys else {}))
    assert conf["spark.hadoop.fs.s3a.endpoint"] == endpoint
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-3"
    literal = host != "s3.example.org"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == str(literal).lower()
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == str(https).lower()
    text = repr(conf)
    assert all(secret not in text for secret in KEYS.values())
    assert "access.key" not in text and "secret.key" not in text


def test_aws_itself_gets_virtual_hosts_and_the_sdks_own_signing() -> None:
    conf = s3a.conf({"AWS_REGION": "us-west-2", "HOME": "/nonexistent"})
    assert "spark.hadoop.fs.s3a.endpoint" not in conf
    assert "spark.hadoop.fs.s3a.signing-algorithm" not in conf
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "false"
    anonymous = s3a.conf({"AWS_SKIP_SIGNATURE": "true", "HOME": "/nonexistent"})
    provider = anonymous["spark.hadoop.fs.s3a.aws.credentials.provider"]
    assert provider.endswith("AnonymousAWSCredentialsProvider")


def test_a_bad_endpoint_is_named_with_the_fix() -> None:
    with pytest.raises(StorageValueError, match="AWS_ENDPOINT_URL"):
        s3a.conf({"AWS_ENDPOINT_URL": "ftp://127.0.0.1:21", "HOME": "/nonexistent"})


def test_bucket_urls_become_s3a_and_paths_stay() -> None:
    assert s3a.to_s3a("s3://b/p/flags/spark") == "s3a://b/p/flags/spark"
    assert s3a.to_s3a("/tmp/x/spark") == "/tmp/x/spark"
    assert s3a.to_s3a("file:///tmp/x") == "file:///tmp/x"
