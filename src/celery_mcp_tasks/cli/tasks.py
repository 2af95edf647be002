"""`celery-mcp-tasks tasks ls|show|cancel|resend|delete [--url URL]`: the console's JSON API from a terminal.

Rows are named by their row key (sha256 of the task id) or a prefix of 8+ of its digits that only one row's key
starts with, or by the task id itself (a user's ticket quotes it): hashed here, it never leaves this process; the
operator token is MCP_TASKS_CONSOLE_TOKEN (sent as a bearer token, never printed).
"""

from __future__ import annotations

import argparse
import getpass
import http.client
import json
import os
import re
import shlex
import shutil
import sys
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from typing import Any

from celery_mcp_tasks.cli.shared import printable
from celery_mcp_tasks.model import OWNER_CLAIMS, owner_namespace, owner_within, task_key
from celery_mcp_tasks.store.rows import owner_tag

_TASK_ID = re.compile(r"[A-Za-z0-9_-]{43}")  # `new_task_id` and `derived_task_id`
_DASHED = re.compile(r"-[A-Za-z0-9_-]{19,}")  # a task id, or most of one, that begins with `-`: never an option
_KEY_OR_PREFIX = re.compile(r"[0-9a-fA-F]{8,64}")  # the console takes 8 or more digits

TOKEN_SETTING = "MCP_TASKS_CONSOLE_TOKEN"
URL_SETTING = "MCP_TASKS_CONSOLE_URL"
DEFAULT_URL = "http://127.0.0.1:9102"  # where `celery-mcp-tasks console` listens unless told otherwise
TIMEOUT_S = 30.0


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def add_parser(sub: Any) -> None:
    tasks = sub.add_parser(
        "tasks",
        help="list, show, cancel, re-send or delete tasks through the console's API (MCP_TASKS_CONSOLE_TOKEN)",
        description=(
            f"The console's JSON API from a terminal, with the operator token from {TOKEN_SETTING}. Cancel, "
            "resend and delete act at once (no confirmation). Exit status: 0 done; 1 the console refused "
            "(no such task, it changed meanwhile, the action does not apply, its store is unavailable); 2 "
            "nothing was asked (no token, a bad flag or filter, no console at the address, a refused token)."
        ),
    )
    commands = tasks.add_subparsers(dest="tasks_command", required=True, help="what to do")

    def common(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--url",
            default=os.environ.get(URL_SETTING) or DEFAULT_URL,
            help=f"the console's root (default: ${URL_SETTING}, else {DEFAULT_URL}, where `console` listens by default)",
        )
        parser.add_argument("--json", dest="json_output", action="store_true", help="print the API's JSON")
        parser.add_argument("--operator", default=None, help="your name in the audit log (default: your login)")

    ls = commands.add_parser("ls", help="list tasks, newest first (the console's filters)")
    common(ls)
    ls.add_argument("--status", help="comma-separated: working, input_required, completed, failed, cancelled")
    ls.add_argument("--tool", help="the tool's name")
    ls.add_argument("--owner", help="anonymous, a namespace (sub:<issuer>) or an owner tag")
    ls.add_argument(
        "--subject",
        help="with --owner NAMESPACE: one owner in it, by its subject (or client id); hashed here, never sent",
    )
    ls.add_argument("--min-age", help="older than (90, 15m, 2h, 7d)")
    ls.add_argument("--max-age", help="younger than (90, 15m, 2h, 7d)")
    ls.add_argument("-q", "--text", help="text in the status message")
    ls.add_argument("--sort", help="-created (default), created, -updated, updated")
    ls.add_argument("--limit", help="rows per page (default 50, at most 500)")
    ls.add_argument("--cursor", help="the next page (printed after a full page)")
    ls.add_argument("--wide", action="store_true", help="full row keys")
    for name, text in [
        ("show", "a task's details"),
        ("cancel", "cancel an active task"),
        ("resend", "send a lost job again"),
        ("delete", "delete a finished task"),
    ]:
        command = commands.add_parser(name, help=text)
        common(command)
        command.add_argument(
            "key",
            metavar="KEY",
            help="the row key, a unique prefix of it (the ROW column of `ls`), or the task's id (hashed here)",
        )
        if name == "cancel":
            command.add_argument("--terminate", action="store_true", help="also stop the running job (if allowed)")


def _request(args: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    token = os.environ.get(TOKEN_SETTING, "").strip()
    if not token:
        raise ApiError(0, f"{TOKEN_SETTING} is not set: the console's API needs the operator token")
    url = args.url.rstrip("/") + path
    if not url.startswith(("http://", "https://")):
        raise ApiError(0, f"--url must be an http:// or https:// URL, got {args.url!r}")
    data = None if body is None else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    operator = args.operator or _login()
    if operator:
        if not operator.isascii() or not operator.isprintable():
            raise ApiError(0, f"--operator: an HTTP header carries printable ASCII only, got {operator!r}")
        headers["X-Console-Operator"] = operator
    if data is not None:
        headers["Content-Type"] = "application/json"
    try:
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            answer = response.read()
    except urllib.error.HTTPError as exc:
        try:
            error = json.loads(exc.read()).get("error", {})
            message = str(error.get("message") or exc.reason)
            if error.get("field"):
                message = f"{error['field']}: {message}"
        except (ValueError, AttributeError):  # not the console's JSON
            if exc.code >= 500:  # a console (or a proxy in front of it) that failed: not "no console there"
                raise ApiError(exc.code, f"the server at {args.url} failed ({exc.reason}): its log says why") from None
            raise ApiError(0, f"no console at {args.url}: HTTP {exc.code} {exc.reason} ({_WHERE})") from None
        raise ApiError(exc.code, message) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        reason = getattr(reason, "strerror", None) or reason  # "Connection refused", not "[Errno 111] ..."
        raise ApiError(0, f"cannot reach the console at {args.url}: {reason} ({_WHERE})") from None
    except (ValueError, http.client.HTTPException) as exc:  # a malformed address ("host:abc", "[::1")
        raise ApiError(0, f"--url is not a usable address ({type(exc).__name__}: {exc})") from None
    try:
        return json.loads(answer or b"null")
    except ValueError:  # a page, not JSON: a sign-in page in front of it, or another server
        raise ApiError(0, f"no console's answer at {args.url}: not JSON ({_WHERE})") from None


_WHERE = f"give its address with --url or {URL_SETTING}, or start one: celery-mcp-tasks console APP"


def _login() -> str | None:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no login name (a container): the API says "api"
        return None


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


_KEYED = ("show", "cancel", "resend", "delete")  # the commands whose one positional is KEY


def id_as_key(argv: list[str]) -> list[str]:
    """`argv` with a task id that begins with `-` (one in 64 of them: base64url) moved after `--`, so argparse
    takes it for KEY, not for an unknown option ("the following arguments are required: KEY"). So is a
    mistyped one (20 characters or more; no option is that long): `KEY` refuses it without repeating it, where
    argparse's error would have shown it."""
    at = next((n for n, arg in enumerate(argv) if not arg.startswith("-")), len(argv))  # the command's name
    if argv[at : at + 1] != ["tasks"] or at + 1 >= len(argv) or argv[at + 1] not in _KEYED or "--" in argv:
        return argv
    ids = [n for n, arg in enumerate(argv) if n > at + 1 and _DASHED.fullmatch(arg)]
    if len(ids) != 1:
        return argv
    return [*argv[: ids[0]], *argv[ids[0] + 1 :], "--", argv[ids[0]]]


def _row_key(given: str) -> str:
    """The row key to ask the console for: a task id (43 base64url characters, not all of them hex digits) is
    hashed as the store hashes it; a key or a prefix of one goes as given; anything else is refused here, so
    nothing that might be an id mistyped reaches the console (its URLs, its logs)."""
    given = given.strip()
    if _KEY_OR_PREFIX.fullmatch(given):
        return given
    if _TASK_ID.fullmatch(given):
        return task_key(given)
    raise ApiError(0, "KEY is neither a row key (8 to 64 hex digits of it) nor a task id (43 characters)")


def _owner_label(namespace: str | None, subject: str) -> str:
    """The console's label for one owner (`<namespace> <tag>`): its tag is the hash of the whole owner string,
    computed here, so the subject reaches neither the console's URLs nor its logs."""
    if namespace is None or not namespace.strip().startswith(OWNER_CLAIMS):
        raise ApiError(0, "--subject needs --owner NAMESPACE (sub:<issuer> or client_id:<issuer>) beside it")
    if not subject:
        raise ApiError(0, "--subject is empty")
    namespace = namespace.strip()  # an issuer as its provider writes it may hold a space: spelled, it holds none
    owner = owner_within(namespace, subject)
    return f"{owner_namespace(owner)} {owner_tag(owner)}"


def _progress(row: dict[str, Any]) -> str:
    if row.get("percent") is not None:
        return f"{row['percent']:.0f}%"
    if row.get("progress") is not None:
        return f"{row['progress']:g}"
    return ""


def _table(rows: list[dict[str, Any]], wide: bool, columns: int | None = None) -> str:
    """The rows as a table; on a terminal `columns` wide, each message cut to what the other columns leave (at
    least 12 characters), so a row stays one line where it can."""
    header = ["ROW", "STATUS", "TOOL", "OWNER", "CREATED (UTC)", "PROGRESS", "MESSAGE"]
    lines = [header]
    for row in rows:
        cells = [
            row["key"] if wide else row["row"],
            row["status"],
            row["tool"],
            row["owner"],
            _when(row["created_at"]),
            _progress(row),
            (row.get("status_message") or "")[:60],
        ]
        lines.append([printable(cell) for cell in cells])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    room = None if columns is None else max(columns - sum(widths) - 2 * len(widths), 12)

    def message(text: str) -> str:
        return text if room is None or len(text) <= room else text[: room - 1] + "…"

    return "\n".join(
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line[:-1])) + "  " + message(line[-1])
        for line in lines
    )


def _show(detail: dict[str, Any]) -> str:
    fields = [
        ("row key", detail["key"]),
        ("status", detail["status"]),
        ("message", detail.get("status_message") or ""),
        ("tool", detail["tool"]),
        ("owner", detail["owner"]),
        ("progress", _progress(detail) or "-"),
        ("created", _when(detail["created_at"])),
        ("updated", _when(detail["updated_at"])),
        ("expires", _when(detail.get("expires_at"))),
        ("heartbeat", _when(detail.get("heartbeat_at"))),
        ("sends", f"{detail['dispatches']} (re-sent {detail['resends']}, attempt {detail['attempt'] + 1})"),
        ("celery id", detail.get("celery_message_id") or "-"),
        ("queue", detail.get("queue") or "-"),
        ("trace id", detail.get("trace_id") or "-"),
    ]
    if error := detail.get("error"):  # its code as the task page shows it
        code = error.get("code")
        fields.append(("error", error["message"] if code is None else f"{code} {error['message']}"))
    for question in detail.get("questions", []):
        text = f" ({question['message']})" if question.get("message") else ""
        fields.append((f"input {question['key']}", question["state"] + text))
    return "\n".join(f"{name:<12} {printable(value)}" for name, value in fields)


def run(args: argparse.Namespace) -> int:
    command = args.tasks_command
    try:
        if command == "ls":
            if args.subject is not None:
                args.owner = _owner_label(args.owner, args.subject)
            filters = ("status", "tool", "owner", "min_age", "max_age", "text", "sort", "limit", "cursor")
            query = {("q" if name == "text" else name): getattr(args, name) for name in filters if getattr(args, name)}
            page = _request(args, "GET", "/api/tasks?" + urllib.parse.urlencode(query))
            if args.json_output:
                print(json.dumps(page, indent=2))
            else:
                columns = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
                print(_table(page["rows"], args.wide, columns))
                if page.get("next_cursor"):  # the same filters and sort with it, or the next page is another list's
                    again = [
                        f"--{name.replace('_', '-')}={getattr(args, name)}"
                        for name in filters[:-1]
                        if getattr(args, name)
                    ]
                    more = shlex.join(["celery-mcp-tasks", "tasks", "ls", *again, f"--cursor={page['next_cursor']}"])
                    print(f"more: {more}", file=sys.stderr)
            return 0
        key = urllib.parse.quote(_row_key(args.key), safe="")
        if command == "show":
            detail = _request(args, "GET", f"/api/tasks/{key}")
            print(json.dumps(detail, indent=2) if args.json_output else _show(detail))
            return 0
        body = {"terminate": True} if command == "cancel" and args.terminate else {}
        result = _request(args, "POST", f"/api/tasks/{key}/{command}", body)
        print(
            json.dumps(result, indent=2)
            if args.json_output
            else printable(f"{result['key'][:12]}: {result['message']}")
        )
        return 0
    except ApiError as exc:
        prefix = f"celery-mcp-tasks tasks {command}"
        print(f"{prefix}: {exc} (HTTP {exc.status})" if exc.status else f"{prefix}: {exc}", file=sys.stderr)
        return 2 if exc.status in (0, 400, 401, 403) else 1
