"""``riverbed stream run --once``'s progress through its backlog."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import Progress, TextColumn


def backlog_of(job: Any) -> int | None:
    """Records of the topic not aggregated yet (None when the topic cannot tell)."""
    from riverbed.stream.specjob import status

    try:
        lag = status(job).get("lag") or {}
    except Exception:  # progress is a courtesy: the run goes on without it
        return None
    return sum(int(n) for n in lag.values()) if lag else None


class Backlog:
    """``stream run --once``'s progress through the backlog it started with: a bar on a
    terminal, else a line every few seconds (:func:`riverbed.stream.specjob.backlog_line`)."""

    EVERY_S = 5.0

    def __init__(self, total: int | None, console: Console) -> None:
        self.total, self.console = total, console
        self.done = 0
        self.began = self.said = time.monotonic()
        self.bar: Progress | None = None
        self.task: Any = None

    def __enter__(self) -> Backlog:
        if self.total and self.console.is_terminal:
            self.bar = Progress(
                *Progress.get_default_columns(), TextColumn("{task.completed:,}/{task.total:,}"),
                console=self.console, transient=True,
            )  # fmt: skip
            self.task = self.bar.add_task("backlog", total=self.total)
            self.bar.start()
        return self

    def advance(self, records: int) -> None:
        if not self.total:
            return
        self.done += records
        if self.bar is not None:
            self.bar.update(self.task, completed=min(self.done, self.total))
            return
        now = time.monotonic()
        if now - self.said >= self.EVERY_S or self.done >= self.total:
            from riverbed.stream.specjob import backlog_line

            self.console.print(backlog_line(self.total, self.done, now - self.began))
            self.said = now

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()


__all__ = ["Backlog", "backlog_of"]
