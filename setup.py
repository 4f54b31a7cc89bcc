"""Build hook for the optional C accelerators: the residency walk's copy and loops, the
the free lists' scout, the census walk's window loop and its classifying loops, and the ptrace hold's per-thread requests.

Everything else is declared in pyproject.toml. The extensions are optional: without a C
compiler ``pip install .`` still succeeds and memforensics uses its pure-Python loops.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "memforensics.sources.glibc._chunkwalk",
            ["memforensics/sources/glibc/_chunkwalk.c"],
            depends=["memforensics/sources/glibc/_procmem_read.h"],
            optional=True,
        ),
        Extension(
            "memforensics.sources.glibc._listscout",
            ["memforensics/sources/glibc/_listscout.c"],
            depends=["memforensics/sources/glibc/_procmem_read.h"],
            optional=True,
        ),
        Extension(
            "memforensics.sources.glibc._heapwindow",
            ["memforensics/sources/glibc/_heapwindow.c"],
            optional=True,
        ),
        Extension(
            "memforensics.sources.census._censuswindow",
            ["memforensics/sources/census/_censuswindow.c"],
            optional=True,
        ),
        Extension(
            "memforensics.sources.proc._ptrace_batch",
            ["memforensics/sources/proc/_ptrace_batch.c"],
            optional=True,
        ),
    ]
)
