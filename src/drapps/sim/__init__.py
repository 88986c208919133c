"""A discrete-event simulator of the data pipeline, with the real State/Action/Reward.

The gymnasium environment (``drapps.sim.env``) and the learners (``drapps.sim.learners``)
need the ``rl`` extra; everything here needs only NumPy.
"""

from drapps.sim.calibration import RecordedRun, Replay, calibrate, record, replay
from drapps.sim.engine import Simulator, Totals
from drapps.sim.evaluate import Evaluation, evaluate
from drapps.sim.families import draw, family_names, register_family
from drapps.sim.run import SimRun, oracle_static, simulate
from drapps.sim.scenario import Change, Pipeline, Scenario

__all__ = [
    "Change",
    "Evaluation",
    "Pipeline",
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
