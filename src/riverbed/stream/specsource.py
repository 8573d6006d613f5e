"""A spec file's aggregation and its source, read: what ``riverbed stream run``,
``status`` and ``plan`` and the console load (``aggregation = Aggregation(...)``,
``source = {...}``; ``join = Join(...)`` for a join's spec file, ``select = Select(...)``
for a Select's, run as a one-sided join) — the source as a
topic's or Kafka's options, a join's rows run in the same driver (``{"join":
"join.py"}``), another aggregation's results through its results topic
(``{"aggregation": "up.py"}``) or run in the same driver (``{"chained": "up.py"}``) —
and :func:`door`, what :func:`riverbed.stream.dataframe.start` reads for it."""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

from riverbed.errors import ConfigError
from riverbed.stream import kafkasource as kafka
from riverbed.stream.aggregation import Aggregation
from riverbed.stream.joins import Join
from riverbed.stream.selects import Select


def _namespace(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(f"spec file {path} does not exist")
    try:
        return runpy.run_path(str(path))
    except Exception as exc:
        raise ConfigError(f"spec file {path} failed to load: {type(exc).__name__}: {exc}") from exc


def load_join(path: str | Path) -> Join | None:
    """The stream-stream join a spec file defines (``join = Join(...)``; ``select =
    Select(...)``: the one-sided join that runs it), or None when it defines an
    aggregation instead."""
    namespace = _namespace(Path(path))
    join = namespace.get("join")
    if "aggregation" in namespace:
        return None
    if join is None and "select" in namespace:
        select = namespace["select"]
        if not isinstance(select, Select):
            raise ConfigError(
                f"{path}: `select` must be a Select(...), not {type(select).__name__}"
            )
        return select.join
    if join is None:
        return None
    if not isinstance(join, Join):
        raise ConfigError(f"{path}: `join` must be a Join(...), not {type(join).__name__}")
    return join


def load_spec(path: str | Path) -> tuple[Aggregation, dict[str, Any]]:
    path = Path(path)
    namespace = _namespace(path)
    aggregation = namespace.get("aggregation")
    source = namespace.get("source")
    if aggregation is None and isinstance(namespace.get("join"), Join):
        raise ConfigError(
            f"{path} defines a stream-stream join (`join = Join(...)`): `riverbed stream run` "
            "and `riverbed stream status` take it; this command takes an aggregation"
        )
    if aggregation is None and isinstance(namespace.get("select"), Select):
        raise ConfigError(
            f"{path} defines a Select (`select = Select(...)`): `riverbed stream run` and "
            "`riverbed stream status` take it; this command takes an aggregation"
        )
    if not isinstance(aggregation, Aggregation):
        raise ConfigError(
            f"{path} must define `aggregation = Aggregation(...)` (or `join = Join(...)`: "
            "two streams joined; or `select = Select(...)`: one stream filtered and projected)"
        )
    if isinstance(source, dict) and "aggregation" in source:
        return aggregation, chained_source(path, source)
    if isinstance(source, dict) and JOINED_SOURCE in source:
        return aggregation, joined_source(path, source)
    if isinstance(source, dict) and CHAINED_SOURCE in source:
        return aggregation, chained_here(path, source)
    if isinstance(source, dict) and kafka.is_kafka(source):
        try:
            kafka.parse(source)
        except kafka.KafkaSourceError as exc:
            raise ConfigError(f"{path}: {exc}") from None
        return aggregation, dict(source)
    if not isinstance(source, dict) or "topic" not in source:
        raise ConfigError(
            f'{path} must define `source = {{"topic": ..., "schema": ...}}` (a riverbed '
            'topic), `source = {"kafka": {"bootstrap": ..., "topic": ..., "schema": ...}}` '
            'or `source = {"aggregation": "upstream.py"}` (another aggregation\'s results) '
            'or `source = {"join": "join.py"}` (a join\'s rows, joined in the same driver) '
            'or `source = {"chained": "upstream.py"}` (another aggregation\'s, run in the '
            "same driver)"
        )
    return aggregation, {str(k): str(v) for k, v in source.items()}


SCALAR_KINDS = ("timestamp", "string", "long", "double", "boolean")


def chained_source(path: Path, source: dict[str, Any]) -> dict[str, str]:
    """``source = {"aggregation": "upstream.py"}``: the results of another aggregation
    as this one's events — its results topic (``<name>.results`` in its log, which it
    writes when run with ``--topic <name>.results``; ``topic`` and ``log`` may say
    otherwise), with its result columns as the schema (TopK's lists left out; its
    ``key`` is the records' key, the source's own ``key`` column). Only
    an upstream with ``output="final"`` can be chained: with ``update`` a window's row
    comes again every batch that changes it, and would be counted again."""
    upstream, upstream_source = _upstream(path, _beside(path, source["aggregation"]))
    if upstream.sessions:
        raise ConfigError(
            f"{path}: chaining from session windows ({upstream.name!r}) is not supported yet"
        )
    from riverbed.spark.source import META_NAMES
    from riverbed.stream.results import output_columns

    # the upstream's key is its result records' key: the source's own `key` column
    columns = [
        (n, k) for n, k in output_columns(upstream) if k in SCALAR_KINDS and n not in META_NAMES
    ]
    chained = {str(k): str(v) for k, v in source.items() if k != "aggregation"}
    chained.setdefault("topic", f"{upstream.name}.results")
    chained.setdefault("schema", ", ".join(f"{n} {k}" for n, k in columns))
    if "log" in upstream_source and not kafka.is_kafka(upstream_source):
        chained.setdefault("log", str(upstream_source["log"]))
    return chained


def _upstream(path: Path, upstream_path: Path) -> tuple[Aggregation, dict[str, Any]]:
    """The aggregation whose final rows ``path`` reads, and its source."""
    upstream, upstream_source = load_spec(upstream_path)
    if upstream.output != "final":
        raise ConfigError(
            f"{path}: reads the results of {upstream.name!r} ({upstream_path}), whose output "
            "is 'update' — a window's row comes again each batch that changes it and would "
            f'be counted again; set output="final" in {upstream_path}'
        )
    return upstream, upstream_source


def _named(path: Path, source: dict[str, Any], key: str, what: str, example: str) -> Path:
    """The spec file ``source[key]`` names (relative to ``path``'s directory), the
    source saying nothing else."""
    extra = sorted(set(source) - {key})
    if extra:
        raise ConfigError(
            f"{path}: a {key} source takes only the {what}'s spec file "
            f'(source = {{"{key}": "{example}"}}), not {extra}'
        )
    return _beside(path, source[key])


def _beside(path: Path, named: Any) -> Path:
    """A spec file a spec file names: as given if absolute, else in its directory."""
    given = Path(str(named))
    return given if given.is_absolute() else path.parent / given


CHAINED_SOURCE = "chained"  # source = {"chained": "up.py"}: its final rows, in this driver


def chained_here(path: Path, source: dict[str, Any]) -> dict[str, str]:
    """``source = {"chained": "upstream.py"}``: the final rows of the aggregation that
    spec file defines, as this one's events — that aggregation run by this one's driver,
    batch by batch, over its own spec file's source (:mod:`riverbed.stream.chained`;
    no results topic between them); a path relative to this spec file's directory."""
    upstream_path = _named(path, source, CHAINED_SOURCE, "upstream aggregation", "upstream.py")
    _upstream(path, upstream_path)
    return {CHAINED_SOURCE: str(upstream_path.resolve())}


def door(source: dict[str, Any], log_url: str, max_records: int | None) -> Any:
    """What :func:`riverbed.stream.dataframe.start` reads for a spec file's source (as
    :func:`load_spec` gave it): a topic's or Kafka's options (each batch at most
    ``max_records`` records, if given), a join (``Joined``), another aggregation's final
    rows (``Chained``, over its own spec file's source, this one's log its default)."""
    from riverbed.stream.doors import Chained, Joined

    if is_joined(source):  # the join runs in this driver (stream/joinedagg.py)
        return Joined(load_join(source[JOINED_SOURCE]), max_records=max_records)
    if CHAINED_SOURCE in source:  # so does the upstream aggregation (stream/chained.py)
        upstream, upstream_source = load_spec(source[CHAINED_SOURCE])
        upstream_log = str(upstream_source.get("log") or log_url)
        return Chained(upstream, door(upstream_source, upstream_log, max_records))
    options: dict[str, Any] = {"log": log_url, **source}
    if max_records and kafka.is_kafka(options):
        return kafka.with_max_records(options, max_records)
    if max_records:
        options = {k: v for k, v in options.items() if k.lower() != "maxrecordsperbatch"}
        options["maxRecordsPerBatch"] = str(max_records)
    return options


JOINED_SOURCE = "join"  # source = {"join": "join.py"}: a join's rows, in this driver


def joined_source(path: Path, source: dict[str, Any]) -> dict[str, str]:
    """``source = {"join": "join.py"}``: the rows of the join that spec file defines, as
    this aggregation's events — the join run by this aggregation's own driver, batch by
    batch (:mod:`riverbed.stream.joinedagg`); a path relative to this spec file's
    directory."""
    join_path = _named(path, source, JOINED_SOURCE, "join", "join.py")
    if load_join(join_path) is None:
        raise ConfigError(
            f"{path}: its source {join_path} must define `join = Join(...)` (the join whose "
            "rows this aggregation reads)"
        )
    return {JOINED_SOURCE: str(join_path.resolve())}


def is_joined(source: dict[str, Any]) -> bool:
    """Whether a job's source is a join's rows (:func:`joined_source`)."""
    return JOINED_SOURCE in source


__all__ = [
    "CHAINED_SOURCE",
    "JOINED_SOURCE",
    "SCALAR_KINDS",
    "chained_here",
    "chained_source",
    "door",
    "is_joined",
    "joined_source",
    "load_join",
    "load_spec",
]
