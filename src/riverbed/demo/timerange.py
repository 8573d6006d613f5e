"""``riverbed demo timerange``: a chunked run through a driver SIGKILL, checked against one pass.

Six hours (``--hours``) of readings from 50 sensors (hour-partitioned Parquet) and a spec with a
45-minute rolling mean/max, the last 5 readings' mean, running totals and half-hourly
means, in 30-minute chunks. A driver runs as a real process and is SIGKILLed after a few
chunks; a second one resumes from the marker. Then the published output is compared with
the whole range computed in one pass on Spark, and with pandas.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from riverbed.config import Config, child_environment

out = Console(highlight=False)

SPEC = """
from riverbed.jobs.timerange import (Cumulative, ParquetInput, Rolling, Rows, TimeRangeJob,
                                     Tumbling)

job = TimeRangeJob(
    input=ParquetInput({input!r}, partition="hour"),
    key="sensor", time="ts",
    metrics=[Rolling("45min", "value", ["mean", "max"]), Rows(5, "value", ["mean"]),
             Cumulative("value", ["sum", "count"])],
    tumbling=[Tumbling("30min", "value", ["mean", "count"])],
    output={output!r}, chunk="30m",
)
"""


def generate_readings(folder: Path, hours: int, sensors: int) -> int:
    """Hour-partitioned Parquet readings under ``folder``; how many rows."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(2026)
    total = 0
    start = pd.Timestamp("2026-01-01", tz="UTC")
    for hour in range(hours):
        n = sensors * 60
        lo = start + pd.Timedelta(hours=hour)
        frame = pd.DataFrame(
            {
                "sensor": rng.integers(0, sensors, n),
                "ts": lo + pd.to_timedelta(rng.integers(0, 3600, n), unit="s"),
                "value": rng.integers(0, 400, n) / 4,  # quarters: sums are exact
            }
        )
        target = folder / f"hour={lo:%Y-%m-%dT%H}"
        target.mkdir(parents=True, exist_ok=True)
        frame.to_parquet(target / "part.parquet", index=False, coerce_timestamps="us")
        total += n
    return total


def worst_difference(got: Any, oracle: Any) -> float:
    """The largest |difference| of any metric between published rows and the pandas
    oracle (``inf`` when their row counts differ)."""
    keys = ["sensor", "ts", "value"]
    if len(got) != len(oracle):
        return float("inf")
    got, oracle = (f.sort_values(keys).reset_index(drop=True) for f in (got, oracle))
    metrics = [c for c in got.columns if c not in keys]
    return max(
        (float((got[c].astype(float) - oracle[c].astype(float)).abs().max()) for c in metrics),
        default=0.0,
    )


def run_demo_timerange(config: Config, hours: int = 6, sensors: int = 50) -> int:
    import pandas as pd
    import pyarrow.parquet as pq

    from riverbed.control import connect
    from riverbed.jobs.timerange import load_spec, parse_time
    from riverbed.spark import session
    from riverbed.timerange.compute import one_pass
    from riverbed.timerange.oracle import pandas_rows

    home = Path(config.home) / "demo-timerange"
    if home.exists():
        import shutil

        shutil.rmtree(home)
    home.mkdir(parents=True)
    rows = generate_readings(home / "readings", hours, sensors)
    spec_path = home / "sensors.py"
    spec_path.write_text(SPEC.format(input=str(home / "readings"), output=str(home / "out")))
    control = f"sqlite:///{home / 'control.db'}"
    env = child_environment({"RIVERBED_CONTROL": control, "PYTHONUNBUFFERED": "1"})
    end = (pd.Timestamp("2026-01-01", tz="UTC") + pd.Timedelta(hours=hours)).strftime(
        "%Y-%m-%dT%H:%MZ"
    )
    cmd = [
        sys.executable,
        "-m",
        "riverbed.cli.main",
        "timerange",
        "run",
        str(spec_path),
        "--from",
        "2026-01-01",
        "--to",
        end,
        "--ttl",
        "2",
        "--batch",  # one chunk per Spark query: published one by one, so the kill lands mid-run
        "1",
    ]
    out.print(
        f"[bold]riverbed demo timerange[/bold]: {rows:,} readings, {sensors} sensors, "
        f"{hours} h in 30-minute chunks → {home / 'out'}"
    )
    cp = connect(control)
    chunks = b"riverbed/timerange/sensors/chunks/"

    first = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while len(cp.get_prefix(chunks)) < 3:
        if first.poll() is not None or time.monotonic() > deadline:
            why = first.stderr.read() if first.stderr else ""
            out.print(f"[red]the first driver ended early[/red]: {why}")
            return 1
        time.sleep(0.1)
    killed_at = len(cp.get_prefix(chunks))
    first.send_signal(signal.SIGKILL)
    first.wait()
    out.print(f"SIGKILLed the driver after {killed_at} of {hours * 2} chunks were published")
    began = time.monotonic()
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if second.returncode != 0:
        out.print(f"[red]the resumed driver failed[/red]: {second.stderr.strip()}")
        return 1
    out.print(
        f"a new driver resumed from the marker and finished in {time.monotonic() - began:.1f} s"
    )

    spec = load_spec(spec_path)
    files = sorted((home / "out" / "rows").glob("*/part.parquet"))
    got = pd.concat(pq.read_table(f).to_pandas() for f in files)
    spark = session(config.spark)
    whole = one_pass(spark, spec.job, parse_time("2026-01-01"), parse_time(end)).rows
    assert whole is not None
    want = whole.toArrow().to_pandas()
    inputs = pd.concat(
        pq.read_table(f).to_pandas() for f in sorted((home / "readings").glob("*/*.parquet"))
    )
    oracle = pandas_rows(spec.job, inputs)
    keys = ["sensor", "ts", "value"]
    got, want = (f.sort_values(keys).reset_index(drop=True) for f in (got, want))
    metrics = [c for c in got.columns if c not in keys]
    exact = len(got) == len(want) and all(
        ((got[c] == want[c]) | (got[c].isna() & want[c].isna())).all() for c in metrics
    )
    worst = worst_difference(got, oracle)
    versions = [kv.version for kv in cp.get_prefix(chunks)]
    table = Table(title="chunked through a SIGKILL vs one pass")
    for col in ("check", "result"):
        table.add_column(col)
    table.add_row(
        "chunks published",
        f"{len(versions)} of {hours * 2}, each once: "
        f"{'yes' if versions == [1] * (hours * 2) else 'NO'}",
    )
    table.add_row("rows", f"{len(got):,} published, {rows:,} read")
    table.add_row("vs one Spark pass", "IDENTICAL" if exact else "[red]DIFFERENT[/red]")
    table.add_row("vs pandas", f"max |difference| {worst:.2e}")
    out.print(table)
    spark.stop()
    ok = exact and versions == [1] * (hours * 2) and worst < 1e-9 and len(got) == rows
    out.print("[green]OK[/green]" if ok else "[red]MISMATCH[/red]")
    return 0 if ok else 1
