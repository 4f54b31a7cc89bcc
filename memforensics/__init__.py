"""memforensics: glibc heap forensics for live processes, saved dumps and OOM kills.

The library (everything but ``memforensics.cli`` and ``memforensics.render``) never
prints and never imports click or rich, so ``import memforensics`` gives the same data
the command line shows.
"""

__version__ = "0.1.0"
