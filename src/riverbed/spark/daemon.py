"""riverbed's PySpark worker daemon (``spark.python.daemon.module``, set by
:func:`riverbed.spark.session`): PySpark's own daemon, started faster, whose workers
start with riverbed's task modules already imported.

Every Spark application starts one daemon per executor; the daemon forks a Python
worker for each task slot (reused while busy, killed after a minute idle). Measured on
this machine (docs/benchmarks.md, "Python workers"):

* Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on the workers' path. Python
  cannot cache bytecode inside a zip, so every daemon compiled PySpark from source:
  0.7 s to import ``pyspark.daemon`` and ``pyspark.worker`` against 0.12 s from the
  installed package. When the zip is the installed ``pyspark``'s own (a pip-installed
  PySpark: ``SPARK_HOME`` is the package), the same code is imported from the package.
* A forked worker imported riverbed's task modules (pandas, pyarrow, RocksDB and
  riverbed's own) when its first task's function was unpickled: ~0.4 s a worker. Here
  they are imported once, before the daemon forks.

PySpark's daemon imports nothing heavy itself because pandas and pyarrow start threads
when imported and a fork copies no threads: numpy's OpenBLAS pool and jemalloc's
background thread. Both libraries re-create them in a forked child (their ``atfork``
handlers), which is what ``multiprocessing``'s fork start method relies on too; the
tests run every Spark job of the suite through this daemon.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys

PRELOAD = (
    "pyspark.worker",
    "pyspark.sql.pandas.serializers",
    "riverbed.stream.engine",
    "riverbed.stream.lognative",
    "riverbed.state.rocksdb",
    "riverbed.spark.tasks",
)


def installed_first(path: list[str]) -> list[str]:
    """``path`` (a ``sys.path``) without the zips Spark packs PySpark and Py4J in when
    the same code is installed on it: ``…/pyspark/python/lib/pyspark.zip`` of the
    ``pyspark`` package found in a directory of ``path``, and
    ``…/py4j-<version>-src.zip`` beside it when that directory's ``py4j`` is
    ``<version>``."""
    dirs = {os.path.realpath(p) for p in path if not p.endswith(".zip")}
    keep = []
    for entry in path:
        lib = os.path.dirname(entry)
        package = os.path.dirname(os.path.dirname(lib))  # …/site-packages/pyspark
        site = os.path.dirname(package)
        name = os.path.basename(entry)
        installed = (
            entry.endswith(".zip")
            and lib.endswith(os.path.join("pyspark", "python", "lib"))
            and os.path.isfile(os.path.join(package, "__init__.py"))
            and os.path.realpath(site) in dirs
        )
        if installed and name == "pyspark.zip":
            continue
        if installed and name.startswith("py4j-") and name.endswith("-src.zip"):
            version = name[len("py4j-") : -len("-src.zip")]
            if _py4j_version(site) == version:
                continue
        keep.append(entry)
    return keep


def _py4j_version(site: str) -> str | None:
    try:
        with open(os.path.join(site, "py4j", "version.py"), encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("'\"")
    return None


def main() -> None:
    sys.path[:] = installed_first(sys.path)
    import importlib

    for name in PRELOAD:
        # a speed-up only: a module that cannot be imported here fails the task that
        # needs it, with the reason
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    from pyspark import daemon

    gc.collect()
    gc.freeze()  # the forked workers share these pages instead of touching every one
    daemon.manager()


if __name__ == "__main__":
    main()
