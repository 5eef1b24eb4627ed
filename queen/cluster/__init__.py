"""High availability: a cluster of Queen nodes, one leader shipping its log to followers."""
