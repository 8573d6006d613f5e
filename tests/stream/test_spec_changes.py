"""A user edits a running aggregation's spec file: `riverbed stream plan` says what
`stream run` will do, and `run` does exactly that — refusing, with the plan's words and
nothing written, what the state cannot carry; applying the rest from the next batch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from riverbed.cli.main import main
from tests.stream.conftest import make_events, write_events

pytestmark = pytest.mark.spark

SPEC = """
from riverbed.stream import Aggregation, Count, Distinct, Max, Sum, Tumbling

source = {{"topic": "events", "schema": "user_id long, flag string, amount double, ts timestamp"}}
aggregation = Aggregation(
    name="flags", key="flag", time="ts", window=Tumbling("1h"), watermark="5h",
    metrics={{{metrics}}}, state_partitions=3, {extra}
)
"""
V1 = {"metrics": '"users": Distinct("user_id"), "events": Count(), "spent": Sum("amount")'}


def _spec(path: Path, metrics: str, extra: str = "") -> None:
    path.write_text(SPEC.format(metrics=metrics, extra=extra))


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_plan_then_run_refuses_or_applies_as_planned(
    tmp_path: Path,
    subprocess_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    home = tmp_path / "home"
    env = {**subprocess_env, "RIVERBED_HOME": str(home), "RIVERBED_SPARK_MASTER": "local[2]"}
    monkeypatch.setenv("RIVERBED_HOME", str(home))
    first = make_events(600, hours=3)
    write_events(f"file://{home / 'log'}", first, partitions=3)
    spec = tmp_path / "flags.py"
    _spec(spec, **V1)
    run = [sys.executable, "-m", "riverbed.cli.main", "stream", "run", str(spec), "--once"]
    # every sink follows a metric removed: the Parquet table, SQL, Delta and Iceberg
    sql, delta = f"sqlite:///{tmp_path / 'r.db'}", tmp_path / "lake"
    iceberg = f"sqlite:///{tmp_path / 'cat.db'}"
    run += ["--sql", sql, "--table", f"delta:{delta}", "--table", f"iceberg:{iceberg}#s.flags"]

    def stream_run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(run, env=env, capture_output=True, text=True, check=False)

    assert main(["stream", "plan", str(spec)]) == 0  # nothing yet: a first start
    assert "no checkpoint yet" in capsys.readouterr().out
    done = stream_run()
    assert done.returncode == 0, done.stderr[-2000:]
    assert main(["stream", "plan", str(spec)]) == 0
    assert "nothing changed" in capsys.readouterr().out

    # a metric redefined: the state holds the old definition's partials -> refused
    # (a metric added is backfilled: test_backfill.py)
    _spec(spec, V1["metrics"].replace('Sum("amount")', 'Sum("user_id")'))
    before = _files(home / "checkpoints")
    assert main(["stream", "plan", str(spec)]) == 1
    said = capsys.readouterr().out
    assert "REFUSED   metric 'spent': Sum(column='amount') → Sum(column='user_id')" in said, said
    assert "`stream run` refuses to start (nothing was written)" in said
    assert main(["stream", "plan", str(spec), "--json"]) == 1
    planned = json.loads(capsys.readouterr().out)
    # compared with the newest batch's shape: 1, the no-data batch after the 600 events
    assert planned["runs"] is False and planned["since_batch"] == 1
    assert [c["part"] for c in planned["changes"] if c["action"] == "refused"] == ["metric 'spent'"]
    refused = stream_run()
    assert refused.returncode == 2
    assert (
        "metric 'spent': Sum(column='amount') → Sum(column='user_id'): the state holds the old"
        in refused.stderr
    )
    assert "Traceback" not in refused.stderr
    assert _files(home / "checkpoints") == before  # nothing written

    # a metric removed, a filter added, the watermark moved: applied from the next batch
    _spec(spec, '"users": Distinct("user_id"), "events": Count()', 'where="amount > 50",')
    assert main(["stream", "plan", str(spec)]) == 0
    said = capsys.readouterr().out
    assert "applied   metric 'spent': Sum(column='amount') → (none)" in said
    assert "applied   where: (none) → 'amount > 50'" in said
    assert "`stream run` resumes with the changes above" in said
    second = make_events(300, hours=2, seed=1)  # the first two windows only
    write_events(f"file://{home / 'log'}", second, partitions=3)
    done = stream_run()
    assert done.returncode == 0, done.stderr[-2000:]
    assert main(["stream", "plan", str(spec)]) == 0  # the new spec is now the recorded one
    assert "compared with the spec of batch 2: nothing changed" in capsys.readouterr().out

    # every window: the first events all counted, the second only where amount > 50
    assert main(["query", "flags", "--json"]) == 0
    rows = pd.DataFrame([json.loads(x) for x in capsys.readouterr().out.splitlines()])
    kept = second[second["amount"] > 50]
    both = pd.concat([first, kept])
    both["window_start"] = both["ts"].dt.floor("1h")
    oracle = both.groupby(["window_start", "flag"]).agg(
        events=("user_id", "size"), users=("user_id", "nunique")
    )
    rows["window_start"] = pd.to_datetime(rows["window_start"], utc=True)
    got = rows.set_index(["window_start", "key"]).sort_index()
    oracle.index = oracle.index.set_names(["window_start", "key"])
    assert got[["events", "users"]].astype(int).equals(oracle.sort_index().astype(int))
    # the removed metric: the windows the second batch wrote have none, the one it did
    # not write keeps what the first batch wrote
    second_windows = set(second["ts"].dt.floor("1h"))
    touched = got.index.get_level_values("window_start").isin(list(second_windows))
    assert got.loc[touched, "spent"].isna().all()
    spent = first.assign(w=first["ts"].dt.floor("1h")).groupby(["w", "flag"])["amount"].sum()
    for (w, key), value in got.loc[~touched, "spent"].items():
        assert value == spent[(w, key)]
    assert (~touched).any() and touched.any()

    # the sinks hold the same rows (the removed metric null where the result table's is)
    import sqlite3

    from riverbed.stream.lakehouse import DeltaSink, IcebergSink

    with sqlite3.connect(tmp_path / "r.db") as conn:
        in_sql = pd.read_sql("SELECT * FROM flags", conn)
    for name, table in [
        ("sql", in_sql),
        ("delta", DeltaSink(delta).read()),
        ("iceberg", IcebergSink(iceberg, "s.flags").read()),
    ]:
        table["window_start"] = pd.to_datetime(table["window_start"], utc=True)
        table = table.set_index(["window_start", "key"]).sort_index()
        columns = ["events", "users", "spent"]
        (
            pd.testing.assert_frame_equal(
                table[columns].astype(float),
                got[columns].astype(float),
                check_names=False,
                check_index_type=False,
            ),
            name,
        )
