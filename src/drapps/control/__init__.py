"""Control: State, Action and Reward definitions, policies, and the controller loop.

Importing this package registers the built-in policies (heuristic, rl, static) in
:data:`POLICIES`.
"""

from drapps.control.action import NOOP, Action
from drapps.control.controller import Actuators, Bounds, Controller, Tick
from drapps.control.heuristic import HeuristicConfig, HeuristicPolicy
from drapps.control.policy import POLICIES, Policy, make_policy, policy_names, register_policy
from drapps.control.reward import RewardWeights, reward
from drapps.control.rl import MlpPolicy
from drapps.control.state import State
from drapps.control.static import StaticPolicy

__all__ = [
    "NOOP",
    "POLICIES",
    "Action",
    "Actuators",
    "Bounds",
    "Controller",
    "HeuristicConfig",
    "HeuristicPolicy",
    "MlpPolicy",
    "Policy",
    "RewardWeights",
    "State",
    "StaticPolicy",
    "Tick",
    "make_policy",
    "policy_names",
    "register_policy",
    "reward",
]
