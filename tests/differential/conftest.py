"""The differential harness: its helpers import by their own names (``cases``, ``compare``,
``harness``), here and in the spawned workers that unpickle its datasets."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
