"""Malloc_info documents."""
