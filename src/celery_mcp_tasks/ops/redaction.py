"""Task-id redaction: the net under "a task id never appears in a log line", on every handler `ops.logs` styles.

The id is a bearer capability, so a false positive (a long mixed-case token redacted) is cheap and a miss is not.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

REDACTED = "<redacted>"
KEY_SHOWN = 8  # hex digits of a row key a log line or a span may show: enough to follow one task, useless to open it

# A task id: 32 random bytes in base64url, 43 characters. The last one carries 4 bits and 2
# zero bits, so it is one of 16, and never `-` or `_`; the first may be either. Mixed case
# rules out a long snake_case name: a random id always has both (the chance of no upper or
# no lower case letter among 43 is ~1e-9); a row key (64 hex) or a Celery id (a UUID) never.
# `-` and `_` are id characters and common separators (`mcp-<id>`, `key_<id>`, `<id>-1`), so
# an id is any such 43-character window that touches no letter or digit on either side (on
# the left, unless it begins with `-`/`_` itself): every window is tried, overlapping ones
# included, so a window that is not an id never hides one that is.
_CANDIDATE = re.compile(r"(?:(?<![A-Za-z0-9])|(?=[-_]))(?=([A-Za-z0-9_-]{42}[AEIMQUYcgkosw048])(?![A-Za-z0-9]))")
_RUN = re.compile(r"(?<![A-Za-z0-9_-])[A-Za-z0-9_-]{43,}")
"""A run of id characters long enough to hold one: only these are searched (a third of the cost)."""
_ID_LENGTH = 43


def redact(text: str) -> str:
    """`text` with every token shaped like a task id replaced by `<redacted>` (overlapping ones as one)."""
    if len(text) < _ID_LENGTH:
        return text
    spans: list[list[int]] = []
    for run in _RUN.finditer(text):
        for match in _CANDIDATE.finditer(text, run.start(), run.end()):
            if match.group(1) in (match.group(1).lower(), match.group(1).upper()):  # not mixed case: not an id
                continue
            start = match.start()
            if spans and start < spans[-1][1]:
                spans[-1][1] = start + _ID_LENGTH
            else:
                spans.append([start, start + _ID_LENGTH])
    for start, end in reversed(spans):  # from the end: the earlier spans' offsets stay true
        text = text[:start] + REDACTED + text[end:]
    return text


def _redact_arguments(record: logging.LogRecord) -> bool:
    """Redact the record's string arguments, keeping its template (a formatter that reads `args`, as uvicorn's
    access line and Celery's trace lines do, still works); False when that alone does not clean the message."""
    args = record.args
    redacted: tuple[Any, ...] | Mapping[str, Any]
    if isinstance(args, tuple):
        redacted = tuple(redact(arg) if isinstance(arg, str) else arg for arg in args)
    elif isinstance(args, Mapping):
        redacted = {name: redact(arg) if isinstance(arg, str) else arg for name, arg in args.items()}
    else:
        return False
    try:
        message = str(record.msg) % redacted if redacted else str(record.msg)
    except Exception:  # noqa: BLE001 - arguments that do not fit the template: the whole message is redacted
        return False
    if redact(message) != message:
        return False
    record.args = redacted
    return True


def record_message(record: logging.LogRecord) -> str:
    """The record's message; with arguments that do not fit its template, a line that says so."""
    try:
        return record.getMessage()
    except Exception:  # noqa: BLE001 - bad args: say so in the line, not with a traceback on stderr
        return f"{record.msg} (unformattable arguments)"


class RedactTaskIds(logging.Filter):
    """A handler's filter: the message and exception text lose anything shaped like a task id.

    The record is rewritten only when something was redacted (the common case costs one regex scan): its
    string arguments first, else its whole message (the template kept for `JsonFormatter`'s event names).
    """

    _exceptions = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record_message(record)
        cleaned = redact(message)
        if cleaned != message and not _redact_arguments(record):
            record.__dict__.setdefault("_mcp_template", record.msg)
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._exceptions.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True
