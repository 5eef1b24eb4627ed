#!/usr/bin/env bash
# Build the etcd loader offline against Debian's packaged Go sources: GO111MODULE=off resolves
# imports from GOPATH, and /usr/share/gocode is where golang-etcd-server-dev and its dependencies
# put them (no module proxy is reachable on these machines, and none is needed).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/etcdload"
export GO111MODULE=off GOPATH=/usr/share/gocode GOFLAGS= GOCACHE="${GOCACHE:-$here/etcdload/.gocache}"
go build -o etcdload main.go
echo "built $here/etcdload/etcdload"
