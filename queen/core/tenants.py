"""Tenants as part of stored names: the one place that knows how.

A tenant's KV namespaces (its lock rows' namespace, `queen-locks`, among them) and queues are
stored under `<tenant>\\x1f<name>`; everything else a tenant names (keys, partitions, groups,
timer keys) lives inside one of those, so it is the tenant's too. The separator is a control
character, which no name may hold (queen/core/names.py), so no name of one tenant can spell a name
of another. The default tenant's names carry no prefix: data written before tenants existed is the
default tenant's, unchanged. Isolation is thus in the log itself, not a filter on answers, and
recovery, snapshots and replication keep it without knowing tenants exist.

Answers show a name as its tenant wrote it (`shown`); listings of the default tenant skip names
that belong to others (`is_own`).
"""

from __future__ import annotations

import re

SEPARATOR = "\x1f"
DEFAULT = "default"
EVERY = "*"  # a token's tenant that is no tenant: the server's operators (the default tenant's names)
# Each tenant's own reserved KV namespace for what the server keeps about it (its pauses): readable
# by the tenant, written only by the server, not counted against its quotas.
SETTINGS_NS = "queen-tenant"
NAME_BYTES_MAX = 32
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")


def prefix_of(tenant: str) -> str:
    """What the tenant's stored names start with: nothing for the default tenant."""
    return "" if tenant in (DEFAULT, EVERY) else tenant + SEPARATOR


def shown(stored: str) -> str:
    """A stored name as its tenant wrote it."""
    at = stored.find(SEPARATOR)
    return stored if at < 0 else stored[at + 1:]


def tenant_of(stored: str) -> str:
    at = stored.find(SEPARATOR)
    return DEFAULT if at < 0 else stored[:at]


def is_own(stored: str, prefix: str) -> bool:
    """Whether a stored name is the tenant's of that prefix (for the default tenant: has none)."""
    return stored.startswith(prefix) if prefix else SEPARATOR not in stored


def name_problem(tenant: str) -> str | None:
    """Why a tenant name cannot be one, or None: lower-case letters, digits, '-' and '_', starting
    with a letter or digit, at most NAME_BYTES_MAX bytes; `*` for the server's operators."""
    if tenant == EVERY:
        return None
    if not isinstance(tenant, str) or not _NAME.fullmatch(tenant) or len(tenant) > NAME_BYTES_MAX:
        return (f"tenant {tenant!r} must be lower-case letters, digits, '-' and '_' (starting with a letter or "
                f"digit, at most {NAME_BYTES_MAX} bytes), or '*'")
    return None


class Usage:
    """What one tenant holds, kept exact as rows, messages and timers come and go (and as they are
    replayed), for its quotas: KV keys (lock permits among them), messages retained (DLQ entries
    too), pending timers, and bytes: keys and values of its KV rows as JSON, payloads of its
    messages and timers."""

    __slots__ = ("keys", "bytes", "messages", "timers")

    def __init__(self):
        self.keys = 0
        self.bytes = 0
        self.messages = 0
        self.timers = 0

    def wire(self) -> dict:
        return {"keys": self.keys, "bytes": self.bytes, "messages": self.messages, "timers": self.timers}


class UsageBook:
    """Every named tenant's Usage, shared by all shards (they run on one thread). The default
    tenant's names carry no prefix and are not counted: it has no quotas, and its writes pay
    nothing for them."""

    __slots__ = ("of_tenant",)

    def __init__(self):
        self.of_tenant: dict[str, Usage] = {}

    def for_name(self, stored: str) -> Usage | None:
        """The Usage that a stored name's holdings count against; None for the default tenant's."""
        at = stored.find(SEPARATOR)
        if at < 0:
            return None
        tenant = stored[:at]
        if stored.endswith(SETTINGS_NS) and len(stored) == at + 1 + len(SETTINGS_NS):
            return None
        usage = self.of_tenant.get(tenant)
        if usage is None:
            usage = self.of_tenant[tenant] = Usage()
        return usage
