"""A standby's executors are warmed while it waits (riverbed.stream.warmup)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from riverbed.stream.warmup import expected_executors, warm_up


@given(cores=st.integers(1, 64), per=st.integers(1, 8))
def test_a_cluster_session_expects_its_cores_over_the_cores_of_an_executor(cores, per):
    conf = {
        "spark.master": "spark://h1:7077",
        "spark.cores.max": str(cores),
        "spark.executor.cores": str(per),
    }
    assert expected_executors(conf) == max(1, cores // per)


def test_a_session_that_does_not_say_expects_nothing_to_wait_for():
    assert expected_executors({"spark.master": "local[2]", "spark.cores.max": "4"}) is None
    assert expected_executors({"spark.master": "spark://h1:7077"}) is None  # no cap
    assert expected_executors({"spark.master": "spark://h1:7077", "spark.cores.max": "x"}) is None
    assert expected_executors({"spark.master": "spark://h", "spark.cores.max": "0"}) is None
    assert expected_executors({}) is None


def test_warming_up_imports_the_task_modules_in_a_task_on_every_core(spark):
    assert warm_up(spark, wait_s=5) == spark.sparkContext.defaultParallelism == 2
