"""``riverbed setup``: what riverbed needs beside its Python packages — ``jars`` fills the
jar cache with the JVM connectors PySpark lacks; ``spark-archive`` builds the class-data
archive Spark drivers map and compiles PySpark's worker zips (riverbed.spark.bytecode)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console

out = Console(highlight=False, soft_wrap=True)


def add_parsers(sub: Any) -> None:
    setup = sub.add_parser("setup", help="install what riverbed needs beside its Python packages")
    what = setup.add_subparsers(dest="setup_command", metavar="WHAT", required=True)
    j = what.add_parser(
        "jars",
        help="fetch Spark's S3A, Kafka and Avro connectors (at PySpark's versions) from Maven "
        "Central into the jar cache Spark drivers use; once, then a no-op",
    )
    j.add_argument(
        "--dir",
        type=Path,
        help="the jar cache to fill (default: RIVERBED_JARS, or jars/ in this virtualenv)",
    )
    j.add_argument(
        "--repository",
        action="append",
        default=[],
        metavar="URL",
        help="a Maven repository to try before Maven Central (a mirror); repeatable",
    )
    j.set_defaults(func=_jars)
    a = what.add_parser(
        "spark-archive",
        help="build a class-data archive of Spark's JVM classes into this virtualenv: every "
        "Spark driver riverbed starts maps it; and compile the PySpark modules Spark's Python "
        "processes import from its zips (faster starts; 1-3 minutes, once)",
    )
    a.add_argument("--force", action="store_true", help="build it again even if it is there")
    a.set_defaults(func=_archive)


def _jars(args: argparse.Namespace) -> int:
    from riverbed.spark.jars import fetch

    done = fetch(args.dir, repositories=args.repository, say=lambda line: out.print(f"==> {line}"))
    if done.fetched:
        out.print(f"jar cache {done.directory}: {len(done.jars)} jars ({done.seconds:.0f} s)")
    else:
        out.print(f"jar cache {done.directory}: already filled ({len(done.jars)} jars)")
    return 0


def _archive(args: argparse.Namespace) -> int:
    from riverbed.spark import bytecode, cds

    bytecode.main()  # a no-op once done
    path = cds.archive()
    if path is not None and path.is_file() and not args.force:
        out.print(f"class-data archive {path}: already built (--force builds it again)")
        return 0
    return cds.main(force=args.force)
