"""`memforensics diff`: placeholder until its issue lands (replaced by the owner)."""

from __future__ import annotations

import click

from memforensics.errors import ToolingError


@click.command(name="diff")
def command() -> None:
    """Not built yet."""
    raise ToolingError("'diff' is not built yet")
