"""Job modules, work ids and cron: what loads, what is refused and how it says so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from riverbed.jobs import Catalog, Job, Schedule, SpecError, WorkIdsError, parse_work_ids
from riverbed.jobs.cron import (
    due_fire,
    due_fires,
    latest_fire,
    missed_fires,
    next_fire,
    parse_cron,
)
from riverbed.jobs.runs import work_ids_for
from riverbed.jobs.spec import schedule_job


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    return path


GOOD = """
from riverbed.jobs import Dependency, Job
CALLED = []
def main(ctx, work_ids, **kwargs):
    CALLED.append(work_ids)
job = Job(main=main, chunk_size=10, dependencies=[Dependency("other", max_lag="2h")],
          retries=2, timeout="5m", schedule="*/5 * * * *")
"""


def test_a_module_loads_without_running_main_and_takes_its_name(tmp_path: Path) -> None:
    write(tmp_path, "daily", GOOD)
    loaded = Catalog(tmp_path).get("daily")
    assert loaded.name == "daily"
    assert loaded.spec.dependencies[0].max_lag_seconds == 7200
    assert loaded.spec.timeout_seconds == 300
    assert loaded.code_version.startswith(("src:", "git:"))
    assert loaded.spec.main.__globals__["CALLED"] == []  # imported, main never called


def test_a_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "broken", "from riverbed.jobs import Job\n\ndef main(:\n    pass\n")
    with pytest.raises(SpecError, match=rf"{path}:3: job module 'broken' failed to import"):
        Catalog(tmp_path).get("broken")


def test_an_error_at_import_names_the_line_that_raised(tmp_path: Path) -> None:
    path = write(tmp_path, "raises", "import os\nx = 1\nraise RuntimeError('no db')\n")
    with pytest.raises(SpecError, match=rf"{path}:3: .*RuntimeError: no db"):
        Catalog(tmp_path).get("raises")


def test_a_bad_spec_value_names_the_line_and_the_fix(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "bad",
        "from riverbed.jobs import Job\n\njob = Job(main=print, chunk_size=0)\n",
    )
    with pytest.raises(SpecError, match=rf"{path}:3: .*chunk_size must be a whole number"):
        Catalog(tmp_path).get("bad")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("x = 1\n", "defines no `job = Job"),
        ("from riverbed.jobs import Job\njob = Job(main=print, name='other')\n", "differs from"),
        (
            "from riverbed.jobs import Job, Dependency\n"
            "job = Job(main=print, dependencies=[Dependency('me')])\n",
            "depends on itself",
        ),
        ("from riverbed.jobs import Job\njob = Job(main=print, kind='java')\n", "kind must be"),
        (
            "from riverbed.jobs import Job\njob = Job(main=print, schedule='every day')\n",
            "five fields",
        ),
        (
            "from riverbed.jobs import Job, Dependency\n"
            "job = Job(main=print, dependencies=[Dependency('x', max_lag='soon')])\n",
            "cannot read duration",
        ),
    ],
)
def test_malformed_specs_are_refused_clearly(tmp_path: Path, text: str, message: str) -> None:
    write(tmp_path, "me", text)
    with pytest.raises(SpecError, match=message):
        Catalog(tmp_path).get("me")


def test_a_missing_job_lists_the_jobs_there_are(tmp_path: Path) -> None:
    write(tmp_path, "daily", GOOD)
    write(tmp_path, "_helpers", "X = 1\n")
    with pytest.raises(SpecError, match=r"no job .weekly.*jobs in .*: daily\)"):
        Catalog(tmp_path).get("weekly")


def test_load_all_reports_broken_modules_and_keeps_the_rest(tmp_path: Path) -> None:
    write(tmp_path, "daily", GOOD)
    write(tmp_path, "broken", "raise ValueError('x')\n")
    jobs, errors = Catalog(tmp_path).load_all()
    assert [j.name for j in jobs] == ["daily"]
    assert len(errors) == 1 and "broken" in str(errors[0])


def test_kwargs_must_be_json() -> None:
    from riverbed.jobs import Dependency

    with pytest.raises(SpecError, match="JSON values"):
        Dependency("x", kwargs={"when": object()})


def test_work_ids_parse_ranges_and_refuse_nonsense() -> None:
    assert parse_work_ids("1-3,7, 5") == [1, 2, 3, 5, 7]
    assert parse_work_ids([3, 1, 3]) == [1, 3]
    with pytest.raises(WorkIdsError, match="runs backwards"):
        parse_work_ids("9-2")
    with pytest.raises(WorkIdsError, match="'x' is not a whole number"):
        parse_work_ids("1,x")
    with pytest.raises(WorkIdsError, match="not a whole number"):
        parse_work_ids([1.5])
    with pytest.raises(Exception, match="whole number"):
        Job(main=print, chunk_size=-1)


def test_cron_refuses_bad_expressions() -> None:
    with pytest.raises(ValueError, match="five fields"):
        parse_cron("* * *")
    with pytest.raises(ValueError, match="61"):
        parse_cron("61 * * * *")
    with pytest.raises(ValueError, match="at least one second"):
        parse_cron("@every 0s")
    with pytest.raises(ValueError, match="interval 'soon'"):
        parse_cron("@every soon")


def test_an_interval_fires_at_whole_multiples_of_its_period() -> None:
    t = 1_800_000_000.0  # a multiple of 15 minutes
    assert next_fire("@every 15m", t) == t + 900
    assert next_fire("@every 15m", t - 0.5) == t
    assert latest_fire("@every 15m", t + 899.9) == t
    assert due_fires("@every 15m", t - 1800, t + 10, 600) == [t]  # t - 900: past its grace
    assert missed_fires("@every 15m", t - 1800, t + 10, 600) == (1, t - 900)


MINUTE = 60.0
TRIGGERS = [
    "* * * * *",
    "*/5 * * * *",
    "0 * * * *",
    "30 2 * * *",
    "0 0 * * 1",
    "@every 45s",
    "@every 15m",
    "@every 1h30m",
    "@every 7d",
]


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(TRIGGERS),
    st.floats(1.7e9, 1.8e9),
    st.one_of(st.none(), st.floats(0, 5e5)),
    st.floats(0, 3600),
)
def test_due_fire_runs_at_most_once_the_latest_missed_fire_inside_grace(
    expr: str, now: float, since_last: float | None, grace: float
) -> None:
    last = None if since_last is None else latest_fire(expr, now - since_last)
    fire = due_fire(expr, last, now, grace)
    latest = latest_fire(expr, now)
    assert latest <= now < next_fire(expr, latest)
    if fire is not None:
        assert fire == latest  # the latest fire only: one run after an outage
        assert now - fire <= grace
        assert last is None or fire > last
        assert due_fire(expr, fire, now, grace) is None  # recorded → never again
    else:
        assert (last is not None and latest <= last) or now - latest > grace


def _every_fire(expr: str, after: float, upto: float) -> list[float]:
    """Brute force: every fire time in (after, upto]."""
    out, fire = [], next_fire(expr, after)
    while fire <= upto:
        out.append(fire)
        fire = next_fire(expr, fire)
    return out


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(TRIGGERS),
    st.floats(1.7e9, 1.8e9),
    st.one_of(st.none(), st.floats(0, 5e4)),
    st.floats(0, 7200),
    st.sampled_from(["all", "latest"]),
)
def test_due_fires_catch_up_every_fire_inside_grace_once_or_only_the_latest(
    expr: str, now: float, since_last: float | None, grace: float, catchup: str
) -> None:
    last = None if since_last is None else latest_fire(expr, now - since_last)
    fires = due_fires(expr, last, now, grace, catchup)
    inside = [] if last is None else [f for f in _every_fire(expr, last, now) if now - f <= grace]
    newest = due_fire(expr, last, now, grace)
    if last is None or catchup == "latest":
        assert fires == ([] if newest is None else [newest])
    else:
        assert fires == inside  # every missed fire inside the grace, oldest first, once
    assert fires == sorted(set(fires))
    if fires:  # recorded one by one → nothing is due again
        assert due_fires(expr, fires[-1], now, grace, catchup) == []
    missed, newest_missed = missed_fires(expr, last, now, grace)
    if last is not None:  # every fire after last is run now, missed, or superseded
        every = _every_fire(expr, last, now)
        assert missed == sum(1 for f in every if now - f > grace)
        assert newest_missed == max((f for f in every if now - f > grace), default=None)
        if catchup == "all":
            assert missed + len(fires) == len(every)


def test_a_failover_longer_than_the_period_still_runs_each_fire_once() -> None:
    """o1 fired 08:44 and died; o2 first ticks at 08:46:10: 08:45 and 08:46 both run."""
    t = 1_800_000_000.0 - 1_800_000_000.0 % 3600 + 8 * 3600 + 44 * 60
    assert due_fires("* * * * *", t, t + 130, 600) == [t + 60, t + 120]
    assert due_fires("* * * * *", t, t + 130, 600, "latest") == [t + 120]
    with pytest.raises(ValueError, match="catchup must be one of all, latest"):
        due_fires("* * * * *", t, t + 130, 600, "some")


def test_a_schedule_may_be_a_dict_and_a_bad_one_is_named() -> None:
    job = Job(main=_noop_main, name="r", schedule={"cron": "0 6 * * *", "work_ids": "1-3"})
    assert isinstance(job.schedule, Schedule) and job.schedule.work_ids == (1, 2, 3)
    with pytest.raises(SpecError, match="not when"):
        Job(main=_noop_main, name="r", schedule={"cron": "0 6 * * *", "when": "daily"})
    with pytest.raises(SpecError, match="schedule must be"):
        Job(main=_noop_main, name="r", schedule=6)  # type: ignore[arg-type]


def _noop_main(ctx: object, work_ids: list[int]) -> None:
    pass


def test_a_job_may_have_several_schedules_named_and_by_interval() -> None:
    job = Job(
        main=_noop_main,
        name="r",
        schedule=[
            "0 6 * * *",
            {"every": "15m", "name": "often", "kwargs": {"fast": True}},
            Schedule(every=90, name="odd"),
        ],
    )
    assert [(s.key("r"), s.trigger) for s in job.schedules] == [
        ("r", "0 6 * * *"),
        ("r:often", "@every 15m"),
        ("r:odd", "@every 90.0s"),
    ]
    assert schedule_job("r:often") == "r" and schedule_job("r") == "r"
    assert Job(main=_noop_main, schedule="0 6 * * *").schedules[0].cron == "0 6 * * *"
    assert Job(main=_noop_main).schedules == ()


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ([{"every": "1h"}, {"every": "2h"}], "need distinct names"),
        ({"every": "1h", "cron": "* * * * *"}, "one of them, not both"),
        ({"name": "x"}, "takes cron or every"),
        ({"every": "0s"}, "at least one second"),
        ({"every": "1h", "name": "no spaces"}, "letters, digits"),
        ([6], "schedule must be a cron string"),
    ],
)
def test_a_bad_schedule_is_named(schedule: Any, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        Job(main=_noop_main, name="r", schedule=schedule)


def test_the_directory_default_work_ids_serve_jobs_without_select_work(tmp_path: Path) -> None:
    (tmp_path / "plain.py").write_text(
        "from riverbed.jobs import Job\n\n"
        "def main(ctx, work_ids):\n    pass\n\n"
        "job = Job(main=main)\n"
    )
    catalog = Catalog(tmp_path)
    assert work_ids_for(catalog, "plain", None, {}) == []  # no _work_ids.py: none
    (tmp_path / "_work_ids.py").write_text(
        "def default_work_ids(job, day=None):\n    return [int(day or 7), 3]\n"
    )
    catalog = Catalog(tmp_path)
    assert catalog.names() == ["plain"]  # _work_ids.py is no job
    assert work_ids_for(catalog, "plain", None, {"day": 9}) == [3, 9]
    assert work_ids_for(catalog, "plain", "1-2", {}) == [1, 2]  # given ids win
    (tmp_path / "_work_ids.py").write_text("def work_ids():\n    return []\n")
    with pytest.raises(SpecError, match="no function default_work_ids"):
        work_ids_for(Catalog(tmp_path), "plain", None, {})
    (tmp_path / "_work_ids.py").write_text("def default_work_ids(job):\n    return 1 / 0\n")
    with pytest.raises(WorkIdsError, match=r"default_work_ids\('plain'\) failed: ZeroDivision"):
        work_ids_for(Catalog(tmp_path), "plain", None, {})
