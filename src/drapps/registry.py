"""Registry: one name -> member table per family (policies, learners, workloads, codecs, ...).

A family's package makes one ``Registry`` and its built-in members register themselves from the
package's ``__init__``; a user's member registers the same way from anywhere. Every lookup of an
unknown name fails with the same wording, which lists the valid names.

Example:
    >>> from drapps.registry import Registry
    >>> shapes = Registry("shape")
    >>> @shapes.register("square")
    ... def square(side):
    ...     return side * side
    >>> shapes.get("square")(3)
    9
    >>> shapes.get("circle")
    Traceback (most recent call last):
    ...
    ValueError: shape must be one of ['square'], got 'circle'
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Members of one family, by name.

    Args:
        kind: what a member is, in words (``"policy"``, ``"scenario family"``); it names the
            family in errors.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._members: dict[str, T] = {}
        self._tags: dict[str, dict[str, Any]] = {}

    def register(self, name: str, member: T | None = None, **tags: Any) -> Any:
        """Add ``member`` as ``name``; without ``member``, a decorator that adds what it wraps.

        ``tags`` are free-form facts about the member (e.g. ``held_out=True``) that
        :meth:`names` can filter on.

        Raises:
            ValueError: ``name`` is empty, not a string, or already taken.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} name must be a non-empty string, got {name!r}")

        def add(item: T) -> T:
            if name in self._members:
                raise ValueError(f"a {self.kind} named {name!r} is already registered")
            self._members[name] = item
            self._tags[name] = dict(tags)
            return item

        if member is not None:
            return add(member)
        return add

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a test's temporary member, for instance)."""
        self.get(name)
        del self._members[name]
        del self._tags[name]

    def names(self, **tags: Any) -> list[str]:
        """Registered names in the order they were registered; only those whose tags match
        ``tags`` when given."""
        return [
            name
            for name, have in self._tags.items()
            if all(have.get(key, None) == value for key, value in tags.items())
        ]

    def get(self, name: str) -> T:
        """The member registered as ``name``.

        Raises:
            ValueError: no member has that name; the message lists the valid ones.
        """
        if not isinstance(name, str) or name not in self._members:
            raise ValueError(self.unknown(name))
        return self._members[name]

    def check(self, names: list[str] | tuple[str, ...]) -> list[str]:
        """``names`` as a list once each is known; the first unknown one raises :meth:`get`'s
        error."""
        for name in names:
            self.get(name)
        return list(names)

    def unknown(self, name: object) -> str:
        """The one wording of the unknown-name error."""
        return f"{self.kind} must be one of {self.names()}, got {name!r}"

    def items(self) -> list[tuple[str, T]]:
        """(name, member) pairs in registration order."""
        return [(name, self._members[name]) for name in self.names()]

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._members

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._members)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"
