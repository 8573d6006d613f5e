"""What evaluating an aggregation's ``where`` and ``columns`` costs a task, per batch.

riverbed evaluates Spark SQL expressions itself on the tasks' Arrow batches
(``riverbed.stream.expressions``: sqlglot's parse, pyarrow.compute, Python's ``re``).
Beside it, on the same Arrow batch: DuckDB running the same expressions as SQL over
the batch (zero-copy Arrow in and out; its semantics differ from Spark's — integer
overflow, casts, regexes — so it is a yardstick of speed, not a candidate answer), and
the batch's own decode (JSON bytes to Arrow: what the task does anyway) for scale.

    .venv/bin/python benchmarks/expressions.py [--rows 50000] [--rounds 7]

Prints the median time per batch of each, and riverbed's ratio to each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from riverbed.stream.expressions import compile_expression, spark_type

WHERE = "price > 100 AND channel <> 'spam'"
COLUMNS = {
    "auction_mod": "auction % 5",
    "dollars": "price * 0.908",
    "domain": "regexp_extract(url, '^https?://([^/]+)', 1)",
}
PLAIN = {"auction_mod": "auction % 5", "dollars": "price * 0.908"}  # no regex


def bids(n: int, seed: int = 1) -> pa.Table:
    rng = np.random.default_rng(seed)
    hosts = np.array(["shop.example", "auction.test", "bids.invalid", "x.y"])
    return pa.table(
        {
            "auction": rng.integers(1000, 2000, n),
            "bidder": rng.integers(0, 10_000, n),
            "price": rng.integers(1, 10_000_000, n),
            "channel": rng.choice(np.array(["web", "app", "spam", "partner"]), n),
            "url": [f"https://{h}/item/{i}" for i, h in enumerate(rng.choice(hosts, n))],
        }
    )


def median_ms(run: Callable[[], object], rounds: int) -> float:
    run()  # warm
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        run()
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    table = bids(args.rows)
    types = {f.name: spark_type(f.type) for f in table.schema}

    def riverbed(columns: dict[str, str]) -> Callable[[], object]:
        compiled = [compile_expression(t, types) for t in columns.values()]
        where = compile_expression(WHERE, types)

        def run() -> object:
            kept = where.evaluate(table)[0]
            return [c.evaluate(table)[0] for c in compiled], kept

        return run

    import duckdb

    def duck(columns: dict[str, str]) -> Callable[[], object]:
        con = duckdb.connect()
        select = ", ".join(f"{t} AS {n}" for n, t in columns.items())
        sql = f"SELECT {select}, ({WHERE}) AS kept FROM batch"

        def run() -> object:
            con.register("batch", table)
            return con.execute(sql).to_arrow_table()

        return run

    rows = [json.dumps(r).encode() for r in table.slice(0, min(args.rows, 50_000)).to_pylist()]
    values = pa.array(rows, pa.binary())

    def decode() -> object:
        from riverbed.spark.values import json_values

        schema = pa.schema([pa.field(f.name, f.type) for f in table.schema])
        from pyspark.sql.types import LongType, StringType, StructField

        fields = [
            StructField(f.name, LongType() if pa.types.is_integer(f.type) else StringType())
            for f in table.schema
        ]
        return json_values(values, fields, schema)

    results = {
        "riverbed (where + 3 columns, one a regex)": median_ms(riverbed(COLUMNS), args.rounds),
        "DuckDB (the same SQL)": median_ms(duck(COLUMNS), args.rounds),
        "riverbed (where + 2 columns, no regex)": median_ms(riverbed(PLAIN), args.rounds),
        "DuckDB (the same SQL, no regex)": median_ms(duck(PLAIN), args.rounds),
        "decoding the batch's JSON (the task's own work)": median_ms(decode, args.rounds),
    }
    print(f"{args.rows:,} rows a batch, median of {args.rounds} rounds")
    for name, ms in results.items():
        print(f"  {name:55s} {ms:8.2f} ms")
    names = list(results)
    print(f"riverbed / DuckDB, with the regex:    {results[names[0]] / results[names[1]]:.2f}x")
    print(f"riverbed / DuckDB, without:           {results[names[2]] / results[names[3]]:.2f}x")
    print(f"riverbed (regex) / the batch's decode: {results[names[0]] / results[names[4]]:.2f}x")


if __name__ == "__main__":
    main()
