"""``python -m wmbook run ...``: same as the ``wmbook`` console script."""

import sys

from wmbook.cli import main

if __name__ == "__main__":
    sys.exit(main())
