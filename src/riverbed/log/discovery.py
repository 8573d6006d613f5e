"""``riverbed://``: the log servers the control plane knows, instead of their addresses.

Every ``riverbed log serve`` announces itself on the control plane (the processes
registry of :mod:`riverbed.control.processes`, on a lease: it goes when the server does)
with its URL and the log it serves. A client given ``riverbed://`` asks the control plane
(``RIVERBED_CONTROL``) for the live servers and talks to them as to
``flight://a:8815,b:8815`` — and when none of those can be reached any more, asks again,
so a server moved to another machine or replaced on another port is found without
editing any configuration.

Servers of different logs are not interchangeable (only servers of one bucket's
diskless topics are): when the control plane knows servers of several logs,
``riverbed://?log=s3://bucket/prefix`` says which. ``?token=`` and ``?reconnect=`` pass
on to the servers' URL as for ``flight://``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from riverbed.log.errors import LogError

__all__ = ["ROLE", "choose", "discovered", "resolver"]

ROLE = "log-server"  # the role a log server announces (riverbed.control.processes)


def choose(announced: Iterable[Mapping[str, Any]], log: str | None) -> tuple[str, list[str]]:
    """The scheme and ``host:port`` list of the live servers of one log (pure).
    ``announced``: the processes' metadata (``role``, ``url``, ``log``)."""
    by_log: dict[str, set[str]] = {}
    for proc in announced:
        if proc.get("role") == ROLE and proc.get("url"):
            by_log.setdefault(str(proc.get("log") or "?"), set()).add(str(proc["url"]))
    if log is not None:
        by_log = {k: v for k, v in by_log.items() if k == log}
    if not by_log:
        which = f" of {log}" if log else ""
        raise LogError(
            f"no log server{which} is registered on the control plane; start one "
            "(`riverbed log serve`) with the same RIVERBED_CONTROL, or name a server "
            "(flight://host:8815)"
        )
    if len(by_log) > 1:
        logs = ", ".join(sorted(by_log))
        raise LogError(
            f"the control plane knows log servers of several logs ({logs}); say which: "
            "riverbed://?log=<one of them>"
        )
    (urls,) = by_log.values()
    schemes = {urlsplit(u).scheme for u in urls}
    if len(schemes) > 1:
        raise LogError(
            f"the servers of one log mix {' and '.join(sorted(schemes))}; serve them alike"
        )
    return schemes.pop(), sorted(urlsplit(u).netloc for u in urls)


def _announced(control: str) -> list[dict[str, Any]]:
    from riverbed.control import connect
    from riverbed.control.processes import processes

    cp = connect(control)
    try:
        return processes(cp)
    finally:
        cp.close()


def resolver(url: str, control: str) -> Callable[[], list[str]]:
    """The live servers of ``url``'s log, asked again at each call (``host:port``)."""
    log = _query(url).get("log")

    def servers() -> list[str]:
        return choose(_announced(control), log)[1]

    return servers


def discovered(url: str, control: str) -> str:
    """The ``flight://a,b?…`` URL ``riverbed://…`` stands for now."""
    query = _query(url)
    scheme, servers = choose(_announced(control), query.pop("log", None))
    rest = f"?{urlencode(query)}" if query else ""
    return f"{scheme}://{','.join(servers)}{rest}"


def _query(url: str) -> dict[str, str]:
    parts = urlsplit(url)
    if parts.netloc or parts.path not in ("", "/"):
        raise LogError(
            f"{url!r}: riverbed:// names no server (the control plane knows them); "
            "options go after ?, e.g. riverbed://?log=s3://bucket/prefix"
        )
    return {k: v[-1] for k, v in parse_qs(parts.query).items()}
