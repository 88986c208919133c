"""``one_run.py`` with the dispatcher's constants set by hand, for A/B rounds of one rule.

    python docs/results/stragglers/constants.py --parts-per-worker 1 -- --workers 6 --step-ms 0
    python docs/results/stragglers/constants.py --no-copies -- --workers 6 --step-ms 0

``--parts-per-worker N`` fixes the parts a batch is cut into per worker (the dispatcher
otherwise picks one or two by the training loop's wait); ``--no-copies`` turns off the copies
of overdue parts, and ``--hedge-factor F`` copies a part once it has run F times its predicted
cost (times the measured stretch; 4 by default). The arguments after ``--`` go to
``one_run.py``.
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

import drapps.runtime.hedging as hedging
import drapps.runtime.schedule as schedule


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts-per-worker", type=int)
    parser.add_argument("--no-copies", action="store_true")
    parser.add_argument("--hedge-factor", type=float, help="a part is overdue at F x its cost")
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.parts_per_worker is not None:
        fixed = args.parts_per_worker
        schedule.Schedule.note_wait = lambda self, waited_s, now: setattr(  # type: ignore[method-assign]
            self, "parts_per_worker", fixed
        )
    if args.no_copies:
        hedging.HEDGE_FACTOR = float("inf")
    elif args.hedge_factor is not None:
        hedging.HEDGE_FACTOR = args.hedge_factor
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    sys.argv = ["one_run.py", *rest]
    runpy.run_path(str(Path(__file__).with_name("one_run.py")), run_name="__main__")


if __name__ == "__main__":
    main()
