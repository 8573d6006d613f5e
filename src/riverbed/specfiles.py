"""Spec files: Python files a user writes (a job module, a time-range spec), imported by
path — how they are named, imported with errors that name the file and line, and
versioned — for every package that loads one (:mod:`riverbed.jobs.spec`,
:mod:`riverbed.timerange.spec`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import subprocess
import sys
import traceback
from pathlib import Path
from types import ModuleType

from riverbed.errors import SpecError

__all__ = ["NAME", "code_version", "git_sha", "import_file", "source_of"]

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")  # a spec's name: its file's stem


def git_sha(directory: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(directory), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def import_file(
    path: Path, module_name: str, what: str, error: type[SpecError] = SpecError
) -> ModuleType:
    """Import the Python file ``path`` as ``module_name``; its directory goes on sys.path.

    A failure is an ``error`` (a :class:`~riverbed.errors.SpecError`) naming the file
    and the line; ``what`` names the module in it (``job module 'daily'``).
    """
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise error(f"{path} cannot be imported as a Python module")
    module: ModuleType = importlib.util.module_from_spec(spec)
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    # In sys.modules while it executes (decorators such as @dataclass look it up),
    # not afterwards: cloudpickle then ships the module's functions to Spark's Python
    # workers by value — those cannot import a module from the spec's directory.
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except SpecError as exc:
        raise error(f"{_where(exc, path)}: {exc}") from None
    except (Exception, SystemExit) as exc:
        raise error(
            f"{_where(exc, path)}: {what} failed to import: {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        sys.modules.pop(module_name, None)
    return module


def code_version(source: bytes, git: str | None) -> str:
    """What a run records as the code's version: the git SHA and the source's hash."""
    digest = hashlib.sha256(source).hexdigest()[:12]
    return f"git:{git} src:{digest}" if git else f"src:{digest}"


def source_of(version: str) -> str:
    """The source hash part (``src:…``) of a :func:`code_version`; ``""`` when the
    version is unknown (recorded before riverbed kept it). Staleness compares this part:
    the git SHA moves with every commit of the repository, related to the job or not."""
    for part in version.split():
        if part.startswith("src:"):
            return part
    return ""


def _where(exc: BaseException, path: Path) -> str:
    if isinstance(exc, SyntaxError) and exc.lineno:
        return f"{path}:{exc.lineno}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == path]
    if frames and frames[-1].lineno:
        return f"{path}:{frames[-1].lineno}"
    return str(path)
