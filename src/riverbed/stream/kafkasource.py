"""Kafka topics as a stream source: read by riverbed's own tasks, or through Spark's
Kafka connector.

An aggregation reads a Kafka topic with ``source = {"kafka": {...}}``::

    source = {"kafka": {
        "bootstrap": "broker-1:9092,broker-2:9092",
        "topic": "clicks",
        "schema": "user_id long, flag string, ts timestamp",
        "format": "json",                 # or "avro" (schema: the value's Avro schema),
                                          # or "raw": key, value (strings), ts (Kafka's)
        "startingOffsets": "earliest",    # or "latest", or Spark's JSON per partition
        "options": {"kafka.security.protocol": "SASL_SSL", ...},  # Spark's Kafka options;
                                          # kafka.* ones also reach riverbed's reader
    }}

A source of JSON values that starts at ``earliest`` or ``latest`` runs on the
**log-native path** (:mod:`riverbed.stream.lognative`): riverbed's trigger loop plans
each batch as offset slices of the topic's partitions and records them before it runs;
the state tasks read their slices themselves, as Arrow columns, through
:mod:`riverbed.log.kafkalog` (the Kafka cluster opened as a read-only riverbed log), and
send only per-(window, key) partials to the state partitions. A batch replayed after a
crash reads the same recorded slices and replaces its own output: state and results
exactly once.

Other sources (Avro, raw, starting offsets pinned per partition) — and checkpoints
that this **DataFrame path** started — are read by ``spark.readStream.format("kafka")``
(``spark-sql-kafka-0-10`` from the jar cache) and aggregated by
:func:`riverbed.stream.dataframe.start`: Spark's offset log in the checkpoint records
which Kafka offsets each batch id read, and riverbed's batch records are keyed by that
batch id, with the same outcome. A JSON value that is not an object of the schema's
fields, an Avro value that does not decode with the schema (or either without the key
or the time) is *malformed*: counted, and sent to the aggregation's ``.dlq`` topic.

Avro values are single Avro datums in Avro's binary encoding, read with the writer's
schema given as ``schema`` (Avro's JSON, as text or a dict) by Spark's own ``from_avro``
(``spark-avro`` from the jar cache); ``timestamp-millis``/``-micros`` fields are
timestamps. Values framed for a schema registry (Confluent's wire format: a zero byte,
the schema id in 4 bytes, then the datum) are read with ``"schema_id": N`` and the
schema registered under N given as ``schema``: a value framed with another id, or not
framed, is malformed. riverbed does not fetch schemas from a registry (none can run
where it is tested: docs/kafka.md).

:func:`parse` is the pure part (every bad option is one :class:`KafkaSourceError` that
names the fix); :func:`frame` builds the streaming DataFrame; :func:`check` asks the
brokers, with a Kafka client, whether the topic is there before Spark starts.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from riverbed.errors import InvalidValueError
from riverbed.spark.kafkaread import TOPIC as _TOPIC  # Kafka's own rule for topic names
from riverbed.spark.kafkaread import client_settings

__all__ = [
    "FORMATS",
    "KafkaSource",
    "KafkaSourceError",
    "avro_schema",
    "check",
    "frame",
    "ignored_options",
    "is_kafka",
    "is_label",
    "lag",
    "log_native",
    "log_options",
    "parse",
    "parse_label",
    "watermarks",
    "with_max_records",
]

log = logging.getLogger(__name__)

FORMATS = ("json", "avro", "raw")
SCHEME = "kafka://"  # a Kafka source's label: kafka://<bootstrap>/<topic>
_KNOWN = {"bootstrap", "topic", "schema", "format", "startingOffsets", "options", "schema_id"}
# options riverbed sets itself: a user's would silently change what a batch reads
_OWNED = {"subscribe", "subscribepattern", "assign", "kafka.bootstrap.servers"}


class KafkaSourceError(InvalidValueError):
    """A Kafka source that cannot be read as given; the message names the fix."""


@dataclass(frozen=True)
class KafkaSource:
    bootstrap: str
    topic: str
    schema: str | None  # json: DDL of the value's fields; avro: its Avro schema (JSON)
    format: str = "json"
    starting_offsets: str = "earliest"
    options: Mapping[str, str] = field(default_factory=dict)
    schema_id: int | None = None  # avro: values in a registry's framing, of this schema id

    @property
    def label(self) -> str:
        """How the source is named to people: ``kafka://<bootstrap>/<topic>``."""
        return f"{SCHEME}{self.bootstrap}/{self.topic}"

    def spark_options(self) -> dict[str, str]:
        """The options of ``readStream.format("kafka")``."""
        return {
            **self.options,
            "kafka.bootstrap.servers": self.bootstrap,
            "subscribe": self.topic,
            "startingOffsets": self.starting_offsets,
            "failOnDataLoss": self.options.get("failOnDataLoss", "true"),
        }

    @property
    def fail_on_data_loss(self) -> bool:
        """Spark's ``failOnDataLoss`` as it is given to Spark: true unless it says false."""
        return str(self.spark_options()["failOnDataLoss"]).lower() != "false"


def is_kafka(source: Any) -> bool:
    """Whether a spec's ``source`` names a Kafka topic."""
    return isinstance(source, Mapping) and "kafka" in source


def is_label(topic: str) -> bool:
    """Whether a manifest's topic is a Kafka source's label (:attr:`KafkaSource.label`)."""
    return topic.startswith(SCHEME)


def parse_label(label: str) -> tuple[str, str]:
    """The bootstrap addresses and the topic of a label ``kafka://<bootstrap>/<topic>``."""
    bootstrap, _, topic = label.removeprefix(SCHEME).rpartition("/")
    if not is_label(label) or not bootstrap or not topic:
        raise KafkaSourceError(f"{label!r} is not a Kafka source label (kafka://host:port/topic)")
    return bootstrap, topic


def lag(label: str, committed: Mapping[int, int], timeout: float = 3.0) -> dict[str, int]:
    """Records per partition of the labelled topic that no finished batch has read:
    the partition's end offset minus where the newest finished batch ended (its earliest
    offset before any batch finished). ``{}`` when no broker answers within
    ``timeout`` — the lag is then unknown, not zero. Only the label's bootstrap
    addresses are used: a cluster that needs credentials shows no lag."""
    from confluent_kafka import KafkaException

    bootstrap, topic = parse_label(label)
    try:
        marks = watermarks({"bootstrap.servers": bootstrap, "log_level": 2}, topic, None, timeout)
    except KafkaException:
        return {}
    if marks is None:
        return {}
    return {str(p): max(0, high - committed.get(p, low)) for p, (low, high) in marks.items()}


def watermarks(
    settings: Mapping[str, Any], topic: str, partitions: list[int] | None, timeout: float
) -> dict[int, tuple[int, int]] | None:
    """(oldest retained offset, next offset) of each of ``partitions`` of ``topic``
    (all of them when None; None when the topic is not there), asked by a consumer that
    never joins a group or commits. The next offset is as ``settings``'
    ``isolation.level`` sees it: under read_committed, the first offset of the oldest
    transaction whose markers are not written yet. Raises confluent_kafka's
    KafkaException when the brokers do not answer within ``timeout``."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {**settings, "group.id": "riverbed-watermarks", "enable.auto.commit": False}
    )
    try:
        if partitions is None:
            meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
            if meta is None or meta.error is not None:
                return None
            partitions = sorted(meta.partitions)
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            for p in partitions
        }
    finally:
        consumer.close()


def parse(source: Mapping[str, Any]) -> KafkaSource:
    """The Kafka source of a spec's ``source = {"kafka": {...}}``."""
    raw = source.get("kafka")
    if not isinstance(raw, Mapping):
        raise KafkaSourceError(
            'source = {"kafka": {...}} takes a dict: {"bootstrap": "host:9092", '
            '"topic": "name", "schema": "field type, ..."}'
        )
    unknown = sorted(set(map(str, raw)) - _KNOWN)
    if unknown:
        raise KafkaSourceError(
            f"unknown Kafka source option(s) {', '.join(unknown)}: use "
            f"{', '.join(sorted(_KNOWN))} (Spark's own options go in 'options')"
        )
    bootstrap = _text(raw, "bootstrap", "the brokers, e.g. 'broker-1:9092,broker-2:9092'")
    for address in bootstrap.split(","):
        host, _, port = address.strip().rpartition(":")
        if not host or not port.isdigit():
            raise KafkaSourceError(
                f"Kafka bootstrap address {address.strip()!r} is not host:port; "
                "give e.g. 'broker-1:9092,broker-2:9092'"
            )
    topic = _text(raw, "topic", "the Kafka topic to read")
    if not _TOPIC.fullmatch(topic) or topic in (".", ".."):
        raise KafkaSourceError(
            f"Kafka topic name {topic!r} is not one Kafka allows: up to 249 of the "
            "characters a-z A-Z 0-9 . _ -"
        )
    fmt = str(raw.get("format", "json"))
    if fmt not in FORMATS:
        raise KafkaSourceError(f"Kafka format {fmt!r} is not one of {', '.join(FORMATS)}")
    schema = raw.get("schema")
    if fmt == "avro":
        schema = avro_schema(schema)
    if fmt == "json" and not (isinstance(schema, str) and schema.strip()):
        raise KafkaSourceError(
            "a JSON Kafka source needs 'schema': the value's fields as DDL, e.g. "
            "'user_id long, flag string, ts timestamp'"
        )
    if fmt == "raw" and schema is not None:
        raise KafkaSourceError(
            "a raw Kafka source has the columns key, value and ts (Kafka's timestamp); "
            "drop 'schema', or use format 'json'"
        )
    schema_id = raw.get("schema_id")
    if schema_id is not None:
        if fmt != "avro":
            raise KafkaSourceError(
                "'schema_id' reads Avro values framed for a schema registry (Confluent's "
                "magic byte and schema id ahead of the datum): it needs format 'avro'"
            )
        if (
            isinstance(schema_id, bool)
            or not isinstance(schema_id, int)
            or not 0 <= schema_id < 2**32  # the framing's 4 bytes
        ):
            raise KafkaSourceError(
                f"'schema_id' {schema_id!r} is not a registry's schema id: give the whole "
                "number the registry gave the schema (its writers frame each value with it)"
            )
    options = raw.get("options", {})
    if not isinstance(options, Mapping):
        raise KafkaSourceError("Kafka 'options' must be a dict of Spark Kafka options")
    owned = sorted(k for k in map(str, options) if k.lower() in _OWNED)
    if owned:
        raise KafkaSourceError(
            f"Kafka option(s) {', '.join(owned)} are riverbed's to set: give the brokers as "
            "'bootstrap' and the topic as 'topic'"
        )
    return KafkaSource(
        bootstrap=bootstrap,
        topic=topic,
        schema=str(schema).strip() if fmt != "raw" else None,
        format=fmt,
        starting_offsets=str(raw.get("startingOffsets", "earliest")),
        options={str(k): str(v) for k, v in options.items()},
        schema_id=schema_id,
    )


def log_native(source: KafkaSource) -> bool:
    """Whether the source can be read on the log-native path (the state tasks read
    their Kafka partitions themselves, :mod:`riverbed.log.kafkalog`): JSON values, and
    a start Spark's options do not pin per partition (``earliest``/``latest``)."""
    return source.format == "json" and source.starting_offsets in ("earliest", "latest")


def log_options(source: KafkaSource) -> dict[str, str]:
    """The log-native source options of ``source``: its topic in the Kafka cluster as
    a read-only log (``kafka://<bootstrap>?serde=json``), its schema, Spark's
    ``maxOffsetsPerTrigger`` as ``maxRecordsPerBatch``, and its ``kafka.*`` client
    settings as they are."""
    given = {k.lower(): v for k, v in source.options.items()}
    for name in ignored_options(source):
        log.warning(
            "Kafka source option %r has no effect when riverbed's tasks read the topic "
            "(JSON values); it applies to Spark's Kafka source (Avro, raw, pinned offsets)",
            name,
        )
    options = {
        "topic": source.topic,
        "log": f"kafka://{source.bootstrap}?serde=json",
        "startingOffsets": source.starting_offsets,
        # co-located when the producers placed each key by its CRC-32, as librdkafka's
        # default partitioner does (checked on the first records, and by every task)
        "co_locate": given.get("co_locate", "auto"),
        **{k: v for k, v in source.options.items() if k.startswith("kafka.")},
    }
    for name in _RIVERBED_OPTIONS:  # as on riverbed's own topics (docs/stream.md)
        if name.lower() in given:
            options[name] = given[name.lower()]
    if source.schema is not None:
        options["schema"] = source.schema
    if "maxoffsetspertrigger" in given:
        options["maxRecordsPerBatch"] = given["maxoffsetspertrigger"]
    return options


_RIVERBED_OPTIONS = ("steal", "driverBatchRecords")  # and co_locate, defaulted above
_NATIVE_OPTIONS = {
    "maxoffsetspertrigger",
    "failondataloss",
    "co_locate",
    *(n.lower() for n in _RIVERBED_OPTIONS),
}


def ignored_options(source: KafkaSource) -> list[str]:
    """The source's Spark options that the log-native path does not use (every
    ``kafka.*`` one goes to its Kafka client; ``maxOffsetsPerTrigger``,
    ``failOnDataLoss`` and riverbed's ``co_locate``, ``steal`` and
    ``driverBatchRecords`` it honours)."""
    return sorted(
        k for k in source.options if not k.startswith("kafka.") and k.lower() not in _NATIVE_OPTIONS
    )


def with_max_records(source: Mapping[str, Any], n: int) -> dict[str, Any]:
    """``source`` reading at most ``n`` records a batch (Spark's ``maxOffsetsPerTrigger``)."""
    inner = dict(source["kafka"])
    inner["options"] = {**inner.get("options", {}), "maxOffsetsPerTrigger": str(n)}
    return {**source, "kafka": inner}


def _text(raw: Mapping[str, Any], key: str, what: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value.strip():
        raise KafkaSourceError(f"a Kafka source needs '{key}': {what}")
    return value.strip()


def avro_schema(schema: Any) -> str:
    """An Avro source's ``schema`` (Avro's JSON schema of a record, as text or a dict)
    as compact JSON; :class:`KafkaSourceError` naming the fix when it is not one."""
    example = (
        '{"type": "record", "name": "Click", "fields": [{"name": "user_id", "type": '
        '"long"}, {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}'
    )
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise KafkaSourceError(
                f"an Avro Kafka source's 'schema' is not JSON ({exc.msg} at character "
                f"{exc.pos}): give the value's Avro schema, e.g. {example}"
            ) from None
    if not isinstance(schema, Mapping) or schema.get("type") != "record":
        raise KafkaSourceError(
            "an Avro Kafka source needs 'schema': the Avro schema of the values, a record "
            f"(as JSON text or a dict), e.g. {example}"
        )
    fields = schema.get("fields")
    if (
        not isinstance(fields, list)
        or not fields
        or not all(isinstance(f, Mapping) and isinstance(f.get("name"), str) for f in fields)
    ):
        raise KafkaSourceError(
            "the Avro schema of a Kafka source needs 'fields', each with a 'name' and a "
            f"'type', e.g. {example}"
        )
    return json.dumps(schema, separators=(",", ":"))


def continuity(
    topic: str,
    partitions: int,
    read: Mapping[int, int],
    earliest: Mapping[int, int],
    fail_on_data_loss: bool = True,
) -> list[str]:
    """What stands between an aggregation that has read ``read`` (partition → the
    offset its next batch starts at) and a topic of ``partitions`` partitions whose
    oldest retained offsets are ``earliest``: raises :class:`KafkaSourceError` for
    partitions it read that are gone, or (with ``fail_on_data_loss``) records deleted
    before it read them; returns warnings (partitions added, records skipped)."""
    gone = sorted(p for p in read if p >= partitions)
    if gone:
        raise KafkaSourceError(
            f"Kafka topic {topic!r} has {partitions} partition(s), but this aggregation "
            f"already read partition(s) {', '.join(map(str, gone))} (its checkpoint says "
            "so): the topic was deleted and created again, or lost partitions. What they "
            "held cannot be read again, so the results could not stay exact: start over "
            "with a new checkpoint, or point the source at the topic it read"
        )
    warnings = []
    lost = {p: (read[p], earliest[p]) for p in sorted(read) if earliest.get(p, 0) > read[p]}
    if lost:
        where = ", ".join(f"partition {p}: offsets {a} to {b - 1}" for p, (a, b) in lost.items())
        if fail_on_data_loss:
            raise KafkaSourceError(
                f"records of Kafka topic {topic!r} were deleted (its retention) before this "
                f"aggregation read them ({where}); to skip them and go on, set "
                "'failOnDataLoss': 'false' in the source's options"
            )
        warnings.append(f"skipping records of Kafka topic {topic!r} deleted before they "
                        f"were read ({where}): failOnDataLoss is false")  # fmt: skip
    if read and partitions > max(read) + 1:
        warnings.append(
            f"Kafka topic {topic!r} has {partitions} partitions now, {max(read) + 1} when this "
            "aggregation last read it: the new ones are read from their earliest offset"
        )
    return warnings


def check(source: KafkaSource, timeout: float = 10.0, read: Mapping[int, int] | None = None) -> int:
    """Ask the brokers for the topic before Spark starts; its partition count. An
    unreachable bootstrap address or a missing topic is one :class:`KafkaSourceError`
    (Spark would retry for minutes, then print a Java trace); so are, for an
    aggregation that has ``read`` the topic before (partition → where its next batch
    starts), partitions gone and records deleted unread (:func:`continuity`)."""
    from confluent_kafka.admin import AdminClient

    settings: dict[str, Any] = {
        "bootstrap.servers": source.bootstrap,
        "log_level": 2,
        **client_settings(source.options),  # security settings reach the check too
    }
    try:
        meta = AdminClient(settings).list_topics(source.topic, timeout=timeout)
    except Exception as exc:
        raise KafkaSourceError(
            f"no Kafka broker answered at {source.bootstrap} within {timeout:.0f} s "
            f"({type(exc).__name__}); check 'bootstrap' and that the brokers are up"
        ) from None
    topic = meta.topics.get(source.topic)
    if topic is None or topic.error is not None or not topic.partitions:
        raise KafkaSourceError(
            f"Kafka topic {source.topic!r} does not exist on {source.bootstrap}; create it "
            "(kafka-topics.sh --create) or fix 'topic'"
        )
    partitions = len(topic.partitions)
    if read:
        asked = [p for p in read if p < partitions]
        marks = watermarks(settings, source.topic, asked, timeout) or {}
        earliest = {p: low for p, (low, _) in marks.items()}
        for warning in continuity(
            source.topic, partitions, read, earliest, source.fail_on_data_loss
        ):
            log.warning("%s", warning)
    return partitions


CORRUPT = "_corrupt_record"  # where from_json puts a value it cannot parse


def _require_spark_avro() -> None:
    """:class:`KafkaSourceError` naming the fix when the jar cache has no spark-avro."""
    from riverbed.spark.jars import jar_dir, jars

    if not any(p.name.startswith("spark-avro_") for p in jars()):
        raise KafkaSourceError(
            f"an Avro Kafka source needs Spark's spark-avro jar, and the jar cache "
            f"{jar_dir()} has none: run `riverbed setup jars` (it fetches it from Maven Central)"
        )


def frame(spark: Any, source: KafkaSource, required: list[str] | None = None) -> Any:
    """The streaming DataFrame of the topic's records: the schema's columns (json) or
    key, value, ts (raw), an ``_error`` column (null, or why the record is malformed:
    not JSON, not an object of the schema's fields, or null in a ``required`` column —
    the aggregation's key and time; for Avro, not a datum of the schema — its bytes are
    shown in base64), and Kafka's ``_partition`` and ``_offset``."""
    from pyspark.sql import functions as F

    records = spark.readStream.format("kafka").options(**source.spark_options()).load()
    value = F.col("value").cast("string")
    meta = [F.col("partition").alias("_partition"), F.col("offset").alias("_offset")]
    if source.format == "raw":
        columns = records.select(
            F.col("key").cast("string").alias("key"),
            value.alias("_value"),
            F.col("timestamp").alias("ts"),
            *meta,
        ).withColumn("value", F.col("_value"))
        fields = ["key", "value", "ts"]
        broken = F.lit(False)
    elif source.format == "avro":
        assert source.schema is not None
        _require_spark_avro()
        from pyspark.sql.avro.functions import from_avro

        datum = F.col("value")
        if source.schema_id is not None:  # magic byte 0, the id (4 bytes, big-endian)
            framed = (F.length(datum) >= 5) & (
                F.hex(F.substring(datum, 1, 5)) == f"00{source.schema_id:08X}"
            )
            datum = F.when(framed, F.expr("substring(value, 6)"))
        decoded = from_avro(datum, source.schema, {"mode": "PERMISSIVE"})
        fields = [f["name"] for f in json.loads(source.schema)["fields"]]
        columns = records.select(
            F.base64("value").alias("_value"), decoded.alias("_parsed"), *meta
        ).select(
            "_value",
            *(F.col(f"_parsed.{name}").alias(name) for name in fields),
            F.col("_parsed").isNull().alias("_broken"),
            "_partition",
            "_offset",
        )
        broken = F.col("_broken")
    else:
        assert source.schema is not None
        schema = f"{source.schema}, {CORRUPT} string"
        options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
        parsed = records.select(
            value.alias("_value"), F.from_json(value, schema, options).alias("_parsed"), *meta
        )
        fields = [f.name for f in spark.createDataFrame([], source.schema).schema.fields]
        columns = parsed.select(
            "_value",
            *(F.col(f"_parsed.{name}").alias(name) for name in fields),
            F.col(f"_parsed.{CORRUPT}").isNotNull().alias("_broken"),
            "_partition",
            "_offset",
        )
        broken = F.col("_broken") | F.col("_broken").isNull()
    missing = [name for name in (required or []) if name not in fields]
    if missing:
        raise KafkaSourceError(
            f"the aggregation reads {', '.join(missing)}, which the Kafka source of "
            f"{source.topic!r} does not have (its columns: {', '.join(fields)}); add them "
            "to 'schema'"
        )
    for name in required or []:
        broken = broken | F.col(name).isNull()
    error = F.when(
        broken,
        F.concat(
            F.lit(f"not a record of {source.format} with {', '.join(required or fields)}: "),
            F.coalesce(F.col("_value"), F.lit("<null>")),
        ),
    )
    return columns.select(*fields, error.alias("_error"), "_partition", "_offset")
