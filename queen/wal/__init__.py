"""The durable log: frames in segment files, snapshots, recovery, and the group-commit writer."""
