from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import pytest

from riverbed import ConfigError, load_config
from riverbed.config import (
    SETTINGS,
    adopt,
    child_environment,
    inherited,
    inherited_environment,
    overlaid,
    settings_table,
    storage_wait_s,
)


def test_defaults_put_everything_under_home(tmp_path: Path) -> None:
    config = load_config(env={}, cwd=tmp_path)
    assert config.home == tmp_path / ".riverbed"
    assert config.control_url == f"sqlite:///{tmp_path / '.riverbed' / 'control.db'}"
    assert config.spark.master == "local[*]"


def test_toml_then_environment_override(tmp_path: Path) -> None:
    (tmp_path / "riverbed.toml").write_text(
        'home = "/data/rb"\ncontrol = "etcd://a:1"\n[spark]\nmaster = "spark://m:7077"\n'
        'conf = { "spark.sql.shuffle.partitions" = 8 }\n'
    )
    config = load_config(env={}, cwd=tmp_path)
    assert (config.home, config.control_url) == (Path("/data/rb"), "etcd://a:1")
    assert config.spark.master == "spark://m:7077"
    assert config.spark.conf["spark.sql.shuffle.partitions"] == "8"
    env = {"RIVERBED_CONTROL": "memory://", "RIVERBED_SPARK_MASTER": "local[2]"}
    config = load_config(env=env, cwd=tmp_path)
    assert (config.control_url, config.spark.master) == ("memory://", "local[2]")
    env = {"RIVERBED_SPARK_CONF": '{"spark.sql.shuffle.partitions": 2, "spark.ui.enabled": "no"}'}
    conf = load_config(env=env, cwd=tmp_path).spark.conf
    assert dict(conf) == {"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "no"}


def test_the_state_memory_budget_from_toml_then_environment(tmp_path: Path) -> None:
    assert load_config(env={}, cwd=tmp_path).state_memory_mb is None
    (tmp_path / "riverbed.toml").write_text("[state]\nmemory_mb = 256\n")
    assert load_config(env={}, cwd=tmp_path).state_memory_mb == 256
    env = {"RIVERBED_STATE_MEMORY_MB": "64"}
    assert load_config(env=env, cwd=tmp_path).state_memory_mb == 64
    with pytest.raises(ConfigError, match="RIVERBED_STATE_MEMORY_MB must be a whole number"):
        load_config(env={"RIVERBED_STATE_MEMORY_MB": "64MB"}, cwd=tmp_path)


@pytest.mark.parametrize("text", ["spark.ui.enabled=false", '["a"]', "{"])
def test_bad_spark_conf_variable_names_the_fix(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError, match="RIVERBED_SPARK_CONF must be a JSON object"):
        load_config(env={"RIVERBED_SPARK_CONF": text}, cwd=tmp_path)


def test_config_is_frozen(tmp_path: Path) -> None:
    config = load_config(env={}, cwd=tmp_path)
    with pytest.raises(AttributeError):
        config.control = "x"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("home = [1", "not valid TOML"),
        ('contrl = "x"', "unknown setting"),
        ("control = 5", "must be a string"),
        ("spark = 3", r"\[spark\] must be a table"),
        ("[state]\nmemory = 64", r"\[state\] takes one setting, memory_mb"),
        ("[state]\nmemory_mb = 4", "state.memory_mb must be a whole number of MiB, at least 8"),
        ('[state]\nmemory_mb = "lots"', "at least 8"),
    ],
)
def test_bad_config_names_the_problem(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "riverbed.toml").write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(env={}, cwd=tmp_path)


def test_missing_explicit_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(env={"RIVERBED_CONFIG": str(tmp_path / "nope.toml")}, cwd=tmp_path)


def test_stream_checkpoints_in_a_bucket_put_results_beside_them_and_refuse_secrets(
    tmp_path: Path,
) -> None:
    """A bucket location puts checkpoints, state and results in the bucket; credentials
    inside the location are refused without being echoed, and an unknown scheme names
    what works."""
    from riverbed.stream.aggregation import Aggregation
    from riverbed.stream.metrics import Count
    from riverbed.stream.specjob import job_for
    from riverbed.windows import Tumbling

    spec = Aggregation(name="a", key="k", time="ts", window=Tumbling("1h"), metrics={"n": Count()})
    config = load_config(env={"RIVERBED_CHECKPOINTS": "s3://bucket/p/"}, cwd=tmp_path)
    job = job_for(config, spec, {"topic": "t"})
    assert (job.checkpoint, job.output) == ("s3://bucket/p/a", "s3://bucket/p/output/a")
    assert job.state.durable == "s3://bucket/p/state"
    config = load_config(env={"RIVERBED_CHECKPOINTS": "s3://KEY:secret@bucket/p"}, cwd=tmp_path)
    with pytest.raises(ConfigError, match="holds credentials") as caught:
        job_for(config, spec, {"topic": "t"})
    assert "secret" not in str(caught.value) and "AWS_SECRET_ACCESS_KEY" in str(caught.value)
    config = load_config(env={"RIVERBED_CHECKPOINTS": "gs://bucket/p"}, cwd=tmp_path)
    with pytest.raises(ConfigError, match="s3://bucket/prefix"):
        job_for(config, spec, {"topic": "t"})


# --- the one list of settings (riverbed.config.SETTINGS) -------------------------------

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"(?<![A-Za-z0-9_])RIVERBED_[A-Z0-9_]*[A-Z0-9](?![A-Za-z0-9_])")
# where the environment may be read (docs/configuration.md, "Where settings are read")
READERS = {"config.py", "storage/awschain.py", "spark/__init__.py"}


def test_docs_configuration_is_the_settings_table() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert settings_table() in doc, (
        "docs/configuration.md's table differs from riverbed.config.SETTINGS; paste "
        "`python -c 'from riverbed.config import settings_table; print(settings_table())'`"
    )


def test_every_riverbed_variable_used_anywhere_is_a_setting() -> None:
    known = {s.env for s in SETTINGS}
    files = [ROOT / "Makefile", ROOT / "README.md"]
    for folder in ("src", "tests", "scripts", "benchmarks", "examples", "docs", ".ci"):
        files += [
            p
            for p in (ROOT / folder).rglob("*")
            if p.suffix in (".py", ".md", ".sh", ".toml", "") and p.is_file()
        ]
    used: dict[str, str] = {}
    for path in files:
        if "__pycache__" in path.parts or path == Path(__file__).resolve():
            continue  # (this file misspells names on purpose)
        for name in NAME.findall(path.read_text(encoding="utf-8", errors="replace")):
            used.setdefault(name, str(path.relative_to(ROOT)))
    unknown = {name: where for name, where in used.items() if name not in known}
    assert not unknown, f"RIVERBED_* names that are not in riverbed.config.SETTINGS: {unknown}"
    assert len(used) >= 20  # the scan found the settings at all


def test_the_environment_is_read_only_where_docs_say() -> None:
    src = ROOT / "src" / "riverbed"
    readers = set()
    for path in src.rglob("*.py"):
        rel = path.relative_to(src).as_posix()
        # (the demo's job files are user code that riverbed loads by path, not its own)
        if rel.startswith(("cli/", "testing/", "demo/jobs_examples/")):
            continue
        if re.search(r"os\.environ|getenv\(", path.read_text(encoding="utf-8")):
            readers.add(rel)
    assert readers == READERS


def test_toml_keys_are_the_settings_spellings(tmp_path: Path) -> None:
    tops = {s.toml.split(".")[0] for s in SETTINGS if s.toml}
    assert tops == {
        "home",
        "control",
        "checkpoints",
        "log",
        "jobs_db",
        "jobs_dir",
        "spark",
        "state",
    }
    (tmp_path / "riverbed.toml").write_text('host = "m1"\n')
    with pytest.raises(ConfigError, match=r"unknown setting.*known: checkpoints, control"):
        load_config(env={}, cwd=tmp_path)


def test_inherited_settings_are_read_by_name_and_only_those() -> None:
    assert inherited("RIVERBED_HOST", {"RIVERBED_HOST": "m1"}) == "m1"
    assert inherited("RIVERBED_HOST", {}) == ""
    with pytest.raises(KeyError, match="RIVERBED_HOME is not an inherited setting"):
        inherited("RIVERBED_HOME", {})
    with pytest.raises(KeyError, match="RIVERBED_HOSTS is not an inherited setting"):
        inherited("RIVERBED_HOSTS", {})


def test_what_a_driver_hands_its_tasks() -> None:
    env = {
        "RIVERBED_CONTROL": "etcd://a:1",
        "RIVERBED_LOG_TOKEN": "t0ken",
        "RIVERBED_HOME": "/h",  # this machine's: not handed
        "RIVERBED_HOST": "m1",  # an executor's host is its own
        "RIVERBED_STORAGE_WAIT": "",
    }
    assert inherited_environment(env) == {
        "RIVERBED_CONTROL": "etcd://a:1",
        "RIVERBED_LOG_TOKEN": "t0ken",
    }


def test_adopt_fills_in_only_what_the_process_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIVERBED_CONTROL", "etcd://mine:1")
    monkeypatch.delenv("RIVERBED_LOG_TOKEN", raising=False)
    adopt({"RIVERBED_CONTROL": "etcd://drivers:1", "RIVERBED_LOG_TOKEN": "t"})
    assert os.environ["RIVERBED_CONTROL"] == "etcd://mine:1"
    assert os.environ["RIVERBED_LOG_TOKEN"] == "t"
    with pytest.raises(KeyError, match="RIVERBED_HOME is not an inherited setting"):
        adopt({"RIVERBED_HOME": "/elsewhere"})


def test_child_environment_sets_removes_and_refuses_unknown_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RIVERBED_LOG", "file:///x")
    env = child_environment({"RIVERBED_HOME": "/h", "RIVERBED_LOG": None, "PYTHONUNBUFFERED": "1"})
    assert env["RIVERBED_HOME"] == "/h" and "RIVERBED_LOG" not in env
    assert env["PYTHONUNBUFFERED"] == "1" and env["PATH"] == os.environ["PATH"]
    with pytest.raises(KeyError, match="RIVERBED_HOEM"):
        child_environment({"RIVERBED_HOEM": "/h"})


def test_overlaid_restores_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RIVERBED_LOG_TOKEN", raising=False)
    with overlaid() as put:
        put({"RIVERBED_LOG_TOKEN": "t"})
        assert os.environ["RIVERBED_LOG_TOKEN"] == "t"
    assert "RIVERBED_LOG_TOKEN" not in os.environ


@pytest.mark.parametrize("text", ["soon", "-1", "nan"])
def test_a_bad_storage_wait_is_named(text: str) -> None:
    with pytest.raises(ConfigError, match=r"RIVERBED_STORAGE_WAIT=.* must be seconds"):
        storage_wait_s({"RIVERBED_STORAGE_WAIT": text})
    assert storage_wait_s({}) == 900.0
    assert storage_wait_s({"RIVERBED_STORAGE_WAIT": "2.5"}) == 2.5


def test_secrets_are_marked() -> None:
    secret = {s.env for s in SETTINGS if s.secret}
    assert secret == {"RIVERBED_ALERT_WEBHOOK", "RIVERBED_LOG_TOKEN", "RIVERBED_UI_TOKEN"}


def test_a_configuration_pickles_as_a_worker_hands_it_to_its_executors(tmp_path: Path) -> None:
    env = {"RIVERBED_SPARK_CONF": '{"spark.ui.enabled": "false"}', "RIVERBED_CONTROL": "etcd://a:1"}
    config = load_config(env=env, cwd=tmp_path)
    again = pickle.loads(pickle.dumps(config))
    assert again == config and again.spark.conf["spark.ui.enabled"] == "false"
    with pytest.raises(TypeError):  # still read-only after the trip
        again.spark.conf["x"] = "y"  # type: ignore[index]
