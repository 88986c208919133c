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
from drapps.control.state import State

FORMAT = 1
ACTIONS = Action.space()


KNOBS = ("workers", "prefetch")
"""The knobs :data:`ACTIONS` move (the shipped policy's); a policy file names its knobs and a
pipeline without them refuses it."""


def action_names(knobs: Sequence[str] = KNOBS) -> list[str]:
    """How a policy file names the actions it scores, in ``Action.space(knobs)`` order."""
    return [action.describe(knobs) for action in Action.space(knobs)]


ACTION_NAMES = action_names()


class MlpPolicy:
    """Picks the action with the highest score from ``State.vector()`` through tanh layers.

    Args:
        layers: ``(weight, bias)`` per layer, weight shaped (inputs, outputs); the last layer
            has one output per action of :meth:`Action.space`.
        meta: anything worth keeping with the weights (how it was trained, its evaluation).
        knobs: the step knobs it moves (``Action.space(knobs)`` is its output order; with
            ``split`` it also reads ``State.SPLIT_FEATURES``).

    Example:
        >>> import numpy as np
        >>> from drapps.control.rl import MlpPolicy
        >>> policy = MlpPolicy.shipped()
        >>> policy.scores(np.zeros(14, dtype=np.float32)).shape
        (9,)
    """

    def __init__(
        self,
        layers: Sequence[tuple[np.ndarray, np.ndarray]],
        meta: dict[str, Any] | None = None,
        knobs: Sequence[str] = KNOBS,
    ) -> None:
        if not layers:
            raise ValueError("an MlpPolicy needs at least one layer")
        self.knobs = tuple(knobs)
        """The knobs this policy moves; a Controller without them refuses it."""
        self.actions = Action.space(self.knobs)
        checked = []
        width = len(State.features(self.knobs))
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
        if width != len(self.actions):
            raise ValueError(f"the last layer must have {len(self.actions)} outputs, got {width}")
        self.layers = checked
        self.meta = dict(meta or {})

    def hidden(self, features: np.ndarray) -> np.ndarray:
        """The last hidden layer's activations: what the output layer scores."""
        x = np.asarray(features, dtype=np.float32)
        for weight, bias in self.layers[:-1]:
            x = x @ weight + bias
            np.tanh(x, out=x)
        return x

    def scores(self, features: np.ndarray) -> np.ndarray:
        """One score per action (logits or Q-values) for a feature vector, or a batch of them."""
        weight, bias = self.layers[-1]
        return self.hidden(features) @ weight + bias

    def decide(self, state: State) -> Action:
        scores = self.scores(state.vector(self.knobs))
        action = self.actions[int(np.argmax(scores))]
        if action.is_noop:
            return action
        return dataclasses.replace(
            action,
            reason=(
                f"learned policy: {action.describe(self.knobs)} (waited "
                f"{state.wait_fraction:.0%}, {state.idle_cores:.1f} idle cores, "
                f"{state.queue_batches}/{state.prefetch} ready)"
            ),
        )

    # ------------------------------------------------------------------ files

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the policy as a ``.npz`` (weights plus a JSON header)."""
        header = {
            "format": FORMAT,
            "features": list(State.features(self.knobs)),
            "actions": action_names(self.knobs),
            "knobs": list(self.knobs),
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
        try:
            checks = (("features", list(State.features(knobs))), ("actions", action_names(knobs)))
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"{path}: trained on knobs {knobs!r}, which this drapps lacks: {exc}"
            ) from None
        for key, ours in checks:
            if header.get(key) != ours:
                raise ValueError(
                    f"{path}: trained on {key} {header.get(key)!r}, this drapps has {ours!r}"
                )
        meta = header.get("meta")
        try:
            return cls(layers, meta if isinstance(meta, dict) else None, knobs)
        except ValueError as exc:
            raise ValueError(f"{path}: malformed policy: {exc}") from exc

    @classmethod
    def shipped(cls) -> MlpPolicy:
        """The policy that ships with drapps (trained by ``drapps train-policy``)."""
        return cls.load(shipped_path())


def shipped_path() -> Path:
    return Path(str(resources.files("drapps.control") / "policies" / "rl.npz"))
