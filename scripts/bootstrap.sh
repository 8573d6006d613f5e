#!/usr/bin/env bash
# Create the virtualenv and install riverbed with its dev tools into it.
set -euo pipefail
venv="${1:-.venv}"

python=""
for candidate in python3.13 python3.12 python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
        "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        python="$candidate"
        break
    fi
done
if [ -z "$python" ]; then
    echo "riverbed needs Python 3.11 or newer (PySpark 4.3 does too); install it and retry." >&2
    exit 1
fi

if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import sys' 2>/dev/null; then
    echo "==> creating $venv with $("$python" --version)"
    rm -rf "$venv"
    "$python" -m venv "$venv" || {
        echo "could not create a virtualenv; on Debian: apt-get install -y python3-venv" >&2
        exit 1
    }
fi
echo "==> installing riverbed and its dev tools into $venv (PySpark builds once, ~1 min)"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -e ".[dev]"
