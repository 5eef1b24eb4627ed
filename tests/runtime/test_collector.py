"""queen serve settles the cyclic collector once its modules are imported (queen/runtime/server.py)."""

import gc

from queen.runtime.server import GC_YOUNG_THRESHOLD, settle_collector


def test_settle_collector_freezes_what_is_imported_and_raises_the_young_threshold():
    saved = gc.get_threshold()
    try:
        settle_collector()
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, *saved[1:])
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*saved)
