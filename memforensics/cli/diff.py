"""`memforensics diff`: what changed between two saved malloc_info dumps."""

from __future__ import annotations

import click

from memforensics.analysis.diff import diff_dumps
from memforensics.cli.inputs import input_source
from memforensics.cli.options import exit_codes_epilog, json_option, verbose_files_option
from memforensics.cli.output import emit_json, stdout_console
from memforensics.errors import InputDataError
from memforensics.model.heap import HeapDump
from memforensics.render.diff import diff_json, render_diff
from memforensics.sources.malloc_info.malloc_xml import iter_dumps

EXAMPLES = """\b
Examples:
  memforensics diff yesterday.xml today.xml
  memforensics diff --json before.xml after.xml | jq .totals.free_delta_bytes
\b
glibc numbers arenas from the main arena (0) through the newest (1) to the
oldest, and a new arena becomes 1, moving the older ones up. Main is paired
with main, the others counted from the oldest: old k is new k + (arenas added).
Each row shows both numbers (2 → 3). A file holding a series of dumps
contributes its last dump.
"""


def _last_dump(name: str) -> HeapDump:
    source, label = input_source(name)
    last = None
    for dump in iter_dumps(source, name=label):
        last = dump
    if last is None:  # iter_dumps raises first; kept for the type checker
        raise InputDataError("no <malloc> document found", source=label)
    return last


@click.command(name="diff", epilog=EXAMPLES + "\n" + exit_codes_epilog())
@click.argument("old", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.argument("new", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.option("--all", "show_unchanged", is_flag=True, help="Also list arenas that did not change.")
@json_option
@verbose_files_option
def command(old: str, new: str, show_unchanged: bool, as_json: bool, verbose: bool) -> None:
    """Compare two saved dumps, OLD then NEW: per-arena and total change."""
    if old == "-" and new == "-":
        raise click.UsageError("only one of OLD and NEW can be - (stdin)")
    diff = diff_dumps(_last_dump(old), _last_dump(new))
    if as_json:
        emit_json(diff_json(diff, old_name=old, new_name=new))
    else:
        stdout_console().print(
            render_diff(diff, old_name=old, new_name=new, show_unchanged=show_unchanged)
        )
