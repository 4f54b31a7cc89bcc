"""A scouted arena walked before its stop (ArenaWalker.prepare_stop), on glibc 2.31, 2.36 and
2.41: a thread arena of 48 MiB whose ~100 free chunks lie 128 pages apart
(tests/targets/prepared_lists.c).

Its scout's copy is walked while the target runs, and the check its stop will make (every word
that walk read, against the held target) is planned then; the stop reads and compares those
words and, where they all hold, takes that walk as its own. The oracle is the target's own
malloc_info(0), written through a FILE opened before its first allocation with a static buffer:
the read's document must equal it byte for byte. Then the lists are changed, or corrupted,
while the read waits between the walk before the stop and the stop (the test's hook there asks
the target's worker to do it in its arena): the bins' heads, and every word of the malloc_state,
stay as the walk read them, so only the check can tell. It must: the changed arena is copied
again in its stop and read as it is now (the target's own document, after the change); the
corrupted one is named as glibc names it, never called into.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from memforensics.entry.readers.memory import inspect_read_only
from memforensics.errors import HeapCorruptionError
from memforensics.model.corruption import LARGEBIN_LIST
from memforensics.sources.glibc import glibc_walk
from memforensics.sources.glibc.glibc_arenas import ArenaState
from tests.support.census_targets import command as ask
from tests.support.glibc_releases import build_target, command
from tests.support.targets import Target, live_skip_reason, proc_status, running

_SKIP = live_skip_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""),
]

TUNABLES = f"glibc.malloc.arena_max=2:glibc.malloc.mmap_threshold={32 << 20}"
TAKEN_BIN = 96  # glibc's large bin of 3,072..3,135-byte chunks (largebin_index_64)


def _start(release: Any, xml: Path) -> Any:
    binary = build_target(release, "prepared_lists")
    return running(
        command(release, binary, [str(xml)]),
        env={"GLIBC_TUNABLES": TUNABLES},
        stdin=subprocess.PIPE,
        ready_timeout_seconds=60,
    )


def _assert_running(pid: int) -> None:
    fields = proc_status(pid)
    assert fields["TracerPid"] == "0" and fields["State"][0] not in "Tt", fields


def _between_walk_and_stop(
    monkeypatch: pytest.MonkeyPatch, target: Target, line: str, answer: str
) -> tuple[list[str], list[bool]]:
    """``line`` sent to the target (and its answer awaited) right after the walk before the
    thread arena's stop was made, once: (the answers, whether each such walk was kept)."""
    answers: list[str] = []
    walked: list[bool] = []
    prepare: Callable[..., None] = glibc_walk.ArenaWalker.prepare_stop
    prewalk: Callable[..., Any] = glibc_walk.ArenaWalker._prewalk

    def counted(walker: glibc_walk.ArenaWalker, state: ArenaState, deadline: float) -> Any:
        made = prewalk(walker, state, deadline)
        walked.append(made is not None)
        return made

    def then_change(walker: glibc_walk.ArenaWalker, state: ArenaState, deadline: float) -> None:
        prepare(walker, state, deadline)
        if not answers:
            answers.append(ask(target, line, answer))

    monkeypatch.setattr(glibc_walk.ArenaWalker, "_prewalk", counted)
    monkeypatch.setattr(glibc_walk.ArenaWalker, "prepare_stop", then_change)
    return answers, walked


def test_an_arena_walked_before_its_stop_reads_as_its_own_malloc_info_changed_or_not(
    release: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read twice. Undisturbed, the stop takes the walk made before it: the document is the
    target's own. Then a chunk is taken from the middle of a large bin after that walk was
    made: the stop's check finds its neighbours' links changed, copies the lists' pages
    again and walks them there; the document is the target's own after the change."""
    own = tmp_path / "own.xml"
    with _start(release, own) as target:
        quiet = inspect_read_only(target.pid)
        ask(target, "xml", "xml")
        before = own.read_bytes()
        answers, walked = _between_walk_and_stop(monkeypatch, target, "take", "took")
        changed = inspect_read_only(target.pid)
        ask(target, "xml", "xml")
        _assert_running(target.pid)
    assert quiet.capture.xml == before
    kept = quiet.read_only
    assert kept is not None
    assert (kept.scouted_arenas, kept.scout_kept_arenas, kept.walked_before_stop_arenas) == (
        1,
        1,
        1,
    ), kept
    assert answers and walked == [True], (answers, walked)
    assert changed.capture.xml == own.read_bytes() != before
    copied = changed.read_only
    assert copied is not None
    assert (copied.scouted_arenas, copied.scout_kept_arenas) == (1, 0), copied
    assert copied.walked_before_stop_arenas == 0, copied
    # The lists' pages copied again (~100 of them), where the check read a few words a chunk
    # (the main arena's stop copied the same in both reads).
    assert copied.stop_copy_bytes > kept.stop_copy_bytes + (256 << 10), (kept, copied)


@pytest.mark.parametrize("when", ["before-the-read", "between-the-walk-and-the-stop"])
def test_a_list_corrupted_in_an_arena_checked_in_its_stop_is_named_never_called_into(
    release: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """The bk of a chunk in the middle of a large bin overwritten, before the read (no walk
    is kept before the stop: that list does not read back) or after the walk before the stop
    (the stop's check finds the word changed): either way the stop copies the lists' pages,
    finds that list inconsistent while every thread is held, and names the chunk with
    glibc's words. Nothing is called into the target, which runs on untraced."""
    with _start(release, tmp_path / "own.xml") as target:
        if when == "before-the-read":
            answers = [ask(target, "corrupt", "corrupted")]
            walked: list[bool] = []
        else:
            answers, walked = _between_walk_and_stop(monkeypatch, target, "corrupt", "corrupted")
        with pytest.raises(HeapCorruptionError) as raised:
            inspect_read_only(target.pid)
        _assert_running(target.pid)
        assert target.alive()
    assert answers, answers
    if when != "before-the-read":
        assert walked == [True], walked
    corrupt = int(answers[0].split()[1], 16)
    findings = raised.value.findings
    assert [(f.bin, f.chunk_address, f.check) for f in findings] == [
        (f"large bin {TAKEN_BIN}", corrupt, LARGEBIN_LIST)
    ], findings
