"""A tiny self-documenting schema for TOML tables: typed fields, ranges, choices.

Every profile section is a `Section` of `Field`s. Validation rejects unknown keys,
wrong types and impossible values with a message that names the file, the line,
the key and what was expected.

A table is declared once, as a frozen dataclass whose fields are made by `key` (the field's
schema rides in its metadata); `section_of` generates the `Section` from it. So the typed
settings object and the schema cannot drift apart: adding a key is one line.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from gputui.model.errors import UserError
from gputui.model.outside import number


def _bound(value: float) -> str:
    """A bound as written in a message: whole numbers in full (4294967295, not 4.29497e+09)."""
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) < 1e16):
        return str(int(value))
    return f"{value:g}"


@dataclass(frozen=True)
class Field:
    """One key of a TOML table.

    kind is one of: "int", "float", "str", "bool", "int_list", "float_pair", "str_list",
    "str_table" (a table of strings, kept as sorted (name, value) pairs: a frozen value),
    "value_table" (the same, of numbers, strings and booleans). `only`, in the [run] table: the
    kind of run the key concerns, "net" (the built-in nets) or "program" (your own); None: both.
    """

    kind: str
    doc: str
    default: Any = None
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    exclusive_maximum: bool = False
    check: Callable[[Any], str | None] | None = None
    only: str | None = None

    def expected(self) -> str:
        """A short phrase describing an acceptable value."""
        base = {
            "int": "a whole number",
            "float": "a number",
            "str": "a string",
            "bool": "true or false",
            "int_list": "a list of whole numbers",
            "float_pair": "a list of two numbers",
            "str_list": "a list of strings",
            "str_table": "a table of strings (name = \"value\")",
            "value_table": "a table of numbers, strings or booleans (name = value)",
        }[self.kind]
        if self.choices:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        bounds = []
        if self.minimum is not None:
            bounds.append((">" if self.exclusive_minimum else ">=") + f" {_bound(self.minimum)}")
        if self.maximum is not None:
            bounds.append(("<" if self.exclusive_maximum else "<=") + f" {_bound(self.maximum)}")
        return base + (" " + " and ".join(bounds) if bounds else "")

    def coerce(self, value: Any) -> Any:
        """Return the value converted to its kind, or raise ValueError(expected ...)."""
        kind = self.kind
        if kind == "bool":
            if not isinstance(value, bool):
                raise ValueError(self.expected())
            return value
        if kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(self.expected())
            self._check_range(value)
        elif kind == "float":
            found = number(value)  # a finite number (an integer too large for a float is not)
            if found is None:
                raise ValueError(self.expected())
            value = found
            self._check_range(value)
        elif kind == "str":
            if not isinstance(value, str):
                raise ValueError(self.expected())
            if self.choices and value not in self.choices:
                raise ValueError(self.expected())
        elif kind == "int_list":
            if not isinstance(value, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in value
            ):
                raise ValueError(self.expected())
            for v in value:
                self._check_range(v)
            value = tuple(value)
        elif kind == "str_list":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(self.expected())
            value = tuple(value)
        elif kind == "str_table":
            if isinstance(value, tuple):  # already coerced (settings merged from settings)
                value = dict(value)
            if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                raise ValueError(self.expected())
            value = tuple(sorted(value.items()))
        elif kind == "value_table":
            if isinstance(value, tuple):  # already coerced
                value = dict(value)
            if not isinstance(value, dict) or not all(_plain(v) for v in value.values()):
                raise ValueError(self.expected())
            value = tuple(sorted(value.items()))
        elif kind == "float_pair":
            if (
                not isinstance(value, list)
                or len(value) != 2
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
            ):
                raise ValueError(self.expected())
            for v in value:
                self._check_range(float(v))
            value = (float(value[0]), float(value[1]))
        else:  # pragma: no cover - programming error
            raise AssertionError(kind)
        if self.check is not None:
            problem = self.check(value)
            if problem:
                raise ValueError(problem)
        return value

    def _check_range(self, value: float) -> None:
        lo, hi = self.minimum, self.maximum
        if lo is not None and (value < lo or (self.exclusive_minimum and value == lo)):
            raise ValueError(self.expected())
        if hi is not None and (value > hi or (self.exclusive_maximum and value == hi)):
            raise ValueError(self.expected())


def _plain(value: Any) -> bool:
    """A string, a boolean, a whole number or a finite number (what JSON and a command word hold)."""
    return isinstance(value, (str, bool, int)) or (isinstance(value, float) and number(value) is not None)


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """", did you mean `model`?" for a near miss of one of `known` (a typo), else ""."""
    import difflib

    close = difflib.get_close_matches(str(word), list(known), n=1, cutoff=0.7)
    return f", did you mean `{close[0]}`?" if close else ""


@dataclass(frozen=True)
class Section:
    """A TOML table: its name and its fields, each documented."""

    name: str
    doc: str
    fields: Mapping[str, Field]
    many: bool = False  # an array of tables, [[name]], rather than one [name]
    required: tuple[str, ...] = ()  # keys that must be present

    def validate_any(self, value: Any, source: "Source") -> Any:
        """Validate this section's value: one table, or a list of tables when `many`."""
        if not self.many:
            return self.validate(value, source)
        if not isinstance(value, list):
            raise source.error(self.name, None, f"write it as [[{self.name}]] tables")
        return [self.validate(item, source) for item in value]

    def validate(self, table: Any, source: "Source") -> dict[str, Any]:
        """Check a parsed table; return {key: coerced value} for the keys present."""
        if not isinstance(table, dict):
            raise source.error(self.name, None, f"[{self.name}] must be a table")
        for key in self.required:
            if key not in table:
                raise source.error(self.name, None, f"[{self.name}] needs `{key}`: {self.fields[key].doc}")
        out: dict[str, Any] = {}
        for key, value in table.items():
            spec = self.fields.get(key)
            if spec is None:
                known = ", ".join(sorted(self.fields))
                raise source.error(self.name, key, f"unknown key{did_you_mean(key, self.fields)} (known keys: {known})")
            try:
                out[key] = spec.coerce(value)
            except ValueError as exc:
                raise source.error(self.name, key, f"expected {exc}, got {value!r}") from None
        return out


@dataclass(frozen=True)
class Source:
    """Where a table came from, for error messages: a file and its text."""

    path: Path | None
    text: str = ""

    def line_of(self, section: str | None, key: str | None) -> int | None:
        """The 1-based line where `key` is set inside `[section]`, if it can be found."""
        current: str | None = None
        header = re.compile(r"^\s*\[\[?\s*([A-Za-z0-9_.\-]+)\s*\]\]?")
        assign = re.compile(r"^\s*\"?([A-Za-z0-9_\-]+)\"?\s*=")
        section_line = None
        for number, line in enumerate(self.text.splitlines(), start=1):
            m = header.match(line)
            if m:
                current = m.group(1)
                if section is None and current == key:
                    return number
                if current == section and section_line is None:
                    section_line = number
                continue
            m = assign.match(line)
            if m and key is not None and m.group(1) == key and current == section:
                return number
            if m and key is None and current is None and m.group(1) == section:
                return number
        return section_line

    def error(self, section: str | None, key: str | None, message: str) -> UserError:
        where = str(self.path) if self.path else "settings"
        line = self.line_of(section, key)
        if line is not None:
            where += f":{line}"
        name = f"[{section}] {key}" if section and key else (key or f"[{section}]")
        return UserError(f"{where}: {name}: {message}")


SCHEMA = "gputui.schema"  # a dataclass field's metadata key holding its `Field`
SCHEMA_KEYS = "gputui.schema.keys"  # ... or holding {key: Field} when one attribute gathers several keys
REQUIRED: Any = dataclasses.MISSING  # `attr=REQUIRED`: the attribute has no default (the caller resolves it)
_SAME: Any = object()


def key(kind: str, doc: str, default: Any = None, *, attr: Any = _SAME, choices: tuple[str, ...] | None = None,
        minimum: float | None = None, maximum: float | None = None, exclusive_minimum: bool = False,
        exclusive_maximum: bool = False, check: Callable[[Any], str | None] | None = None,
        only: str | None = None) -> Any:
    """A dataclass field that is also a profile key: its schema `Field` (kind, doc, documented
    default, bounds, check) in the metadata, and `default` as the attribute's default unless
    `attr` says otherwise (None for "not set", or REQUIRED for an attribute the caller resolves)."""
    spec = Field(kind, doc, default, choices=choices, minimum=minimum, maximum=maximum,
                 exclusive_minimum=exclusive_minimum, exclusive_maximum=exclusive_maximum, check=check, only=only)
    attr_default = default if attr is _SAME else attr
    return dataclasses.field(default=attr_default, metadata={SCHEMA: spec})


def keys_of(cls: type) -> dict[str, Field]:
    """The profile keys a table's dataclass declares, in declaration order."""
    out: dict[str, Field] = {}
    for f in dataclasses.fields(cls):
        if SCHEMA in f.metadata:
            out[f.name] = f.metadata[SCHEMA]
        out.update(f.metadata.get(SCHEMA_KEYS, {}))
    return out


def section_of(cls: type, name: str, doc: str, *, many: bool = False, required: tuple[str, ...] = ()) -> Section:
    """The `Section` of the table that `cls` declares (its `key` fields)."""
    return Section(name=name, doc=doc, fields=keys_of(cls), many=many, required=required)
