"""The S3 backend's settings, errors and outages, against the tests' Ceph RGW."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from riverbed.storage import (
    StorageAccessError,
    StorageUnavailableError,
    StorageValueError,
    open_store,
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
from riverbed.storage.s3 import S3ObjectStore, redact, settings_from_env
from riverbed.testing import CephS3Server

ENV = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "s3cr3t/k3y+"}


# -- settings: pure -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "path_style"),
    [
        ("http://127.0.0.1:7480", True),
        ("http://localhost:9000", True),
        ("http://[::1]:9000", True),
        ("https://minio.internal.example:9000", False),
        (None, False),
    ],
)
def test_path_style_is_automatic_for_addresses_and_localhost(
    endpoint: str | None, path_style: bool, tmp_path: Path
) -> None:
    env = ENV | {"HOME": str(tmp_path)}
    if endpoint:
        env["AWS_ENDPOINT_URL"] = endpoint
    assert settings_from_env(env).path_style is path_style
    assert settings_from_env(env | {"RIVERBED_S3_ADDRESSING": "path"}).path_style is True


def test_the_aws_chain_env_then_profile(tmp_path: Path) -> None:
    aws = tmp_path / ".aws"
    aws.mkdir()
    (aws / "credentials").write_text(
        "[default]\naws_access_key_id = DEFKEY\naws_secret_access_key = defsecret\n"
        "[ci]\naws_access_key_id = CIKEY\naws_secret_access_key = cisecret\n"
    )
    (aws / "config").write_text(
        "[profile ci]\nregion = eu-west-1\nendpoint_url = http://127.0.0.1:9\n"
    )
    home = {"HOME": str(tmp_path)}
    s = settings_from_env(home)
    assert (s.access_key, s.secret_key, s.region, s.endpoint) == (
        "DEFKEY",
        "defsecret",
        "us-east-1",
        None,
    )
    s = settings_from_env(home | {"AWS_PROFILE": "ci"})
    assert (s.access_key, s.region, s.endpoint) == ("CIKEY", "eu-west-1", "http://127.0.0.1:9")
    s = settings_from_env(home | {"AWS_PROFILE": "ci"} | ENV | {"AWS_REGION": "ap-south-1"})
    assert (s.access_key, s.region) == ("AKIDEXAMPLE", "ap-south-1")  # env first
    with pytest.raises(StorageValueError, match="AWS_PROFILE='nope'"):
        settings_from_env(home | {"AWS_PROFILE": "nope"})
    assert "s3cr3t" not in repr(settings_from_env(home | ENV))


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("s3://", "not an S3 location"),
        ("s3://bucket?region=x", "s3://<bucket>/<prefix> only"),
        ("s3://KEY:secret@bucket/p", "take the credentials out"),
        ("gs://bucket/p", "unknown storage scheme 'gs'"),
        ("gs://KEY:secret@bucket/p", "unknown storage scheme 'gs'"),
    ],
)
def test_bad_locations_say_what_to_write(
    url: str, match: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(StorageValueError, match=match) as caught:
        open_store(url)
    assert "secret" not in str(caught.value).replace("'secret'", "")  # never echoed back


def test_no_credentials_anywhere_stops_before_any_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(StorageAccessError, match="no AWS credentials for s3://b/p: set"):
        open_store("s3://b/p")


@given(st.integers(0, 100), st.floats(0, 0.999999))
def test_backoff_is_full_jitter_under_a_cap(attempt: int, u: float) -> None:
    delay = backoff(attempt, u)
    assert 0 <= delay <= 5.0
    assert delay <= 0.1 * 2**attempt
    assert backoff(attempt, 0.0) == 0.0


@pytest.mark.parametrize(
    ("text", "kind", "expected"),
    [
        (
            "Server returned non-2xx status code: 503 Service Unavailable: <Code>SlowDown</Code>",
            "GenericError",
            TRANSIENT,
        ),
        ("status code: 500 Internal Server Error", "GenericError", TRANSIENT),
        ("HTTP error: error sending request", "GenericError", TRANSIENT),
        ("operation timed out", "GenericError", TRANSIENT),
        ("status code: 404 Not Found: <Code>NoSuchBucket</Code>", "FileNotFoundError", ACCESS),
        ("status code: 404 Not Found: <Code>NoSuchKey</Code>", "FileNotFoundError", MISSING),
        (
            "status code: 403 Forbidden: <Code>SignatureDoesNotMatch</Code>",
            "PermissionDeniedError",
            ACCESS,
        ),
        ("Object already exists", "AlreadyExistsError", EXISTS),
        (
            "status code: 416 Range Not Satisfiable: <Code>InvalidRange</Code>",
            "GenericError",
            PAST_END,
        ),
    ],
)
def test_failures_are_sorted_by_what_retrying_can_do(text: str, kind: str, expected: str) -> None:
    assert classify(text, kind) == expected


def test_redaction_removes_keys_and_signature_material() -> None:
    text = (
        "403: <Error><Code>SignatureDoesNotMatch</Code><StringToSign>AWS4 AKIDEXAMPLE"
        "</StringToSign><CanonicalRequest>GET /</CanonicalRequest></Error> "
        "Credential=AKIDEXAMPLE/20261125/us-east-1/s3, Signature=abcdef s3cr3t/k3y+"
    )
    out = redact(text, ["AKIDEXAMPLE", "s3cr3t/k3y+"])
    for secret in ("AKIDEXAMPLE", "s3cr3t/k3y+", "abcdef", "StringToSign", "GET /"):
        assert secret not in out
    assert "SignatureDoesNotMatch" in out


# -- against the server ----------------------------------------------------------------


@pytest.mark.s3
def test_a_missing_bucket_is_one_line_naming_it(s3_url: str, s3_server: CephS3Server) -> None:
    store = open_store("s3://no-such-bucket-here/p")
    with pytest.raises(StorageAccessError) as caught:
        store.put("k", b"x")
    message = str(caught.value)
    assert "the bucket 'no-such-bucket-here' does not exist at http://127.0.0.1:" in message
    assert "create it" in message and "\n" not in message


@pytest.mark.s3
@pytest.mark.parametrize("wrong", ["AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID"])
def test_wrong_credentials_name_the_setting_and_never_the_secret(
    s3_url: str,
    s3_server: CephS3Server,
    wrong: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    bad = "WRONGwrongWRONG1234567890abcdef"
    monkeypatch.setenv(wrong, bad)
    store = open_store(s3_url)
    with caplog.at_level(logging.DEBUG), pytest.raises(StorageAccessError) as caught:
        store.put("k", b"x")
    message = str(caught.value)
    assert wrong in message
    for secret in (bad, s3_server.secret_key, s3_server.access_key):
        assert secret not in message and secret not in repr(store)
        assert secret not in caplog.text


@pytest.mark.s3
def test_an_endpoint_that_never_answers_gives_up_after_the_wait(
    s3_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from riverbed.testing import free_port

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    store = S3ObjectStore(s3_url, wait=1.5)
    began = time.monotonic()
    with caplog.at_level(logging.WARNING), pytest.raises(StorageUnavailableError) as caught:
        store.get("k")
    assert 1.5 <= time.monotonic() - began < 10
    assert "did not answer for 2s" in str(caught.value) or "did not answer for 1s" in str(
        caught.value
    )
    assert "RIVERBED_STORAGE_WAIT" in str(caught.value)
    assert "retrying for up to" in caplog.text  # the stall is logged while it lasts


@pytest.mark.s3
@pytest.mark.slow
def test_an_outage_of_the_store_stalls_a_write_which_then_lands(
    s3_url: str, s3_server: CephS3Server, caplog: pytest.LogCaptureFixture
) -> None:
    store = open_store(s3_url)
    store.put("before", b"1")
    s3_server.stop_gateway()
    done = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        try:
            store.put("during", b"2")
        except BaseException as exc:
            errors.append(exc)
        done.set()

    with caplog.at_level(logging.WARNING):
        writer = threading.Thread(target=write)
        writer.start()
        time.sleep(8)
        assert not done.is_set()  # stalled, not failed
        s3_server.start_gateway()
        writer.join(60)
    assert done.is_set() and not errors, errors
    assert store.get("during") == b"2" and store.get("before") == b"1"
    assert "retrying for up to" in caplog.text


@pytest.mark.s3
def test_the_state_commands_read_state_in_a_bucket(
    s3_url: str, s3_server: CephS3Server, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """`riverbed state ls/describe/verify --checkpoints s3://…` as a user runs them:
    the state a provider wrote to the bucket, no secret in any output."""
    from riverbed.state import StateConfig, StateProvider
    from riverbed.stream.layout import state_url
    from tests.cli import run_cli

    provider = StateProvider(
        StateConfig(local_dir=tmp_path / "writer", durable=state_url(s3_url), snapshot_every=2)
    )
    for version in range(1, 6):
        store = provider.load("clicks", 1, version - 1)
        store.put(b"k%d" % version, b"v")
        store.commit(version)
    env = subprocess_env | s3_server.env() | {"RIVERBED_HOME": str(tmp_path / "home")}
    listed = run_cli("state", "ls", "--checkpoints", s3_url, "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert '"namespace": "clicks"' in listed.stdout and '"latest_version": 5' in listed.stdout
    described = run_cli("state", "describe", "clicks", "--checkpoints", s3_url, env=env)
    assert described.returncode == 0 and "clicks" in described.stdout, described.stderr
    verified = run_cli("state", "verify", "--checkpoints", s3_url, env=env)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    for result in (listed, described, verified):
        for secret in (s3_server.secret_key, s3_server.access_key):
            assert secret not in result.stdout + result.stderr
    wrong = run_cli("state", "ls", "--checkpoints", "s3://no-such-bucket-cli/p", env=env)
    assert wrong.returncode != 0
    assert "the bucket 'no-such-bucket-cli' does not exist" in wrong.stderr
    assert "Traceback" not in wrong.stderr


@pytest.mark.parametrize(
    ("endpoint", "preset", "want"),
    [
        ("http://127.0.0.1:7480", None, "WHEN_REQUIRED"),  # a server of one's own
        ("https://s3.eu-west-3.amazonaws.com", None, None),  # AWS: the SDKs' default
        (None, None, None),
        ("http://127.0.0.1:7480", "WHEN_SUPPORTED", "WHEN_SUPPORTED"),  # the user's, kept
    ],
)
def test_sdk_checksums_are_asked_only_where_required_of_a_server_of_ones_own(
    monkeypatch: pytest.MonkeyPatch, endpoint: str | None, preset: str | None, want: str | None
) -> None:
    from riverbed.storage.awschain import CHECKSUMS, S3Settings, checksums_when_required

    monkeypatch.setenv(CHECKSUMS, preset or "")  # restored (removed) when the test ends
    if preset is None:
        monkeypatch.delenv(CHECKSUMS)
    checksums_when_required(S3Settings(endpoint=endpoint, region="us-east-1"))
    assert os.environ.get(CHECKSUMS) == want
