"""Placement epochs (`topic alter --partitions`) as pure decisions, against a model that
remembers the count each record was placed by."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from riverbed.log.base import TopicConfig, next_boundary, placed_at, placed_by

steps = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 20), st.integers(1, 4)),
        st.tuples(st.just("alter"), st.integers(0, 3), st.just(0)),
    ),
    max_size=12,
)


@given(st.integers(1, 4), steps, st.data())
def test_every_record_is_placed_by_the_count_of_its_epoch(
    first: int, plan: list[tuple[str, int, int]], data: st.DataObject
) -> None:
    config = TopicConfig("t", first)
    counts: list[list[int]] = [[] for _ in range(first)]  # partition -> count per record
    for kind, a, b in plan:
        if kind == "append":
            counts[a % config.partitions] += [config.partitions] * b
        else:
            config = config.grown(config.partitions + a, [len(c) for c in counts])
            counts += [[] for _ in range(config.partitions - len(counts))]
    again = TopicConfig.from_dict(config.to_dict())
    assert again == config  # the epochs survive topic.json
    for p, placed in enumerate(counts):
        for offset, count in enumerate(placed):
            assert placed_at(config, p, offset) == count
        if placed:
            start = data.draw(st.integers(0, len(placed) - 1))
            end = data.draw(st.integers(start + 1, len(placed)))
            one = len(set(placed[start:end])) == 1
            assert placed_by(config, p, start, end) == (placed[start] if one else None)
            later = [o for o in range(start + 1, len(placed)) if placed[o] != placed[o - 1]]
            boundary = next_boundary(config, p, start)
            if later:  # where a batch must end to stay inside one placement
                assert boundary == later[0]
            else:  # none inside what was written (an alter with nothing after it)
                assert boundary is None or boundary >= len(placed)
        # a partition an alter added holds only that alter's count or later ones
        assert placed == sorted(placed)
