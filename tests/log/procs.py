"""Child-process producers for the log crash tests (run as scripts)."""

from __future__ import annotations

import sys

import riverbed.log


def produce_forever(path: str, writer: str, batch: int) -> None:
    """Append numbered batches; print "partition base count first_seq" once acknowledged."""
    log = riverbed.log.open(f"file://{path}")
    producer = log.producer("events")
    seq = 0
    while True:
        values = [{"w": writer, "seq": seq + i, "pad": "x" * 200} for i in range(batch)]
        metas = producer.send_batch(values, key_field="w")
        print(metas[0].partition, metas[0].offset, len(metas), seq, flush=True)
        seq += batch


if __name__ == "__main__":
    produce_forever(sys.argv[1], sys.argv[2], int(sys.argv[3]))
