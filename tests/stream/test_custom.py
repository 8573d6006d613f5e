"""User-defined metrics (``Custom`` over an ``Aggregator``): the documented example,
``examples/stddev.py``, loaded as a spec file and run on every engine path (its class
pickled to Spark's tasks by value), against pandas; and the protocol's checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import riverbed.log
from riverbed.stream.errors import StreamValueError
from riverbed.stream.metrics import Custom
from riverbed.stream.specsource import load_spec
from tests.stream.conftest import make_events

EXAMPLE = Path(__file__).parents[2] / "examples" / "stddev.py"


def example() -> Any:
    aggregation, _ = load_spec(EXAMPLE)
    return aggregation


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.lists(st.one_of(st.none(), st.floats(-1e6, 1e6)), max_size=20), min_size=1, max_size=6
    ),
    st.randoms(),
)
def test_the_examples_partials_merged_in_any_order_give_numpys_stddev(
    parts: list[list[float | None]], rng: Any
) -> None:
    metric = example().metrics["spread"]
    partials = [
        metric.partial(np.array([np.nan if v is None else v for v in p], dtype=float), len(p))
        for p in parts
    ]
    rng.shuffle(partials)
    merged = partials[0]
    for p in partials[1:]:
        merged = metric.merge(merged, p) if rng.random() < 0.5 else metric.merge(p, merged)
    values = np.array([v for p in parts for v in p if v is not None])
    got = metric.result(merged)[""]
    if len(values) < 2:
        assert got is None
    else:
        assert got == pytest.approx(float(np.std(values, ddof=1)), rel=1e-6, abs=1e-6)


def test_an_aggregator_without_the_protocol_or_with_an_unknown_type_is_refused() -> None:
    class Half:
        def create(self) -> int:
            return 0

    with pytest.raises(StreamValueError, match="has no update, merge, result, to_bytes"):
        Custom("x", Half())
    with pytest.raises(StreamValueError, match="type must be one of"):
        Custom("x", example().metrics["spread"].aggregator, type="decimal")


def test_an_aggregator_spark_cannot_send_to_its_tasks_is_refused_in_one_line(
    tmp_path: Path,
) -> None:
    spec = tmp_path / "spec.py"
    spec.write_text(
        EXAMPLE.read_text()
        .replace("State = tuple", 'PACKED = struct.Struct("<qdd")\nState = tuple')
        .replace('struct.pack("<qdd", *state)', "PACKED.pack(*state)")
    )
    aggregation, _ = load_spec(spec)
    refused = r"metric 'spread': its aggregator StdDev cannot be sent to Spark's tasks \(TypeError"
    with pytest.raises(StreamValueError, match=refused + r": cannot pickle '_struct.Struct'"):
        aggregation.metrics["spread"].check_shippable("spread")
    example().metrics["spread"].check_shippable("spread")  # the example's is fine


@pytest.mark.spark
@pytest.mark.parametrize("path", ["spark", "colocated", "colocated-driver", "shuffled"])
def test_the_stddev_example_equals_pandas_on_every_path(
    spark: Any, log_url: str, tmp_path: Path, path: str
) -> None:
    from tests.stream.test_engine import run_to_end

    events = make_events(1500, hours=3, seed=91)
    events.loc[events.index[::7], "amount"] = np.nan  # NULLs: skipped, as Spark's stddev
    log = riverbed.log.open(log_url)
    log.create_topic("events", 3)
    log.producer("events").send_batch(
        [
            {"user_id": int(u), "flag": f, "amount": None if a != a else a, "ts": t.isoformat()}
            for u, f, a, t in events[["user_id", "flag", "amount", "ts"]].itertuples(index=False)
        ],
        key_field="flag",
    )
    log.close()
    got = run_to_end(spark, example(), log_url, tmp_path, path)
    want = (
        events.assign(window_start=events["ts"].dt.floor("1h"))
        .groupby(["window_start", "flag"])["amount"]
        .agg(["size", "std"])
        .reset_index()
    )
    assert len(got) == len(want)
    assert got["events"].tolist() == want["size"].tolist()
    assert np.allclose(got["spread"], want["std"], rtol=1e-9, equal_nan=True)
    assert pa.types.is_floating(pa.array(got["spread"]).type)
