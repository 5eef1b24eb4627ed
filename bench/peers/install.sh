#!/usr/bin/env bash
# Install the peers `python -m bench` compares Queen with, from Debian's packages only (no other
# registry or download is reachable on these machines, and none is needed):
#   redis-server            Redis 7, run by the bench on 127.0.0.1 with a temp dir
#   etcd-server             etcd 3.4, single node, data dir on the same disk as Queen's
#   golang-go               Go toolchain, to build the etcd loader in bench/peers/etcdload
#   golang-etcd-server-dev  etcd's Go client library (clientv3) as source under /usr/share/gocode,
#                           so the loader builds offline with GO111MODULE=off
# Then it builds the loader (bench/peers/etcdload/etcdload). Both packaged servers are stopped and
# disabled where the package started them: the bench starts its own, on free ports, by pid.
# Run as root. Idempotent.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export DEBIAN_FRONTEND=noninteractive
if ! command -v redis-server >/dev/null || ! command -v etcd >/dev/null || ! command -v go >/dev/null \
   || [ ! -d /usr/share/gocode/src/go.etcd.io/etcd/clientv3 ]; then
    apt-get update -q
    apt-get install -y -q --no-install-recommends redis-server etcd-server golang-go golang-etcd-server-dev
fi
# The packages may start system services (on the default ports); the bench never uses them.
if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
    systemctl disable --now redis-server etcd >/dev/null 2>&1 || true
elif command -v service >/dev/null; then
    service redis-server stop >/dev/null 2>&1 || true
    service etcd stop >/dev/null 2>&1 || true
fi
"$here/build_etcdload.sh"
