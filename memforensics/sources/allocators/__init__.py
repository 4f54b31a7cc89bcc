"""Allocators other than glibc's (jemalloc, tcmalloc, mimalloc): where they live in a
process, and their own statistics and purge, called in the target without gdb."""
