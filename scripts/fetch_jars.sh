#!/usr/bin/env bash
# Fill the jar cache with the JVM jars riverbed's Spark drivers add to PySpark's own
# (scripts/jars/pom.xml: Hadoop's S3A connector and the AWS SDK bundle), from Maven
# Central, at the Hadoop version PySpark bundles. Idempotent: nothing to do when the
# cache was filled from this pom and this PySpark.
#   usage: fetch_jars.sh [venv]
set -euo pipefail
venv="${1:-.venv}"
here="$(cd "$(dirname "$0")" && pwd)"
cache="$venv/jars"

pyspark_jars="$("$venv/bin/python" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')"
api="$(ls "$pyspark_jars"/hadoop-client-api-*.jar 2>/dev/null | head -1)"
if [ -z "$api" ]; then
    echo "error: no hadoop-client-api jar in $pyspark_jars: is PySpark installed in $venv?" >&2
    exit 1
fi
hadoop="$(basename "$api" .jar)"
hadoop="${hadoop#hadoop-client-api-}"
stamp="$cache/.fetched-$(cat "$here/jars/pom.xml" | sha256sum | cut -c1-12)-hadoop-$hadoop"
if [ -f "$stamp" ]; then
    exit 0
fi

if ! command -v mvn >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "==> Maven missing: installing Debian's maven"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq maven >/dev/null
    fi
    if ! command -v mvn >/dev/null 2>&1; then
        echo "error: Maven (mvn) is needed to fetch Hadoop's S3A jars; install it (Debian: apt-get install maven) and retry." >&2
        exit 1
    fi
fi

echo "==> fetching hadoop-aws $hadoop and the AWS SDK bundle (Spark's s3a://) into $cache (~700 MB, once)"
rm -rf "$cache.partial"
if ! mvn -q -B -f "$here/jars/pom.xml" -Dhadoop.version="$hadoop" \
    dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$(realpath -m "$cache.partial")" \
    >"$venv/fetch-jars.log" 2>&1; then
    echo "error: Maven could not fetch the jars (see $venv/fetch-jars.log); check that Maven Central is reachable and retry." >&2
    tail -5 "$venv/fetch-jars.log" >&2
    exit 1
fi
rm -rf "$cache"
mv "$cache.partial" "$cache"
touch "$stamp"
