"""The read model: every question the console and the CLI's ``list``/``status``
commands ask, answered once, below both (``riverbed ui`` pages, their ``/api`` twins,
``/metrics`` and ``riverbed … --json`` print the same data).

Every function takes :class:`Sources` and returns plain JSON-ready data (dicts, lists,
numbers, strings). Reads never take a lock a running job needs: topics are read through
the log's readers, groups from the control plane's keys, state through durable storage
into a private directory, jobs with plain SELECTs. One module per part::

    sources.py   Sources (the configured log, control plane, state, jobs db), QueryError
    topics.py    topics, topic, browse (the record browser's filters), objects (diskless)
    groups.py    consumer groups and their lag
    streams.py   aggregations: driver, batches, ledger, lag, live results from state;
                 stream-stream joins: sides' lag, newest events, events held
    state.py     namespaces, partitions, versions, keys
    control.py   leaders, locks, registrations
    hosts.py     which host runs what, which are down
    jobs.py      runs, chunks, attempts, schedules, an attempt's log
    overview.py  bytes on disk per part
"""

from __future__ import annotations

from riverbed.inspect.control import control, control_of
from riverbed.inspect.groups import group, group_names, group_of, groups
from riverbed.inspect.hosts import hosts
from riverbed.inspect.jobs import chunk, chunk_log, jobs, run
from riverbed.inspect.overview import disk
from riverbed.inspect.sources import QueryError, Sources, du, jsonable
from riverbed.inspect.state import state, state_keys
from riverbed.inspect.streams import (
    active_driver,
    join,
    join_names,
    joins_status,
    live,
    newest_batch,
    stream,
    stream_names,
    streams,
)
from riverbed.inspect.topics import browse, objects, parse_where, topic, topics

__all__ = [
    "QueryError",
    "Sources",
    "active_driver",
    "browse",
    "chunk",
    "chunk_log",
    "control",
    "control_of",
    "disk",
    "du",
    "group",
    "group_names",
    "group_of",
    "groups",
    "hosts",
    "jobs",
    "join",
    "join_names",
    "joins_status",
    "jsonable",
    "live",
    "newest_batch",
    "objects",
    "parse_where",
    "run",
    "state",
    "state_keys",
    "stream",
    "stream_names",
    "streams",
    "topic",
    "topics",
]
