"""The jar cache: the JVM jars riverbed's Spark drivers add to PySpark's own.

PySpark ships Spark and Hadoop's client; three connectors riverbed uses are not in it:

* ``org.apache.hadoop:hadoop-aws`` (Hadoop's S3A connector, ``s3a://``) and the AWS SDK v2
  bundle it declares — at the Hadoop version PySpark bundles (its
  ``hadoop-client-api-<version>.jar``), or S3A and Hadoop's client disagree;
* ``org.apache.spark:spark-sql-kafka-0-10_2.13`` (Spark's own Kafka source and sink);
* ``org.apache.spark:spark-avro_2.13`` (``from_avro`` for Kafka sources of Avro values).

:func:`fetch` (``riverbed setup jars``; ``make jars`` calls it) resolves them from Maven
Central — or the repositories a user names — with Spark's own Ivy resolution (what
``spark.jars.packages`` does), keeps Ivy's downloads in a user cache, and copies into the
jar cache every resolved jar **except the artifacts PySpark already ships** (Scala,
Hadoop's client, slf4j, lz4, snappy, …: a second copy ahead of Spark's own on the class
path would shadow it). Nothing but Java and PySpark is needed: no Maven, no repository
checkout. :func:`riverbed.spark.session` puts the cache on the driver's and executors'
class path.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from riverbed.config import child_environment, inherited
from riverbed.errors import InvalidValueError, RiverbedError

__all__ = [
    "CENTRAL",
    "CONNECTORS_VERSION",
    "ENV",
    "Fetched",
    "JarFetchError",
    "artifact_of",
    "cache_names",
    "coordinates",
    "fetch",
    "hadoop_version",
    "jar_dir",
    "jars",
    "pyspark_jars",
]

ENV = "RIVERBED_JARS"
CENTRAL = "https://repo1.maven.org/maven2/"
# spark-sql-kafka and spark-avro: 4.2.0, not PySpark's 4.3.0 — Maven Central serves no
# 4.3.0 of them here (tried 2026-11-26); 4.2.0 reads and writes Kafka under Spark 4.3.0 in
# batch and streaming queries (tests/spark/test_kafka_connector.py)
CONNECTORS_VERSION = "4.2.0"
SCALA = "2.13"  # PySpark 4's


class JarFetchError(RiverbedError):
    """The connectors could not be resolved or copied into the jar cache."""


def jar_dir() -> Path:
    """The jar cache: ``RIVERBED_JARS``, or ``jars/`` in the virtualenv riverbed runs in."""
    chosen = inherited(ENV)
    return Path(chosen) if chosen else Path(sys.prefix) / "jars"


def jars(directory: Path | None = None) -> list[Path]:
    """The jars of the cache (sorted), or [] when it has no ``hadoop-aws`` (not filled)."""
    directory = jar_dir() if directory is None else directory
    found = sorted(directory.glob("*.jar")) if directory.is_dir() else []
    return found if any(p.name.startswith("hadoop-aws-") for p in found) else []


def pyspark_jars() -> Path:
    """The directory of the jars PySpark ships."""
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def hadoop_version(bundled: Sequence[str] | None = None) -> str:
    """The Hadoop version PySpark bundles, from its ``hadoop-client-api-<v>.jar``."""
    names = [p.name for p in pyspark_jars().glob("*.jar")] if bundled is None else bundled
    for name in sorted(names):
        if name.startswith("hadoop-client-api-") and name.endswith(".jar"):
            return name.removeprefix("hadoop-client-api-").removesuffix(".jar")
    raise JarFetchError(
        f"PySpark's jars ({pyspark_jars()}) hold no hadoop-client-api jar, so the Hadoop "
        "version for hadoop-aws is unknown; reinstall PySpark (pip install --force-reinstall "
        "pyspark)"
    )


def coordinates(hadoop: str | None = None) -> list[str]:
    """The Maven coordinates riverbed adds, pinned to PySpark's versions."""
    hadoop = hadoop_version() if hadoop is None else hadoop
    return [
        f"org.apache.hadoop:hadoop-aws:{hadoop}",
        f"org.apache.spark:spark-sql-kafka-0-10_{SCALA}:{CONNECTORS_VERSION}",
        f"org.apache.spark:spark-avro_{SCALA}:{CONNECTORS_VERSION}",
    ]


# a version begins at the last "-" that a digit follows: kafka-clients-3.9.2,
# spark-sql-kafka-0-10_2.13-4.2.0, wildfly-openssl-2.2.5.Final, scala-xml_2.13-2.4.0
_VERSIONED = re.compile(r"^(?P<artifact>.+)-(?P<version>\d[^-]*(?:-[^\d][^-]*)*)\.jar$")


def artifact_of(name: str) -> str:
    """A jar's artifact, from its file name as Maven writes it (``artifact-version.jar``):
    what tells two versions of the same library apart from two libraries."""
    matched = _VERSIONED.match(name)
    return matched.group("artifact") if matched else name.removesuffix(".jar")


def cache_names(resolved: Sequence[str], bundled: Sequence[str]) -> dict[str, str]:
    """Which of Ivy's resolved jars (``group_artifact-version.jar``) go into the cache, and
    under which name (Maven's ``artifact-version.jar``): all but the artifacts PySpark
    ships (``bundled``), whatever their version."""
    shipped = {artifact_of(name) for name in bundled}
    chosen: dict[str, str] = {}
    for name in resolved:
        if not name.endswith(".jar"):
            continue
        plain = name.split("_", 1)[1] if "_" in name else name  # less Ivy's "group_"
        if artifact_of(plain) not in shipped:
            chosen[name] = plain
    return chosen


@dataclass(frozen=True)
class Fetched:
    """What :func:`fetch` did."""

    directory: Path
    jars: list[str]  # the cache's jars, by name
    fetched: bool  # False: the cache already held this set (nothing was resolved)
    seconds: float


def _stamp(coords: Sequence[str], repositories: Sequence[str]) -> str:
    import pyspark

    text = "\n".join([pyspark.__version__, *coords, "--", *repositories])
    return f".fetched-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def ivy_home() -> Path:
    """Where Ivy keeps what it downloaded, across virtualenvs (the user's cache)."""
    return Path.home() / ".cache" / "riverbed" / "ivy"


def check_repository(url: str) -> str:
    """A Maven repository's URL as given (``https://…`` or ``file://…``), or a clear error."""
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http", "file") or not (parts.netloc or parts.path):
        raise InvalidValueError(
            f"--repository {url!r} is not a Maven repository URL; give its root, e.g. "
            "https://nexus.example.org/repository/maven-central/"
        )
    if parts.username or parts.password:
        raise InvalidValueError(
            "--repository with a user or password is not taken (Ivy would show them in its "
            "output); give a mirror reachable without them, or resolve with ivy settings of "
            "your own (spark.jars.ivySettings) and set RIVERBED_JARS to the jars"
        )
    return url if url.endswith("/") else url + "/"


def ivy_settings(repositories: Sequence[str]) -> str:
    """Ivy settings resolving from the given repositories, then Maven Central — and nothing
    else (Spark's defaults add spark-packages.org and the local Maven cache, whose poms
    without jars fail a resolution)."""
    from xml.sax.saxutils import quoteattr

    roots = [*repositories, CENTRAL]
    resolvers = "\n".join(
        f'      <ibiblio name={quoteattr(f"repo-{i}")} m2compatible="true" root={quoteattr(root)}/>'
        for i, root in enumerate(roots)
    )
    return (
        "<ivysettings>\n"
        '  <settings defaultResolver="riverbed"/>\n'
        "  <resolvers>\n"
        '    <chain name="riverbed" returnFirst="true">\n'
        f"{resolvers}\n"
        "    </chain>\n"
        "  </resolvers>\n"
        "</ivysettings>\n"
    )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def fetch(
    directory: Path | None = None,
    *,
    repositories: Sequence[str] = (),
    say: Callable[[str], None] = lambda _line: None,
    timeout: float = 1800.0,
) -> Fetched:
    """Fill the jar cache (default :func:`jar_dir`) with the connectors, once: a cache
    already filled from the same coordinates and repositories is left as it is.

    Raises :class:`JarFetchError` naming what could not be resolved and the fix."""
    import time

    started = time.monotonic()
    directory = jar_dir() if directory is None else directory
    repositories = [check_repository(url) for url in repositories]
    coords = coordinates()
    stamp = directory / _stamp(coords, repositories)
    if stamp.is_file():
        return Fetched(directory, [p.name for p in jars(directory)], False, 0.0)
    _refuse_foreign(directory)
    home = ivy_home()
    with _locked(home / ".lock"):
        if stamp.is_file():  # another process filled it meanwhile
            return Fetched(directory, [p.name for p in jars(directory)], False, 0.0)
        say(
            f"resolving {', '.join(coords)} from "
            f"{', '.join([*repositories, 'Maven Central'])} (the AWS SDK bundle is ~700 MB "
            f"the first time; cached in {home})"
        )
        resolved = _resolve(home, coords, repositories, timeout)
        bundled = [p.name for p in pyspark_jars().glob("*.jar")]
        chosen = cache_names([p.name for p in resolved], bundled)
        by_name = {p.name: p for p in resolved}
        partial = directory.with_name(directory.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        for ivy_name, name in sorted(chosen.items()):
            _place(by_name[ivy_name], partial / name)
        (partial / stamp.name).write_text("\n".join(coords) + "\n")
        shutil.rmtree(directory, ignore_errors=True)
        partial.rename(directory)
    names = sorted(chosen.values())
    say(f"{len(names)} jars in {directory}: {', '.join(names)}")
    return Fetched(directory, names, True, time.monotonic() - started)


def _refuse_foreign(directory: Path) -> None:
    """A cache is replaced whole when filled again: refuse a directory that holds files
    a fill did not put there (no ``.fetched-*`` stamp), rather than delete them."""
    if not directory.exists():
        return
    if not directory.is_dir():
        raise JarFetchError(f"the jar cache {directory} is a file; give a directory")
    entries = list(directory.iterdir())
    if entries and not any(p.name.startswith(".fetched-") for p in entries):
        raise JarFetchError(
            f"{directory} holds {len(entries)} files riverbed setup jars did not put there; "
            "it replaces the cache whole when it fills it, so give an empty or new directory "
            "(--dir) — nothing was changed"
        )


def _place(source: Path, target: Path) -> None:
    """A hard link to Ivy's copy where both are on one file system, else a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def _resolve(
    home: Path, coords: Sequence[str], repositories: Sequence[str], timeout: float
) -> list[Path]:
    """Resolve ``coords`` with Spark's own Ivy (``spark-submit --packages`` on a script
    that does nothing); the jars it retrieved."""
    retrieved = home / "jars"  # Spark retrieves the resolution's jars here
    shutil.rmtree(retrieved, ignore_errors=True)
    submit = pyspark_jars().parent / "bin" / "spark-submit"
    with tempfile.TemporaryDirectory(prefix="riverbed-jars-") as scratch:
        settings = Path(scratch) / "ivysettings.xml"
        settings.write_text(ivy_settings(repositories))
        noop = Path(scratch) / "resolved.py"
        noop.write_text("# riverbed setup jars: Spark resolved the packages before this ran\n")
        command = [
            str(submit),
            "--master", "local[1]",
            "--conf", f"spark.jars.ivy={home}",
            "--conf", f"spark.jars.ivySettings={settings}",
            "--conf", "spark.ui.enabled=false",
            "--packages", ",".join(coords),
            str(noop),
        ]  # fmt: skip
        # PySpark's own Spark (not a SPARK_HOME's), whose jars the cache completes
        env = child_environment({"PYSPARK_PYTHON": sys.executable, "SPARK_HOME": None})
        try:
            done = subprocess.run(
                command, env=env, capture_output=True, text=True, timeout=timeout, check=False
            )
        except FileNotFoundError as exc:
            raise JarFetchError(f"PySpark's spark-submit is missing ({submit}): {exc}") from None
        except subprocess.TimeoutExpired:
            raise JarFetchError(
                f"resolving the connectors took over {timeout:.0f} s; check that Maven Central "
                "(or the --repository given) is reachable, then run `riverbed setup jars` again"
            ) from None
    found = sorted(retrieved.glob("*.jar")) if retrieved.is_dir() else []
    if done.returncode != 0 or not found:
        lines = [line for line in (done.stderr or "").splitlines() if line.strip()]
        unresolved = [line.strip() for line in lines if "not found" in line or "::" in line]
        detail = "\n".join((unresolved or lines)[-12:])
        raise JarFetchError(
            "Spark's Ivy could not resolve riverbed's connectors "
            f"({', '.join(coords)}); check that Maven Central is reachable, or name a mirror "
            f"with `riverbed setup jars --repository URL`. What Ivy said:\n{detail}"
        )
    return found
