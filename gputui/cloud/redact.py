"""Keep AWS credentials out of everything gputui prints, logs or stores."""

from __future__ import annotations

import os
import re

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
