"""The jar cache (riverbed.spark.jars, ``riverbed setup jars``): Spark's own Ivy resolves
the connectors at PySpark's versions from Maven Central, and the cache holds what PySpark
lacks — never a second copy of what it ships."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from riverbed.errors import InvalidValueError
from riverbed.spark import jars
from tests.cli import run_cli

words = st.from_regex(r"[a-z][a-z0-9]{0,7}", fullmatch=True)
# artifacts as Maven Central names them: words joined by "-", a Scala suffix, Kafka's
# "-0-10" (a dash a digit follows, inside the artifact)
artifacts = st.builds(
    lambda parts, kafka, scala: "-".join(parts) + ("-0-10" if kafka else "") + scala,
    st.lists(words, min_size=1, max_size=4),
    st.booleans(),
    st.sampled_from(["", "_2.13", "_2.12"]),
)
versions = st.builds(
    lambda numbers, tail: ".".join(map(str, numbers)) + tail,
    st.lists(st.integers(0, 99), min_size=1, max_size=4),
    st.sampled_from(["", ".Final", "-M1", "-beta", "-jre", ".RELEASE"]),
)


@given(artifact=artifacts, version=versions)
def test_a_jars_artifact_is_its_name_less_the_version(artifact: str, version: str) -> None:
    assert jars.artifact_of(f"{artifact}-{version}.jar") == artifact


@given(
    ours=st.dictionaries(artifacts, versions, max_size=6),
    shipped=st.dictionaries(artifacts, versions, max_size=6),
    groups=st.lists(st.from_regex(r"[a-z]{2,5}(\.[a-z]{2,6}){0,3}", fullmatch=True), min_size=1),
)
def test_the_cache_takes_what_pyspark_lacks_under_mavens_names(
    ours: dict[str, str], shipped: dict[str, str], groups: list[str]
) -> None:
    resolved = [
        f"{groups[i % len(groups)]}_{artifact}-{version}.jar"
        for i, (artifact, version) in enumerate(ours.items())
    ]
    # PySpark's copy of a library riverbed's resolution also pulls in: another version
    bundled = [f"{a}-{v}.jar" for a, v in shipped.items()] + [
        f"{a}-0.{v}.jar" for a, v in list(ours.items())[:2]
    ]
    chosen = jars.cache_names([*resolved, "x_y-1.pom"], bundled)
    shipped_artifacts = {jars.artifact_of(name) for name in bundled}
    want = {a: f"{a}-{v}.jar" for a, v in ours.items() if a not in shipped_artifacts}
    assert sorted(chosen.values()) == sorted(want.values())
    for ivy_name, name in chosen.items():
        assert ivy_name.endswith("_" + name)


def test_coordinates_follow_pysparks_hadoop() -> None:
    assert jars.coordinates("3.9.1")[0] == "org.apache.hadoop:hadoop-aws:3.9.1"
    assert jars.hadoop_version(["a-1.jar", "hadoop-client-api-3.5.0.jar"]) == "3.5.0"
    with pytest.raises(jars.JarFetchError, match="hadoop-client-api"):
        jars.hadoop_version(["scala-library-2.13.16.jar"])


def test_ivy_resolves_from_the_named_mirrors_then_maven_central_only() -> None:
    settings = ET.fromstring(jars.ivy_settings(["https://m1.example.org/r/", "file:///srv/m2/"]))
    roots = [r.get("root") for r in settings.iter("ibiblio")]
    assert roots == ["https://m1.example.org/r/", "file:///srv/m2/", jars.CENTRAL]
    assert settings.find("settings").get("defaultResolver") == "riverbed"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("ftp://mirror.example.org/m2", "not a Maven repository URL"),
        ("nexus.example.org", "not a Maven repository URL"),
        ("https://builder:s3cr3t-token@nexus.example.org/m2", "user or password"),
    ],
)
def test_a_repository_that_cannot_be_used_is_refused_naming_why(url: str, problem: str) -> None:
    with pytest.raises(InvalidValueError, match=problem) as caught:
        jars.check_repository(url)
    assert "s3cr3t" not in str(caught.value)
    assert jars.check_repository("https://nexus.example.org/m2") == "https://nexus.example.org/m2/"


def test_setup_jars_refuses_a_repository_with_a_password_without_showing_it(
    tmp_path: Path,
) -> None:
    done = run_cli(
        "setup", "jars", "--dir", str(tmp_path / "jars"),
        "--repository", "https://builder:s3cr3t-token@nexus.example.org/m2",
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "user or password" in done.stderr
    assert "s3cr3t" not in done.stdout + done.stderr
    assert not (tmp_path / "jars").exists()


def test_setup_jars_fills_a_cache_once_with_what_pyspark_lacks(tmp_path: Path) -> None:
    """Resolved from Maven Central by Spark's Ivy (its downloads cached for the user, so a
    run after ``make jars`` downloads nothing): hadoop-aws at PySpark's Hadoop with the AWS
    SDK bundle, the Kafka and Avro connectors; nothing PySpark ships; a second run is a
    no-op that leaves the files as they are."""
    cache = tmp_path / "jars"
    done = run_cli("setup", "jars", "--dir", str(cache), timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"jar cache {cache}:" in done.stdout, done.stdout
    names = sorted(p.name for p in cache.glob("*.jar"))
    hadoop = jars.hadoop_version()
    assert f"hadoop-aws-{hadoop}.jar" in names, names
    assert any(n.startswith("bundle-") for n in names), names  # the AWS SDK v2 bundle
    for connector in ("spark-sql-kafka-0-10_2.13-", "spark-avro_2.13-", "kafka-clients-"):
        assert any(n.startswith(connector) for n in names), (connector, names)
    shipped = {jars.artifact_of(p.name) for p in jars.pyspark_jars().glob("*.jar")}
    assert not shipped & {jars.artifact_of(n) for n in names}
    assert jars.jars(cache) == sorted(cache.glob("*.jar"))
    inodes = {p.name: p.stat().st_ino for p in cache.glob("*.jar")}

    again = run_cli("setup", "jars", "--dir", str(cache), timeout=300)
    assert again.returncode == 0, again.stderr
    assert "already filled" in again.stdout
    assert {p.name: p.stat().st_ino for p in cache.glob("*.jar")} == inodes


def test_setup_jars_never_replaces_a_directory_it_did_not_fill(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "my-udfs-1.0.jar").write_bytes(b"PK")
    done = run_cli("setup", "jars", "--dir", str(mine))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "did not put there" in done.stderr and "nothing was changed" in done.stderr
    assert [p.name for p in mine.iterdir()] == ["my-udfs-1.0.jar"]
