"""Keep secrets out of everything gputui prints, logs or stores: AWS credentials, and the
secrets a profile holds (the alerts' webhook URL and command, any key named like a token)."""

from __future__ import annotations

import os
import re
import sys
from typing import Any, Iterator, Union

CREDENTIAL_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")
# Access key ids have a recognisable shape even when they did not come from the environment.
ACCESS_KEY_RE = re.compile(r"\b(AKIA|ASIA|AIDA|AROA)[A-Z0-9]{12,}\b")
MASK = "[redacted]"


def redact(text: str) -> str:
    """`text` with every credential value from the environment and every access key id masked."""
    for var in CREDENTIAL_VARS:
        value = os.environ.get(var)
        if value and len(value) >= 8:
            text = text.replace(value, MASK)
    return ACCESS_KEY_RE.sub(MASK, text)



# -- secrets in profiles and URLs ----------------------------------------------------------------
# A profile gputui keeps (a sweep's study holds the whole text, so that --resume needs no file)
# keeps no secret: the alerts' webhook URL (its path is the credential in Slack's and many
# others), the alerts' command line (it may carry a bearer header), and any key named like one.
PLACEHOLDER = "<redacted: set in the profile>"
SECRET_KEY_RE = re.compile(r"token|secret|passw(or)?d|credential|api_?key|access_?key|private_?key", re.IGNORECASE)
SECRET_FIELDS = frozenset({("alerts", "webhook"), ("alerts", "command")})
_KEPT_HEADER = "# The profile as gputui keeps it: comments and secrets (set in the profile) left out.\n"

Key = Union[str, int]


def secret_key(table: str, key: str) -> bool:
    """Whether `[table] key` of a profile holds a secret."""
    return (table, key) in SECRET_FIELDS or bool(SECRET_KEY_RE.search(key))


def _secrets(node: Any, table: str, path: tuple[Key, ...]) -> Iterator[tuple[Key, ...]]:
    """The paths of the secret values under `node` (a parsed TOML table), `table` the top table's name."""
    for key, value in node.items():
        here = path + (key,)
        if isinstance(value, dict):
            yield from _secrets(value, table or key, here)
        elif isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            for i, item in enumerate(value):  # an array of tables ([[hosts]])
                yield from _secrets(item, table or key, here + (i,))
        elif secret_key(table, key):
            yield here


def _loads(text: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    return tomllib.loads(text)


def _dumps(doc: dict[str, Any]) -> str:
    import tomli_w

    return _KEPT_HEADER + tomli_w.dumps(doc)


def _get(doc: Any, path: tuple[Key, ...]) -> Any:
    for key in path:
        if isinstance(key, int):
            if not isinstance(doc, list) or key >= len(doc):
                return None
        elif not isinstance(doc, dict) or key not in doc:
            return None
        doc = doc[key]
    return doc


def _where(path: tuple[Key, ...]) -> str:
    tables = [str(k) for k in path[:-1] if not isinstance(k, int)]
    return (f"[{'.'.join(tables)}] " if tables else "") + str(path[-1])


def redact_profile(text: str) -> str:
    """Profile TOML text as gputui may keep it: each secret value replaced by PLACEHOLDER. It is
    the parsed document written again, so comments (a commented-out webhook too) are not kept.
    A ValueError when `text` is not TOML."""
    doc = _loads(text)
    for path in list(_secrets(doc, "", ())):
        _get(doc, path[:-1])[path[-1]] = PLACEHOLDER
    return _dumps(doc)


def restore_profile(kept: str, original: str | None) -> tuple[str, list[str]]:
    """`kept` (from `redact_profile`) with each placeholder given its value from `original`, the
    profile's text now (None: unreadable); a secret that `original` no longer holds is left out.
    Returns the text and what was left out ("[alerts] webhook")."""
    doc = _loads(kept)
    wanted = [path for path in _secrets(doc, "", ()) if _get(doc, path) == PLACEHOLDER]
    if not wanted:
        return kept, []
    try:
        source = _loads(original) if original is not None else {}
    except ValueError:
        source = {}
    missing = []
    for path in wanted:
        value = _get(source, path)
        if value is None or value == PLACEHOLDER:
            del _get(doc, path[:-1])[path[-1]]
            missing.append(_where(path))
        else:
            _get(doc, path[:-1])[path[-1]] = value
    return _dumps(doc), missing


def safe_url(url: str) -> str:
    """A URL as gputui shows it: scheme://host[:port], then "/…" for a path or query (credentials
    of `user:password@` and tokens in the path never show)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<a URL>"
    shown = f"{parts.scheme}://{'[' + host + ']' if ':' in host else host}{f':{port}' if port else ''}"
    return shown + ("/…" if parts.path.strip("/") or parts.query or parts.fragment else "")


def url_host(url: str) -> str:
    """The host[:port] of a URL, as a message names where it went: never its user:password."""
    shown = safe_url(url)
    return shown.partition("://")[2].removesuffix("/…") or shown


def scrub_url(text: str, url: str) -> str:
    """`text` (an error message) with `url` and each of its secret parts shown as `safe_url`."""
    from urllib.parse import urlsplit

    shown = safe_url(url)
    text = text.replace(url, shown)
    try:
        parts = urlsplit(url)
        pieces = [parts.netloc.rpartition("@")[0], parts.path, parts.query, parts.fragment, parts.password or ""]
    except ValueError:
        pieces = []
    for piece in sorted((p for p in pieces if len(p) >= 4), key=len, reverse=True):
        text = text.replace(piece, "…")
    return text


def holds_secrets(text: str) -> bool:
    """Whether profile text holds a secret value (not a placeholder); False when it is not TOML."""
    try:
        doc = _loads(text)
    except ValueError:
        return False
    return any(_get(doc, path) != PLACEHOLDER for path in _secrets(doc, "", ()))
