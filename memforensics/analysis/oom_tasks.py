"""The kernel's task table (``dump_tasks``) at an OOM: rows parsed by the header's column
names (every generation's column set), the victim's row, sizes in bytes, the top consumers."""

from __future__ import annotations

from memforensics.model.oom import TopTask

DEFAULT_PAGE_BYTES = 4096
TOP_TASKS = 5
_PAGE_SIZES = (4096, 16384, 65536)
# Column names of the task table and the TopTask field (and unit) each feeds.
_PAGE_COLUMNS = {
    "total_vm": "total_vm_bytes",
    "rss": "rss_bytes",
    "rss_anon": "rss_anon_bytes",
    "rss_file": "rss_file_bytes",
    "rss_shmem": "rss_shmem_bytes",
    "swapents": "swap_bytes",
}

Row = dict[str, int | str]


def parse_row(columns: list[str], rest: str) -> Row | None:
    """One table row after its ``[ pid ]``: numeric columns as ints, the name (may contain
    spaces) as the rest; None if the row does not fit the header."""
    values = rest.split(None, len(columns) - 1)
    if len(values) != len(columns):
        return None
    parsed: Row = {"name": values[-1]}
    try:
        for column, value in zip(columns[:-1], values[:-1], strict=False):
            parsed[column] = int(value)
    except ValueError:
        return None
    return parsed


def victim_row(rows: dict[int, Row], pid: int, name: str | None = None) -> Row | None:
    """The victim's task-table row: by pid, else the row whose tgid is the victim's pid (the
    table may list another thread of the process than the one the kill line names), else the
    only row of the victim's name (old kernels' selection line names the chosen thread, which
    the table, one row per process, lists under its leader's pid: RHEL 7 memcg OOMs)."""
    row = rows.get(pid)
    if row is not None:
        return row
    for candidate in rows.values():
        if candidate.get("tgid") == pid:
            return candidate
    if name is not None:
        named = [candidate for candidate in rows.values() if candidate.get("name") == name]
        if len(named) == 1:
            return named[0]
    return None


def row_sizes(
    row: Row, page_bytes: int
) -> tuple[int | None, int | None, int | None, int | None, int | None]:
    """(total_vm, anon, file, shmem, rss) in bytes from a task-table row (pages)."""

    def pages(column: str) -> int | None:
        value = row.get(column)
        return value * page_bytes if isinstance(value, int) else None

    return (
        pages("total_vm"),
        pages("rss_anon"),
        pages("rss_file"),
        pages("rss_shmem"),
        pages("rss"),
    )


def page_size(row: Row | None, total_vm_bytes: int | None) -> tuple[int, int | None]:
    """(page size to use, page size inferred or None): the victim's table row in pages against
    its Killed line in kB gives the machine's page size (4 KiB x86-64, 16/64 KiB arm64/ppc64)."""
    if row is None or total_vm_bytes is None:
        return DEFAULT_PAGE_BYTES, None
    pages = row.get("total_vm")
    if not isinstance(pages, int) or pages <= 0:
        return DEFAULT_PAGE_BYTES, None
    ratio = total_vm_bytes / pages
    best = min(_PAGE_SIZES, key=lambda size: abs(size - ratio))
    if abs(best - ratio) > best * 0.05:
        return DEFAULT_PAGE_BYTES, None
    return best, best


def top_tasks(rows: dict[int, Row], page_bytes: int) -> tuple[TopTask, ...]:
    """The biggest rows of the task table by rss, converted to bytes."""
    tasks = []
    for pid, row in rows.items():
        values: dict[str, int | None] = {}
        for column, attribute in _PAGE_COLUMNS.items():
            value = row.get(column)
            values[attribute] = value * page_bytes if isinstance(value, int) else None
        pgtables = row.get("pgtables_bytes")
        uid, tgid, adj = row.get("uid"), row.get("tgid"), row.get("oom_score_adj")
        tasks.append(
            TopTask(
                pid=pid,
                name=str(row["name"]),
                uid=uid if isinstance(uid, int) else None,
                tgid=tgid if isinstance(tgid, int) else None,
                pgtables_bytes=pgtables if isinstance(pgtables, int) else None,
                oom_score_adj=adj if isinstance(adj, int) else None,
                **values,
            )
        )
    tasks.sort(key=lambda task: task.rss_bytes or 0, reverse=True)
    return tuple(tasks[:TOP_TASKS])
