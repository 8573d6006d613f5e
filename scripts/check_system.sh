#!/usr/bin/env bash
# Check the system programs riverbed's tests need; install them with apt where we may.
#   usage: check_system.sh [java] [etcd] [postgres] [mariadb] [chromium] [s3]
set -uo pipefail

can_apt() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }
apt_updated=""
apt_install() {
    if [ -z "$apt_updated" ]; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1 || true
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

ensure() {  # ensure NAME CHECK-COMMAND PACKAGE HINT
    local name="$1" check="$2" package="$3" hint="$4"
    if eval "$check" >/dev/null 2>&1; then return 0; fi
    if can_apt; then
        echo "==> $name missing: installing Debian packages: $package"
        if apt_install $package && eval "$check" >/dev/null 2>&1; then return 0; fi
    fi
    echo "error: $name is required but not available. $hint" >&2
    return 1
}

java_ok() {
    command -v java >/dev/null 2>&1 || return 1
    local v
    v=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)
    [ -n "$v" ] && [ "$v" -ge 17 ]
}
pg_ok() { ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; }

status=0
for need in "$@"; do
    case "$need" in
        java) ensure "Java 17+" java_ok openjdk-17-jre-headless \
            "Install a JDK/JRE 17 or newer (Debian: apt-get install openjdk-17-jre-headless) and put java on PATH." || status=1 ;;
        etcd) ensure "etcd" "command -v etcd" etcd-server \
            "Install etcd 3.4+ (Debian: apt-get install etcd-server) so 'etcd' is on PATH." || status=1 ;;
        postgres) ensure "PostgreSQL server" pg_ok postgresql \
            "Install PostgreSQL 13+ (Debian: apt-get install postgresql); tests start their own throwaway server." || status=1 ;;
        mariadb) ensure "MariaDB server" "command -v mariadbd && command -v mariadb-install-db" mariadb-server \
            "Install MariaDB 10.6+ (Debian: apt-get install mariadb-server); tests start their own throwaway server." || status=1 ;;
        chromium) ensure "Chromium" "test -x /usr/bin/chromium" chromium \
            "Install Debian's chromium (apt-get install chromium): the console's browser tests drive it with Playwright." || status=1 ;;
        s3) ensure "Ceph RGW (the tests' S3 server)" "command -v radosgw && command -v ceph-osd && command -v ceph-mon && command -v monmaptool && command -v uuidgen" \
            "--no-install-recommends ceph-mon ceph-osd radosgw ceph-common uuid-runtime" \
            "Install Debian's Ceph RGW (apt-get install --no-install-recommends ceph-mon ceph-osd radosgw ceph-common uuid-runtime): the tests keep objects in a one-host Ceph cluster on loopback." || status=1 ;;
        *) echo "check_system.sh: unknown requirement '$need'" >&2; status=2 ;;
    esac
done
exit $status
