#!/usr/bin/env bash
# Install the peers `python -m bench` compares Queen with, from Debian's packages only (no other
# registry or download is reachable on these machines, and none is needed):
#   redis-server                     Redis 7, run by the bench on 127.0.0.1 with a temp dir
#   etcd-server                      etcd 3.4, single node, data dir on the same disk as Queen's
#   postgresql-15                    PostgreSQL 15: the SKIP LOCKED queue table of queue-push / queue-cycle
#   nats-server                      NATS with JetStream (file storage)
#   golang-go                        Go toolchain, to build the loader in bench/peers/peerload
#   golang-etcd-server-dev           etcd's Go client (clientv3) as source under /usr/share/gocode,
#   golang-github-jackc-pgx-v4-dev   PostgreSQL's (pgx),
#   golang-github-nats-io-go-nats-dev  NATS's (nats.go, with JetStream),
#   golang-github-gomodule-redigo-dev  Redis's (redigo, for queue-latency): so the loader builds
#                                    offline with GO111MODULE=off
# Then it builds the loader (bench/peers/peerload/peerload). The packaged servers are stopped and
# disabled where the package started them: the bench starts its own, on free ports, by pid.
# Run as root. Idempotent.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export DEBIAN_FRONTEND=noninteractive
packages=(redis-server etcd-server postgresql-15 nats-server golang-go golang-etcd-server-dev
          golang-github-jackc-pgx-v4-dev golang-github-nats-io-go-nats-dev golang-github-gomodule-redigo-dev)
missing=()
for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
# The packages may start system services (on the default ports); the bench never uses them.
services=(redis-server etcd postgresql nats-server)
if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
    systemctl disable --now "${services[@]}" >/dev/null 2>&1 || true
elif command -v service >/dev/null; then
    for service in "${services[@]}"; do
        service "$service" stop >/dev/null 2>&1 || true
    done
fi
"$here/build_peerload.sh"
