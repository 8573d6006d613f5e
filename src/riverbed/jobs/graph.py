"""Resolving a submitted job into the chunks that must run: pure, no I/O.

Given the specs, the root (master) job, its work ids and kwargs, what succeeded when
(:class:`Freshness`) and what is already queued or running (:class:`ActiveChunk`),
:func:`resolve` returns a :class:`Plan`:

1. **Nodes**: the root and its dependencies, recursively (no depth limit; a cycle is
   a :class:`CycleError` naming it). A node is (job, kwargs): a dependency's fixed
   kwargs flow to it and every node below it, a lower edge's value winning. Paths that
   reach the same (job, kwargs) share one node unless the edge is ``unique``.
2. **Chunks**: every node splits the graph's sorted work ids by its own chunk size;
   chunk *i* of a node covers ranks ``[i·size, (i+1)·size)``. No work ids: one chunk
   with none.
3. **Top-down pruning, per chunk**: every root chunk runs (with ``stale_only``, only
   the root chunks the current code has not run: some work id never succeeded, or its
   newest success ran another source of the job). A dependency chunk runs
   when it intersects a running chunk of a parent *and* is stale for that edge: some
   work id in it never succeeded with these kwargs, or succeeded ``max_lag`` or more
   ago (ages are differences of the database's own timestamps; ``max_lag=0`` always
   runs), or its newest success ran another source of the job than the current one
   (``code``: job → :func:`~riverbed.specfiles.code_version`; the ``src:`` parts are
   compared, :func:`~riverbed.specfiles.source_of`; a success recorded without a
   version is taken as current). ``allow_missing_work_ids`` asks only whether the job
   succeeded at all within ``max_lag``. A pruned chunk prunes everything below it that
   only it needed. Each chunk says why it runs (``PlannedChunk.why``).
4. **Links** exactly where work ids intersect: a running chunk waits for every running
   chunk of its dependencies that shares a work id with it.
5. **Reuse**: a chunk whose every work id is already covered by queued or running
   chunks of the same job and kwargs is not added; its dependents wait on those.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from riverbed.jobs.errors import CycleError, SpecError
from riverbed.jobs.spec import Dependency, Job, canonical_kwargs
from riverbed.specfiles import source_of

__all__ = [
    "ActiveChunk",
    "Freshness",
    "Plan",
    "PlannedChunk",
    "code_changed",
    "find_cycle",
    "node_keys",
    "resolve",
]

NodeKey = tuple[str, str, tuple[int, ...]]  # job, kwargs text, unique path (() = shared)


@dataclass(frozen=True)
class ActiveChunk:
    """A chunk already in the queue and not finished (QUEUED, PENDING or RUNNING)."""

    id: int
    job: str
    kwargs: str
    work_ids: tuple[int, ...]


@dataclass
class Freshness:
    """When each (job, kwargs) last succeeded, per work id and overall (database clock,
    seconds), and which code version that success ran (``""``: not recorded)."""

    by_id: dict[tuple[str, str], dict[int, float]] = field(default_factory=dict)
    latest: dict[tuple[str, str], float] = field(default_factory=dict)
    code_by_id: dict[tuple[str, str], dict[int, str]] = field(default_factory=dict)
    latest_code: dict[tuple[str, str], str] = field(default_factory=dict)

    def record(
        self, job: str, kwargs: str, work_ids: Sequence[int], at: float, code: str = ""
    ) -> None:
        key = (job, kwargs)
        ids = self.by_id.setdefault(key, {})
        codes = self.code_by_id.setdefault(key, {})
        for w in work_ids:
            if w not in ids or at >= ids[w]:
                ids[w], codes[w] = at, code
        if key not in self.latest or at >= self.latest[key]:
            self.latest[key], self.latest_code[key] = at, code


@dataclass
class PlannedChunk:
    """One chunk of the plan. ``reuse`` is the id of an existing chunk standing for it."""

    index: int
    job: str
    kwargs: dict[str, Any]
    kwargs_text: str
    work_ids: tuple[int, ...]
    upstream: list[int] = field(default_factory=list)  # indices into Plan.chunks
    reuse: int | None = None
    why: str = ""  # why it runs: "submitted", "code changed (src:… → src:…)", …


@dataclass
class Plan:
    """The resolved graph: ``chunks`` top-down (root chunks first), ``roots`` the
    indices the master waits for, and what was pruned and why."""

    job: str
    kwargs: dict[str, Any]
    work_ids: tuple[int, ...]
    chunks: list[PlannedChunk]
    roots: list[int]
    pruned: list[tuple[str, tuple[int, ...], str]]

    @property
    def new_chunks(self) -> list[PlannedChunk]:
        return [c for c in self.chunks if c.reuse is None]


def find_cycle(specs: Mapping[str, Job], root: str) -> list[str] | None:
    """A dependency cycle reachable from ``root`` (first name repeated last), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []
    stack: list[tuple[str, int]] = [(root, 0)]
    while stack:
        name, i = stack.pop()
        if i == 0:
            state[name] = 1
            path.append(name)
        deps = specs[name].dependencies
        if i < len(deps):
            stack.append((name, i + 1))
            child = deps[i].job
            if state.get(child) == 1:
                return [*path[path.index(child) :], child]
            if child not in state:
                stack.append((child, 0))
        else:
            state[name] = 2
            path.pop()
    return None


@dataclass
class _Node:
    key: NodeKey
    job: Job
    kwargs: dict[str, Any]
    parents: list[tuple[NodeKey, Dependency]] = field(default_factory=list)
    children: list[NodeKey] = field(default_factory=list)


def _nodes(
    specs: Mapping[str, Job], root: str, kwargs: Mapping[str, Any]
) -> tuple[dict[NodeKey, _Node], list[NodeKey]]:
    for name, spec in specs.items():
        for dep in spec.dependencies:
            if dep.job not in specs:
                raise SpecError(f"job '{name}' depends on '{dep.job}', which is not a job")
    cycle = find_cycle(specs, root)
    if cycle:
        raise CycleError(cycle)
    root_kw = dict(kwargs)
    root_key: NodeKey = (root, canonical_kwargs(root_kw), ())
    nodes = {root_key: _Node(root_key, specs[root], root_kw)}
    order = [root_key]
    # Nodes are created in a breadth-first walk; ordering them topologically afterwards
    # (Kahn) guarantees a node comes after every parent that can reach it.
    todo = [root_key]
    while todo:
        key = todo.pop(0)
        node = nodes[key]
        for i, dep in enumerate(node.job.dependencies):
            child_kw = {**node.kwargs, **dep.kwargs}
            text = canonical_kwargs(child_kw)
            path = (*key[2], len(order), i) if dep.unique else ()
            child_key: NodeKey = (dep.job, text, path)
            if child_key not in nodes:
                nodes[child_key] = _Node(child_key, specs[dep.job], child_kw)
                order.append(child_key)
                todo.append(child_key)
            nodes[child_key].parents.append((key, dep))
            if child_key not in node.children:
                node.children.append(child_key)
    indegree = {k: len({p for p, _ in n.parents}) for k, n in nodes.items()}
    ready = [root_key]
    topo: list[NodeKey] = []
    while ready:
        key = ready.pop(0)
        topo.append(key)
        for child in nodes[key].children:
            indegree[child] -= 1
            if indegree[child] == 0:
                ready.append(child)
    return nodes, topo


def node_keys(
    specs: Mapping[str, Job], root: str, kwargs: Mapping[str, Any] | None = None
) -> set[tuple[str, str]]:
    """The (job, kwargs text) pairs a resolution of ``root`` can touch."""
    nodes, _ = _nodes(specs, root, kwargs or {})
    return {(k[0], k[1]) for k in nodes}


def _split(n: int, size: int | None) -> list[tuple[int, int]]:
    """Rank ranges [lo, hi) of the chunks of ``n`` ids (one empty chunk for none)."""
    if n == 0:
        return [(0, 0)]
    step = size or n
    return [(lo, min(lo + step, n)) for lo in range(0, n, step)]


def _overlapping(lo: int, hi: int, size: int | None, n: int) -> range:
    """Indices of the chunks (of ``size``) that share a rank with [lo, hi)."""
    if n == 0 or lo == hi:
        return range(len(_split(n, size)))
    step = size or n
    return range(lo // step, (hi - 1) // step + 1)


def code_changed(
    job: str, kwargs: str, ids: Sequence[int], fresh: Freshness, current: str | None
) -> str | None:
    """``code changed (src:a → src:b)`` when the newest success of a work id of the chunk
    (of the job, for a chunk without work ids) ran another source than ``current``;
    None when it ran this one, never ran, or recorded no version."""
    now = source_of(current or "")
    if not now:
        return None
    if ids:
        codes = fresh.code_by_id.get((job, kwargs), {})
        ran = [source_of(codes.get(w, "")) for w in ids]
    else:
        ran = [source_of(fresh.latest_code.get((job, kwargs), ""))]
    for old in ran:
        if old and old != now:
            return f"code changed ({old} → {now})"
    return None


def _never(job: str, kwargs: str, ids: Sequence[int], fresh: Freshness) -> str | None:
    if not ids:
        return None if (job, kwargs) in fresh.latest else "never succeeded"
    by_id = fresh.by_id.get((job, kwargs), {})
    for w in ids:
        if w not in by_id:
            return f"work id {w} never succeeded"
    return None


def _stale(
    dep: Dependency,
    job: str,
    kwargs: str,
    ids: Sequence[int],
    fresh: Freshness,
    now: float,
    current: str | None,
) -> str | None:
    """Why the chunk must run for this edge, or None when it is fresh."""
    lag = dep.max_lag_seconds
    if lag is None:
        return "no max_lag"
    if dep.allow_missing_work_ids or not ids:
        last = fresh.latest.get((job, kwargs))
        if last is None:
            return "never succeeded"
        if now - last >= lag:
            return "older than max_lag"
        return code_changed(job, kwargs, (), fresh, current)
    by_id = fresh.by_id.get((job, kwargs), {})
    for w in ids:
        at = by_id.get(w)
        if at is None:
            return f"work id {w} never succeeded"
        if now - at >= lag:
            return f"work id {w} older than max_lag"
    return code_changed(job, kwargs, ids, fresh, current)


def resolve(
    specs: Mapping[str, Job],
    root: str,
    work_ids: Sequence[int],
    kwargs: Mapping[str, Any] | None = None,
    freshness: Freshness | None = None,
    active: Sequence[ActiveChunk] = (),
    now: float = 0.0,
    code: Mapping[str, str] | None = None,
    stale_only: bool = False,
) -> Plan:
    """Resolve ``root`` over ``work_ids`` into a :class:`Plan` (see the module doc)."""
    code = code or {}
    if root not in specs:
        raise SpecError(f"no job '{root}' among the loaded specs")
    fresh = freshness or Freshness()
    ids = tuple(sorted(set(work_ids)))
    n = len(ids)
    nodes, topo = _nodes(specs, root, kwargs or {})
    covered: dict[tuple[str, str], dict[int, int]] = {}
    empty_active: dict[tuple[str, str], int] = {}
    for a in sorted(active, key=lambda a: a.id):
        if a.work_ids:
            slot = covered.setdefault((a.job, a.kwargs), {})
            for w in a.work_ids:
                slot.setdefault(w, a.id)
        else:
            empty_active.setdefault((a.job, a.kwargs), a.id)

    chunks: list[PlannedChunk] = []
    by_id = {a.id: a for a in active}
    reused: dict[int, int] = {}  # existing chunk id -> plan index
    # Per node: chunk position -> plan indices standing for it (one new chunk, or the
    # existing chunks reused for it), and the positions whose dependencies are expanded
    # (new chunks only: a reused chunk's own graph already has its dependencies).
    placed: dict[NodeKey, dict[int, list[int]]] = {}
    expand: dict[NodeKey, set[int]] = {}
    pruned: list[tuple[str, tuple[int, ...], str]] = []

    for key in topo:
        node = nodes[key]
        size = node.job.chunk_size
        placed[key] = {}
        expand[key] = set()
        for pos, (lo, hi) in enumerate(_split(n, size)):
            chunk_ids = ids[lo:hi]
            parents: list[int] = []
            why: str | None = None
            if key == topo[0]:
                changed = code_changed(key[0], key[1], chunk_ids, fresh, code.get(key[0]))
                if not stale_only:
                    why = f"submitted; {changed}" if changed else "submitted"
                else:
                    why = changed or _never(key[0], key[1], chunk_ids, fresh)
                    if why is None:
                        pruned.append((key[0], chunk_ids, "kept: its last success ran this code"))
                        continue
            else:
                for parent_key, dep in node.parents:
                    p_size = nodes[parent_key].job.chunk_size
                    hits = [
                        i
                        for j in _overlapping(lo, hi, p_size, n)
                        if j in expand[parent_key]
                        for i in placed[parent_key][j]
                    ]
                    if not hits:
                        continue
                    reason = _stale(dep, key[0], key[1], chunk_ids, fresh, now, code.get(key[0]))
                    parents.extend(hits)
                    if reason is not None and why is None:
                        why = reason
                if why is None:
                    if parents:
                        pruned.append((key[0], chunk_ids, "fresh within max_lag"))
                    continue
            existing = _covering(key, chunk_ids, covered, empty_active)
            if existing:
                indices = []
                for chunk_id in existing:
                    if chunk_id not in reused:
                        reused[chunk_id] = len(chunks)
                        chunks.append(
                            PlannedChunk(
                                len(chunks),
                                key[0],
                                dict(node.kwargs),
                                key[1],
                                by_id[chunk_id].work_ids,
                                reuse=chunk_id,
                                why=why,
                            )
                        )
                    indices.append(reused[chunk_id])
            else:
                indices = [len(chunks)]
                chunks.append(
                    PlannedChunk(len(chunks), key[0], dict(node.kwargs), key[1], chunk_ids, why=why)
                )
                expand[key].add(pos)
            placed[key][pos] = indices
            for p in dict.fromkeys(parents):
                for index in indices:
                    if index not in chunks[p].upstream:
                        chunks[p].upstream.append(index)
    roots = [i for pos in sorted(placed[topo[0]]) for i in placed[topo[0]][pos]]
    return Plan(root, dict(kwargs or {}), ids, chunks, roots, pruned)


def _covering(
    key: NodeKey,
    chunk_ids: tuple[int, ...],
    covered: dict[tuple[str, str], dict[int, int]],
    empty_active: dict[tuple[str, str], int],
) -> list[int]:
    """Existing active chunks of the same job and kwargs that together cover
    ``chunk_ids`` (a chunk without work ids: one without work ids), else none."""
    job_kw = (key[0], key[1])
    if not chunk_ids:
        return [empty_active[job_kw]] if job_kw in empty_active else []
    slot = covered.get(job_kw, {})
    if not all(w in slot for w in chunk_ids):
        return []
    return sorted({slot[w] for w in chunk_ids})
