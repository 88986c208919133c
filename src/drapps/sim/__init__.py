"""A discrete-event simulator of the data pipeline, with the real State/Action/Reward.

The gymnasium environment (``drapps.sim.env``) and the learners (``drapps.sim.learners``)
need the ``rl`` extra; everything here needs only NumPy.
"""

from drapps.sim.calibration import RecordedRun, Replay, calibrate, record, replay
from drapps.sim.engine import Simulator, Totals
from drapps.sim.evaluate import Evaluation, evaluate
from drapps.sim.families import draw, family_names, register_family
from drapps.sim.run import SimRun, oracle_static, simulate
from drapps.sim.scenario import Change, PipelineModel, Scenario

__all__ = [
    "Change",
    "Evaluation",
    "PipelineModel",
    "RecordedRun",
    "Replay",
    "Scenario",
    "SimRun",
    "Simulator",
    "Totals",
    "calibrate",
    "draw",
    "evaluate",
    "family_names",
    "oracle_static",
    "record",
    "register_family",
    "replay",
    "simulate",
]


def __getattr__(name: str) -> object:
    # The old name of PipelineModel, kept working for a while: `Pipeline` now means the op
    # pipeline (drapps.ops.Pipeline).
    if name == "Pipeline":
        import warnings

        warnings.warn(
            "drapps.sim.Pipeline is now drapps.sim.PipelineModel", DeprecationWarning, stacklevel=2
        )
        return PipelineModel
    raise AttributeError(f"module 'drapps.sim' has no attribute {name!r}")
