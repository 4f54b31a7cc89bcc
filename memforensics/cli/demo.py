"""`memforensics demo`: placeholder until its issue lands (replaced by the owner)."""

from __future__ import annotations

import click

from memforensics.errors import ToolingError


@click.command(name="demo")
def command() -> None:
    """Not built yet."""
    raise ToolingError("'demo' is not built yet")
