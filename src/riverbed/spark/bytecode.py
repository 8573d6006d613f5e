"""Compiled bytecode inside PySpark's worker zips, for faster Python worker starts.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and ``py4j-<version>-src.zip`` first
on the path of every Python process it starts, and Python caches no bytecode for a
module imported from a zip: each such process compiles the PySpark modules it imports
from source. riverbed's own worker daemon imports them from the installed package
instead (:mod:`riverbed.spark.daemon`), but Spark starts others it cannot reach: the
Python data source's planning and reading workers (riverbed's Spark source), the
streaming source runner, Spark Connect's ``foreachBatch`` worker — 0.5-0.7 s of CPU
each (``import pyspark.worker`` from the zip 0.88 s, with its bytecode 0.24 s; a Connect
``foreachBatch`` worker 1.4 s against 0.7 s: docs/benchmarks.md, "Python workers").

:func:`compile_zip` adds each module's bytecode beside its source in the zip — a
``.pyc`` of the *unchecked hash-based* kind (PEP 552), which ``zipimport`` reads without
comparing timestamps — and keeps every entry the zip had. A Python whose bytecode
differs (another version) finds a foreign magic number and compiles from source, as
before, so a worker never runs the wrong code. The zip is replaced atomically, but a
Python process that already imported from the old one reads the new file at the old
one's offsets: compile before Spark runs from this PySpark, not beside it (a Spark
Connect test run beside a compile here failed a test). A zip already holding this
Python's bytecode is left alone. ``make`` (and ``riverbed setup spark-archive``) runs
it for the virtualenv's PySpark, before any Spark starts; a PySpark installed again
brings its zips back as they were, and the next ``make`` compiles them again.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Compiled", "compile_pyspark", "compile_zip", "has_bytecode", "worker_zips"]


@dataclass(frozen=True)
class Compiled:
    """What :func:`compile_zip` did to one zip."""

    path: Path
    modules: int  # modules whose bytecode it added (0: the zip had it already)
    failed: int  # sources that do not compile (their workers compile them, as before)


def worker_zips(spark_home: Path) -> list[Path]:
    """The zips Spark puts on its Python workers' path: PySpark's and Py4J's."""
    lib = spark_home / "python" / "lib"
    return sorted([*lib.glob("pyspark.zip"), *lib.glob("py4j-*-src.zip")])


def has_bytecode(path: Path) -> bool:
    """Whether the zip holds this Python's bytecode for its modules already (judged by
    the first ``.pyc`` in it: :func:`compile_zip` writes them all at once)."""
    with zipfile.ZipFile(path) as archive:
        for name in archive.namelist():
            if name.endswith(".pyc"):
                return archive.read(name)[:4] == importlib.util.MAGIC_NUMBER
    return False


def _pyc(source: bytes, filename: str) -> bytes:
    """Unchecked hash-based bytecode of ``source`` (PEP 552: flags 0b01; zipimport
    uses it without looking at the source's time or hash)."""
    import marshal

    code = compile(source, filename, "exec", dont_inherit=True)
    header = importlib.util.MAGIC_NUMBER + (0b01).to_bytes(4, "little")
    return header + importlib.util.source_hash(source) + marshal.dumps(code)


def compile_zip(path: Path) -> Compiled:
    """Add this Python's bytecode for every module of the zip at ``path`` (replacing the
    zip atomically), unless it holds it already."""
    path = Path(path)
    if has_bytecode(path):
        return Compiled(path, 0, 0)
    partial = path.with_name(f".{path.name}.partial")
    added = failed = 0
    try:
        with zipfile.ZipFile(path) as src, zipfile.ZipFile(partial, "w") as dst:
            names = set(src.namelist())
            for info in src.infolist():
                data = src.read(info)
                dst.writestr(info, data)
                name = info.filename
                if not name.endswith(".py") or f"{name}c" in names:
                    continue
                try:
                    pyc = _pyc(data, f"{path}{os.sep}{name}")
                except (SyntaxError, ValueError):
                    failed += 1  # a module of another Python's syntax: compiled on import
                    continue
                entry = zipfile.ZipInfo(f"{name}c", info.date_time)
                entry.compress_type = zipfile.ZIP_DEFLATED
                dst.writestr(entry, pyc)
                added += 1
        os.chmod(partial, path.stat().st_mode)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return Compiled(path, added, failed)


def compile_pyspark() -> list[Compiled]:
    """:func:`compile_zip` for the zips of this Python's PySpark: its package is the
    Spark home of a pip-installed PySpark (riverbed's sessions; a Spark installed
    elsewhere keeps its zips as they are)."""
    import pyspark

    return [compile_zip(z) for z in worker_zips(Path(pyspark.__file__).parent)]


def main() -> int:
    """``python -m riverbed.spark.bytecode``: compile the zips; say what was done."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)  # PySpark's own tests' sources
        try:
            done = compile_pyspark()
        except (OSError, zipfile.BadZipFile) as exc:  # a read-only Spark: slower only
            print(f"    PySpark's zips left as they are ({exc})", file=sys.stderr)  # noqa: T201
            return 0
    for c in done:
        if c.modules:
            print(f"==> bytecode of {c.modules} modules added to {c.path}")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
