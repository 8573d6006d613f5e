"""riverbed.spark.daemon: Python workers forked from a daemon that imported riverbed's
task modules, PySpark from the installed package rather than Spark's zip."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from riverbed.spark.daemon import PRELOAD, installed_first


def _site(tmp_path: Path, py4j: str | None = "0.10.9.9") -> Path:
    """A site-packages with a pip-installed PySpark: the package, and Spark's zips
    inside it (python/lib)."""
    site = tmp_path / "site-packages"
    lib = site / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    (lib / "pyspark.zip").write_bytes(b"")
    (lib / "py4j-0.10.9.9-src.zip").write_bytes(b"")
    if py4j is not None:
        (site / "py4j").mkdir()
        (site / "py4j" / "version.py").write_text(f"__version__ = '{py4j}'\n")
    return site


def test_the_zips_of_an_installed_pyspark_give_way_to_the_package(tmp_path: Path) -> None:
    site = _site(tmp_path)
    lib = site / "pyspark" / "python" / "lib"
    path = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip"), "/x", str(site)]
    assert installed_first(path) == ["/x", str(site)]


def test_a_py4j_of_another_version_keeps_its_zip(tmp_path: Path) -> None:
    site = _site(tmp_path, py4j="0.10.9.7")
    lib = site / "pyspark" / "python" / "lib"
    path = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip"), str(site)]
    assert installed_first(path) == [str(lib / "py4j-0.10.9.9-src.zip"), str(site)]


def test_zips_are_kept_when_the_package_is_not_on_the_path(tmp_path: Path) -> None:
    site = _site(tmp_path)
    lib = site / "pyspark" / "python" / "lib"
    path = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip"), "/x"]
    assert installed_first(path) == path


def test_a_spark_distributions_zips_are_kept(tmp_path: Path) -> None:
    """SPARK_HOME of a downloaded Spark (no Python package there): its zip is the only
    PySpark the workers have."""
    home = tmp_path / "spark-4.3.0-bin-hadoop3"
    (home / "python" / "lib").mkdir(parents=True)
    zipped = home / "python" / "lib" / "pyspark.zip"
    zipped.write_bytes(b"")
    path = [str(zipped), str(tmp_path), "/usr/lib/python311.zip"]
    assert installed_first(path) == path


@pytest.mark.spark
def test_workers_are_forked_by_riverbeds_daemon_with_its_task_modules_imported(
    spark: Any,
) -> None:
    wanted = list(PRELOAD)

    def probe(rows: Any) -> Any:
        import os as worker_os
        import sys as worker_sys

        with open(f"/proc/{worker_os.getppid()}/cmdline", "rb") as f:
            parent = f.read().replace(b"\0", b" ").decode()
        loaded = all(name in worker_sys.modules for name in wanted)
        pyspark_file = worker_sys.modules["pyspark"].__file__
        for _ in rows:
            pass
        yield (parent, loaded, pyspark_file)

    seen = spark.range(0, 10, numPartitions=2).rdd.mapPartitions(probe).collect()
    assert len(seen) == 2
    for parent, loaded, pyspark_file in seen:
        assert "-m riverbed.spark.daemon" in parent
        assert loaded
        assert ".zip" not in pyspark_file
        assert os.path.isfile(pyspark_file)


@pytest.mark.spark
def test_sql_and_rdd_tasks_share_one_daemon_per_executor(spark: Any) -> None:
    """A pandas UDF's tasks and an RDD's (the warm-up's) are forked by the same daemon:
    Spark keys daemons by the workers' environment, which the simplified-traceback
    setting would make differ (riverbed.spark.BASE_CONF)."""

    def by_rdd(rows: Any) -> Any:
        import os as worker_os

        yield worker_os.getppid()

    def by_pandas(frames: Any) -> Any:
        import os as worker_os

        import pandas as worker_pd

        for _ in frames:
            yield worker_pd.DataFrame({"daemon": [worker_os.getppid()]})

    rdd = set(spark.range(0, 4, numPartitions=2).rdd.mapPartitions(by_rdd).collect())
    frame = spark.range(0, 4, numPartitions=2).mapInPandas(by_pandas, "daemon long")
    sql = {r.daemon for r in frame.collect()}
    assert len(rdd) == 1 and rdd == sql, (rdd, sql)
