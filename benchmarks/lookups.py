"""What a lookup join costs a task, per batch of events.

riverbed joins each piece of a batch with the lookup table's snapshot (hashed once per
snapshot and process: ``riverbed.stream.lookups``). Beside it, on the same Arrow batch
and table: DuckDB's left join (zero-copy Arrow in and out; it hashes the table for
every query), and ``pyarrow.compute.index_in`` (what the join used first: the table
hashed again for every piece).

    .venv/bin/python benchmarks/lookups.py [--rows 50000] [--rounds 7]

Prints, for tables of 1,000 to 1,000,000 keys (integer and text), the median time per
batch of each and riverbed's speed relative to each (above 1: riverbed is faster).
"""

from __future__ import annotations

import argparse
import warnings

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from expressions import median_ms  # beside this script: warm once, then the median (ms)
from riverbed.stream import Lookup
from riverbed.stream.lookups import join


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000, help="events per batch")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # DuckDB's note on Arrow output copies
    rng = np.random.default_rng(0)
    lookup = Lookup("table.parquet", on=("cid", "id"))
    print(f"a batch of {args.rows:,} events joined with a table (left join, 2 columns added)")
    print(f"{'key':>5} {'table':>10} {'riverbed':>10} {'duckdb':>10} {'index_in':>10}  ratios")
    for kind in ("int", "text"):
        for size in (1_000, 100_000, 1_000_000):
            ids = np.arange(size)
            keys = pa.array(ids, pa.int64()) if kind == "int" else pa.array([f"c{i}" for i in ids])
            table = pa.table(
                {
                    "id": keys,
                    "owner": pa.array([f"o{i % 97}" for i in range(size)]),
                    "budget": pa.array(rng.random(size)),
                }
            )
            drawn = rng.integers(0, int(size * 1.1), args.rows)  # ~9 % without a row
            values = (
                pa.array(drawn, pa.int64()) if kind == "int" else pa.array([f"c{i}" for i in drawn])
            )
            events = pa.table({"cid": values})
            ours = median_ms(lambda e=events, t=table: join(e, lookup, t), args.rounds)
            con = duckdb.connect()
            con.register("ev", events)
            con.register("t", table)
            query = "SELECT * FROM ev LEFT JOIN t ON ev.cid = t.id"
            duck = median_ms(lambda: con.sql(query).to_arrow_table(), args.rounds)  # noqa: B023

            def again() -> None:
                at = pc.index_in(values, value_set=keys)  # noqa: B023
                for name in ("owner", "budget"):
                    table.column(name).take(at)  # noqa: B023

            rehash = median_ms(again, args.rounds)
            print(
                f"{kind:>5} {size:>10,} {ours:>8.1f}ms {duck:>8.1f}ms {rehash:>8.1f}ms  "
                f"{duck / ours:.2f}x duckdb, {rehash / ours:.2f}x index_in"
            )


if __name__ == "__main__":
    main()
