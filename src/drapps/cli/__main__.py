"""``python -m drapps.cli``: the ``drapps`` command."""

import sys

from drapps.cli import main

sys.exit(main())
