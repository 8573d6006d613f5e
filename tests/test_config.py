from __future__ import annotations

from pathlib import Path

import pytest

from riverbed import ConfigError, load_config


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
    from riverbed.stream.windows import Tumbling

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
