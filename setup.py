"""Build hook for the optional C accelerator of the residency walk.

Everything else is declared in pyproject.toml. The extension is optional: without a C
compiler ``pip install .`` still succeeds and memforensics uses its pure-Python loop.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "memforensics.sources.glibc._chunkwalk",
            ["memforensics/sources/glibc/_chunkwalk.c"],
            optional=True,
        )
    ]
)
