#!/usr/bin/env bash
# Build the Go loader offline against Debian's packaged Go sources: GO111MODULE=off resolves
# imports from GOPATH, and /usr/share/gocode is where golang-etcd-server-dev (clientv3) and the
# pgx, nats.go and redigo packages put them (no module proxy is reachable on these machines, and
# none is needed).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/peerload"
export GO111MODULE=off GOPATH=/usr/share/gocode GOFLAGS= GOCACHE="${GOCACHE:-$here/peerload/.gocache}"
go build -o peerload .
echo "built $here/peerload/peerload"
