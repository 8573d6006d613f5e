"""Times and durations as whole milliseconds, exactly (riverbed.durations)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from riverbed.durations import duration_ms, epoch_ms

MOMENTS = st.datetimes(  # Hypothesis takes naive bounds and adds the zone itself
    min_value=datetime(1970, 1, 1),  # noqa: DTZ001
    max_value=datetime(2200, 1, 1),  # noqa: DTZ001
    timezones=st.just(UTC),
)


@given(MOMENTS)
def test_a_moment_is_its_whole_milliseconds_since_the_epoch(when: datetime) -> None:
    """What Arrow's cast gives: the microseconds truncated, never a float's 1 ms short."""
    ms = epoch_ms(when)
    back = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)
    assert back <= when < back + timedelta(milliseconds=1)
    assert (
        ms
        == (when.replace(microsecond=0) - datetime(1970, 1, 1, tzinfo=UTC))
        // timedelta(seconds=1)
        * 1000
        + when.microsecond // 1000
    )


def test_the_value_a_float_got_wrong() -> None:
    when = datetime(1970, 1, 1, 0, 1, 4, 335000, tzinfo=UTC)  # 64.335 s
    assert int(when.timestamp() * 1000) == 64334  # the float's answer
    assert epoch_ms(when) == 64335


@given(st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=10_000)))
def test_a_timedelta_is_its_whole_milliseconds(delta: timedelta) -> None:
    ms = duration_ms(delta)
    assert timedelta(milliseconds=ms) <= delta < timedelta(milliseconds=ms + 1)
