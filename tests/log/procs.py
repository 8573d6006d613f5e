"""Child-process producers for the log crash tests (run as scripts)."""

from __future__ import annotations

import sys

import riverbed.log


def _url(where: str) -> str:
    """A log directory, or a log URL (a log server: flight://...)."""
    return where if "://" in where else f"file://{where}"


def produce_forever(where: str, writer: str, batch: int) -> None:
    """Append numbered batches; print "partition base count first_seq" once acknowledged,
    "? - count first_seq" when a log server's connection broke before the acknowledgement
    (the batch may or may not be there)."""
    from riverbed.log.wire import ProduceOutcomeUnknownError

    log = riverbed.log.open(_url(where))
    producer = log.producer("events")
    seq = 0
    while True:
        values = [{"w": writer, "seq": seq + i, "pad": "x" * 200} for i in range(batch)]
        try:
            metas = producer.send_batch(values, key_field="w")
            print(metas[0].partition, metas[0].offset, len(metas), seq, flush=True)
        except ProduceOutcomeUnknownError:
            print("?", "-", batch, seq, flush=True)
        seq += batch


def consume_forever(
    where: str, control_url: str, member: str, out_path: str, group: str = "workers"
) -> None:
    """A group member that appends "partition offset key seq time_ns" per processed record."""
    import time as _time

    from riverbed.control import connect

    log = riverbed.log.open(_url(where))
    cp = connect(control_url)
    out = open(out_path, "a")  # noqa: SIM115 - kept open until SIGKILL

    def handle(record: riverbed.log.Record) -> None:
        value = record.value
        out.write(
            f"{record.partition} {record.offset} {value['k']} {value['seq']} {_time.time_ns()}\n"
        )
        out.flush()
        _time.sleep(0.001)

    with log.consumer(cp, group, "events", member_id=member, session_ttl=2) as consumer:
        consumer.run(handle, max_records=20)


if __name__ == "__main__":
    if sys.argv[1] == "consume":
        consume_forever(*sys.argv[2:7])
    else:
        produce_forever(sys.argv[1], sys.argv[2], int(sys.argv[3]))
