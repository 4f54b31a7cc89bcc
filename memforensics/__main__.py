"""Allow ``python -m memforensics``."""

from memforensics.cli import main

if __name__ == "__main__":
    main()
