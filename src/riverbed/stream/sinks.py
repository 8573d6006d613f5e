"""Result sinks besides the Parquet table: SQL tables and riverbed topics.

**SQL** (SQLite or PostgreSQL), upserted per batch. Rows are keyed by
(window_start, key); a session merged into another is deleted. An upsert only
replaces a row written by the same or an earlier batch (``WHERE stored.batch_id <=
new.batch_id``), so re-running a batch is harmless and a late retry of an old batch
never overwrites newer results. Identifiers are validated names; values always
travel as parameters.

**Topic**: each batch's rows become records of a riverbed topic (key = the
aggregation key, value = the row as JSON with its ``batch_id`` and its window; a
session merged away is a record with ``"deleted": true`` and its window's start), so
downstream consumers and groups follow results as a stream. A result record's
timestamp is when it was written, never its window's time: a topic's retention counts
from its records' timestamps (Kafka's, a diskless topic's), and results of old windows
— a backfill, a replay — would be deleted as soon as they were written.

**Kafka topic** (``kafka://<bootstrap>/<topic>``): the same records, written by Kafka's
transactional producer — see :class:`KafkaSink`.
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
import time
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pandas as pd
import pyarrow as pa

from riverbed.errors import ConfigError
from riverbed.stream.aggregation import DELETED
from riverbed.stream.errors import StreamValueError

log = logging.getLogger(__name__)

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,62}$")  # quoted: a version's "flags-v2" too


def _ident(name: str) -> str:
    if not _IDENT.match(name):
        raise ConfigError(f"{name!r} is not a valid SQL table or column name")
    return f'"{name}"'


def _sql_type(dtype: Any, postgres: bool) -> str:
    kind = getattr(dtype, "kind", "O")
    if str(dtype).startswith("datetime64"):
        return "TIMESTAMPTZ" if postgres else "TEXT"
    if kind == "b":
        return "BOOLEAN" if postgres else "INTEGER"
    if kind in "iu":
        return "BIGINT" if postgres else "INTEGER"
    if kind == "f":
        return "DOUBLE PRECISION" if postgres else "REAL"
    return "TEXT"


class SqlSink:
    """``sqlite:///path.db`` (SQLAlchemy-style, as for the control plane) or
    ``postgresql://user@host:port/db``."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme == "sqlite":
            path = parts.path[1:] if parts.path.startswith("/") else parts.path
            if not path:
                raise ConfigError(f"{url}: no database path; e.g. sqlite:///results.db")
            self.postgres = False
            self.path = Path(path)
        elif parts.scheme in ("postgresql", "postgres"):
            self.postgres = True
        else:
            raise ConfigError(
                f"unsupported SQL sink {url!r}; use sqlite:///path.db or postgresql://…"
            )
        self.url = url

    def _connect(self) -> Any:
        if self.postgres:
            try:
                import psycopg
            except ImportError:
                raise ConfigError(
                    "the PostgreSQL sink needs psycopg: pip install 'riverbed[postgres]'"
                ) from None
            return psycopg.connect(self.url)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return sqlite3.connect(self.path)

    def upsert(self, table: str, frame: pd.DataFrame) -> int:
        """Insert or replace rows of ``frame`` (must have window_start, key, batch_id);
        a tombstone row (``deleted``: a session merged away) deletes its row instead,
        if the stored row is not newer. Returns the rows written or deleted."""
        if frame.empty:
            return 0
        if DELETED in frame.columns:
            gone = frame[DELETED].fillna(False).astype(bool).to_numpy()
            deleted = self._delete(table, frame[gone]) if gone.any() else 0
            return deleted + self.upsert(table, frame[~gone].drop(columns=[DELETED]))
        columns = list(frame.columns)
        for required in ("window_start", "key", "batch_id"):
            if required not in columns:
                raise StreamValueError(f"result rows need a {required!r} column")
        names = [_ident(c) for c in columns]
        target = _ident(table)
        ddl = (
            f"CREATE TABLE IF NOT EXISTS {target} ("
            + ", ".join(
                f"{n} {_sql_type(frame[c].dtype, self.postgres)}"
                for n, c in zip(names, columns, strict=True)
            )
            + ', PRIMARY KEY ("window_start", "key"))'
        )
        rows = [
            tuple(_value(v, self.postgres) for v in row)
            for row in frame.itertuples(index=False, name=None)
        ]
        with self._connect() as conn:
            conn.execute(ddl)
            have = self._columns(conn, table)
            # a column the table lacks (a metric added and backfilled: stream/
            # backfill.py) is added to it, as the Parquet result table's files grow
            for n, c in zip(names, columns, strict=True):
                if c not in have:
                    kind = _sql_type(frame[c].dtype, self.postgres)
                    conn.execute(f"ALTER TABLE {target} ADD COLUMN {n} {kind}")
            # a column the rows lack (a metric removed from the running aggregation,
            # stream/changes.py) is null in the rows written from now on, as in the
            # Parquet result table — never a stale value beside newer counts
            gone = [c for c in have if c not in columns]
            sets = [
                f"{n} = excluded.{n}"
                for n, c in zip(names, columns, strict=True)
                if c not in ("window_start", "key")
            ] + [f"{_ident(c)} = NULL" for c in gone]
            dml = self._dml(target, names, ", ".join(sets))
            if self.postgres:
                with conn.cursor() as cur:
                    cur.executemany(dml, rows)
            else:
                conn.executemany(dml, rows)
        return len(rows)

    def _dml(self, target: str, names: list[str], updates: str) -> str:
        mark = "%s" if self.postgres else "?"
        return (
            f"INSERT INTO {target} ({', '.join(names)}) VALUES ({', '.join([mark] * len(names))}) "  # noqa: S608 - identifiers validated by _ident, values are parameters
            f'ON CONFLICT ("window_start", "key") DO UPDATE SET {updates} '
            f'WHERE {target}."batch_id" <= excluded."batch_id"'
        )

    def _columns(self, conn: Any, table: str) -> list[str]:
        """The columns the table has now."""
        if self.postgres:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT column_name FROM information_schema.columns "
                    "WHERE table_name = %s AND table_schema = current_schema()",
                    (table,),
                )
                return [r[0] for r in cur.fetchall()]
        return [r[1] for r in conn.execute(f"PRAGMA table_info({_ident(table)})")]

    def _delete(self, table: str, frame: pd.DataFrame) -> int:
        mark = "%s" if self.postgres else "?"
        dml = (
            f"DELETE FROM {_ident(table)} WHERE window_start = {mark} AND key = {mark} "  # noqa: S608 - identifier validated, values are parameters
            f"AND batch_id <= {mark}"
        )
        rows = [
            tuple(_value(v, self.postgres) for v in row)
            for row in frame[["window_start", "key", "batch_id"]].itertuples(index=False, name=None)
        ]
        with self._connect() as conn:
            if self.postgres:
                with conn.cursor() as cur:
                    cur.executemany(dml, rows)
            else:
                conn.executemany(dml, rows)
        return len(rows)

    def read(self, table: str) -> pd.DataFrame:
        with self._connect() as conn:
            cur = conn.execute(f"SELECT * FROM {_ident(table)} ORDER BY window_start, key")  # noqa: S608
            cols = [d[0] for d in cur.description]
            return pd.DataFrame(cur.fetchall(), columns=cols)


def _value(v: Any, postgres: bool) -> Any:
    if v is pd.NaT:  # a missing time (a `<metric>_since` where nothing is missing)
        return None
    if isinstance(v, pd.Timestamp):
        return v.to_pydatetime() if postgres else v.isoformat()
    if isinstance(v, list | tuple | dict | np.ndarray):
        return json.dumps(plain(v))  # TopK's pairs: JSON text in a TEXT column
    if hasattr(v, "item"):  # numpy scalars
        return v.item()
    return v


class TopicSink:
    """Exactly once per batch into a riverbed topic, with the driver as its only writer.

    A batch's rows are appended as one atomic log batch per partition. A partition whose
    last record already carries this batch id (or a later one) is skipped, so a re-run
    after a crash between two partitions' appends writes only what is missing.
    """

    def __init__(
        self, log_url: str, topic: str, partitions: int = 1, schema: pa.Schema | None = None
    ) -> None:
        """``schema``: a topic created here is typed with its columns and ``batch_id``
        when every column's type is one a topic can carry (riverbed.log.schema; else it
        holds JSON records, as without one); an existing topic is written as it is."""
        import riverbed.log

        self.log = riverbed.log.open(log_url)
        self.topic = topic
        if topic not in self.log.topics():
            self.log.create_topic(topic, partitions, schema=_typed(schema))

    def write(self, batch_id: int, rows: pd.DataFrame, keys: list[str] | None = None) -> int:
        """Append the batch's rows (keyed by their ``key`` column, or by ``keys``);
        returns how many records were written now."""
        from riverbed.log.records import RawRecord

        producer = self.log.producer(self.topic)
        by_partition: dict[int, list[RawRecord]] = {}
        for key, value in result_records(batch_id, rows, keys):
            partition, raw = producer.record(value, key=key)  # stamped now: see the module
            by_partition.setdefault(partition, []).append(raw)
        written = 0
        for partition, records in sorted(by_partition.items()):
            if self._last_batch(partition) >= batch_id:
                continue  # this batch (or a newer one) already reached this partition
            self.log.storage.append(self.topic, partition, records)
            written += len(records)
        return written

    def write_table(self, batch_id: int, table: pa.Table, key: str) -> int:
        """Append the batch's rows (an Arrow table, keyed by its column ``key``) — as
        typed columns when the topic is typed with the table's columns (what a
        ``schema`` given to the sink makes), without a Python object per row; else as
        :meth:`write` does. Exactly once per partition as :meth:`write`."""
        n = table.num_rows
        ids = pa.array(np.full(n, batch_id, dtype=np.int64))
        if "batch_id" in table.column_names:
            table = table.set_column(table.column_names.index("batch_id"), "batch_id", ids)
        else:
            table = table.append_column("batch_id", ids)
        producer = self.log.producer(self.topic)
        partitions = producer.column_partitions(table, key) if n else None
        if partitions is None:
            keys = [str(k) for k in table.column(key).to_pylist()]
            return self.write(batch_id, table.to_pandas(), keys=keys)
        due = [p for p in np.unique(partitions).tolist() if self._last_batch(p) < batch_id]
        rows = np.flatnonzero(np.isin(partitions, due))
        if len(rows):  # (a partition this batch already reached is skipped)
            producer.send_batch(table.take(pa.array(rows)), key_field=key)
        return len(rows)

    def _last_batch(self, partition: int) -> int:
        start, end = self.log.storage.offsets(self.topic, partition)
        if end == start:
            return -1
        last = self.log.read(self.topic, partition, end - 1, 1)
        value = last[0].value if last else None
        return int(value.get("batch_id", -1)) if isinstance(value, dict) else -1

    def close(self) -> None:
        self.log.close()


def _typed(schema: pa.Schema | None) -> str | None:
    """The DDL a results topic is created with: ``schema``'s columns and ``batch_id``,
    or None (JSON records) without one or with a type a topic cannot carry."""
    from riverbed.log.schema import SchemaError, schema_ddl

    if schema is None:
        return None
    fields = [f for f in schema if f.name != "batch_id"]
    try:
        return schema_ddl(pa.schema([*fields, pa.field("batch_id", pa.int64())]))
    except SchemaError:
        return None


class KafkaSinkError(StreamValueError):
    """A Kafka results topic that cannot be written; the message names the fix."""


RETRY_S = 120.0  # how long a Kafka sink keeps a batch going through passing failures
# A results topic riverbed creates keeps its records (as the result table does) and is
# stamped by the brokers when they append (docs/kafka.md, "The results topic's settings")
RESULTS_TOPIC_CONFIG = {"retention.ms": "-1", "message.timestamp.type": "LogAppendTime"}
MARKERS = ".riverbed-batches"  # beside a Kafka results topic: its last written batch id


class KafkaSink:
    """Exactly once per batch into a Kafka topic, for ``read_committed`` consumers.

    Each batch is one Kafka transaction holding its rows (key = the aggregation key,
    value = the row as JSON with its ``batch_id``, timestamp = when it was written) and a
    marker — ``{"batch_id": b}`` — in the compacted topic ``<topic>.riverbed-batches``.
    A batch replayed after a crash between the transaction's commit and the batch's own
    commit finds its marker and writes nothing; a driver killed inside the transaction
    leaves it open until the next driver's producer, with the same ``transactional.id``
    (``riverbed.<aggregation>.<topic>``), starts: Kafka aborts it then, and fences the
    old producer, so a paused driver that wakes up cannot commit. (Keys + batch ids for
    readers to deduplicate would push the work to every consumer; Kafka's transactions
    keep it in one place.)
    """

    def __init__(self, label: str, aggregation: str, partitions: int = 1) -> None:
        self.commit_s = 60.0  # how long a commit (or an abort) may take
        from riverbed.stream import kafkasource as kafka

        self.bootstrap, self.topic = kafka.parse_label(label)
        self.label = label
        self.markers = self.topic + MARKERS
        self._ensure_topics(partitions)
        from confluent_kafka import KafkaException, Producer

        self.producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "transactional.id": f"riverbed.{aggregation}.{self.topic}",
                "acks": "all",
                "linger.ms": 5,
                "log_level": 2,
            }
        )
        try:  # aborts what a killed predecessor left open, and fences it
            self.producer.init_transactions(30)
        except KafkaException as exc:
            raise KafkaSinkError(
                f"Kafka results topic {label}: the transactional producer could not start "
                f"({_reason(exc)}); check that the brokers are up and allow transactions"
            ) from None
        # read once: from here on only this producer can commit (a newer one fences it)
        self._last = self.last_batch()

    def _ensure_topics(self, partitions: int) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 2})
        try:
            have = admin.list_topics(timeout=10).topics
        except Exception as exc:
            raise KafkaSinkError(
                f"no Kafka broker answered at {self.bootstrap} within 10 s "
                f"({type(exc).__name__}); check the results topic's address"
            ) from None
        wanted = []
        if self.topic not in have:
            wanted.append(NewTopic(self.topic, partitions, config=dict(RESULTS_TOPIC_CONFIG)))
        else:
            self._check_retention(admin)
        if self.markers not in have:
            wanted.append(NewTopic(self.markers, 1, config={"cleanup.policy": "compact"}))
        for name, future in admin.create_topics(wanted).items() if wanted else []:
            try:
                future.result(30)
            except Exception as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc):  # another driver made it
                    raise KafkaSinkError(
                        f"could not create Kafka topic {name!r} at {self.bootstrap} "
                        f"({_reason(exc)}); create it yourself or allow riverbed to"
                    ) from None

    def _check_retention(self, admin: Any) -> None:
        """Warn when an existing results topic deletes records by age: what it will
        delete, and how to keep them (riverbed's own result table keeps them all)."""
        from confluent_kafka.admin import ConfigResource  # type: ignore[attr-defined]

        resource = ConfigResource("topic", self.topic)
        try:
            configs = admin.describe_configs([resource])[resource].result(10)
        except Exception as exc:  # not allowed to describe it: say so, do not stop
            log.warning(
                "Kafka results topic %s: its retention could not be read (%s)",
                self.label,
                _reason(exc),
            )
            return
        words = retention_warning(
            self.label,
            {name: entry.value for name, entry in configs.items()},
        )
        if words:
            log.warning("%s", words)

    def last_batch(self) -> int:
        """The batch id of the newest committed transaction (-1 before the first)."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": "riverbed-sink",  # never joins or commits
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "log_level": 2,
            }
        )
        try:
            part = TopicPartition(self.markers, 0)
            low, high = consumer.get_watermark_offsets(part, timeout=10)  # high: the LSO
            last, start = -1, high
            while last < 0 and start > low:  # back from the end: aborted markers skipped
                start = max(low, start - 64)
                consumer.assign([TopicPartition(self.markers, 0, start)])
                while consumer.position([part])[0].offset < high:
                    message = consumer.poll(1.0)
                    if message is None:
                        break
                    value = message.value()
                    if message.error() is None and value is not None:
                        last = max(last, int(json.loads(value)["batch_id"]))
            return last
        finally:
            consumer.close()

    def write(self, batch_id: int, rows: pd.DataFrame) -> int:
        """The batch's rows in one transaction; returns how many were written now (0
        when the batch's transaction committed before). Through passing failures (a
        broker restarting or stalled, a leader moving) it keeps going for up to
        :data:`RETRY_S` seconds: a commit that timed out is committed again, a
        transaction Kafka says must be aborted is aborted and written again."""
        from confluent_kafka import KafkaException

        if self._last >= batch_id:
            return 0
        deadline = time.monotonic() + RETRY_S
        while True:
            try:
                self._transaction(batch_id, rows, deadline)
                return len(rows)
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if _says(error, "fatal"):
                    raise KafkaSinkError(
                        f"Kafka results topic {self.label}: this driver's producer was fenced "
                        f"({_reason(exc)}) — a newer driver writes the results now"
                    ) from None
                aborted = self._abort(deadline)
                if not (aborted and _says(error, "txn_requires_abort", "retriable")) or (
                    time.monotonic() >= deadline
                ):
                    raise KafkaSinkError(
                        f"Kafka results topic {self.label}: batch {batch_id} was not written "
                        f"({_reason(exc)}); the batch is retried when the driver restarts"
                    ) from None
                time.sleep(0.5)

    def _transaction(self, batch_id: int, rows: pd.DataFrame, deadline: float) -> None:
        """The batch's rows and its marker in one transaction, its commit tried again
        while it times out (as Kafka's client asks) until ``deadline``."""
        from confluent_kafka import KafkaException

        self.producer.begin_transaction()
        for key, value in result_records(batch_id, rows):
            self.producer.produce(self.topic, key=key, value=json.dumps(value))
        self.producer.produce(self.markers, key=b"batch", value=json.dumps({"batch_id": batch_id}))
        while True:
            try:
                self.producer.commit_transaction(self.commit_s)
                break
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if not _says(error, "retriable") or time.monotonic() >= deadline:
                    raise
        self._last = batch_id

    def _abort(self, deadline: float) -> bool:
        """Abort the open transaction, again while it times out; whether it was."""
        from confluent_kafka import KafkaException

        while True:
            try:
                self.producer.abort_transaction(self.commit_s)
                return True
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if not _says(error, "retriable") or time.monotonic() >= deadline:
                    return False

    def close(self) -> None:
        self.producer.flush(10)


def retention_warning(label: str, config: dict[str, str | None]) -> str | None:
    """What an existing Kafka results topic's settings (``retention.ms``,
    ``cleanup.policy``) will delete, in a line naming the fix; ``None`` when it keeps
    every record."""
    policy = config.get("cleanup.policy") or "delete"
    retention = int(config.get("retention.ms") or -1)
    if "delete" not in policy.split(",") or retention < 0:
        return None
    return (
        f"Kafka results topic {label} deletes records {_age(retention)} after they are "
        f"written (retention.ms={retention}): a consumer that reads it from the start "
        "will miss the results of older batches (riverbed's result table keeps them). "
        "To keep them in Kafka too: kafka-configs --alter --entity-type topics "
        f"--entity-name {label.rsplit('/', 1)[-1]} --add-config retention.ms=-1"
    )


def _age(ms: int) -> str:
    for unit, size in (("day", 86_400_000), ("hour", 3_600_000), ("minute", 60_000)):
        if ms >= size:
            return f"{ms / size:g} {unit}" + ("" if ms == size else "s")
    return f"{ms} ms"


def _says(error: Any, *flags: str) -> bool:
    """Whether a Kafka client error carries any of ``flags`` (``fatal``, ``retriable``,
    ``txn_requires_abort``)."""
    return error is not None and any(getattr(error, f, lambda: False)() for f in flags)


def _reason(exc: BaseException) -> str:
    """A Kafka client error's own words, without a stack or the client's config."""
    error = exc.args[0] if exc.args else exc
    text = getattr(error, "str", lambda: str(error))()
    return str(text)[:200]


def result_records(
    batch_id: int, rows: pd.DataFrame, keys: list[str] | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """The batch's rows as results-topic records (riverbed's or Kafka's): key = the
    aggregation key (or ``keys``, one per row), value = the row as JSON-friendly values
    (:func:`plain`'s) with its ``batch_id`` (its timestamp is the time it is written:
    see the module). Built column by column — a batch's timestamps are a few windows,
    each formatted once; numbers as Python's — about three times as fast as row by row
    (the q5 run of benchmarks/nexmark.py wrote 30,000 rows a batch)."""
    if rows.empty:
        return []
    names = list(rows.columns)
    columns = [_plain_column(rows[name]) for name in names]
    if keys is None:
        keys = [str(k) for k in rows["key"].tolist()]
    values = [dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)]
    for value in values:
        value["batch_id"] = batch_id
    return list(zip(keys, values, strict=True))


def _plain_column(column: pd.Series) -> list[Any]:
    """:func:`plain` of every value of ``column``, by column where its type allows."""
    kind = column.dtype.kind
    if kind in "iub":  # no NULLs in these dtypes
        return column.tolist()  # type: ignore[no-any-return]
    if kind == "f":
        return [None if v != v else v for v in column.tolist()]
    if kind == "M":  # timestamps: a few distinct windows per batch
        codes, uniques = pd.factorize(column)
        text = [plain(u) for u in uniques]
        return [None if c < 0 else text[c] for c in codes.tolist()]
    return [plain(v) for v in column.tolist()]


def plain(value: Any) -> Any:
    """JSON-friendly: timestamps as ISO strings, numpy scalars as Python, NaN as None,
    decimals as their exact text."""
    if value is None or (isinstance(value, float) and value != value) or value is pd.NaT:
        return None
    if value is pd.NA:  # a nullable integer's missing value
        return None
    if isinstance(value, Decimal):
        return str(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, np.ndarray):  # an array (TopK's pairs)
        return [plain(v) for v in value.tolist()]
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if hasattr(value, "item"):
        return value.item()
    return value
