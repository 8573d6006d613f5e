"""``riverbed topic|produce|consume|group``: the event log from a shell."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

import riverbed.log
from riverbed.cli._common import Subcommands, shared_options
from riverbed.config import load_config
from riverbed.control import connect
from riverbed.log import Log, LogError, Record
from riverbed.log.group import describe_group
from riverbed.log.group.consumer import list_groups

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False)

LOG_OPTS = (
    "--log",
    {
        "help": "log location: file:///path or memory:// (default: RIVERBED_LOG, "
        "else RIVERBED_HOME/log)"
    },
)
CONTROL_OPTS = (
    "--control",
    {"help": "control plane URL (default: RIVERBED_CONTROL, else sqlite under RIVERBED_HOME)"},
)
JSON_OPTS = ("--json", {"action": "store_true", "help": "JSON lines output"})


def _size(text: str) -> int:
    units = {"k": 1024, "m": 1024**2, "g": 1024**3}
    text = text.strip().lower().rstrip("b")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def _duration_ms(text: str) -> int:
    units = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
    for suffix in sorted(units, key=len, reverse=True):
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * units[suffix])
    return int(text)


def add_parsers(sub: Any) -> None:
    topic = sub.add_parser("topic", help="create, list, describe topics; add partitions")
    common = shared_options(topic, LOG_OPTS, JSON_OPTS)
    cmds = Subcommands(
        topic.add_subparsers(dest="topic_command", metavar="COMMAND", required=True), common
    )
    c = cmds.add_parser("create", help="create a topic")
    c.add_argument("name")
    c.add_argument("--partitions", type=int, required=True)
    c.add_argument("--partitioner", default="key-hash", choices=["key-hash", "round-robin"])
    c.add_argument("--serde", default="json", choices=["json", "msgpack", "bytes"])
    c.add_argument("--retention", help="keep at most this age per partition, e.g. 7d, 12h")
    c.add_argument("--retention-bytes", help="keep at most this size per partition, e.g. 10G")
    c.add_argument("--segment-bytes", default="64M", help="segment size (default 64M)")
    c.add_argument("--fsync", default="batch", choices=["batch", "interval", "never"])
    c.set_defaults(func=_topic_create)
    c = cmds.add_parser("list", help="list topics")
    c.set_defaults(func=_topic_list)
    c = cmds.add_parser("describe", help="configuration and offsets per partition")
    c.add_argument("name")
    c.set_defaults(func=_topic_describe)
    c = cmds.add_parser("add-partitions", help="grow a topic to N partitions")
    c.add_argument("name")
    c.add_argument("--partitions", type=int, required=True)
    c.set_defaults(func=_topic_add)

    produce = sub.add_parser("produce", help="append JSON lines from stdin to a topic")
    produce.add_argument("topic")
    produce.add_argument("--key-field", help="use this field of each record as its key")
    produce.add_argument("--batch", type=int, default=1000, help="records per append")
    shared_options(produce, LOG_OPTS, JSON_OPTS)
    produce.set_defaults(func=_produce)

    consume = sub.add_parser("consume", help="print records as JSON lines and commit")
    consume.add_argument("topic")
    consume.add_argument("--group", required=True)
    consume.add_argument(
        "--from-beginning",
        action="store_true",
        help="a new group starts at the earliest offset (default: latest)",
    )
    consume.add_argument("--max", type=int, help="exit after this many records")
    consume.add_argument("--timeout", type=float, help="exit after this many idle seconds")
    consume.add_argument("--ttl", type=int, default=10, help="session lease TTL (default 10)")
    shared_options(consume, LOG_OPTS, CONTROL_OPTS, JSON_OPTS)
    consume.set_defaults(func=_consume)

    group = sub.add_parser("group", help="list consumer groups, describe one")
    gcommon = shared_options(group, LOG_OPTS, CONTROL_OPTS, JSON_OPTS)
    gcmds = Subcommands(
        group.add_subparsers(dest="group_command", metavar="COMMAND", required=True), gcommon
    )
    c = gcmds.add_parser("list", help="groups with committed state")
    c.set_defaults(func=_group_list)
    c = gcmds.add_parser("describe", help="members, assignment, offsets and lag")
    c.add_argument("name")
    c.set_defaults(func=_group_describe)


def _log(args: argparse.Namespace) -> Log:
    return riverbed.log.open(getattr(args, "log", None) or load_config().log_url)


def _control_url(args: argparse.Namespace) -> str:
    return getattr(args, "control", None) or load_config().control_url


def _topic_create(args: argparse.Namespace) -> int:
    log = _log(args)
    config = log.create_topic(
        args.name,
        args.partitions,
        partitioner=args.partitioner,
        serde=args.serde,
        segment_bytes=_size(args.segment_bytes),
        retention_bytes=_size(args.retention_bytes) if args.retention_bytes else None,
        retention_ms=_duration_ms(args.retention) if args.retention else None,
        fsync=args.fsync,
    )
    if args.json:
        print(json.dumps(config.to_dict()))
    else:
        out.print(f"created topic {config.name} with {config.partitions} partitions")
    return 0


def _topic_list(args: argparse.Namespace) -> int:
    log = _log(args)
    for name in log.topics():
        config = log.topic(name)
        if args.json:
            print(json.dumps({"name": name, "partitions": config.partitions}))
        else:
            out.print(f"{name}  partitions={config.partitions}  serde={config.serde}")
    return 0


def _topic_describe(args: argparse.Namespace) -> int:
    log = _log(args)
    config = log.topic(args.name)
    offsets = log.offsets(args.name)
    if args.json:
        print(
            json.dumps(
                {
                    **config.to_dict(),
                    "offsets": [
                        {"partition": o.partition, "start": o.start, "end": o.end} for o in offsets
                    ],
                }
            )
        )
        return 0
    out.print(
        f"[bold]{config.name}[/bold]  partitioner={config.partitioner} "
        f"serde={config.serde} fsync={config.fsync}"
    )
    table = Table()
    for col in ("partition", "first offset", "next offset", "records"):
        table.add_column(col, justify="right")
    for o in offsets:
        table.add_row(str(o.partition), str(o.start), str(o.end), str(o.end - o.start))
    out.print(table)
    return 0


def _topic_add(args: argparse.Namespace) -> int:
    config = _log(args).add_partitions(args.name, args.partitions)
    if args.json:
        print(json.dumps(config.to_dict()))
    else:
        out.print(f"topic {config.name} now has {config.partitions} partitions")
    return 0


def _produce(args: argparse.Namespace) -> int:
    log = _log(args)
    producer = log.producer(args.topic)
    batch: list[Any] = []
    count = 0
    tty = sys.stdin.isatty() is False and sys.stderr.isatty()
    progress = Progress(console=err, transient=True) if tty else None
    task = progress.add_task(f"producing to {args.topic}", total=None) if progress else None
    if progress:
        progress.start()
    try:
        for n, line in enumerate(sys.stdin, 1):
            if not line.strip():
                continue
            try:
                batch.append(json.loads(line))
            except ValueError as exc:
                if batch:
                    count += len(producer.send_batch(batch, key_field=args.key_field))
                raise LogError(
                    f"stdin line {n} is not JSON ({exc}): {line[:80]!r}; the {count} records "
                    "before it were produced"
                ) from None
            if len(batch) >= args.batch:
                count += len(producer.send_batch(batch, key_field=args.key_field))
                batch = []
                if progress and task is not None:
                    progress.update(task, completed=count)
        if batch:
            count += len(producer.send_batch(batch, key_field=args.key_field))
    finally:
        if progress:
            progress.stop()
    if args.json:
        print(json.dumps({"topic": args.topic, "records": count}))
    else:
        err.print(f"produced {count} records to {args.topic}")
    return 0


def _record_json(record: Record) -> str:
    return json.dumps(
        {
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "timestamp": record.timestamp.isoformat(),
            "key": record.key.decode("utf-8", "backslashreplace") if record.key else None,
            "value": record.value
            if not isinstance(record.value, bytes)
            else record.value.decode("utf-8", "backslashreplace"),
        }
    )


def _consume(args: argparse.Namespace) -> int:
    log = _log(args)
    cp = connect(_control_url(args))
    seen = 0
    idle_since = None
    with log.consumer(
        cp,
        args.group,
        args.topic,
        session_ttl=args.ttl,
        start_from="earliest" if args.from_beginning else "latest",
    ) as consumer:
        while True:
            records = consumer.poll(
                timeout=0.5,
                max_records=100 if args.max is None else max(1, min(100, args.max - seen)),
            )
            if not records:
                idle_since = idle_since or time.monotonic()
                if args.timeout is not None and time.monotonic() - idle_since >= args.timeout:
                    break
                continue
            idle_since = None
            for record in records:
                print(_record_json(record), flush=True)
                seen += 1
            if args.max is not None and seen >= args.max:
                break
        consumer.commit()
    cp.close()
    return 0


def _group_list(args: argparse.Namespace) -> int:
    cp = connect(_control_url(args))
    for name in list_groups(cp):
        print(json.dumps({"group": name}) if args.json else name)
    cp.close()
    return 0


def _group_describe(args: argparse.Namespace) -> int:
    cp = connect(_control_url(args))
    desc = describe_group(_log(args), cp, args.name)
    cp.close()
    if args.json:
        print(
            json.dumps(
                {
                    "group": desc.group,
                    "generation": desc.generation,
                    "members": desc.members,
                    "leader": desc.leader,
                    "partitions": [
                        {
                            "topic": p.topic,
                            "partition": p.partition,
                            "owner": p.owner,
                            "committed": p.committed,
                            "end": p.end,
                            "lag": p.lag,
                        }
                        for p in desc.partitions
                    ],
                }
            )
        )
        return 0
    out.print(
        f"group [bold]{desc.group}[/bold]  generation {desc.generation}  "
        f"leader {desc.leader or '-'}  members: {', '.join(desc.members) or '-'}"
    )
    table = Table()
    for col in ("topic", "partition", "owner", "committed", "end", "lag"):
        table.add_column(col)
    for p in desc.partitions:
        table.add_row(
            p.topic,
            str(p.partition),
            p.owner or "-",
            "-" if p.committed is None else str(p.committed),
            str(p.end),
            str(p.lag),
        )
    out.print(table)
    return 0
