"""The queues of one shard, as a package (one idea a module):

  model.py          the classes: queues, partitions, per-group state, leases, groups, parked pops
  packed.py         the packed layouts of a retained message and a producer id (on-disk format)
  table.py          QueueTable: every transition, the live decisions that make them, and replay
  delivery.py       what a pop takes and the pops parked until something comes (a QueueTable mixin)
  parking.py        who is parked, until when, and when a delayed head wakes them
  producer_ids.py   producer ids that make a retried push a duplicate, and their forgetting
  views.py          the admin reads, as functions that change nothing
  snapshot.py       the copy a snapshot takes, and its records

Pure like the rest of queen/core: no clock reads, no I/O, no awaits.
"""

from queen.core.queues.model import Growth, Shared
from queen.core.queues.snapshot import snapshot_copy, snapshot_records
from queen.core.queues.table import QueueTable

__all__ = ["Growth", "QueueTable", "Shared", "snapshot_copy", "snapshot_records"]
