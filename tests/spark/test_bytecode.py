"""Bytecode in PySpark's worker zips (riverbed.spark.bytecode): Python processes Spark
starts import compiled modules from the zip, every entry it had is kept, and a Python
that cannot use the bytecode compiles from source as before."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from riverbed.spark import bytecode


def make_zip(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def imported(zip_path: Path, expression: str) -> str:
    """``expression`` evaluated in a fresh Python whose path starts with the zip, as
    Spark starts its workers."""
    out = subprocess.run(
        [sys.executable, "-c", f"import pkg.mod; print({expression})"],
        env={"PYTHONPATH": str(zip_path), "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return out.stdout.strip()


def rewrite(path: Path, change: dict[str, bytes | str]) -> None:
    """The zip with the entries named in ``change`` given new contents, every other
    entry as it was."""
    with zipfile.ZipFile(path) as z:
        entries = [(i, z.read(i)) for i in z.infolist()]
    with zipfile.ZipFile(path, "w") as z:
        for info, data in entries:
            z.writestr(info, change.get(info.filename, data))


def test_a_worker_imports_the_compiled_module_from_the_zip(tmp_path: Path) -> None:
    """After compiling, the module's code comes from the bytecode: with its source in the
    zip changed afterwards, the import still gives the compiled value (zipimport reads
    an unchecked .pyc without the source)."""
    z = make_zip(tmp_path / "pyspark.zip", {"pkg/__init__.py": "", "pkg/mod.py": "X = 1\n"})
    done = bytecode.compile_zip(z)
    assert done.modules == 2 and done.failed == 0
    assert bytecode.has_bytecode(z)
    rewrite(z, {"pkg/mod.py": "X = 2\n"})
    assert imported(z, "pkg.mod.X") == "1"
    assert imported(z, "pkg.mod.__file__").endswith("pyspark.zip/pkg/mod.pyc")


def test_bytecode_of_another_python_is_passed_over_for_the_source(tmp_path: Path) -> None:
    """A foreign magic number (another Python's bytecode): the worker compiles the
    source, so it never runs code of the wrong kind; and the zip counts as not compiled
    for this Python, so compiling it adds this one's."""
    z = make_zip(tmp_path / "pyspark.zip", {"pkg/__init__.py": "", "pkg/mod.py": "X = 3\n"})
    bytecode.compile_zip(z)
    with zipfile.ZipFile(z) as archive:
        foreign = {
            n: bytes([archive.read(n)[0] ^ 0xFF]) + archive.read(n)[1:]
            for n in archive.namelist()
            if n.endswith(".pyc")
        }
    rewrite(z, {**foreign, "pkg/mod.py": "X = 4\n"})
    assert imported(z, "pkg.mod.X") == "4"
    assert not bytecode.has_bytecode(z)


def test_compiling_twice_leaves_the_zip_alone_and_bad_sources_are_counted(
    tmp_path: Path,
) -> None:
    z = make_zip(
        tmp_path / "py4j-0.10.9.9-src.zip",
        {"pkg/__init__.py": "", "pkg/mod.py": "X = 5\n", "pkg/broken.py": "def (:\n"},
    )
    first = bytecode.compile_zip(z)
    assert (first.modules, first.failed) == (2, 1)
    inode, mtime = z.stat().st_ino, z.stat().st_mtime_ns
    again = bytecode.compile_zip(z)
    assert (again.modules, again.failed) == (0, 0)
    assert (z.stat().st_ino, z.stat().st_mtime_ns) == (inode, mtime)
    assert imported(z, "pkg.mod.X") == "5"
    assert not list(tmp_path.glob(".*partial"))


@settings(max_examples=25, deadline=None)
@given(
    st.dictionaries(
        st.from_regex(r"[a-z]{1,8}(/[a-z]{1,8}){0,2}\.(py|txt|json)", fullmatch=True),
        st.text(alphabet="abc =123\n", max_size=40),
        max_size=8,
    )
)
def test_every_entry_of_the_zip_is_kept_byte_for_byte(files: dict[str, str]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        z = make_zip(Path(tmp) / "pyspark.zip", files)
        done = bytecode.compile_zip(z)
        with zipfile.ZipFile(z) as archive:
            got = {n: archive.read(n) for n in archive.namelist()}
        kept = {n: v.decode() for n, v in got.items() if not n.endswith(".pyc")}
        assert kept == files
        compiled = {n[:-1] for n in got if n.endswith(".pyc")}
        assert compiled <= {n for n in files if n.endswith(".py")}
        assert len(compiled) == done.modules
        assert done.modules + done.failed == sum(n.endswith(".py") for n in files)
        for name in compiled:
            assert got[f"{name}c"][:4] == importlib.util.MAGIC_NUMBER


@pytest.mark.setup
def test_make_compiled_the_virtualenvs_pyspark_zips() -> None:
    """What `make` runs (`python -m riverbed.spark.bytecode`) left bytecode in both zips
    Spark puts first on its workers' path."""
    import pyspark

    zips = bytecode.worker_zips(Path(pyspark.__file__).parent)
    assert [z.name.split("-")[0] for z in zips] == ["py4j", "pyspark.zip"]
    assert all(bytecode.has_bytecode(z) for z in zips), (
        "no bytecode in PySpark's zips: `make` runs python -m riverbed.spark.bytecode"
    )
