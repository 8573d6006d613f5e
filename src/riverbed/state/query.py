"""Queryable state: read a namespace's state, live, as Arrow record batches.

Reads go through durable storage into a private temporary local directory, so they
never take the lock of a partition a running job holds, and they see exactly a
committed version (per partition: the newest at or before the requested one).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pyarrow as pa

from riverbed.state.provider import StateProvider

SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("version", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
    ]
)


def read_state(
    provider: StateProvider,
    namespace: str,
    version: int | None = None,
    *,
    partitions: list[int] | None = None,
    prefix: bytes = b"",
    batch_rows: int = 65_536,
) -> Iterator[pa.RecordBatch]:
    """Yield the namespace's key/value pairs as record batches of :data:`SCHEMA`."""
    tmp = Path(tempfile.mkdtemp(prefix="riverbed-read-"))
    try:
        reader = StateProvider(replace(provider.config, local_dir=tmp))
        for partition in partitions if partitions is not None else provider.partitions(namespace):
            store = reader.load(namespace, partition, version)
            try:
                keys: list[bytes] = []
                values: list[bytes] = []
                for key, value in store.scan(prefix):
                    keys.append(key)
                    values.append(value)
                    if len(keys) >= batch_rows:
                        yield _batch(partition, store.version, keys, values)
                        keys, values = [], []
                if keys:
                    yield _batch(partition, store.version, keys, values)
            finally:
                store.abort()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _batch(partition: int, version: int, keys: list[bytes], values: list[bytes]) -> pa.RecordBatch:
    n = len(keys)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([partition] * n, pa.int32()),
            pa.array([version] * n, pa.int64()),
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
        ],
        schema=SCHEMA,
    )


def read_table(provider: StateProvider, namespace: str, version: int | None = None) -> pa.Table:
    """The whole namespace as one Arrow table."""
    return pa.Table.from_batches(list(read_state(provider, namespace, version)), schema=SCHEMA)
