"""The store's payload codec: the one place a task's payloads are measured, sealed and opened.

A payload's size is its compact JSON encoding (`encode`, the engine's serializer) in UTF-8 bytes. With a key ring
(MCP_TASKS_ENCRYPTION_KEYS, opt-in) each payload is sealed with AES-256-GCM as the JSON string
`mcpenc1:<key id>:<nonce + ciphertext, base64url>`, bound to its column and row (a copy elsewhere does not
open). The key id derives from the key, so a read goes straight to the key that wrote it, and a ring that lacks
it says which. New writes use the ring's first key; reads use any.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, Final

from celery_mcp_tasks.model import LONE_SURROGATE

ENCRYPTION_SETTING: Final = "MCP_TASKS_ENCRYPTION_KEYS"
PAYLOADS: Final = ("arguments", "input_requests", "input_responses", "result")
"""The columns that hold what clients and jobs sent: sealed with a ring, measured against the limits."""
SEALED_PREFIX: Final = "mcpenc1:"
"""How a sealed value begins (then its key id and the sealed bytes)."""
_KEY_BYTES = 32
SEALED_HEAD_CHARS: Final = len(SEALED_PREFIX) + 8
"""The characters of a sealed value that say it is sealed and name its key (the key id: base64 of 6 bytes)."""
_NONCE_BYTES = 12


_EMPTY: Final = {type(None): "null", dict: "{}", list: "[]", tuple: "[]"}
"""The encodings of the values most columns hold (no arguments, no answers yet, no result): not worth a dumps."""


def encode(value: Any) -> str:
    """A JSON column's value as the store writes it: its compact JSON encoding (the engine's `json_serializer`).

    A lone surrogate (a client may send `"\\ud800"`, which JSON allows but is no character, and UTF-8 cannot
    hold) is written as U+FFFD, the replacement character, as a UTF-8 decoder reads invalid text: the row, and
    every page, log and client that shows it, holds only text."""
    if not value:
        known = _EMPTY.get(type(value))
        if known is not None:
            return known
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            return LONE_SURROGATE.sub("\ufffd", text)
    return text


def same_json(a: Any, b: Any) -> bool:
    """Equal as the store keeps them: as JSON (a tuple written reads back as a list; key order aside; a lone
    surrogate as U+FFFD)."""
    return _as_kept(a) == _as_kept(b)


def _as_kept(value: Any) -> str:
    return LONE_SURROGATE.sub("\ufffd", json.dumps(value, sort_keys=True, ensure_ascii=False, default=str))


def payload_bytes(value: Any) -> int:
    """The size of `value` as the store keeps it: `encode(value)` in UTF-8 bytes."""
    return len(encode(value).encode())


MAX_NESTING: Final = 100
"""The deepest a payload (arguments, answers, a job's result) may nest objects and arrays. What carries a job is
recursive (the prefork pool pickles its arguments, a read parses the row's JSON): a few hundred nested brackets,
~1 KB, would stop a worker at every redelivery, or leave a row no process can read; and the SDK's client parses
about 190 levels, so a deeper result completes a task no client can read. No tool's input needs a tenth of it."""


_CONTAINERS = (dict, list, tuple)  # what `encode` writes as JSON objects and arrays (another Mapping: a string)


def too_deep(value: Any, limit: int = MAX_NESTING) -> bool:
    """Whether `value` nests objects and arrays more than `limit` levels deep (the value itself is level 1).
    Recursive, at most `limit` calls deep, and it stops at the first path over."""
    if not isinstance(value, _CONTAINERS):
        return False
    if limit < 1:
        return True
    children = value.values() if isinstance(value, dict) else value
    return any(isinstance(child, _CONTAINERS) and too_deep(child, limit - 1) for child in children)


class PayloadTooLarge(ValueError):
    """A payload over its limit. The text names the limit and the setting, never the payload."""

    size: int | None
    setting: str | None

    def __init__(self, what: str, size: int, limit: int, setting: str, option: str) -> None:
        super().__init__(
            f"{what} too large: {size} bytes, over the limit of {limit} bytes ({setting}, or @mcp_task({option}=...))"
        )
        self.what, self.size, self.limit, self.setting = what, size, limit, setting


class PayloadTooDeep(PayloadTooLarge):
    """A payload nested deeper than `MAX_NESTING` levels: too large in depth, whatever its bytes
    (refused wherever `PayloadTooLarge` is). A fixed limit of the runtime, no setting."""

    def __init__(self, what: str) -> None:
        ValueError.__init__(self, f"{what} nested too deeply: more than {MAX_NESTING} levels of objects and arrays")
        self.what, self.size, self.limit, self.setting = what, None, MAX_NESTING, None


class UnreadablePayload(Exception):
    """A sealed payload this process's ring cannot open. The text says why, naming the setting."""


def new_key() -> str:
    """A fresh key for MCP_TASKS_ENCRYPTION_KEYS: 32 random bytes, base64url."""
    return base64.urlsafe_b64encode(os.urandom(_KEY_BYTES)).decode("ascii")


def _key_id(key: bytes) -> str:
    digest = hashlib.sha256(b"celery-mcp-tasks key id\0" + key).digest()
    return base64.urlsafe_b64encode(digest[:6]).decode("ascii")


def _decode_key(text: str) -> bytes | None:
    """A base64 (standard or url-safe, padding optional) 32-byte key, or None."""
    padded = text.strip().replace("-", "+").replace("_", "/")
    padded += "=" * (-len(padded) % 4)
    try:
        raw = binascii.a2b_base64(padded, strict_mode=True)
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == _KEY_BYTES else None


def _aesgcm() -> Any:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        raise ValueError(
            f"{ENCRYPTION_SETTING}: encryption needs the `cryptography` package "
            "(pip install 'celery-mcp-tasks[encryption]')"
        ) from None
    return AESGCM


class KeyRing:
    """AES-256-GCM keys by id: the first seals, every one opens. Thread-safe (the ciphers hold no state)."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise ValueError(f"{ENCRYPTION_SETTING}: a key ring needs at least one key")
        cipher = _aesgcm()
        self._ciphers = {_key_id(key): cipher(key) for key in keys}
        self.primary_id = _key_id(keys[0])
        self._primary = self._ciphers[self.primary_id]

    @classmethod
    def parse(cls, keys: Sequence[str]) -> KeyRing:
        """The ring of `keys` (MCP_TASKS_ENCRYPTION_KEYS, split at commas). ValueError naming the setting."""
        raw: list[bytes] = []
        for position, text in enumerate(keys, start=1):
            key = _decode_key(text)
            if key is None:
                raise ValueError(
                    f"{ENCRYPTION_SETTING}: key {position} of {len(keys)} is not a base64 {_KEY_BYTES}-byte key "
                    "(make one with `celery-mcp-tasks db newkey`)"
                )
            raw.append(key)
        return cls(raw)

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(self._ciphers)

    def seal(self, value: Any, *, row: str, column: str) -> str:
        """`value` sealed with the first key, for `column` of the row keyed `row`."""
        nonce = os.urandom(_NONCE_BYTES)
        plain = encode(value).encode()
        sealed = self._primary.encrypt(nonce, plain, _bound(row, column))
        body = base64.urlsafe_b64encode(nonce + sealed).rstrip(b"=").decode("ascii")
        return f"{SEALED_PREFIX}{self.primary_id}:{body}"

    def open(self, stored: str, *, row: str, column: str) -> Any:
        """The value `seal` sealed. `UnreadablePayload` for a key not in the ring or a payload altered."""
        key_id, _, body = stored.removeprefix(SEALED_PREFIX).partition(":")
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise UnreadablePayload(
                f"the task's {column} column was encrypted with key {key_id}, which is not in {ENCRYPTION_SETTING} "
                "(a retired key?)"
            )
        try:
            blob = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
            plain = cipher.decrypt(blob[:_NONCE_BYTES], blob[_NONCE_BYTES:], _bound(row, column))
        except Exception:  # noqa: BLE001 - InvalidTag, bad base64, short blob: all one answer
            raise UnreadablePayload(
                f"the task's {column} column does not decrypt with key {key_id} of {ENCRYPTION_SETTING} (altered or moved)"
            ) from None
        return json.loads(plain)

    def is_current(self, stored: Any) -> bool:
        """`stored` (a column's value) is sealed with the first key already: nothing to re-encrypt."""
        return stored is None or (isinstance(stored, str) and stored.startswith(f"{SEALED_PREFIX}{self.primary_id}:"))


def _bound(row: str, column: str) -> bytes:
    return f"{column}\0{row}".encode()


def sealed_key_id(stored: Any) -> str | None:
    """The key id of a sealed column value; None for a value in clear."""
    if isinstance(stored, str) and stored.startswith(SEALED_PREFIX):
        return stored.removeprefix(SEALED_PREFIX).partition(":")[0]
    return None


def seal_columns(ring: KeyRing, row: str, values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`values` (column -> value, each name after `prefix`) with every payload sealed; other columns as given."""
    out = dict(values)
    for column in PAYLOADS:
        name = prefix + column
        value = out.get(name)
        if value is not None:
            out[name] = ring.seal(value, row=row, column=column)
    return out


def open_columns(ring: KeyRing | None, row: str, values: dict[str, Any]) -> dict[str, Any]:
    """`values` with every sealed payload opened (in place). Raises `UnreadablePayload`."""
    for column in PAYLOADS:
        stored = values.get(column)
        if isinstance(stored, str) and stored.startswith(SEALED_PREFIX):
            if ring is None:
                raise UnreadablePayload(
                    f"the task's {column} column is encrypted, and {ENCRYPTION_SETTING} is not set in this process"
                )
            values[column] = ring.open(stored, row=row, column=column)
    return values
