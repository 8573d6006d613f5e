#!/usr/bin/env bash
# Fill .venv/kafka with an Apache Kafka broker for the tests and benchmarks
# (scripts/jars/kafka-broker.pom.xml) and .venv/iceberg-rest with Apache Iceberg's REST
# catalog server (scripts/jars/iceberg-rest.pom.xml), from Maven Central. Idempotent:
# nothing to do for a set fetched from the same pom. (The jars Spark drivers use come
# from `riverbed setup jars`, which needs no Maven: riverbed.spark.jars.)
#   usage: fetch_test_servers.sh [venv]
set -euo pipefail
venv="${1:-.venv}"
here="$(cd "$(dirname "$0")" && pwd)"

ensure_maven() {
    if ! command -v mvn >/dev/null 2>&1; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            echo "==> Maven missing: installing Debian's maven"
            DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1 || true
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq maven >/dev/null
        fi
        if ! command -v mvn >/dev/null 2>&1; then
            echo "error: Maven (mvn) is needed to fetch the tests' Kafka broker and Iceberg REST catalog; install it (Debian: apt-get install maven) and retry." >&2
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
        >"$venv/fetch-test-servers.log" 2>&1; then
        echo "error: Maven could not fetch $what (see $venv/fetch-test-servers.log); check that Maven Central is reachable and retry." >&2
        tail -5 "$venv/fetch-test-servers.log" >&2
        exit 1
    fi
    rm -rf "$dest"
    mv "$dest.partial" "$dest"
    touch "$stamp"
}

fetch "$here/jars/kafka-broker.pom.xml" "$venv/kafka" "an Apache Kafka broker for the tests (~45 MB)"
fetch "$here/jars/iceberg-rest.pom.xml" "$venv/iceberg-rest" "Apache Iceberg's REST catalog server for the tests (~75 MB)"
