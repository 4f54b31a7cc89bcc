"""One piece of advice in plain words, with a stable code scripts can match on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["info", "warn"]


@dataclass(frozen=True, slots=True)
class Advice:
    """Advice shown under a report; ``code`` never changes once published."""

    code: str
    message: str
    severity: Severity = "info"
