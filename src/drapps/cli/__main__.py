"""``python -m drapps.cli``: the ``drapps`` command."""

import sys

from drapps.cli import main

if __name__ == "__main__":
    sys.exit(main())
