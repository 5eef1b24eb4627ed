"""Who is calling: tokens, roles and tenants.

The auth file (`queen serve --auth-file FILE`, read at start and on SIGHUP) is JSON:

    {"tokens": [{"name": "billing-worker", "id": "k2v5...", "role": "writer", "tenant": "billing",
                 "salt": "<hex>", "hash": "<hex>", "createdAt": "2026-12-01T10:00:00Z"}],
     "tenants": {"billing": {"keysMax": 100000, "writesPerSecond": 500, ...}}}

`queen auth add|list|remove` edit it; a secret is printed once by `add` and stored only as a keyed
hash (BLAKE2b keyed with the token's own random salt). A secret is `queen_<id>_<43 random
characters>`: 256 random bits, which no one can guess, so one fast keyed hash per request is as
safe as a slow one and costs a microsecond. The id picks the token; the hash is compared in
constant time, and an unknown id is hashed and compared too, so both take as long.

Roles: a reader reads, a writer reads and writes, an admin also deletes, purges and pauses in its
tenant; an admin of tenant `*` is the server's operator (every tenant's metrics, pauses, the
default tenant's names, and any one tenant's data read with `?tenant=NAME`). Without an auth file
every caller is that operator, as before tokens existed.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from hashlib import blake2b

from queen.core import tenants
from queen.errors import QueenError

ROLES = ("reader", "writer", "admin")
# What a call needs, in order: each role has every level up to its own.
READ, WRITE, ADMIN, SERVER = 1, 2, 3, 4
LEVEL_NAMES = {READ: "read", WRITE: "write", ADMIN: "admin", SERVER: "operator (an admin of tenant *)"}
_ROLE_LEVEL = {"reader": READ, "writer": WRITE, "admin": ADMIN}
SECRET_PREFIX = "queen_"
_ID_LENGTH = 12
_ID_ALPHABET = "abcdefghijklmnopqrstuvwxyz234567"
REALM = b'Bearer realm="queen"'


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller of a request: its token's name, role and tenant, and the tenant's name prefix."""

    name: str
    role: str
    tenant: str
    prefix: str
    level: int
    read_as: bool = False  # the operator reading as `tenant` (reading_as): its token's tenant is `*`

    @classmethod
    def of(cls, name: str, role: str, tenant: str) -> Principal:
        level = _ROLE_LEVEL[role]
        if role == "admin" and tenant == tenants.EVERY:
            level = SERVER
        return cls(name, role, tenant, tenants.prefix_of(tenant), level)

    @property
    def operator(self) -> bool:
        """The server's operator: sees every tenant."""
        return self.level >= SERVER

    def reading_as(self, tenant: str) -> Principal:
        """The operator reading one tenant's data (a read's `tenant` query parameter): that tenant's
        names, and read rights only, so nothing it calls can write there."""
        assert self.operator, "only the operator reads as another tenant"
        return Principal(self.name, self.role, tenant, tenants.prefix_of(tenant), READ, True)


# Every caller when the server runs without an auth file (loopback, or --insecure).
OPEN = Principal.of("-", "admin", tenants.EVERY)
_NOBODY = (bytes(16), bytes(32), None)  # what an unknown id is checked against: it never matches


class Unauthenticated(QueenError):
    """401: no token, or one that is not valid. Says nothing about which tokens exist."""

    http_status = 401

    def __init__(self, message: str, error: str | None = None):
        super().__init__("unauthenticated", message)
        challenge = REALM if error is None else REALM + b', error="' + error.encode() + b'"'
        self.headers = [(b"www-authenticate", challenge)]


class Forbidden(QueenError):
    """403: a valid token whose role may not make this call."""

    http_status = 403

    def __init__(self, principal: Principal, level: int):
        article = "an" if principal.role[0] in "aeiou" else "a"
        super().__init__("forbidden", f"{article} {principal.role} token may not do this; it needs "
                                      f"{LEVEL_NAMES[level]} rights")
        self.headers = [(b"www-authenticate", REALM + b', error="insufficient_scope"')]


@dataclass(frozen=True, slots=True)
class Token:
    name: str
    id: str
    role: str
    tenant: str
    salt: str
    hash: str
    created_at: str

    def wire(self) -> dict:
        return {"name": self.name, "id": self.id, "role": self.role, "tenant": self.tenant, "salt": self.salt,
                "hash": self.hash, "createdAt": self.created_at}


class AuthFileError(Exception):
    """The auth file cannot be used; the message says which file and why."""


class AuthFile:
    """The auth file's contents: tokens and per-tenant settings."""

    def __init__(self, path: str, tokens: list[Token], tenant_settings: dict[str, dict]):
        self.path = path
        self.tokens = tokens
        self.tenant_settings = tenant_settings

    @classmethod
    def load(cls, path: str, missing_ok: bool = False) -> AuthFile:
        try:
            with open(path, encoding="utf-8") as f:
                document = json.load(f)
        except FileNotFoundError:
            if missing_ok:
                return cls(path, [], {})
            raise AuthFileError(f"auth file {path}: not found") from None
        except (OSError, ValueError) as error:
            raise AuthFileError(f"auth file {path}: {error}") from None
        if type(document) is not dict or not set(document) <= {"tokens", "tenants"}:
            raise AuthFileError(f'auth file {path}: must be an object with "tokens" and "tenants"')
        tokens = []
        seen_ids, seen_names = set(), set()
        for n, raw in enumerate(document.get("tokens", [])):
            where = f"auth file {path}: token {n}"
            if type(raw) is not dict:
                raise AuthFileError(f"{where}: must be an object")
            try:
                token = Token(raw["name"], raw["id"], raw["role"], raw["tenant"], raw["salt"], raw["hash"],
                              raw.get("createdAt", ""))
            except KeyError as missing:
                raise AuthFileError(f"{where}: {missing} is missing") from None
            if token.role not in ROLES:
                raise AuthFileError(f"{where}: role {token.role!r} is not one of {', '.join(ROLES)}")
            problem = tenants.name_problem(token.tenant)
            if problem:
                raise AuthFileError(f"{where}: {problem}")
            if not _is_hex(token.hash, 64) or not _is_hex(token.salt, 32):
                raise AuthFileError(f"{where}: hash must be 64 and salt 32 lower-case hex digits")
            if token.id in seen_ids or token.name in seen_names:
                raise AuthFileError(f"{where}: the name {token.name!r} or id {token.id!r} is used twice")
            seen_ids.add(token.id)
            seen_names.add(token.name)
            tokens.append(token)
        settings = document.get("tenants", {})
        if type(settings) is not dict:
            raise AuthFileError(f'auth file {path}: "tenants" must be an object')
        for tenant, values in settings.items():
            problem = tenants.name_problem(tenant)
            if problem or tenant == tenants.EVERY:
                raise AuthFileError(f"auth file {path}: {problem or 'tenant * has no settings'}")
            if type(values) is not dict:
                raise AuthFileError(f"auth file {path}: the settings of tenant {tenant!r} must be an object")
            problem = settings_problem(tenant, values)
            if problem:
                raise AuthFileError(f"auth file {path}: {problem}")
        return cls(path, tokens, settings)

    def save(self) -> None:
        """Write the file whole and atomically (a reader never sees half of it), mode 0600."""
        document = {"tokens": [token.wire() for token in self.tokens], "tenants": self.tenant_settings}
        directory = os.path.dirname(os.path.abspath(self.path))
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            fd, temporary = tempfile.mkstemp(prefix=".auth-", dir=directory)
        except OSError as error:
            raise AuthFileError(f"auth file {self.path}: cannot write it: {error.strerror or error}") from None
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(document, f, indent=2)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.chmod(temporary, 0o600)
            os.replace(temporary, self.path)
        except BaseException:
            os.unlink(temporary)
            raise

    def add(self, name: str, role: str, tenant: str) -> str:
        """A new token; its secret, which is not kept."""
        if role not in ROLES:
            raise AuthFileError(f"role {role!r} is not one of {', '.join(ROLES)}")
        problem = tenants.name_problem(tenant)
        if problem:
            raise AuthFileError(problem)
        if not name or len(name) > 64 or not name.isprintable() or any(c.isspace() for c in name):
            raise AuthFileError(f"token name {name!r} must be 1 to 64 printable characters without spaces")
        if any(token.name == name for token in self.tokens):
            raise AuthFileError(f"a token named {name!r} exists; remove it first")
        token_id = "".join(secrets.choice(_ID_ALPHABET) for _ in range(_ID_LENGTH))
        secret = f"{SECRET_PREFIX}{token_id}_{secrets.token_urlsafe(32)}"
        created_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        salt = secrets.token_hex(16)
        self.tokens.append(Token(name, token_id, role, tenant, salt, _digest(secret.encode(), salt), created_at))
        return secret

    def remove(self, name: str) -> bool:
        kept = [token for token in self.tokens if token.name != name]
        removed = len(kept) != len(self.tokens)
        self.tokens = kept
        return removed


def _digest(secret: bytes, salt: str) -> str:
    return blake2b(secret, key=bytes.fromhex(salt), digest_size=32).hexdigest()


def _is_hex(text, length: int) -> bool:
    return isinstance(text, str) and len(text) == length and all(c in "0123456789abcdef" for c in text)


# A tenant's settings in the auth file: name -> what it limits. Quotas are checked when a call
# arrives against what the tenant holds then; rates are token buckets holding a tenth of a
# second's worth.
SETTINGS = {
    "keysMax": "KV keys held, lock permits included",
    "bytesMax": "bytes held: KV keys and values (as JSON), message and timer payloads",
    "messagesMax": "messages retained in its queues (DLQ entries included)",
    "timersMax": "pending timers",
    "writesPerSecond": "calls that write, per second",
    "operationsPerSecond": "operations in calls that write, per second",
}
QUOTAS = ("keysMax", "bytesMax", "messagesMax", "timersMax")


def settings_problem(tenant: str, values: dict) -> str | None:
    """Why one tenant's settings cannot be used, or None."""
    for name, value in values.items():
        if name not in SETTINGS:
            return f"tenant {tenant!r}: unknown setting {name!r}; the settings are {', '.join(SETTINGS)}"
        if type(value) is not int or not 1 <= value <= 1 << 62:
            return f"tenant {tenant!r}: {name} must be a whole number from 1"
        if name in QUOTAS and tenant == tenants.DEFAULT:
            return (f"tenant {tenant!r}: the default tenant (the names written without a tenant) has no quotas; "
                    "give it rates only")
    return None


class Authenticator:
    """Requests' Authorization headers to principals, from the auth file in force (None: open)."""

    def __init__(self, auth_file: AuthFile | None):
        self.auth_file = auth_file
        tokens = [] if auth_file is None else auth_file.tokens
        # id -> (token, its principal), built once: a request costs one keyed hash and a compare.
        self._by_id = {token.id: (bytes.fromhex(token.salt), bytes.fromhex(token.hash),
                                  Principal.of(token.name, token.role, token.tenant)) for token in tokens}

    @property
    def open(self) -> bool:
        return self.auth_file is None

    def principal(self, authorization: bytes) -> Principal:
        if self.auth_file is None:
            return OPEN
        if not authorization:
            raise Unauthenticated("this server needs a token: send Authorization: Bearer <token>")
        scheme, _, secret = authorization.partition(b" ")
        if scheme.lower() != b"bearer" or not secret:
            raise Unauthenticated("send the token as Authorization: Bearer <token>", "invalid_request")
        secret = secret.strip()
        found = None
        if secret.startswith(b"queen_") and len(secret) > len(SECRET_PREFIX) + _ID_LENGTH:
            found = self._by_id.get(secret[len(SECRET_PREFIX):len(SECRET_PREFIX) + _ID_LENGTH].decode("latin-1"))
        # Hashed and compared either way, so an unknown id takes as long as a wrong secret.
        salt, expected, principal = found if found is not None else _NOBODY
        if not hmac.compare_digest(blake2b(secret, key=salt, digest_size=32).digest(), expected) or found is None:
            raise Unauthenticated("the token is not valid", "invalid_token")
        return principal


def require(principal: Principal, level: int) -> None:
    if principal.level < level:
        raise Forbidden(principal, level)
