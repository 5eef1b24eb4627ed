"""The pure core: state machines with no trio, no os, no clock reads, no sockets, no logging.

Every call takes `now_ms`; everything here is deterministic and tested in microseconds.
"""
