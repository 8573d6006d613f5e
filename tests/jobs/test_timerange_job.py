"""``TimeRangeJob.as_job``: a time-range job as a job of the orchestrator (no Spark here;
tests/jobs/test_processes.py runs one under a real orchestrator and worker)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from riverbed.config import Config
from riverbed.jobs import Job
from riverbed.jobs.spec import Catalog
from riverbed.jobs.timerange import (
    ParquetInput,
    Rolling,
    SpecError,
    TimeRangeJob,
    TimeRangeMain,
    TopicInput,
    Tumbling,
    load_spec,
)
from riverbed.timerange.plan import parse_time
from riverbed.timerange.topic import _log_url

HOUR = 3_600_000_000
JOB = TimeRangeJob(
    input=ParquetInput("in"), key="k", time="t", metrics=[Rolling("1h", "v")], chunk="1h"
)


@given(st.integers(0, 10_000 * HOUR), st.integers(0, 5 * HOUR))
def test_a_run_goes_up_to_the_last_chunk_edge_before_now_minus_delay(now: int, delay: int) -> None:
    origin = parse_time("2026-01-01")
    main = TimeRangeMain(JOB, origin, delay)
    end = main.end_at(origin + now)
    assert (end - origin) % HOUR == 0
    assert end <= origin + now - delay < end + HOUR


def test_as_job_is_a_spark_job_with_the_orchestrators_options() -> None:
    job = JOB.as_job(start="2026-01-01", schedule="5 * * * *", retries=2, delay="10min")
    assert isinstance(job, Job) and job.kind == "spark" and job.retries == 2
    assert job.schedule is not None and job.schedule.cron == "5 * * * *"
    assert isinstance(job.main, TimeRangeMain) and job.main.delay_us == 600_000_000
    with pytest.raises(SpecError, match=r"as_job\(start=...\): cannot read time"):
        JOB.as_job(start="yesterday-ish")
    with pytest.raises(SpecError, match=r"as_job\(delay=...\)"):
        JOB.as_job(start="2026-01-01", delay="soon")


def test_the_same_file_is_a_job_and_a_time_range_spec(tmp_path: Path) -> None:
    (tmp_path / "metrics.py").write_text(
        "from riverbed.jobs.timerange import ParquetInput, Rolling, TimeRangeJob\n"
        "job = TimeRangeJob(input=ParquetInput('in'), key='k', time='t',\n"
        "                   metrics=[Rolling('1h', 'v')]).as_job(start='2026-01-01')\n"
    )
    loaded = Catalog(tmp_path).get("metrics")
    assert isinstance(loaded.spec.main, TimeRangeMain)
    spec = load_spec(tmp_path / "metrics.py")  # riverbed timerange status/run/reset
    assert spec.name == "metrics" and spec.job.rolling[0].column == "v"
    (tmp_path / "other.py").write_text("job = 3\n")
    with pytest.raises(SpecError, match="as_job"):
        load_spec(tmp_path / "other.py")


def test_a_spec_is_placed_by_the_settings_it_is_loaded_with(tmp_path: Path) -> None:
    """Where output goes and which log a topic input reads are settled when a spec is
    loaded — by the CLI's settings, or a worker's handed to the job (ctx.config) — so
    nothing below reads the configuration."""
    (tmp_path / "topics.py").write_text(
        "from riverbed.jobs.timerange import Rolling, TimeRangeJob, TopicInput\n"
        "job = TimeRangeJob(input=TopicInput('r', schema='k bigint, v double'), key='k',\n"
        "                   time='timestamp', metrics=[Rolling('1h', 'v')])\n"
    )
    spec = load_spec(tmp_path / "topics.py", "s3://b/rb", "file:///logs")
    assert spec.job.output == "s3://b/rb/output/topics"
    assert isinstance(spec.job.input, TopicInput) and spec.job.input.log == "file:///logs"
    (tmp_path / "named.py").write_text(
        (tmp_path / "topics.py").read_text().replace("TopicInput('r',", "TopicInput('r', log='x',")
    )
    named = load_spec(tmp_path / "named.py", "", "file:///logs").job.input
    assert isinstance(named, TopicInput) and named.log == "x"  # the spec's own wins
    main = TimeRangeMain(JOB, parse_time("2026-01-01"))
    config = Config(checkpoints="s3://b/rb", log="file:///logs")
    assert main.loaded("m", tmp_path / "m.py", "v1", config).job.output == "s3://b/rb/output/m"


def test_a_topic_input_without_a_log_is_named_not_guessed() -> None:
    with pytest.raises(SpecError, match=r"TopicInput\('r'\) names no log; give log="):
        _log_url(TopicInput("r"))


def test_tables_name_datasets_the_job_writes_in_a_table_spelling() -> None:
    def job(**tables: str) -> TimeRangeJob:
        return TimeRangeJob(
            input=ParquetInput("in"),
            key="sensor",
            time="ts",
            metrics=[Rolling("1h", "v")],
            tumbling=[Tumbling("30m", "v")],
            tables=tables,
        )

    assert job().datasets() == ["rows", "windows_30m"]
    assert job(rows="delta:s3://b/rows").tables == {"rows": "delta:s3://b/rows"}
    with pytest.raises(SpecError, match=r"dataset 'windows_1h'; the job writes \['rows', 'win"):
        job(windows_1h="delta:/x")
    with pytest.raises(SpecError, match=r"tables\['rows'\] 'x.parquet': write delta:PATH"):
        job(rows="x.parquet")
    with pytest.raises(SpecError, match="a column is named 'chunk'"):
        TimeRangeJob(
            input=ParquetInput("in"),
            key="chunk",
            time="ts",
            metrics=[Rolling("1h", "v")],
            tables={"rows": "delta:/x"},
        )
