"""High availability: nodes of one cluster, a leader chosen through etcd, its log shipped to followers."""
