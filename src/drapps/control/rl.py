"""The learned policy: a small MLP trained in the simulator, run with NumPy.

Training needs the ``rl`` extra (``drapps train-policy``); running a trained policy needs
nothing but NumPy. The package ships one (``policies/rl.npz``), which ``Loader(policy="rl")``
uses. A policy file holds the layers and the feature and action lists it was trained on, so a
file from an incompatible drapps is refused instead of misread.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from drapps.control.action import Action
from drapps.control.heuristic import HeuristicConfig, HeuristicPolicy
from drapps.control.policy import register_policy
from drapps.control.state import State

FORMAT = 1
ACTIONS = Action.space()


KNOBS = ("workers", "prefetch")
"""The knobs :data:`ACTIONS` move (the shipped policy's); a policy file names its knobs and a
pipeline without them refuses it."""
TRAINED_INTERVAL = 0.5
"""Seconds between decisions in training (``PipelineEnv``'s and the Loader's default
``control_interval``): what a policy file that does not record its own was trained at."""


def action_names(knobs: Sequence[str] = KNOBS) -> list[str]:
    """How a policy file names the actions it scores, in ``Action.space(knobs)`` order."""
    return [action.describe(knobs) for action in Action.space(knobs)]


ACTION_NAMES = action_names()

FED_WAIT = 0.02
"""A tick whose training loop waited less than this share of it was fed (:func:`may_grow`)."""
BUSY_TO_GROW = 0.9
"""Workers at work (``State.busy_share``) from which a fed loop's pool may still grow."""
STEADY_SPREAD = HeuristicConfig().bursty
"""p99 / p50 of batch times under which batches come steadily (the heuristic's ``bursty``)."""


def may_grow(state: State) -> bool:
    """Whether a learned policy may add a worker on this tick: not while the training loop
    is fed (it waited less than ``FED_WAIT`` of the tick), its workers sat idle part of the
    tick (``busy_share`` under ``BUSY_TO_GROW``: the queue full) and batches came steadily
    (their p99 time under ``STEADY_SPREAD`` times their p50). The pool then makes batches
    faster than the loop takes them and will go on doing so: a worker added makes nothing
    the loop takes sooner, and its memory raises the run's peak for as long as it stays. In
    the simulator such a worker is worth as much as none, so the reward does not tell apart
    a network that adds it from one that does not; the rule does. With bursty batch times a
    full queue can drain in a burst, and a worker added ahead of it pays: growth is left to
    the network, as it is where batches in flight were not measured."""
    if state.wait_fraction >= FED_WAIT or state.in_flight is None:
        return True
    if state.latency_p99_s >= STEADY_SPREAD * state.latency_p50_s:
        return True
    return state.busy_share >= BUSY_TO_GROW


STEP_AT = 1 / 3
"""A continuous output above this takes a +1 step of its knob, below minus this a -1 step."""


def continuous_names(knobs: Sequence[str]) -> list[str]:
    """How a policy file names the outputs of a continuous policy: one per knob, a step knob
    thresholded into a step, ``offload`` set to the share the output maps to."""
    return [f"{knob}:{'share' if knob == 'offload' else 'step'}" for knob in knobs]


def continuous_action(values: np.ndarray, knobs: Sequence[str]) -> Action:
    """The Action of a continuous policy's outputs in [-1, 1], one per knob: a step knob moves
    -1 below ``-STEP_AT``, +1 above ``STEP_AT``, else holds; ``offload`` is set to
    ``(value + 1) / 2``, its share of each batch (a value, not a step: the knob takes any share
    in [0, 1] at once).

    Example:
        >>> continuous_action(np.array([0.9, -0.1, -1.0]), ("workers", "prefetch", "offload"))
        Action(workers=1, prefetch=0, split=0, codec=None, reason='', other={'offload': 0.0})
    """
    steps: dict[str, int] = {}
    share: dict[str, Any] = {}
    for knob, value in zip(knobs, np.clip(values, -1.0, 1.0), strict=True):
        if knob == "offload":
            share["offload"] = round(float(value + 1.0) / 2.0, 4)
        elif value > STEP_AT or value < -STEP_AT:
            steps[knob] = 1 if value > 0 else -1
    action = Action.of_steps(steps)
    return dataclasses.replace(action, other={**action.other, **share}) if share else action


class MlpPolicy:
    """Picks the action with the highest score from ``State.vector()`` through tanh layers.

    Args:
        layers: ``(weight, bias)`` per layer, weight shaped (inputs, outputs); the last layer
            has one output per action of :meth:`Action.space`.
        meta: anything worth keeping with the weights (how it was trained, its evaluation).
        knobs: the step knobs it moves (``Action.space(knobs)`` is its output order; with
            ``split`` it also reads ``State.SPLIT_FEATURES``).
        continuous: True for a policy with one output per knob, squashed by tanh into
            [-1, 1] and turned into an Action by :func:`continuous_action` (what SAC trains);
            False for one score per discrete action, the highest taken (PPO, DDQN).
        features: the State features it reads, in order (default: ``State.features(knobs)``,
            what a policy trained now reads; a file keeps the list it was trained on).

    Example:
        >>> import numpy as np
        >>> from drapps.control.rl import MlpPolicy
        >>> policy = MlpPolicy.shipped()
        >>> policy.scores(np.zeros(len(policy.features), dtype=np.float32)).shape
        (9,)
    """

    def __init__(
        self,
        layers: Sequence[tuple[np.ndarray, np.ndarray]],
        meta: dict[str, Any] | None = None,
        knobs: Sequence[str] = KNOBS,
        continuous: bool = False,
        features: Sequence[str] | None = None,
    ) -> None:
        if not layers:
            raise ValueError("an MlpPolicy needs at least one layer")
        self.knobs = tuple(knobs)
        """The knobs this policy moves; a Controller without them refuses it."""
        self.features = tuple(features) if features is not None else State.features(knobs)
        """The State features it reads (:meth:`State.vector`), in order."""
        unknown = [name for name in self.features if name not in State.ALL_FEATURES]
        if unknown:
            raise ValueError(f"features {unknown} are not State features")
        self.continuous = continuous
        self.actions = Action.space(self.knobs)
        self._adds = np.array([action.workers > 0 for action in self.actions])
        outputs = len(self.knobs) if continuous else len(self.actions)
        checked = []
        width = len(self.features)
        for k, (weight, bias) in enumerate(layers):
            weight = np.asarray(weight, dtype=np.float32)
            bias = np.asarray(bias, dtype=np.float32)
            if weight.ndim != 2 or weight.shape[0] != width or bias.shape != (weight.shape[1],):
                raise ValueError(
                    f"layer {k}: expected a ({width}, n) weight and an (n,) bias, got "
                    f"{weight.shape} and {bias.shape}"
                )
            checked.append((weight, bias))
            width = weight.shape[1]
        if width != outputs:
            raise ValueError(f"the last layer must have {outputs} outputs, got {width}")
        self.layers = checked
        self.meta = dict(meta or {})
        self._rules: HeuristicPolicy | None = None
        self._epoch_left: int | None = None
        interval = self.meta.get("interval", TRAINED_INTERVAL)
        if isinstance(interval, bool) or not isinstance(interval, int | float) or interval <= 0:
            raise ValueError(f"meta['interval'] must be seconds > 0, got {interval!r}")
        self.interval = float(interval)
        """Seconds between its decisions in training. On a controller that ticks faster it
        decides once per this many seconds and holds on the ticks between: one step of a knob
        per tick, taken twice as often as trained, overshoots what the step was learned for,
        and an epoch's start, one tick long in training, spans several short ticks."""
        self._decided_at: float | None = None
        self._ruled: tuple[str, ...] = ()

    def bind(self, movable: tuple[str, ...]) -> None:
        """Hand the pipeline's movable knobs this policy was not trained on (the ``split``,
        the ``offload`` share, the ``codec``) to the heuristic's rules for them, so a pipeline
        with more knobs than the policy still has each one moved. The Controller calls this;
        a policy that lacks a knob the pipeline has is thereby never refused for it (one
        trained on a knob the pipeline lacks still is)."""
        self._ruled = tuple(k for k in movable if k not in self.knobs and k in _RULED)
        self._rules = None
        if self._ruled:
            self._rules = HeuristicPolicy()
            self._rules.bind(self._ruled)

    def hidden(self, features: np.ndarray) -> np.ndarray:
        """The last hidden layer's activations: what the output layer scores."""
        x = np.asarray(features, dtype=np.float32)
        for weight, bias in self.layers[:-1]:
            x = x @ weight + bias
            np.tanh(x, out=x)
        return x

    def scores(self, features: np.ndarray) -> np.ndarray:
        """One score per action (logits or Q-values) for a feature vector, or a batch of them;
        for a continuous policy, one pre-tanh output per knob."""
        weight, bias = self.layers[-1]
        return self.hidden(features) @ weight + bias

    def choose(self, features: np.ndarray) -> Action:
        """The action for one feature vector, without a reason."""
        return self._pick(self.scores(features), grow=True)

    def _pick(self, scores: np.ndarray, grow: bool) -> Action:
        """The best-scored action; ``grow=False`` leaves out every action that adds a worker
        (a continuous policy's worker step is dropped)."""
        if self.continuous:
            action = continuous_action(np.tanh(scores), self.knobs)
            return action if grow or action.workers <= 0 else dataclasses.replace(action, workers=0)
        if not grow:
            scores = np.where(self._adds, -np.inf, scores)
        return self.actions[int(np.argmax(scores))]

    def describe(self, action: Action) -> str:
        """The action in words, as this policy's outputs name it."""
        if self.continuous and "offload" in action.other:
            steps = [k for k in self.knobs if k != "offload"]
            steps_only = {k: v for k, v in action.other.items() if k != "offload"}
            moved = dataclasses.replace(action, reason="", other=steps_only)
            words = moved.describe(steps) if steps else ""
            return f"{words} offload={action.other['offload']:.2f}".strip()
        return action.describe(self.knobs)

    def _no_evidence(self, state: State) -> str | None:
        """Why this tick says nothing about the knobs, or None. The policy reads one tick;
        three kinds of tick show the pipeline starting or stopped, not its rate: one in which
        nothing was delivered or waited for (the run has not begun), one in which an epoch
        began (its first batches are made from an empty queue whatever the knobs): what the
        epoch has left rose, or is known for the first time (the run's first epoch, or one
        after a spell between epochs), and one that ends with the epoch's every batch
        delivered (nothing is left for the workers to make, whatever their number)."""
        began = state.epoch_left is not None and (
            self._epoch_left is None or state.epoch_left > self._epoch_left
        )
        self._epoch_left = state.epoch_left
        if began:
            self._decided_at = state.t  # its next decision: one interval on
            return (
                "learned policy: holding while an epoch begins (its first batches refill the queue)"
            )
        if state.throughput <= 0 and state.wait_fraction <= 0:
            return "learned policy: holding (no batch delivered or waited for this tick)"
        if state.epoch_left == 0:
            return "learned policy: holding (the epoch's batches are all delivered)"
        return None

    def _between_decisions(self, state: State) -> bool:
        """True on a tick less than :attr:`interval` after its last decision (or hold at an
        epoch's start). A State no later than that decision (a new run, or States read out
        of order from a trace) is decided afresh."""
        last = self._decided_at
        if last is None or state.t <= last:
            return False
        return state.t - last < self.interval * 0.999  # float ticks: 0.49999 is 0.5

    def decide(self, state: State) -> Action:
        why = self._no_evidence(state)
        if why is None and self._between_decisions(state):
            why = f"learned policy: holding between decisions (one per {self.interval:g} s)"
        elif why is None:
            self._decided_at = state.t
        masked = False
        if why:
            action = Action(reason=why)
        else:
            scores = self.scores(state.vector(features=self.features))
            action = self._pick(scores, True)
            if action.workers > 0 and not may_grow(state):
                action, masked = self._pick(scores, False), True
        if not action.is_noop:
            action = dataclasses.replace(
                action,
                reason=(
                    f"learned policy: {self.describe(action)} (waited "
                    f"{state.wait_fraction:.0%}, {state.idle_cores:.1f} idle cores, "
                    f"{state.queue_batches}/{state.prefetch} ready)"
                ),
            )
        if masked:
            held = "learned policy: holding" if action.is_noop else action.reason
            action = dataclasses.replace(
                action,
                reason=f"{held}; no worker added: the loop is fed and its workers "
                f"{state.busy_share:.0%} at work",
            )
        if self._rules is None:
            return action
        return _with_rules(action, self._rules.decide(state), self._ruled)

    # ------------------------------------------------------------------ files

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the policy as a ``.npz`` (weights plus a JSON header)."""
        header = {
            "format": FORMAT,
            "features": list(self.features),
            "actions": _output_names(self.knobs, self.continuous),
            "knobs": list(self.knobs),
            "continuous": self.continuous,
            "meta": self.meta,
        }
        arrays: dict[str, Any] = {"header": np.asarray(json.dumps(header))}
        for k, (weight, bias) in enumerate(self.layers):
            arrays[f"w{k}"], arrays[f"b{k}"] = weight, bias
        with open(path, "wb") as file:
            np.savez(file, **arrays)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> MlpPolicy:
        """Read a policy written by :meth:`save`.

        Raises:
            ValueError: the file is not a drapps policy, or was trained on other features or
                actions than this drapps has (naming the file and the difference).
        """
        try:
            # Never unpickles: a policy file is arrays and a JSON header only.
            with np.load(path, allow_pickle=False) as data:
                header = json.loads(str(data["header"]))
                count = sum(1 for name in data.files if name.startswith("w"))
                layers = [(data[f"w{k}"], data[f"b{k}"]) for k in range(count)]
        except (
            Exception
        ) as exc:  # missing, truncated, empty, not a zip, missing arrays, bad JSON ...
            raise ValueError(
                f"{path}: not a drapps policy file ({type(exc).__name__}: {exc})"
            ) from exc
        if not isinstance(header, dict):
            raise ValueError(f"{path}: not a drapps policy file (its header is not a mapping)")
        if header.get("format") != FORMAT:
            raise ValueError(f"{path}: policy format {header.get('format')!r}, expected {FORMAT}")
        header.setdefault("knobs", list(KNOBS))  # files from before knobs were named
        knobs = header["knobs"]
        continuous = header.get("continuous", False)
        if not isinstance(continuous, bool):
            raise ValueError(f"{path}: 'continuous' must be true or false, got {continuous!r}")
        try:
            actions = _output_names(knobs, continuous)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"{path}: trained on knobs {knobs!r}, which this drapps lacks: {exc}"
            ) from None
        if header.get("actions") != actions:
            raise ValueError(
                f"{path}: trained on actions {header.get('actions')!r}, this drapps has {actions!r}"
            )
        features = header.get("features")
        if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
            raise ValueError(f"{path}: 'features' must be a list of names, got {features!r}")
        unknown = [name for name in features if name not in State.ALL_FEATURES]
        if unknown:
            raise ValueError(
                f"{path}: trained on features {unknown} this drapps lacks (it has "
                f"{sorted(State.ALL_FEATURES)})"
            )
        meta = header.get("meta")
        try:
            return cls(
                layers, meta if isinstance(meta, dict) else None, knobs, continuous, features
            )
        except ValueError as exc:
            raise ValueError(f"{path}: malformed policy: {exc}") from exc

    @classmethod
    def shipped(cls) -> MlpPolicy:
        """The policy that ships with drapps (trained by ``drapps train-policy``)."""
        return cls.load(shipped_path())


_RULED = ("split", "offload", "codec")
"""Knobs the heuristic's rules move for a learned policy not trained on them."""


def _with_rules(learned: Action, rules: Action, ruled: Sequence[str]) -> Action:
    """The learned action on its own knobs, and the rules' moves of the ``ruled`` knobs."""
    split = rules.split if "split" in ruled else learned.split
    codec = rules.codec if "codec" in ruled else None
    ruled_other = {k: v for k, v in rules.other.items() if k in ruled}
    reasons = [learned.reason] if learned.reason else []
    if (split != learned.split or codec is not None or ruled_other) and rules.reason:
        reasons.append(f"rule: {rules.reason}")
    return Action(
        workers=learned.workers,
        prefetch=learned.prefetch,
        split=split,
        codec=codec,
        other={**learned.other, **ruled_other},
        reason="; ".join(reasons),
    )


def _output_names(knobs: Sequence[str], continuous: bool) -> list[str]:
    return continuous_names(knobs) if continuous else action_names(knobs)


def shipped_path() -> Path:
    return Path(str(resources.files("drapps.control") / "policies" / "rl.npz"))


@register_policy("rl")
def shipped_policy() -> MlpPolicy:
    """The shipped learned policy (``Loader(policy="rl")``)."""
    return MlpPolicy.shipped()
