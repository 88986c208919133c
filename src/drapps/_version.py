"""The package version, in a module of its own so any part of drapps can read it."""

__version__ = "0.1.0"
