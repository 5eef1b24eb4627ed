"""The peers Queen is measured against: install script, the Go etcd loader and its Python driver."""
