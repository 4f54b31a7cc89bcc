"""`memforensics diff`: what changed between two saved malloc_info dumps, or between two
census documents (`census --json`): per type, biggest growth first."""

from __future__ import annotations

import click

from memforensics.analysis.diff import diff_dumps
from memforensics.cli import COMMAND_SUMMARIES
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
  memforensics diff census-before.json census-after.json
  memforensics diff --json a.json b.json | jq '.types[0] | .name, .count_delta'
\b
Two census documents (memforensics census --json) are compared type by
type: the change in count and bytes, biggest growth first, with the rate per
hour from their times: the leaking type comes first.
\b
glibc numbers arenas from the main arena (0) through the newest (1) to the
oldest, and a new arena becomes 1, moving the older ones up. Main is paired
with main, the others counted from the oldest: old k is new k + (arenas added).
Each row shows both numbers (2 → 3). A file holding a series of dumps
contributes its last dump.
"""


def _is_census(name: str) -> bool:
    from memforensics.sources.files.census_doc import looks_like_census

    if name == "-":
        return False
    try:
        with open(name, "rb") as handle:
            return looks_like_census(handle.read(4096))
    except OSError:
        return False


def _census_diff(old: str, new: str, as_json: bool, show_all: bool) -> None:
    from memforensics.analysis.census_diff import diff_censuses
    from memforensics.sources.files.census_doc import read_census

    old_types, old_time = read_census(*input_source(old))
    new_types, new_time = read_census(*input_source(new))
    diff = diff_censuses(old_types, new_types, old_time=old_time, new_time=new_time)
    if as_json:
        from memforensics.render.census_json import census_diff_json

        emit_json(census_diff_json(diff, old_name=old, new_name=new))
        return
    from memforensics.render.census import render_census_diff

    stdout_console().print(
        render_census_diff(diff, old_name=old, new_name=new, top=None if show_all else 20)
    )


def _last_dump(name: str) -> HeapDump:
    source, label = input_source(name)
    last = None
    for dump in iter_dumps(source, name=label):
        last = dump
    if last is None:  # iter_dumps raises first; kept for the type checker
        raise InputDataError("no <malloc> document found", source=label)
    return last


@click.command(
    name="diff", short_help=COMMAND_SUMMARIES["diff"], epilog=EXAMPLES + "\n" + exit_codes_epilog()
)
@click.argument("old", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.argument("new", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.option(
    "--all",
    "show_unchanged",
    is_flag=True,
    help="Also list arenas that did not change (censuses: every changed type).",
)
@json_option
@verbose_files_option
def command(old: str, new: str, show_unchanged: bool, as_json: bool, verbose: bool) -> None:
    """Compare two saved dumps (or two censuses), OLD then NEW: what changed."""
    if old == "-" and new == "-":
        raise click.UsageError("only one of OLD and NEW can be - (stdin)")
    census_old, census_new = _is_census(old), _is_census(new)
    if census_old or census_new:
        if not (census_old and census_new):
            raise InputDataError(
                "one input is a census document and the other is not",
                hint="diff compares two censuses or two malloc_info dumps",
            )
        _census_diff(old, new, as_json, show_unchanged)
        return
    diff = diff_dumps(_last_dump(old), _last_dump(new))
    if as_json:
        emit_json(diff_json(diff, old_name=old, new_name=new))
    else:
        stdout_console().print(
            render_diff(diff, old_name=old, new_name=new, show_unchanged=show_unchanged)
        )
