"""What fills a heap, read from a target's memory: C++ types by RTTI, CPython objects,
pymalloc pools."""
