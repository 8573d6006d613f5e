"""Random histories against a naive model of etcd's data model (Hypothesis)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from riverbed.control import Compare, ControlPlane, EventType, Put, connect
from riverbed.control.base import prefix_end

KEYS = st.sampled_from(["a", "a/1", "a/2", "b", "b/x", "c"])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), KEYS, st.text("xyz", max_size=3)),
        st.tuples(st.just("del"), KEYS, st.booleans()),
        st.tuples(st.just("cas"), KEYS, st.text("xyz", max_size=3)),
    ),
    max_size=40,
)


@given(st.binary(max_size=6))
def test_prefix_end_bounds_exactly_the_prefixed_keys(prefix: bytes) -> None:
    end = prefix_end(prefix)
    for probe in [prefix, prefix + b"\x00", prefix + b"\xff\xff", b"", b"\xff" * 7]:
        inside = probe.startswith(prefix)
        below_end = end == b"" or probe < end
        assert (probe >= prefix and below_end) == inside


def _check_history(cp: ControlPlane, ops: list[tuple[str, str, object]]) -> None:
    model: dict[str, tuple[str, int, int, int]] = {}  # key -> value, create, mod, version
    revision = cp.revision()
    start = revision + 1
    for op, key, arg in ops:
        if op == "put":
            assert isinstance(arg, str)
            revision += 1
            old = model.get(key)
            model[key] = (arg, old[1] if old else revision, revision, old[3] + 1 if old else 1)
            assert cp.put(key, arg) == revision
        elif op == "del":
            victims = [k for k in model if (k.startswith(key) if arg else k == key)]
            if victims:
                revision += 1
            for k in victims:
                del model[k]
            assert cp.delete(key, prefix=bool(arg)) == len(victims)
        else:
            assert isinstance(arg, str)
            old = model.get(key)
            ok = old is not None and old[0] == "x"
            if ok and old is not None:
                revision += 1
                model[key] = (arg, old[1], revision, old[3] + 1)
            assert cp.txn([Compare.value(key) == "x"], [Put.of(key, arg)]).succeeded == ok
        assert cp.revision() == revision
    stored = {
        kv.key.decode(): (kv.text, kv.create_revision, kv.mod_revision, kv.version)
        for kv in cp.get_prefix("")
    }
    assert stored == model
    # Replaying the whole history from a watch rebuilds the same state.
    replay: dict[str, tuple[str, int, int, int]] = {}
    last = start - 1
    with cp.watch("", prefix=True, start_revision=start) as watch:
        while True:
            # drain: several events can share the last revision (a prefix delete)
            event = watch.get(timeout=5 if last < revision else 0.05)
            if event is None:
                assert last == revision, f"watch stopped at {last}, history ends at {revision}"
                break
            assert event.revision >= last
            last = event.revision
            k = event.kv.key.decode()
            if event.type is EventType.PUT:
                kv = event.kv
                replay[k] = (kv.text, kv.create_revision, kv.mod_revision, kv.version)
            else:
                replay.pop(k, None)
    assert replay == model


@settings(max_examples=60, deadline=None)
@given(OPS)
def test_memory_matches_the_model(ops: list[tuple[str, str, object]]) -> None:
    cp = connect("memory://")
    _check_history(cp, ops)
    cp.close()


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(OPS)
def test_sqlite_matches_the_model(tmp_path: Path, ops: list[tuple[str, str, object]]) -> None:
    db = tmp_path / "model.db"
    for suffix in ["", "-wal", "-shm", ".lock"]:
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    cp = connect(f"sqlite:///{db}")
    _check_history(cp, ops)
    cp.close()
