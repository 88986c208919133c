"""Prioritized experience replay (Schaul et al., 2016) over a sum tree.

Transitions are drawn with probability proportional to ``priority ** alpha``; importance weights
``(N * P(i)) ** -beta``, normalised by their maximum, undo the bias this sampling adds.
"""

from __future__ import annotations

import numpy as np


class SumTree:
    """A binary tree whose leaves hold priorities and whose nodes hold their subtree's sum:
    finding the leaf under a cumulative value and updating one leaf are both O(log n)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity!r}")
        self.capacity = capacity
        # Leaves padded to a power of two keep them in order, all at the same depth.
        self._leaves = 1 << (capacity - 1).bit_length()
        self.nodes = np.zeros(2 * self._leaves - 1, dtype=np.float64)

    @property
    def total(self) -> float:
        return float(self.nodes[0])

    def update(self, leaf: int, priority: float) -> None:
        if not 0 <= leaf < self.capacity:
            raise IndexError(f"leaf must be in [0, {self.capacity}), got {leaf}")
        node = leaf + self._leaves - 1
        change = priority - self.nodes[node]
        while True:
            self.nodes[node] += change
            if node == 0:
                break
            node = (node - 1) // 2

    def find(self, value: float) -> int:
        """The leaf whose cumulative range holds ``value`` (0 <= value < total)."""
        node = 0
        while node < self._leaves - 1:
            left = 2 * node + 1
            if value < self.nodes[left] or self.nodes[left + 1] <= 0:
                node = left
            else:
                value -= self.nodes[left]
                node = left + 1
        return min(node - (self._leaves - 1), self.capacity - 1)

    def priority(self, leaf: int) -> float:
        return float(self.nodes[leaf + self._leaves - 1])


class PrioritizedReplay:
    """A ring buffer of (obs, action, reward, next_obs, done) with prioritized sampling."""

    def __init__(self, capacity: int, obs_size: int, *, alpha: float = 0.6, eps: float = 1e-3):
        if not 0 <= alpha <= 1:
            raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
        self.tree = SumTree(capacity)
        self.alpha, self.eps = alpha, eps
        self.obs = np.zeros((capacity, obs_size), dtype=np.float32)
        self.next_obs = np.zeros((capacity, obs_size), dtype=np.float32)
        self.actions = np.zeros(capacity, dtype=np.int64)
        self.rewards = np.zeros(capacity, dtype=np.float32)
        self.dones = np.zeros(capacity, dtype=np.float32)
        self.size = 0
        self._next = 0
        self._max_priority = 1.0

    def __len__(self) -> int:
        return self.size

    def add(
        self, obs: np.ndarray, action: int, reward: float, next_obs: np.ndarray, done: bool
    ) -> None:
        """Store a transition at the highest priority seen, so it is replayed at least once."""
        i = self._next
        self.obs[i], self.actions[i], self.rewards[i] = obs, action, reward
        self.next_obs[i], self.dones[i] = next_obs, float(done)
        self.tree.update(i, self._max_priority**self.alpha)
        self._next = (i + 1) % self.tree.capacity
        self.size = min(self.size + 1, self.tree.capacity)

    def sample(
        self, batch: int, beta: float, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """``batch`` indices (one per equal slice of the total priority) and their weights."""
        if self.size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        total = self.tree.total
        bounds = np.linspace(0.0, total, batch + 1)
        values = rng.uniform(bounds[:-1], bounds[1:])
        indices = np.array([min(self.tree.find(v), self.size - 1) for v in values])
        probabilities = np.array([self.tree.priority(i) for i in indices]) / total
        weights = (self.size * np.maximum(probabilities, 1e-12)) ** -beta
        return indices, (weights / weights.max()).astype(np.float32)

    def update(self, indices: np.ndarray, errors: np.ndarray) -> None:
        """New priorities from the TD errors of a replayed batch."""
        for i, error in zip(indices, np.abs(errors) + self.eps, strict=True):
            self._max_priority = max(self._max_priority, float(error))
            self.tree.update(int(i), float(error) ** self.alpha)
