#!/usr/bin/env bash
# Fill the jar cache with the JVM jars riverbed's Spark drivers add to PySpark's own
# (scripts/jars/pom.xml: Hadoop's S3A connector and the AWS SDK bundle, at the Hadoop
# version PySpark bundles; Spark's Kafka connector), and .venv/kafka with a Kafka broker
# for the tests (scripts/jars/kafka/pom.xml), from Maven Central. Idempotent: nothing to
# do for a set fetched from the same pom and arguments.
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

ensure_maven() {
    if ! command -v mvn >/dev/null 2>&1; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            echo "==> Maven missing: installing Debian's maven"
            DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1 || true
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq maven >/dev/null
        fi
        if ! command -v mvn >/dev/null 2>&1; then
            echo "error: Maven (mvn) is needed to fetch riverbed's JVM jars; install it (Debian: apt-get install maven) and retry." >&2
            exit 1
        fi
    fi
}

# fetch POM DEST WHAT [maven args]: the runtime jars of POM into DEST, unless DEST was
# filled from this POM (and these arguments) already
fetch() {
    local pom="$1" dest="$2" what="$3"
    shift 3
    local stamp="$dest/.fetched-$( (cat "$pom"; echo "$*") | sha256sum | cut -c1-12)"
    if [ -f "$stamp" ]; then
        return 0
    fi
    ensure_maven
    echo "==> fetching $what into $dest (once)"
    rm -rf "$dest.partial"
    if ! mvn -q -B -f "$pom" "$@" \
        dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$(realpath -m "$dest.partial")" \
        >"$venv/fetch-jars.log" 2>&1; then
        echo "error: Maven could not fetch $what (see $venv/fetch-jars.log); check that Maven Central is reachable and retry." >&2
        tail -5 "$venv/fetch-jars.log" >&2
        exit 1
    fi
    rm -rf "$dest"
    mv "$dest.partial" "$dest"
    touch "$stamp"
}

fetch "$here/jars/pom.xml" "$cache" \
    "hadoop-aws $hadoop with the AWS SDK bundle (s3a://) and Spark's Kafka connector (~700 MB)" \
    -Dhadoop.version="$hadoop"
fetch "$here/jars/kafka/pom.xml" "$venv/kafka" "an Apache Kafka broker for the tests (~45 MB)"
