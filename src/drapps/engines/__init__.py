"""Engines: what makes a loader's batches, behind one protocol (:class:`Engine`).

The loader holds DataLoader's arguments; :func:`~drapps.engines.assembly.assemble` chooses
the engine (:func:`~drapps.engines.choice.choose_engine`) and builds the owners of the other
knobs around it; the cursor plans epochs and keeps resume state; the epoch iterator takes the
engine's batches through the device stage.
"""

from drapps.engines.backends import BACKENDS, Backend, ProcessBackend, RayBackend
from drapps.engines.base import Engine, EngineBatch, EpochJob, Limits
from drapps.engines.inline import InlineEngine
from drapps.engines.pooled import PoolEngine
from drapps.engines.source import Source
from drapps.engines.stream import StreamEngine

__all__ = [
    "BACKENDS",
    "Backend",
    "Engine",
    "EngineBatch",
    "EpochJob",
    "InlineEngine",
    "Limits",
    "PoolEngine",
    "ProcessBackend",
    "RayBackend",
    "Source",
    "StreamEngine",
]
