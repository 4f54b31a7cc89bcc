"""Timestamps as logs print them (syslog, dmesg -T, ISO, any locale) and as users type them."""

from __future__ import annotations

import functools
import re
import time
from datetime import datetime, timedelta, timezone

# Month abbreviations and names as glibc locales print %b/%B (journalctl short, syslog,
# dmesg -T). Keys are lower case without a trailing dot; the commonest server locales.
_MONTHS: dict[str, int] = {}
for _number, _names in enumerate(
    (
        "jan january janv janvier ene enero gen gennaio "
        "januar jänner jän janeiro styczeń sty янв января январь",
        "feb february févr février fév febr februar feb febrero "
        "febbraio fevereiro fev februari lut luty фев февраля февраль",
        "mar march mars märz mär marzo março mrt maart marca mar мар марта март",
        "apr april avr avril abr abril aprile kwi kwiecień апр апреля апрель",
        "may mai mayo mag maggio maio mei maj май мая",
        "jun june juin juni junio giu giugno junho cze czerwiec июн июня июнь",
        "jul july juil juillet juli julio lug luglio julho lip lipiec июл июля июль",
        "aug august août aoû ago agosto aug augustus sie sierpień авг августа август",
        "sep sept september septembre sept septiembre set "
        "settembre setembro wrz wrzesień сен сентября сентябрь",
        "oct october oct octobre okt oktober octubre ott "
        "ottobre out outubro paź październik окт октября октябрь",
        "nov november novembre noviembre novembro lis listopad ноя ноября ноябрь",
        "dec december déc décembre dez dezember dic "
        "diciembre dicembre dezembro gru grudzień дек декабря декабрь",
    ),
    start=1,
):
    for _name in _names.split():
        _MONTHS.setdefault(_name, _number)

# CJK locales print the month as a number followed by 月 (ja, zh) or 월 (ko).
_CJK_MONTH_RE = re.compile(r"^(\d{1,2})(?:月|월)$")
_CLOCK_RE = re.compile(r"^(\d{1,2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?$")
ISO_RE = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?"
    r"(Z|[+-]\d{2}:?\d{2})?$"
)


def month_number(token: str) -> int | None:
    """Month 1..12 from an English or localised month token (``Mar``, ``mars``, ``3月``)."""
    word = token.strip().rstrip(".").lower()
    if word in _MONTHS:
        return _MONTHS[word]
    cjk = _CJK_MONTH_RE.match(word)
    if cjk and 1 <= int(cjk.group(1)) <= 12:
        return int(cjk.group(1))
    return None


def _fraction_microseconds(digits: str | None) -> int:
    return int((digits or "0")[:6].ljust(6, "0"))


def _local_to_utc(year: int, month: int, day: int, clock: re.Match[str]) -> datetime | None:
    try:
        naive = datetime(
            year,
            month,
            day,
            int(clock.group(1)),
            int(clock.group(2)),
            int(clock.group(3)),
            _fraction_microseconds(clock.group(4)),
        )
    except ValueError:
        return None
    # A naive datetime's astimezone() reads it as local time (TZ), as syslog wrote it.
    return naive.astimezone().astimezone(timezone.utc)


def parse_iso(text: str) -> datetime | None:
    """ISO-8601 as rsyslog, ``journalctl -o short-iso`` and ``dmesg --time-format iso`` print it.

    Without an offset the time is read as local time. Returns UTC, or None if not ISO.
    """
    match = ISO_RE.match(text.strip())
    if not match:
        return None
    year, month, day, hour, minute, second = (int(match.group(i)) for i in range(1, 7))
    offset = match.group(8)
    try:
        naive = datetime(
            year, month, day, hour, minute, second, _fraction_microseconds(match.group(7))
        )
    except ValueError:
        return None
    if offset is None:
        return naive.astimezone().astimezone(timezone.utc)
    if offset == "Z":
        return naive.replace(tzinfo=timezone.utc)
    sign = -1 if offset[0] == "-" else 1
    digits = offset[1:].replace(":", "")
    delta = timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
    return (naive - sign * delta).replace(tzinfo=timezone.utc)


def parse_syslog_date(
    month_token: str, day: str, clock_text: str, reference: datetime, *, year: int | None = None
) -> datetime | None:
    """``Mar  5 11:22:33`` as local time. Without ``year`` (classic syslog): the latest such
    time not after ``reference`` + 1 day."""
    # The lines of one report share their second, and the local-time conversion is the
    # costly part: cache, keyed on the time zone too.
    return _syslog_date(month_token, day, clock_text, reference, year, time.tzname)


@functools.lru_cache(maxsize=4096)
def _syslog_date(
    month_token: str,
    day: str,
    clock_text: str,
    reference: datetime,
    year: int | None,
    zone: tuple[str, str],
) -> datetime | None:
    month = month_number(month_token)
    clock = _CLOCK_RE.match(clock_text)
    if month is None or clock is None:
        return None
    if year is not None:
        return _local_to_utc(year, month, int(day), clock)
    year = reference.year
    stamp = _local_to_utc(year, month, int(day), clock)
    # syslog has no year: a date after the reference (file mtime) is from the previous year.
    if stamp is not None and stamp > reference + timedelta(days=1):
        stamp = _local_to_utc(year - 1, month, int(day), clock)
    return stamp


def parse_ctime(text: str) -> datetime | None:
    """``dmesg -T``'s ctime-like stamp in any locale: ``Thu May  9 14:52:38 2024``,
    ``lun. 3 mars 09:15:02 2025``. Tokens are recognised by shape, not position."""
    month = day = year = None
    clock = None
    for token in text.split():
        if clock is None and (found := _CLOCK_RE.match(token)):
            clock = found
        elif token.isdigit() and len(token) == 4:
            year = int(token)
        elif token.rstrip(".").isdigit() and len(token.rstrip(".")) <= 2 and day is None:
            day = int(token.rstrip("."))
        elif month is None:
            month = month_number(token)
    if None in (month, day, year) or clock is None:
        return None
    assert month is not None and day is not None and year is not None
    return _local_to_utc(year, month, day, clock)


_RELATIVE_RE = re.compile(r"^([+-])?\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d|w)(?:\s+ago)?$")
_RELATIVE_SECONDS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_user_time(text: str, now: datetime) -> datetime:
    """A --since/--until value: ISO date or date-time (local unless an offset is given),
    ``@EPOCH``, ``now``, ``today``, ``yesterday``, or relative ``-2h`` / ``2h ago`` / ``30min``.

    Raises ValueError with a readable message otherwise.
    """
    value = text.strip()
    lowered = value.lower()
    local_now = now.astimezone()
    if lowered == "now":
        return now.astimezone(timezone.utc)
    if lowered in ("today", "yesterday"):
        midnight = local_now.replace(hour=0, minute=0, second=0, microsecond=0)
        if lowered == "yesterday":
            midnight -= timedelta(days=1)
        return midnight.astimezone(timezone.utc)
    if value.startswith("@"):
        try:
            return datetime.fromtimestamp(float(value[1:]), tz=timezone.utc)
        except (ValueError, OverflowError, OSError):
            pass
    relative = _RELATIVE_RE.match(lowered)
    if relative:
        sign, amount, unit = relative.groups()
        seconds = float(amount) * _RELATIVE_SECONDS[unit]
        # "2h" and "-2h" and "2h ago" all mean the past; "+2h" the future.
        return (now + timedelta(seconds=seconds if sign == "+" else -seconds)).astimezone(
            timezone.utc
        )
    if re.match(r"^\d{4}-\d{2}-\d{2}$", value):
        value += "T00:00:00"
    parsed = parse_iso(value)
    if parsed is None:
        raise ValueError(
            f"{text!r} is not a time (try 2024-05-09, '2024-05-09 14:52:38', "
            "2024-05-09T14:52:38Z, @1715266358, yesterday, -2h or '3d ago')"
        )
    return parsed
