"""Gdb sessions and surviving our own death."""
