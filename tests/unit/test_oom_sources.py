"""Text-log reading: every line format, the fast prefilter against a full parse, bad input."""

from __future__ import annotations

import gzip
import io
import random
from collections.abc import Iterable, Iterator
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pytest

from memforensics.analysis.oom_select import scan
from memforensics.errors import InputDataError
from memforensics.model.logrecord import KERNEL, LogRecord
from memforensics.model.oom import OomEvent
from memforensics.sources.logs import kmsg, logfile, logprefilter
from memforensics.sources.logs.logfile import read_text_log
from memforensics.sources.logs.logline import parse_line
from memforensics.sources.logs.logtime import month_number, parse_user_time
from tests.support.timezone import pinned_timezone


def find_events(records: Iterable[LogRecord]) -> list[OomEvent]:
    """Every event of one stream, as a whole scan reports them."""
    return list(scan([("test", records)]).events)


OOM = Path(__file__).resolve().parent.parent.parent / "fixtures" / "oom"
REFERENCE = datetime(2024, 6, 1, tzinfo=timezone.utc)
TEXT_FIXTURES = sorted(p for p in OOM.iterdir() if p.suffix in (".log", ".kmsg"))
NOISE = [
    "[ 1234.567890] EXT4-fs (vda): mounted filesystem with ordered data mode. Quota mode: none.",
    "[ 1234.600000] usb 1-1: new high-speed USB device number 2 using xhci_hcd",
    "[ 1234.700000] IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready",
    '[ 1234.800000] audit: type=1400 audit(1700000000.123:45): apparmor="STATUS" name="x"',
    "[ 1234.900000] Killing interrupt storm on irq 7 (not an OOM)",
    "[ 1235.000000] nfs: server 10.0.0.1 not responding, still trying",
]


@pytest.fixture(autouse=True)
def utc() -> Iterator[None]:
    """Local-time stamps (syslog, dmesg -T) are read in TZ; pin it, then put it back."""
    with pinned_timezone("UTC"):
        yield


@pytest.mark.parametrize(
    ("line", "ident", "text", "uptime", "stamp"),
    [
        ("[  52.341234] Out of x", KERNEL, "Out of x", 52.341234, None),
        ("[   52.341234][ T4242] Out of x", KERNEL, "Out of x", 52.341234, None),
        (
            "[Thu May  9 14:52:38 2024] Out of x",
            KERNEL,
            "Out of x",
            None,
            datetime(2024, 5, 9, 14, 52, 38),
        ),
        ("kern  :err   : [  1.500000] Out of x", KERNEL, "Out of x", 1.5, None),
        (
            "2024-05-09T14:52:38,000001+02:00 Out of x",
            KERNEL,
            "Out of x",
            None,
            datetime(2024, 5, 9, 12, 52, 38, 1),
        ),
        (
            "Mar  5 11:22:33 host kernel: [52341.234567] Out of x",
            KERNEL,
            "Out of x",
            52341.234567,
            datetime(2024, 3, 5, 11, 22, 33),
        ),
        (
            "Mar 05 11:22:33 host kernel: Out of x",
            KERNEL,
            "Out of x",
            None,
            datetime(2024, 3, 5, 11, 22, 33),
        ),
        (
            "Dec 31 23:59:59 host kernel: Out of x",
            KERNEL,
            "Out of x",
            None,
            datetime(2023, 12, 31, 23, 59, 59),
        ),
        (
            "Okt 05 11:22:33 host earlyoom[9]: sending",
            "earlyoom",
            "sending",
            None,
            datetime(2023, 10, 5, 11, 22, 33),
        ),
        (
            "2024-03-05T11:22:33.5+01:00 host systemd-oomd[2]: Killed",
            "systemd-oomd",
            "Killed",
            None,
            datetime(2024, 3, 5, 10, 22, 33, 500000),
        ),
        ("[   77.749670] systemd-oomd[659]: Marked", "systemd-oomd", "Marked", 77.74967, None),
        (
            "6,414,300947560,-;[   5256]     0  5256",
            KERNEL,
            "[   5256]     0  5256",
            300.94756,
            None,
        ),
        (
            "12,9,5,-;myapp[3]: Out of memory: Killed process 1 (x)",
            "myapp",
            "Out of memory: Killed process 1 (x)",
            5e-06,
            None,
        ),
        ("just some text", None, "just some text", None, None),
        (
            "Mar  5 11:22:33 h kernel: Memory cgroup stats for /x:#012anon 1",
            KERNEL,
            "Memory cgroup stats for /x:\nanon 1",
            None,
            datetime(2024, 3, 5, 11, 22, 33),
        ),
    ],
)
def test_parse_line_formats(
    line: str, ident: str | None, text: str, uptime: float | None, stamp: datetime | None
) -> None:
    record = parse_line(line, "t", REFERENCE)
    assert record is not None
    assert (record.ident, record.text) == (ident, text)
    assert record.uptime_seconds == (pytest.approx(uptime) if uptime is not None else None)
    assert record.time == (stamp.replace(tzinfo=timezone.utc) if stamp else None)


def test_journal_json_line_in_a_text_file() -> None:
    line = (
        '{"MESSAGE":[79,117,116],"_TRANSPORT":"kernel","_BOOT_ID":"ab",'
        '"__REALTIME_TIMESTAMP":"1700000000000000","_SOURCE_MONOTONIC_TIMESTAMP":"2500000"}'
    )
    record = parse_line(line, "t", REFERENCE)
    assert record == LogRecord(
        "Out", "t", KERNEL, datetime(2023, 11, 14, 22, 13, 20, tzinfo=timezone.utc), 2.5, "ab"
    )


def test_kmsg_record_escapes_and_facilities() -> None:
    record = kmsg.parse_record("6,89,217674,-,caller=T1;rcu: \\x09RCU restricting\\x0anext")
    assert record is not None
    assert record.text == "rcu: \tRCU restricting\nnext"
    assert (record.priority, record.facility, record.sequence) == (6, 0, 89)
    assert kmsg.parse_record(" SUBSYSTEM=acpi") is None
    user = kmsg.parse_record("30,5,1,-;systemd[1]: started")
    assert user is not None and kmsg.split_userspace(user) == ("systemd", "started")


def test_month_tokens_and_user_times() -> None:
    assert [month_number(t) for t in ("Mar", "mars", "März", "3月", "окт", "déc.", "Foo")] == [
        3,
        3,
        3,
        3,
        10,
        12,
        None,
    ]
    now = datetime(2024, 6, 1, 12, 0, tzinfo=timezone.utc)
    assert parse_user_time("-2h", now) == datetime(2024, 6, 1, 10, 0, tzinfo=timezone.utc)
    assert parse_user_time("3d ago", now) == datetime(2024, 5, 29, 12, 0, tzinfo=timezone.utc)
    assert parse_user_time("2024-05-09", now) == datetime(2024, 5, 9, tzinfo=timezone.utc)
    assert parse_user_time("@0", now) == datetime(1970, 1, 1, tzinfo=timezone.utc)
    assert parse_user_time("yesterday", now) == datetime(2024, 5, 31, tzinfo=timezone.utc)
    with pytest.raises(ValueError, match="not a time"):
        parse_user_time("last tuesday", now)


def _slow_events(text: str, source: str) -> list[OomEvent]:
    """The reference: parse every single line, no prefilter."""
    records = [parse_line(line, source, REFERENCE) for line in text.splitlines()]
    return find_events(r for r in records if r is not None)


def _noisy(seed: int) -> str:
    rng = random.Random(seed)
    lines: list[str] = []
    for path in TEXT_FIXTURES:
        for _ in range(rng.randrange(0, 300)):
            lines.append(rng.choice(NOISE))
        lines.extend(path.read_text().splitlines())
    return "\n".join(lines) + "\n"


def _comparable(found: list[OomEvent]) -> list[OomEvent]:
    return [replace(e, source="x") for e in found]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_prefilter_finds_what_a_full_parse_finds(tmp_path: Path, seed: int) -> None:
    text = _noisy(seed)
    path = tmp_path / "noisy.log"
    path.write_text(text)
    expected = _comparable(_slow_events(text, str(path)))
    assert len(expected) >= 30
    fast = _comparable(find_events(read_text_log(str(path), reference=REFERENCE)))
    assert fast == expected


@pytest.mark.parametrize("window_bytes", [1, 3000, 7777])
def test_mapped_windows_find_what_a_full_parse_finds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, window_bytes: int
) -> None:
    """A mapped file is searched window by window, its pages released behind the search;
    window edges cut incidents."""
    text = _noisy(11)
    path = tmp_path / "noisy.log"
    path.write_text(text)
    expected = _comparable(_slow_events(text, str(path)))
    monkeypatch.setattr(logfile, "WINDOW_BYTES", window_bytes)
    monkeypatch.setattr(logprefilter, "LOOKBACK_BYTES", 5000)
    fast = _comparable(find_events(read_text_log(str(path), reference=REFERENCE)))
    assert fast == expected


@pytest.mark.parametrize("chunk_bytes", [1500, 4000, 9001])
def test_streamed_chunks_and_lookbehind_match_the_mapped_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk_bytes: int
) -> None:
    """Tiny chunks put incidents across chunk boundaries (header in the look-behind)."""
    text = _noisy(7)
    expected = _comparable(_slow_events(text, "-"))
    monkeypatch.setattr(logfile, "_CHUNK_BYTES", chunk_bytes)
    monkeypatch.setattr(logprefilter, "LOOKBACK_BYTES", 6000)
    gz = tmp_path / "noisy.log.gz"
    gz.write_bytes(gzip.compress(text.encode()))
    assert _comparable(find_events(read_text_log(str(gz), reference=REFERENCE))) == expected
    stdin = io.BytesIO(text.encode())
    streamed = find_events(read_text_log("-", stdin=stdin, reference=REFERENCE))  # type: ignore[arg-type]
    assert _comparable(streamed) == expected


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"LPKSHHRH\x00\x00\x00binary journal", "binary journal file"),
        (b"\x7fELF\x02\x01\x01\x00\x00\x00", "binary data"),
        (gzip.compress(b"Out of memory: Killed process 1 (x)\n" * 100)[:40], "compressed"),
    ],
)
def test_bad_input_is_exit_7(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad"
    path.write_bytes(content)
    with pytest.raises(InputDataError, match=message) as caught:
        list(read_text_log(str(path)))
    assert caught.value.exit_code == 7
    assert caught.value.hint


def test_missing_and_directory_inputs(tmp_path: Path) -> None:
    with pytest.raises(InputDataError, match="cannot read"):
        read_text_log(str(tmp_path / "nope.log"))
    with pytest.raises(InputDataError, match="directory"):
        read_text_log(str(tmp_path))
    empty = tmp_path / "empty.log"
    empty.write_text("")
    assert list(read_text_log(str(empty))) == []


def test_file_without_final_newline(tmp_path: Path) -> None:
    path = tmp_path / "x.log"
    path.write_text(
        "Out of memory: Killed process 7 (a b) total-vm:8kB, anon-rss:4kB, file-rss:0kB"
    )
    (event,) = find_events(read_text_log(str(path)))
    assert (event.pid, event.process) == (7, "a b")
