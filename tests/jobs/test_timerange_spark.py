"""Time-range jobs on a real local Spark: any chunking equals one pass, and pandas agrees.

Values are multiples of 1/4, so every sum is exact in floating point and chunked and
one-pass results must be *equal*, not merely close; only the sample standard deviation
(a division and a square root over different partial sums) is compared to 1e-9.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from riverbed.control import connect
from riverbed.jobs.timerange import (
    Cumulative,
    Custom,
    Driver,
    LoadedSpec,
    MissingInputError,
    ParquetInput,
    Progress,
    RangeError,
    Rolling,
    Rows,
    SpecError,
    TimeRangeJob,
    Tumbling,
    load_spec,
    parse_time,
)
from riverbed.timerange.compute import one_pass
from riverbed.timerange.oracle import pandas_rows
from riverbed.timerange.spec import label

T0 = parse_time("2026-01-01")
START = pd.Timestamp("2026-01-01", tz="UTC")
AGGS = ["mean", "sum", "count", "min", "max", "stddev"]


def write_input(folder: Path, frame: pd.DataFrame) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pandas(frame, preserve_index=False).cast(
        pa.schema(
            [("sensor", pa.int64()), ("ts", pa.timestamp("us", tz="UTC")), ("value", pa.float64())]
        )
    )
    pq.write_table(table, folder / "part.parquet")


def spec_for(job: TimeRangeJob, out: Path) -> LoadedSpec:
    return LoadedSpec(replace(job, name="t", output=str(out)), Path("t.py"), "test")


def run(
    spark: Any,
    spec: LoadedSpec,
    start: str,
    end: str,
    cp: Any = None,
    batch: int | None = None,
    **kw: Any,
) -> Any:
    driver = Driver(spec, cp or connect("memory://"), lambda: spark, ttl=5, batch=batch)
    driver.run(start, end, **kw)
    return driver


def sort(frame: pd.DataFrame) -> pd.DataFrame:
    cols = [c for c in ("sensor", "ts", "value", "window_start") if c in frame.columns]
    return frame.sort_values(cols, na_position="first", kind="stable").reset_index(drop=True)


def assert_same(got: pd.DataFrame, want: pd.DataFrame, exact: bool) -> None:
    got, want = sort(got), sort(want[list(got.columns)])
    assert len(got) == len(want)
    assert (got["sensor"].to_numpy() == want["sensor"].to_numpy()).all()
    assert (pd.to_datetime(got["ts"], utc=True) == pd.to_datetime(want["ts"], utc=True)).all()
    for col in got.columns:
        if col in ("sensor", "ts"):
            continue
        a = got[col].astype(float).to_numpy()
        b = want[col].astype(float).to_numpy()
        if exact and "stddev" not in col:
            same = (a == b) | (np.isnan(a) & np.isnan(b))
        else:
            same = np.isclose(a, b, rtol=1e-9, atol=1e-12, equal_nan=True)
        assert same.all(), f"{col}: {a[~same][:5]} != {b[~same][:5]}"


events = st.lists(
    st.tuples(
        st.sampled_from([0, 1, 2]),
        # minutes into the range: many land exactly on chunk edges (multiples of 15)
        st.one_of(st.integers(0, 119).map(lambda m: m * 60), st.integers(0, 7199)),
        st.one_of(st.none(), st.integers(-20, 40).map(lambda v: v / 4)),
    ),
    max_size=60,
)


@given(
    events,
    st.sampled_from(["15m", "20m", "30m", "1h"]),
    st.sampled_from(["10min", "45min", "90min"]),
    st.integers(1, 3),
    st.booleans(),
    st.integers(1, 5),
)
@example([], "1h", "10min", 1, False, 1)  # nothing at all
@example([(0, 0, None), (0, 900, None), (0, 900, 1.0), (1, 1800, 2.5)], "15m", "45min", 3, True, 3)
@settings(
    max_examples=2,  # 30-60 s each on 2 cores, plus the 2 explicit; other tests cover more
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # shrinking on Spark takes ages
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_any_chunking_equals_one_pass_and_pandas(
    spark: Any,
    rows: list[tuple[int, int, float | None]],
    chunk: str,
    window: str,
    n: int,
    lonely: bool,
    batch: int,
) -> None:
    """Carried state (cumulative values, row windows) across chunks computed ``batch`` per
    Spark query, each chunk with its own carry."""
    frame = pd.DataFrame(
        [(s, START + pd.Timedelta(seconds=sec), v) for s, sec, v in rows]
        # a key seen in one chunk only, and two rows tied in time on an edge
        + (
            [(7, START + pd.Timedelta(minutes=60), 1.0), (7, START + pd.Timedelta(minutes=60), 2.5)]
            if lonely
            else []
        ),
        columns=["sensor", "ts", "value"],
    )
    with tempfile.TemporaryDirectory() as tmp:
        write_input(Path(tmp) / "in", frame)
        job = TimeRangeJob(
            input=ParquetInput(str(Path(tmp) / "in")),
            key="sensor",
            time="ts",
            metrics=[
                Rolling(window, "value", AGGS),
                Rows(n, "value", ["mean", "sum", "max"]),
                Cumulative("value", ["sum", "count", "min", "max", "mean"]),
            ],
            chunk=chunk,
        )
        spec = spec_for(job, Path(tmp) / "out")
        driver = run(spark, spec, "2026-01-01T00:00Z", "2026-01-01T02:00Z", batch=batch)
        got = driver.output.read("rows").to_pandas()
        whole = one_pass(spark, spec.job, T0, T0 + 2 * 3_600_000_000).rows
        assert whole is not None
        assert_same(got, whole.toPandas(), exact=True)
        assert_same(got, pandas_rows(spec.job, frame), exact=False)


def max_over_10min(df: Any) -> Any:
    """A Custom metric: the max of the last 10 minutes, written in Spark by hand."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    w = Window.partitionBy("sensor").orderBy(F.unix_micros("ts")).rangeBetween(-599_999_999, 0)
    return df.withColumn("value_custom_max", F.max("value").over(w))


@given(
    events,
    st.sampled_from(["10m", "15m", "30m", "1h"]),
    st.sampled_from(["5min", "25min", "70min"]),
    st.integers(1, 7),
)
@settings(
    max_examples=3,  # 30-60 s each on 2 cores
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_chunks_computed_several_per_query_equal_one_pass(
    spark: Any, rows: list[tuple[int, int, float | None]], chunk: str, window: str, batch: int
) -> None:
    """Jobs without carried state compute several chunks per Spark query (``batch``, any
    size, cut short at the range's end): rolling, custom and tumbling outputs still equal
    one pass exactly."""
    frame = pd.DataFrame(
        [(s, START + pd.Timedelta(seconds=sec), v) for s, sec, v in rows],
        columns=["sensor", "ts", "value"],
    )
    with tempfile.TemporaryDirectory() as tmp:
        write_input(Path(tmp) / "in", frame)
        job = TimeRangeJob(
            input=ParquetInput(str(Path(tmp) / "in")),
            key="sensor",
            time="ts",
            metrics=[
                Rolling(window, "value", ["mean", "sum", "count", "max"], min_periods=2),
                Custom(max_over_10min, lookback="10min"),
            ],
            tumbling=[Tumbling(chunk, "value", ["sum", "count"])],
            chunk=chunk,
        )
        spec = spec_for(job, Path(tmp) / "out")
        driver = Driver(spec, connect("memory://"), lambda: spark, ttl=5, batch=batch)
        chunks = (2 * 3_600_000_000) // spec.job.chunk_us
        progress = Progress(T0, spec.job.chunk_us, T0, T0 + 2 * 3_600_000_000)
        assert driver.batch_size(progress, T0) == min(batch, chunks)
        driver.run("2026-01-01T00:00Z", "2026-01-01T02:00Z")
        whole = one_pass(spark, spec.job, T0, T0 + 2 * 3_600_000_000)
        assert whole.rows is not None
        assert_same(driver.output.read("rows").to_pandas(), whole.rows.toPandas(), exact=True)
        size = label(spec.job.chunk_us)
        got = driver.output.read(f"windows_{size}").to_pandas()
        want = whole.windows[size].toPandas()
        key = ["sensor", "window_start"]
        got, want = (f.sort_values(key).reset_index(drop=True) for f in (got, want))
        pd.testing.assert_frame_equal(got, want[got.columns], check_dtype=False)
        assert len(list((Path(tmp) / "out" / "rows").iterdir())) == chunks  # one per chunk


def test_tumbling_windows_equal_one_pass(spark: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    frame = pd.DataFrame(
        {
            "sensor": rng.integers(0, 4, 400),
            "ts": START + pd.to_timedelta(rng.integers(0, 4 * 3600, 400), unit="s"),
            "value": rng.integers(0, 80, 400) / 4,
        }
    )
    write_input(tmp_path / "in", frame)
    job = TimeRangeJob(
        input=ParquetInput(str(tmp_path / "in")),
        key="sensor",
        time="ts",
        tumbling=[Tumbling("30min", "value", AGGS), Tumbling("1h", "value", ["count"])],
        chunk="1h",
    )
    driver = run(spark, spec_for(job, tmp_path / "out"), "2026-01-01", "2026-01-01T04:00")
    assert driver.output.datasets() == ["windows_1h", "windows_30m"]
    whole = one_pass(spark, driver.job, T0, T0 + 4 * 3_600_000_000)
    for size in ("30m", "1h"):
        got = driver.output.read(f"windows_{size}").to_pandas()
        want = whole.windows[size].toArrow().to_pandas()
        got, want = (
            f.sort_values(["sensor", "window_start"]).reset_index(drop=True) for f in (got, want)
        )
        pd.testing.assert_frame_equal(got, want[got.columns], check_dtype=False)
    expected = frame.assign(w=frame.ts.dt.floor("30min")).groupby(["sensor", "w"]).value.mean()
    got = driver.output.read("windows_30m").to_pandas()
    got = got.set_index(["sensor", got.window_start.dt.tz_convert("UTC").rename("w")])
    assert np.allclose(got.value_mean_30m.sort_index(), expected.sort_index())


class FailOnce:
    """An input that raises the first time it is asked for one chunk (a crash stand-in)."""

    def __init__(self, folder: Path, at: int) -> None:
        self.folder, self.at, self.failed = folder, at, False

    def __call__(self, spark: Any, start: Any, end: Any) -> Any:
        if not self.failed and end == pd.Timestamp(self.at, unit="us", tz="UTC"):
            self.failed = True
            raise RuntimeError("boom")
        return spark.read.parquet(str(self.folder))


def readings(hours: int, seed: int, n: int = 600) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "sensor": rng.integers(0, 5, n),
            "ts": START + pd.to_timedelta(rng.integers(0, hours * 3600, n), unit="s"),
            "value": rng.integers(0, 100, n) / 4,
        }
    )


def hourly_readings(tmp_path: Path, frame: pd.DataFrame, metrics: list[Any]) -> LoadedSpec:
    """A job of hourly chunks over ``frame`` written as the Parquet input under tmp_path."""
    write_input(tmp_path / "in", frame)
    job = TimeRangeJob(
        input=ParquetInput(str(tmp_path / "in")),
        key="sensor",
        time="ts",
        metrics=metrics,
        chunk="1h",
    )
    return spec_for(job, tmp_path / "out")


def metrics() -> list[Any]:
    return [Rolling("45min", "value", ["mean", "max"]), Cumulative("value", ["sum", "count"])]


def test_a_failed_run_resumes_where_it_stopped(spark: Any, tmp_path: Path) -> None:
    frame = readings(6, seed=5)
    write_input(tmp_path / "in", frame)
    fail = FailOnce(tmp_path / "in", at=T0 + 4 * 3_600_000_000)
    job = TimeRangeJob(input=fail, key="sensor", time="ts", metrics=metrics(), chunk="1h")
    spec = spec_for(job, tmp_path / "out")
    cp = connect("memory://")
    with pytest.raises(RuntimeError, match="boom"):
        run(spark, spec, "2026-01-01", "2026-01-01T06:00", cp=cp, batch=1)
    assert len(list((tmp_path / "out" / "rows").iterdir())) == 3  # chunks 0..2 published
    driver = run(spark, spec, "2026-01-01", "2026-01-01T06:00", cp=cp)
    records = cp.get_prefix(b"riverbed/timerange/t/chunks/")
    assert len(records) == 6 and {kv.version for kv in records} == {1}  # each published once
    assert_same(driver.output.read("rows").to_pandas(), pandas_rows(spec.job, frame), False)
    assert not list((tmp_path / "out" / "_riverbed" / "staging").glob("*"))


def test_a_run_stopped_inside_a_batch_resumes_from_that_chunks_carry(
    spark: Any, tmp_path: Path
) -> None:
    """Chunks computed three per query, the run stopped right after the middle chunk of a
    batch is published: the resumed run starts from that chunk's own carried state and
    the whole equals one pass and pandas."""
    frame = readings(8, seed=11)
    metrics = [
        Rolling("40min", "value", ["mean"]),
        Rows(4, "value", ["sum", "max"]),
        Cumulative("value", ["sum", "count", "mean", "min"]),
    ]
    spec = hourly_readings(tmp_path, frame, metrics)
    cp = connect("memory://")

    class Stop(Exception):
        pass

    published = []

    def stop_after_the_fifth(event: Any) -> None:
        if event.kind == "chunk":
            published.append(event.record)
            if len(published) == 5:  # chunk 4: the middle of the batch [3, 6)
                raise Stop

    driver = Driver(spec, cp, lambda: spark, ttl=5, batch=3, on_event=stop_after_the_fifth)
    with pytest.raises(Stop):
        driver.run("2026-01-01", "2026-01-01T08:00")
    assert all(r.carry for r in published)
    driver = run(spark, spec, "2026-01-01", "2026-01-01T08:00", cp=cp, batch=3)
    records = cp.get_prefix(b"riverbed/timerange/t/chunks/")
    assert len(records) == 8 and {kv.version for kv in records} == {1}
    got = driver.output.read("rows").to_pandas()
    whole = one_pass(spark, spec.job, T0, T0 + 8 * 3_600_000_000).rows
    assert whole is not None
    assert_same(got, whole.toPandas(), exact=True)
    assert_same(got, pandas_rows(spec.job, frame), exact=False)


def test_a_rerun_recomputes_the_corrected_chunks_and_what_they_feed(
    spark: Any, tmp_path: Path
) -> None:
    frame = readings(8, seed=9)
    spec = hourly_readings(tmp_path, frame, [Rolling("90min", "value", ["sum"])])
    cp = connect("memory://")
    run(spark, spec, "2026-01-01", "2026-01-01T08:00", cp=cp)
    late = frame.copy()
    hour2 = (late.ts >= START + pd.Timedelta(hours=2)) & (late.ts < START + pd.Timedelta(hours=3))
    late.loc[hour2, "value"] += 100  # late corrections of hour 2
    write_input(tmp_path / "in", late)
    driver = run(spark, spec, "2026-01-01T02:00", "2026-01-01T03:00", cp=cp, rerun=True)
    versions = {
        kv.key.decode().rsplit("/", 1)[1]: kv.version
        for kv in cp.get_prefix(b"riverbed/timerange/t/chunks/")
    }
    # hour 2 and the chunks whose 90-minute windows reach into it: hours 3 and 4
    assert [k[9:11] for k, v in sorted(versions.items()) if v == 2] == ["02", "03", "04"]
    assert_same(driver.output.read("rows").to_pandas(), pandas_rows(spec.job, late), False)


def test_bad_input_gets_one_line_that_names_the_fix(spark: Any, tmp_path: Path) -> None:
    folder = tmp_path / "in"
    for hour in (0, 2):  # hour 1 is missing
        frame = readings(1, seed=hour)
        frame["ts"] += pd.Timedelta(hours=hour)
        write_input(folder / f"hour=2026-01-01T{hour:02d}", frame)
    job = TimeRangeJob(
        input=ParquetInput(str(folder), partition="hour"),
        key="sensor",
        time="ts",
        metrics=metrics(),
    )
    spec = spec_for(job, tmp_path / "out")
    with pytest.raises(MissingInputError, match=r"T01 does not exist.*allow_missing"):
        run(spark, spec, "2026-01-01", "2026-01-01T03:00")
    with pytest.raises(RangeError, match="not before --to"):
        run(spark, spec, "2026-01-01T03:00", "2026-01-01")
    ok = spec_for(
        replace(job, input=ParquetInput(str(folder), "hour", allow_missing=True)), tmp_path / "out2"
    )
    driver = run(spark, ok, "2026-01-01", "2026-01-01T03:00")
    assert len(driver.output.read("rows")) == 1200
    wrong = spec_for(replace(job, key="device"), tmp_path / "out3")
    with pytest.raises(SpecError, match="no column 'device'"):
        run(spark, wrong, "2026-01-01", "2026-01-01T01:00")
    bad = tmp_path / "broken.py"
    bad.write_text(
        "from riverbed.jobs.timerange import TimeRangeJob\n\njob = TimeRangeJob(\n"
        "    input=None, key='k', time='t', metrics=[])\n"
    )
    with pytest.raises(SpecError, match=r"broken.py:3: .*input must be"):
        load_spec(bad)


def test_nanosecond_timestamps_get_a_clear_error(spark: Any, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    readings(1, seed=1).to_parquet(tmp_path / "in" / "p.parquet")  # pandas writes nanoseconds
    job = TimeRangeJob(
        input=ParquetInput(str(tmp_path / "in")), key="sensor", time="ts", metrics=metrics()
    )
    with pytest.raises(SpecError, match="microseconds"):
        run(spark, spec_for(job, tmp_path / "out"), "2026-01-01", "2026-01-01T01:00")


def test_outputs_read_in_duckdb_and_polars_without_duplicates(spark: Any, tmp_path: Path) -> None:
    import duckdb
    import polars as pl

    frame = readings(3, seed=2)
    write_input(tmp_path / "in", frame)
    job = TimeRangeJob(
        input=ParquetInput(str(tmp_path / "in")),
        key="sensor",
        time="ts",
        metrics=metrics(),
        chunk="1h",
    )
    run(spark, spec_for(job, tmp_path / "out"), "2026-01-01", "2026-01-01T03:00")
    pattern = str(tmp_path / "out" / "rows" / "*" / "*.parquet")
    n, chunks = duckdb.sql(
        f"select count(*), count(distinct chunk) from read_parquet('{pattern}', "
        "hive_partitioning=true)"
    ).fetchall()[0]
    assert (n, chunks) == (len(frame), 3)
    assert pl.read_parquet(pattern).height == len(frame)
    assert spark.read.parquet(str(tmp_path / "out" / "rows")).count() == len(frame)
    assert math.isclose(
        pl.read_parquet(pattern)["value_cum_sum"].max(),
        frame.groupby("sensor").value.sum().max(),
    )


def test_rows_come_back_through_a_spill_that_is_sized_resumed_and_never_left_behind(
    spark: Any, tmp_path: Path
) -> None:
    """A batch's rows go through a spill (Spark writes them, the driver reads them
    back): a run's first query computes one chunk, the later ones several (sized by
    what a chunk took — on a resume, by what the last run's chunks took); no spill is
    left, and one a crashed driver left is forgotten by the next. Left to choose, a
    driver spills only when the heap would keep its batches small."""
    from riverbed.timerange.driver import ChunkRecord

    frame = readings(8, seed=5)
    spec = hourly_readings(tmp_path, frame, [Rows(3, "value", ["mean"]), Cumulative("value")])
    cp = connect("memory://")
    leftover = tmp_path / "out" / "_riverbed" / "spill" / "batch-crashed"
    leftover.mkdir(parents=True)
    (leftover / "part-0.parquet").write_bytes(b"half a file")

    class Stop(Exception):
        pass

    sizes: list[int] = []

    def stop_after_three(event: Any) -> None:
        if event.kind == "chunk" and event.record.start == T0 + 2 * 3_600_000_000:
            raise Stop

    driver = Driver(spec, cp, lambda: spark, ttl=5, spill=True, on_event=stop_after_three)
    progress = Progress(T0, spec.job.chunk_us, T0, T0 + 8 * 3_600_000_000)
    sizes.append(driver.batch_size(progress, T0))
    with pytest.raises(Stop):
        driver.run("2026-01-01", "2026-01-01T08:00")
    assert not leftover.exists(), "the crashed driver's spill was not forgotten"
    records = [
        ChunkRecord.from_json(kv.value)
        for kv in cp.get_prefix(b"riverbed/timerange/t/")
        if b"/chunks/" in kv.key
    ]
    assert records and all(r.arrow_bytes > 0 for r in records)

    resumed = Driver(spec, cp, lambda: spark, ttl=5, spill=True)
    seen: list[int] = []
    original = resumed.batch_size

    def recorded(progress: Progress, start: int) -> int:
        seen.append(original(progress, start))
        return seen[-1]

    resumed.batch_size = recorded  # type: ignore[method-assign]
    resumed.run("2026-01-01", "2026-01-01T08:00")
    assert sizes == [1], "a fresh run's first query is one chunk"
    assert seen[0] > 1, "a resume sized its first batch by the last run's chunks"
    spill = tmp_path / "out" / "_riverbed" / "spill"  # emptied folders go with their files
    assert not (spill.exists() and any(spill.iterdir())), list(spill.iterdir())
    # what Spark wrote (INT96 timestamps, its schema metadata) does not reach the output
    schema = pq.read_schema(next((tmp_path / "out" / "rows").glob("*/part.parquet")))
    assert schema.field("ts").type == pa.timestamp("us", tz="UTC")
    assert not any(b"spark" in k for k in (schema.metadata or {}))
    whole = one_pass(spark, spec.job, T0, T0 + 8 * 3_600_000_000).rows
    assert whole is not None
    assert_same(resumed.output.read("rows").to_pandas(), whole.toPandas(), exact=True)

    chooser = Driver(spec, cp, lambda: spark, ttl=5)
    chooser._bytes_per_chunk = resumed._bytes_per_chunk
    assert not chooser._spills(3), "small chunks: collected through the heap"
    chooser._bytes_per_chunk = 10**12
    assert chooser._spills(3), "chunks too big for the heap's share: spilled"
