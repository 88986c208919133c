"""The ``drapps`` command line: one module per command group, one exit-code convention.

``main`` returns 0 on success and 2 on a usage error (bad option, unknown name, unreadable
input), which it prints as one line on stderr, never a traceback. Each group module provides
``add_commands(commands)``; a command is a function ``(args) -> int`` that raises
:class:`UsageError` (or ``ValueError``) for bad input.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from drapps.cli import bench, codec, profile, serve, sim, train
from drapps.cli._args import Parser, UsageError

GROUPS = (bench, profile, train, sim, codec, serve)


def build_parser() -> Parser:
    parser = Parser(prog="drapps", description="drapps: keep a training loop fed.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for group in GROUPS:
        group.add_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``drapps`` command; returns its exit code (2: usage error)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    try:
        return int(args.run(args))
    except UsageError as exc:
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        print(f"drapps {args.command}: {lines[0]}", file=sys.stderr)
        return 2


__all__ = ["UsageError", "build_parser", "main"]
