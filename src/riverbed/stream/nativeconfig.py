"""What the log-native path's tasks are given: a riverbed topic source's options
checked against the topic and the aggregation, and the co-location decision — on the
driver, once per start (:func:`prepare`), pickled to the tasks as a
:class:`DirectConfig`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from riverbed.log.kafkalog import PARTITIONER as KAFKA_PARTITIONER
from riverbed.log.partitioners import KeyHashPartitioner
from riverbed.spark.source import open_log
from riverbed.stream.aggregation import KEY
from riverbed.stream.engine import EngineConfig
from riverbed.stream.errors import StreamValueError
from riverbed.stream.lookups import added_columns
from riverbed.stream.metrics import VALUE_METRICS
from riverbed.stream.steal import PIECE

if TYPE_CHECKING:
    from riverbed.log import Log

__all__ = [
    "DRIVER_BATCH_RECORDS",
    "JOIN_DRIVER_BATCH_RECORDS",
    "SHUFFLED_DRIVER_BATCH_RECORDS",
    "DirectConfig",
    "check_reads",
    "count_option",
    "decide_co_location",
    "prepare",
]

# Co-located batches up to this many records can run in the driver process (local
# masters): a PySpark job costs ~100 ms here whatever it does, more than a small batch's
# own work. The source option driverBatchRecords sets it (0: never; docs/stream.md).
DRIVER_BATCH_RECORDS = 50_000
# A join's batches, likewise, up to this many records of both sides: its pairing is
# Arrow's (the GIL let go), and as a Spark job each batch ships its events pickled
# through a shuffle to tasks that open their partitions anew — Nexmark q20, 92,000 bids
# a batch: ~100 ms in the driver, ~750 ms as a job (benchmarks/nexmark_joins.py,
# 2026-12-04). Bounded so a backlog read whole does not sit in the driver's memory.
JOIN_DRIVER_BATCH_RECORDS = 1_000_000
# A shuffled aggregation batch (its key not the topic's: derived, composite, or a
# topic keyed otherwise), likewise: as a Spark job it pays a job and a shuffle of its
# partials whatever its size, but its partials are Python work the driver's threads do
# on one core (the GIL) where a job's Python workers use every core. Measured
# (benchmarks/nexmark.py, 2 cores, 92,000-bid batches, 2026-12-04): q7's one key per
# window ~460 ms a batch as a job, ~50 ms here; q11's sessions 5.1 → 1.9 s a run; but
# q16's 11 metrics per channel (8 exact distincts) 16.7 → 21.1 s, and at 460,000 bids a
# batch 43 → 69 s. So up to about q7's batches; driverBatchRecords, when given, bounds
# both kinds.
SHUFFLED_DRIVER_BATCH_RECORDS = 100_000


@dataclass(frozen=True)
class DirectConfig:
    """What the tasks need besides the engine config; pickled to executors."""

    engine: EngineConfig
    options: dict[str, str]  # source options: topic, log, ...
    schema: Any  # StructType: value fields + the source's metadata columns
    co_located: bool
    max_records: int | None = None  # maxRecordsPerBatch (None: no bound)
    starting: str = "earliest"  # startingOffsets: where a first batch starts
    steal: bool = True  # co-located tasks done early help the others (steal.py)
    piece_records: int = PIECE  # co-located tasks claim and help with pieces this big
    # co-located batches of at most this many records, with a local master, run in the
    # driver process instead of as a Spark job (DRIVER_BATCH_RECORDS; 0: never)
    driver_records: int = DRIVER_BATCH_RECORDS
    # shuffled batches of at most this many records likewise (SHUFFLED_DRIVER_BATCH_RECORDS)
    shuffled_driver_records: int = SHUFFLED_DRIVER_BATCH_RECORDS


def decide_co_location(
    topic_log: Log, options: dict[str, str], spec: Any, added: Sequence[str] = ()
) -> bool:
    """Co-locate when asked (``co_locate``: auto | true | false) and the topic fits: one
    log partition per state partition, its records keyed by the aggregation key and
    placed by the key's CRC-32 (riverbed's key-hash partitioner — and librdkafka's
    default, ``consistent_random``, so a Kafka topic written by a librdkafka client
    keyed by the aggregation key fits; Java's producer places by murmur2 and does not).
    Checked on the first records of every partition here (a Kafka topic's placement
    too: riverbed does not know its producers), and on every record by the tasks."""
    choice = options.get("co_locate", "auto").lower()
    if choice not in ("auto", "true", "false"):
        raise StreamValueError(f"co_locate must be auto, true or false, not {choice!r}")
    if choice == "false":
        return False
    if spec.composite or spec.key in spec.columns or spec.key in added:
        # no producer placed records by it
        if choice == "true":
            raise StreamValueError(
                f"co_locate=true: the key {spec.key!r} is derived (a derived column, a "
                "lookup's column, or a composite key's text), which no producer placed "
                "the topic's records by; leave co_locate at auto"
            )
        return False
    topic = topic_log.topic(options["topic"])
    hashed = topic.partitioner == KeyHashPartitioner.name  # placed by riverbed's producer
    placed_by_others = topic.partitioner == KAFKA_PARTITIONER
    fits = (hashed or placed_by_others) and topic.partitions == spec.state_partitions
    if fits and choice == "auto":
        sampled = 0
        for p in range(topic.partitions):
            first = topic_log.storage.offsets(topic.name, p)[0]
            # a malformed record (not decodable, not an object, no key) says nothing of
            # how keys are placed, and the batch counts it and sends it to the DLQ
            for record in topic_log.read(topic.name, p, first, 100, malformed="skip"):
                value = record.value
                if not isinstance(value, dict) or value.get(spec.key) is None:
                    continue
                if record.key != str(value[spec.key]).encode():
                    return False
                if not hashed and _KEY_HASH.partition(record.key, topic.partitions) != p:
                    return False
                sampled += 1
        if placed_by_others and not sampled:
            return False  # no record shows yet how the producers place keys
    if choice == "true" and not fits:
        raise StreamValueError(
            f"co_locate=true needs topic {options['topic']!r} to have "
            f"{spec.state_partitions} partitions (the aggregation's state_partitions) and "
            "records placed by the CRC-32 of their key (riverbed's key-hash partitioner, "
            "or a Kafka producer on librdkafka's default partitioner)"
        )
    return fits


_KEY_HASH = KeyHashPartitioner()


def prepare(config: EngineConfig, options: dict[str, str]) -> DirectConfig:
    """Check a topic source's options against the topic and the aggregation, and decide
    co-location; on the driver, with a Spark session running (DDL is parsed by it)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from riverbed.spark.offsets import source_limits
    from riverbed.spark.source import reader_schema

    if "topic" not in options:
        raise StreamValueError('a riverbed source needs {"topic": NAME, ...}')
    lowered = {k.lower(): v for k, v in options.items()}  # Spark's option names: any case
    max_records, starting = source_limits(lowered)
    steal = str(options.get("steal", "true")).lower()
    if steal not in ("true", "false"):
        raise StreamValueError(f"steal must be true or false, not {steal!r}")
    driver_records = count_option(lowered, "driverBatchRecords", DRIVER_BATCH_RECORDS)
    shuffled = count_option(lowered, "driverBatchRecords", SHUFFLED_DRIVER_BATCH_RECORDS)
    topic_log = open_log(options)
    try:
        if options["topic"] not in topic_log.topics():
            raise StreamValueError(
                f"topic {options['topic']!r} does not exist in {options['log']}; create it "
                f"with `riverbed topic create {options['topic']} --partitions "
                f"{config.spec.state_partitions}`"
            )
        added = added_columns(config.lookup_schemas, config.spec.lookups)
        co_located = decide_co_location(topic_log, options, config.spec, added)
    finally:
        topic_log.close()
    schema = reader_schema(lowered)
    check_reads(config, to_arrow_schema(schema, timezone="UTC"), "the topic's schema")
    config = _with_column_types(config, schema)
    return DirectConfig(
        config,
        options,
        schema,
        co_located,
        max_records,
        starting,
        steal == "true",
        driver_records=driver_records,
        shuffled_driver_records=shuffled,
    )


def check_reads(config: EngineConfig, arrow: pa.Schema, source: str) -> None:
    """The spec's derived columns compiled against the source's columns (``arrow``; and
    the lookups' tables), so that a ``where`` or ``columns`` that cannot be evaluated is
    refused at start — and a column the spec reads that neither the source (named by
    ``source``), a derived column nor a lookup gives is refused too."""
    from riverbed.stream.derive import compile_for, input_types

    spec = config.spec
    derived: list[str] = []
    if spec.derives:
        compiled = compile_for(spec, input_types(arrow), config.lookup_schemas)
        derived = [name for name, _ in compiled.columns] if compiled is not None else []
        if spec.composite:
            derived.append(KEY)  # the composite key's text
    added = added_columns(config.lookup_schemas, spec.lookups)
    known = [*arrow.names, *derived, *added]
    missing = [c for c in spec.reads() if c not in known]
    if missing:
        raise StreamValueError(
            f"aggregation {spec.name!r} reads column(s) {missing}, which {source} "
            f"({', '.join(arrow.names)}) does not have"
        )


def _with_column_types(config: EngineConfig, schema: Any) -> EngineConfig:
    """``config`` with its spec's composite key part types, from the source's schema and
    the derived columns (the result table types each part as its column)."""
    spec = config.spec
    if not spec.composite and not any(isinstance(m, VALUE_METRICS) for m in spec.metrics.values()):
        return config
    from pyspark.sql.pandas.types import to_arrow_schema

    from riverbed.stream.derive import column_types
    from riverbed.stream.keys import resolved

    arrow = to_arrow_schema(schema, timezone="UTC")
    types = column_types(config.spec, arrow, config.lookup_schemas)
    return dataclasses.replace(config, spec=resolved(config.spec, types))


def count_option(lowered: Mapping[str, str], name: str, default: int) -> int:
    """A non-negative whole-number source option (``lowered``: the options with their
    names in lower case)."""
    given = lowered.get(name.lower())
    if given is None:
        return default
    try:
        value = int(str(given))
    except ValueError:
        value = -1
    if value < 0:
        raise StreamValueError(
            f"{name} must be a whole number of records, 0 or more, not {given!r}"
        )
    return value
