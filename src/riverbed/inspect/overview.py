"""The overview: bytes on disk per part."""

from __future__ import annotations

from riverbed.inspect.sources import Sources, du, local_path
from riverbed.stream.layout import STATE


def disk(src: Sources) -> dict[str, int | None]:
    """Bytes used by the log, state (durable and local) and the jobs' logs."""
    log_path = local_path(src.config.log_url)
    return {
        "log": du(log_path) if log_path is not None else None,
        "state_durable": du(src.place(STATE)),
        "state_local": du(src.config.state_dir),
        "job_logs": du(src.config.home / "jobs" / "logs"),
    }
