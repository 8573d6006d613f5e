"""The run manifest (riverbed/job.json) is a description: missing or damaged reads as
none, but a bucket that cannot be read is the error it is, not "no manifest"."""

from __future__ import annotations

import pytest

from riverbed.storage import StorageAccessError
from riverbed.stream.layout import MANIFEST, checkpoint_store
from riverbed.stream.specjob import read_manifest

pytestmark = [pytest.mark.s3]


def test_missing_or_damaged_is_none_and_an_unreadable_bucket_is_an_error(
    s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = f"{s3_url}/flags"
    assert read_manifest(checkpoint) is None
    store = checkpoint_store(checkpoint)
    store.put(MANIFEST, b'{"name": "flags", "topic": "events"}')
    assert read_manifest(checkpoint) == {"name": "flags", "topic": "events"}
    store.put(MANIFEST, b"{damaged")
    assert read_manifest(checkpoint) is None
    store.put(MANIFEST, b"[1, 2]")
    assert read_manifest(checkpoint) is None

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "WRONGwrongWRONG1234567890abcdef")
    with pytest.raises(StorageAccessError, match="AWS_SECRET_ACCESS_KEY"):
        read_manifest(checkpoint)
