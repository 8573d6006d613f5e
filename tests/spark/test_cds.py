"""The class-data archive of Spark's JVM classes (riverbed.spark.cds): sessions map the
one ``make`` built, and an archive that does not fit costs nothing and says nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from riverbed.spark import cds


def test_options_name_the_archive_only_when_there_is_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    there = tmp_path / "spark.jsa"
    monkeypatch.setenv(cds.ENV, str(there))
    assert cds.java_options() == ""  # not built (yet): the JVM loads classes itself
    there.write_bytes(b"\0")
    assert cds.java_options() == f"-XX:SharedArchiveFile={there} {cds.QUIET}"
    monkeypatch.setenv(cds.ENV, "off")
    assert cds.archive() is None and cds.java_options() == ""


def test_an_archive_that_does_not_fit_is_ignored_silently(tmp_path: Path) -> None:
    garbage = tmp_path / "other.jsa"
    garbage.write_bytes(bytes(range(256)) * 64)
    out = subprocess.run(
        ["java", f"-XX:SharedArchiveFile={garbage}", *cds.QUIET.split(), "-version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""  # CDS warnings would come here
    assert "warning" not in out.stderr.lower() and "cds" not in out.stderr.lower(), out.stderr


@pytest.mark.spark
def test_the_session_maps_the_archive_make_built(spark: Any) -> None:
    path = cds.archive()
    assert path is not None and path.is_file(), (
        f"no archive at {path}: `make test` builds it (python -m riverbed.spark.cds)"
    )
    jvm = spark.sparkContext._jvm
    args = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert f"-XX:SharedArchiveFile={path}" in args
    # the same JVM build and class path with sharing required: it starts only if the
    # archive maps (it is refused when built by another JVM or for another class path)
    java = Path(jvm.java.lang.System.getProperty("java.home")) / "bin" / "java"
    classpath = jvm.java.lang.System.getProperty("java.class.path")
    out = subprocess.run(
        [str(java), "-Xshare:on", f"-XX:SharedArchiveFile={path}", "-cp", classpath, "-version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_jars_fetched_again_name_another_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The JVM maps an archive only over the very jars it was built with (their size and
    modification time): a jar cache filled again must not reuse the old archive, which
    would be ignored silently and every Spark start slower."""
    import os

    from riverbed.spark import jars

    monkeypatch.delenv(cds.ENV, raising=False)
    monkeypatch.setenv(jars.ENV, str(tmp_path))
    jar = tmp_path / "hadoop-aws-3.5.0.jar"
    jar.write_bytes(b"PK")
    first = cds.archive()
    assert first == cds.archive()  # the same jars, the same archive
    os.utime(jar, ns=(jar.stat().st_atime_ns, jar.stat().st_mtime_ns + 10**9))
    assert cds.archive() != first


@pytest.mark.setup
def test_setup_spark_archive_builds_it_once(tmp_path: Path) -> None:
    """``riverbed setup spark-archive`` (what a pip-installed riverbed runs) leaves an
    archive that is there alone; ``make`` built this virtualenv's."""
    from tests.cli import run_cli

    path = cds.archive()
    assert path is not None and path.is_file(), f"no archive at {path}: `make test` builds it"
    before = path.stat().st_mtime_ns
    done = run_cli("setup", "spark-archive")
    assert done.returncode == 0, done.stderr
    assert f"class-data archive {path}: already built" in done.stdout
    assert path.stat().st_mtime_ns == before
