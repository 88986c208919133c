"""Import every module of drapps in an install with no extras (run by `make core`).

A module may need an extra only if it says so on import, with the install line to use
(`pip install 'drapps-loader[extra]'`); any other failure means `import drapps` with no extras
breaks.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import drapps


def main() -> int:
    names = [m.name for m in pkgutil.walk_packages(drapps.__path__, "drapps.")]
    gated, broken = [], []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            gated_here = "pip install 'drapps-loader[" in str(exc)
            (gated if gated_here else broken).append(f"{name}: {exc}")
        except Exception as exc:
            broken.append(f"{name}: {type(exc).__name__}: {exc}")
    print(
        f"imported {len(names) - len(gated) - len(broken)} of {len(names)} modules with no extras"
    )
    for line in gated:
        print(f"  needs an extra, and says so: {line}")
    for line in broken:
        print(f"  BROKEN: {line}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
