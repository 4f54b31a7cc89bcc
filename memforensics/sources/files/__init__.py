"""Saved files: recordings, report inputs, atomic writes."""
