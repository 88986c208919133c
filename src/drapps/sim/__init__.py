"""A discrete-event simulator of the data pipeline, with the real State/Action/Reward."""

from drapps.sim.engine import Simulator, Totals
from drapps.sim.scenario import Change, Pipeline, Scenario

__all__ = ["Change", "Pipeline", "Scenario", "Simulator", "Totals"]
