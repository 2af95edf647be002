"""Elicitation forms: a `requestedSchema` as fields to ask, and the typed answers read and checked.

fields = parse_form({"type": "object", "properties": {"pages": {"type": "integer", "minimum": 1}}})
fields[0].parse("3")  # 3; "0" raises ValueError("type a number >= 1")
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, Literal
from urllib.parse import urlparse

__all__ = ["FieldKind", "FormField", "Value", "parse_form"]


FieldKind = Literal["string", "integer", "number", "boolean", "choice", "choices"]
Value = str | int | float | bool | list[str]


@dataclass(frozen=True)
class FormField:
    """One property of an elicitation's `requestedSchema`, as the prompt asks it."""

    name: str
    kind: FieldKind
    title: str | None = None
    description: str | None = None
    required: bool = False
    default: Value | None = None
    choices: tuple[tuple[str, str], ...] = ()  # (value, label)
    minimum: float | None = None
    maximum: float | None = None
    min_length: int | None = None
    max_length: int | None = None
    min_items: int | None = None
    max_items: int | None = None
    format: str | None = None

    @property
    def label(self) -> str:
        if self.title and self.title != self.name:
            return f"{self.title} ({self.name})"
        return self.name

    def hint(self) -> str:
        """What may be typed, and what Enter gives."""
        parts: list[str] = []
        if self.kind == "boolean":
            parts.append("Y/n" if self.default is True else "y/N" if self.default is False else "y/n")
        elif self.kind in ("integer", "number"):
            bounds = _bounds(self.minimum, self.maximum)
            parts.append(f"{self.kind}{' ' + bounds if bounds else ''}")
        elif self.kind == "choice":
            parts.append(f"1-{len(self.choices)}")
        elif self.kind == "choices":
            parts.append(f"numbers 1-{len(self.choices)}, comma-separated")
        elif self.format:
            parts.append(self.format)
        text = ", ".join(parts)
        if self.default is not None and self.kind != "boolean":
            shown = self._shown(self.default)
            text = f"{text}, Enter: {shown}" if text else f"Enter: {shown}"
        return text

    def _shown(self, value: Value) -> str:
        labels = dict(self.choices)
        if isinstance(value, list):
            return ", ".join(labels.get(str(item), str(item)) for item in value)
        if isinstance(value, bool):
            return "yes" if value else "no"
        return labels.get(str(value), str(value))

    def parse(self, text: str) -> Value:
        """The typed text as this field's value; `ValueError` with what to type instead."""
        text = text.strip()
        if self.kind == "boolean":
            lowered = text.lower()
            if lowered in ("y", "yes", "true", "1"):
                return True
            if lowered in ("n", "no", "false", "0"):
                return False
            raise ValueError("type y or n")
        if self.kind == "integer":
            try:
                number: int | float = int(text)
            except ValueError:
                raise ValueError("type a whole number") from None
            return self._in_bounds(number)
        if self.kind == "number":
            try:
                number = int(text)
            except ValueError:
                try:
                    number = float(text)
                except ValueError:
                    raise ValueError("type a number") from None
                if not math.isfinite(number):
                    raise ValueError("type a finite number") from None
            return self._in_bounds(number)
        if self.kind == "choice":
            return self._choice(text)
        if self.kind == "choices":
            picked: list[str] = []
            for part in (item for item in text.split(",") if item.strip()):
                value = self._choice(part.strip())
                if value not in picked:
                    picked.append(value)
            if self.min_items is not None and len(picked) < self.min_items:
                raise ValueError(f"pick at least {self.min_items}")
            if self.max_items is not None and len(picked) > self.max_items:
                raise ValueError(f"pick at most {self.max_items}")
            return picked
        if self.min_length is not None and len(text) < self.min_length:
            raise ValueError(f"at least {self.min_length} characters")
        if self.max_length is not None and len(text) > self.max_length:
            raise ValueError(f"at most {self.max_length} characters")
        _check_format(self.format, text)
        return text

    def _in_bounds(self, number: int | float) -> int | float:
        if (self.minimum is not None and number < self.minimum) or (self.maximum is not None and number > self.maximum):
            raise ValueError(f"type a number {_bounds(self.minimum, self.maximum)}")
        return number

    def _choice(self, text: str) -> str:
        if text.isdigit() and 1 <= int(text) <= len(self.choices):
            return self.choices[int(text) - 1][0]
        for value, label in self.choices:
            if text == value or text.lower() == label.lower():
                return value
        raise ValueError(f"type a number from 1 to {len(self.choices)}")


def _bounds(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"{low:g}..{high:g}"
    if low is not None:
        return f">= {low:g}"
    if high is not None:
        return f"<= {high:g}"
    return ""


def _check_format(fmt: str | None, text: str) -> None:
    if fmt == "email" and ("@" not in text or text.startswith("@") or text.endswith("@")):
        raise ValueError("type an email address")
    if fmt == "uri" and not urlparse(text).scheme:
        raise ValueError("type a URI with a scheme, e.g. https://...")
    if fmt == "date":
        try:
            date.fromisoformat(text)
        except ValueError:
            raise ValueError("type a date as YYYY-MM-DD") from None
    if fmt == "date-time":
        try:
            datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError("type a date and time as YYYY-MM-DDTHH:MM:SS") from None


def _titled(options: Any) -> tuple[tuple[str, str], ...] | None:
    """`oneOf`/`anyOf` of `{"const": ..., "title": ...}`: titled choices."""
    if not isinstance(options, list) or not options:
        return None
    found: list[tuple[str, str]] = []
    for option in options:
        if not isinstance(option, dict) or "const" not in option:
            return None
        found.append((str(option["const"]), str(option.get("title") or option["const"])))
    return tuple(found)


def _enum(prop: Mapping[str, Any]) -> tuple[tuple[str, str], ...] | None:
    values = prop.get("enum")
    if isinstance(values, list) and values:
        names = prop.get("enumNames")
        labels = names if isinstance(names, list) and len(names) == len(values) else values
        return tuple((str(value), str(label)) for value, label in zip(values, labels, strict=True))
    return _titled(prop.get("oneOf")) or _titled(prop.get("anyOf"))


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_form(schema: Mapping[str, Any]) -> list[FormField]:
    """The fields of a form elicitation's `requestedSchema`, in its order."""
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return []
    required = set(schema.get("required") or [])
    fields: list[FormField] = []
    for name, prop in properties.items():
        if not isinstance(prop, dict):
            continue
        kind: FieldKind
        choices = _enum(prop)
        declared = prop.get("type")
        if declared == "array":
            items = prop.get("items")
            choices = (_enum(items) if isinstance(items, dict) else None) or ()
            kind = "choices"
        elif choices:
            kind = "choice"
        elif declared in ("integer", "number", "boolean"):
            kind = declared
        else:
            kind = "string"
        default = prop.get("default")
        if not isinstance(default, str | int | float | bool | list):
            default = None
        fields.append(
            FormField(
                name=str(name),
                kind=kind,
                title=prop.get("title") if isinstance(prop.get("title"), str) else None,
                description=prop.get("description") if isinstance(prop.get("description"), str) else None,
                required=name in required,
                default=default,
                choices=choices or (),
                minimum=_number(prop.get("minimum")),
                maximum=_number(prop.get("maximum")),
                min_length=_int(prop.get("minLength")),
                max_length=_int(prop.get("maxLength")),
                min_items=_int(prop.get("minItems")),
                max_items=_int(prop.get("maxItems")),
                format=prop.get("format") if isinstance(prop.get("format"), str) else None,
            )
        )
    return fields
