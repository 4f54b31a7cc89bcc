"""`memforensics parse` on every kind of input in fixtures/: real, published, dialects, and the
broken and hostile files, through click's CliRunner and, for a few, a real subprocess.

The contract pinned here (README.md "Exit codes"): bad input is exit 7 with one line
``error: FILE:LINE: what`` on stderr, a hint, nothing on stdout and no traceback; entities
are never resolved (no /etc/passwd text in any output) and nothing is fetched (a live local
HTTP server sees no request).
"""

from __future__ import annotations

import http.server
import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from memforensics.cli import cli
from memforensics.errors import EXIT_INPUT, EXIT_OK

REPO = Path(__file__).resolve().parent.parent.parent
FIXTURES = REPO / "fixtures"

BROKEN = sorted(p.relative_to(FIXTURES).as_posix() for p in (FIXTURES / "broken").iterdir())
HOSTILE = sorted(p.relative_to(FIXTURES).as_posix() for p in (FIXTURES / "hostile").iterdir())
REFUSED_DIALECTS = ["dialects/jemalloc-1.xml", "dialects/hardened_malloc-1.xml"]
REFUSED_PUBLISHED = [
    "published/algolia-2021-heap87-fragment.xml",
    "published/algolia-2021-totals-fragment.xml",
    "published/sonic-buildimage-28245-fragment.txt",
]
ACCEPTED = [
    "threads-fragmented.xml",
    "arena-max-1.xml",
    "free-all-but-last-before-trim.xml",
    "free-all-but-last-after-trim.xml",
    "mmap-heavy.xml",
    "python3-idle.xml",
    "series-5.xml",
    "jemalloc-preload.xml",
    "tcmalloc-preload.xml",
    "dialects/glibc-2.12-nested.xml",
    "dialects/glibc-2.17-rhel7.xml",
    "dialects/glibc-2.27-tab-junk.xml",
    "dialects/glibc-2.30-no-top.xml",
    "dialects/glibc-2.36-i386.xml",
    "dialects/glibc-2.44-no-fastbins.xml",
    "dialects/unused-arena.xml",
    "dialects/future-extras.xml",
    "derived/threads-fragmented-one-arena-earlier.xml",
    "published/mysql-refman-sighup-status.xml",
    "published/man-malloc_info-glibc-2.13-series.xml",
    "published/man-malloc_info-glibc-2.13-session.txt",
]
SERVED_MARKER = "memforensics-served-body-7f3a"  # only the local HTTP server's reply has it
ERROR_LINE = re.compile(r"^error: (?P<file>.+?):(?P<line>\d+): (?P<what>\S.*)$")


def _passwd_lines() -> list[str]:
    """Lines of this machine's /etc/passwd long enough not to occur by chance."""
    lines = [ln for ln in Path("/etc/passwd").read_text().splitlines() if len(ln) > 8]
    assert lines, "no /etc/passwd to compare against"
    return lines


def _parse(*args: str, stdin: bytes | None = None) -> Result:
    return CliRunner().invoke(cli, ["parse", *args], input=stdin)


def _assert_refused(result: Result, path: str) -> re.Match[str]:
    """Exit 7; stdout empty; stderr = `error: FILE:LINE: what` (+ optional hint); no traceback."""
    assert result.exit_code == EXIT_INPUT, (result.exit_code, result.stderr, result.stdout)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert 1 <= len(lines) <= 2, result.stderr
    match = ERROR_LINE.match(lines[0])
    assert match, lines[0]
    assert match.group("file").endswith(Path(path).name), lines[0]
    assert int(match.group("line")) >= 1
    if len(lines) == 2:
        assert lines[1].startswith("hint: ")
    assert "Traceback" not in result.stderr
    assert "internal error" not in result.stderr
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)
    return match


# --------------------------------------------------------------------------------------------
# Refused: broken, hostile, other allocators, fragments


@pytest.mark.parametrize("name", BROKEN + HOSTILE + REFUSED_DIALECTS + REFUSED_PUBLISHED)
def test_bad_input_is_exit_7_with_file_and_line(name: str) -> None:
    path = str(FIXTURES / name)
    _assert_refused(_parse(path), path)


@pytest.mark.parametrize("name", BROKEN + HOSTILE)
def test_bad_input_with_json_prints_no_json(name: str) -> None:
    path = str(FIXTURES / name)
    _assert_refused(_parse("--json", path), path)


@pytest.mark.parametrize(
    ("name", "line"),
    [
        ("broken/missing-attribute.xml", 7),
        ("broken/non-numeric.xml", 8),
        ("broken/negative.xml", 6),
        ("hostile/over-2-64.xml", 8),
        ("hostile/huge-attribute.xml", 9),
        ("broken/unknown-version.xml", 1),
        ("dialects/jemalloc-1.xml", 1),
        ("dialects/hardened_malloc-1.xml", 1),
    ],
)
def test_error_names_the_line_of_the_fault(name: str, line: int) -> None:
    path = str(FIXTURES / name)
    match = _assert_refused(_parse(path), path)
    assert int(match.group("line")) == line


@pytest.mark.parametrize(
    ("name", "word"),
    [("dialects/jemalloc-1.xml", "jemalloc"), ("dialects/hardened_malloc-1.xml", "hardened")],
)
def test_other_allocators_are_refused_by_name(name: str, word: str) -> None:
    path = str(FIXTURES / name)
    match = _assert_refused(_parse(path), path)
    assert word in match.group("what")


def test_one_bad_file_among_good_ones_fails_the_run_with_7() -> None:
    good = str(FIXTURES / "arena-max-1.xml")
    bad = str(FIXTURES / "broken/truncated.xml")
    result = _parse(good, bad)
    assert result.exit_code == EXIT_INPUT
    assert "truncated.xml" in result.stderr and "Traceback" not in result.stderr


def test_bad_input_on_stdin_is_exit_7() -> None:
    data = (FIXTURES / "broken/truncated.xml").read_bytes()
    result = _parse("-", stdin=data)
    assert result.exit_code == EXIT_INPUT
    assert result.stdout == ""
    assert ERROR_LINE.match(result.stderr.splitlines()[0]), result.stderr


def test_attribute_beyond_libxml2s_text_limit_is_exit_7(tmp_path: Path) -> None:
    """12 MB in one attribute value: over libxml2's 10 MB default, refused not swallowed."""
    template = (FIXTURES / "free-all-but-last-before-trim.xml").read_text()
    huge = template.replace('<heap nr="0">', '<heap nr="0" junk="' + "x" * 12_000_000 + '">')
    path = tmp_path / "huge.xml"
    path.write_text(huge)
    _assert_refused(_parse(str(path)), str(path))


# --------------------------------------------------------------------------------------------
# Entities: never resolved, never fetched


def test_file_entity_never_leaks_passwd_into_any_output() -> None:
    path = str(FIXTURES / "hostile/xxe-file.xml")
    passwd = _passwd_lines()
    for args in (["parse", path], ["parse", "--json", path], ["parse", "-v", path]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == EXIT_INPUT, result.output
        everything = result.stdout + result.stderr
        assert not any(line in everything for line in passwd), args
        assert "root:x:" not in everything


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Counts every request it gets; serves a harmless DTD/entity body."""

    requests: list[str] = []  # noqa: RUF012 (one list per server, set before start)

    def do_GET(self) -> None:
        type(self).requests.append(self.path)
        body = f'<!ENTITY leaked "{SERVED_MARKER}">'.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the test reads ``requests``, not a log."""


@pytest.fixture
def http_recorder() -> Iterator[tuple[str, list[str]]]:
    """A live HTTP server on 127.0.0.1 (any free port); yields its base URL and request log."""
    handler: type[_Recorder] = type("Recorder", (_Recorder,), {"requests": []})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/", handler.requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_recorder_sees_a_real_request(http_recorder: tuple[str, list[str]]) -> None:
    """Control: the server does record fetches, so the zero below means something."""
    import urllib.request

    base, requests = http_recorder
    with urllib.request.urlopen(base + "control") as response:
        assert response.status == 200
    assert requests == ["/control"]


@pytest.mark.parametrize(
    "name",
    ["hostile/xxe-http.xml", "hostile/external-dtd-http.xml", "hostile/parameter-entity-http.xml"],
)
def test_http_entities_are_never_fetched(
    name: str, tmp_path: Path, http_recorder: tuple[str, list[str]]
) -> None:
    base, requests = http_recorder
    text = (FIXTURES / name).read_text()
    assert "http://127.0.0.1:9/" in text
    path = tmp_path / Path(name).name
    path.write_text(text.replace("http://127.0.0.1:9/", base))
    _assert_refused(_parse(str(path)), str(path))
    _assert_refused(_parse("--json", str(path)), str(path))
    proc = subprocess.run(
        [sys.executable, "-m", "memforensics", "parse", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == EXIT_INPUT, proc.stderr
    assert requests == []
    assert SERVED_MARKER not in proc.stdout + proc.stderr


# --------------------------------------------------------------------------------------------
# Accepted: every real, published and dialect file gives a report and a heap/1 document


@pytest.mark.parametrize("name", ACCEPTED)
def test_good_input_gives_a_report(name: str) -> None:
    result = _parse(str(FIXTURES / name))
    assert result.exit_code == EXIT_OK, result.stderr
    assert result.stdout.strip()
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("name", ACCEPTED)
def test_good_input_gives_a_heap_json_document(name: str) -> None:
    result = _parse("--json", str(FIXTURES / name))
    assert result.exit_code == EXIT_OK, result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema"] == "memforensics/heap/1"
    totals = doc["totals"]
    for key in ("system_bytes", "free_bytes", "rest_bytes", "in_use_bytes", "arenas"):
        assert isinstance(totals[key], int), key
    assert totals["arenas"] == len(doc["arenas"])
    assert totals["free_bytes"] == sum(a["free_bytes"] for a in doc["arenas"]) or name.startswith(
        "published/mysql"
    )


def test_json_keeps_unknown_as_null_never_zero() -> None:
    """No mmap total before ~2.17 and no fast total after 2.43: null in JSON, not 0."""
    old = json.loads(_parse("--json", str(FIXTURES / "dialects/glibc-2.12-nested.xml")).stdout)
    assert old["totals"]["mmap_bytes"] is None and old["totals"]["mmap_chunks"] is None
    new = json.loads(_parse("--json", str(FIXTURES / "dialects/glibc-2.44-no-fastbins.xml")).stdout)
    assert new["totals"]["fast_bytes"] is None and new["totals"]["fast_chunks"] is None
    assert new["totals"]["free_bytes"] == new["totals"]["rest_bytes"] == 933950


def test_several_files_give_a_json_array_in_argument_order() -> None:
    names = ["arena-max-1.xml", "threads-fragmented.xml", "jemalloc-preload.xml"]
    result = _parse("--json", *(str(FIXTURES / n) for n in names))
    assert result.exit_code == EXIT_OK, result.stderr
    docs = json.loads(result.stdout)
    assert isinstance(docs, list)
    assert [d["totals"]["arenas"] for d in docs] == [1, 16, 1]


def test_all_zero_dump_says_glibc_malloc_is_unused() -> None:
    result = _parse(str(FIXTURES / "tcmalloc-preload.xml"))
    assert result.exit_code == EXIT_OK
    report = " ".join(result.stdout.split()).lower()
    assert "unused" in report or "not used" in report or "another allocator" in report


def test_suspect_garbage_counts_are_flagged_not_fatal() -> None:
    result = _parse(str(FIXTURES / "dialects/glibc-2.12-nested.xml"))
    assert result.exit_code == EXIT_OK
    assert "suspect" in (result.stdout + result.stderr).lower()


def test_series_on_stdin_reports_the_last_dump() -> None:
    data = (FIXTURES / "series-5.xml").read_bytes()
    result = _parse("--json", "-", stdin=data)
    assert result.exit_code == EXIT_OK, result.stderr
    doc = json.loads(result.stdout)
    last_system_bytes = 12029952  # the 5th document's <system type="current"> (top level)
    assert doc["totals"]["system_bytes"] == last_system_bytes


# --------------------------------------------------------------------------------------------
# A real process: python -m memforensics


def test_subprocess_hostile_input_is_one_line_and_exit_7() -> None:
    path = FIXTURES / "hostile/xxe-file.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "memforensics", "parse", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == EXIT_INPUT
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert ERROR_LINE.match(lines[0]) and lines[0].count("xxe-file.xml") == 1
    assert "Traceback" not in proc.stderr
    assert not any(line in proc.stderr for line in _passwd_lines())


def test_subprocess_series_json_from_a_pipe() -> None:
    data = (FIXTURES / "series-5.xml").read_bytes()
    proc = subprocess.run(
        [sys.executable, "-m", "memforensics", "parse", "--json", "-"],
        input=data,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == EXIT_OK, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema"] == "memforensics/heap/1"
