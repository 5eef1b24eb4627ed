"""Adapters around the pure core: shard actors, the router, the ticker and the server's wiring."""
