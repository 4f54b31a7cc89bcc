"""The live glibc heap read through /proc."""
