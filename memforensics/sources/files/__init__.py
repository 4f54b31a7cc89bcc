"""Saved files: recordings, report inputs, atomic writes, core files of dead processes."""
