"""Where a loader reads batches made elsewhere: :class:`Source` and its redacted URL.

A leaf module: the engines that read a source (``integrations/redis_source.py``) import it, and
``engines/backends.py`` names those engines by module only when a source is used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, repr=False)
class Source:
    """Where a loader reads batches made elsewhere (``Loader(source=...)``; a URL string is
    ``Source(url)``).

    Example:
        >>> import drapps
        >>> drapps.Source("redis://127.0.0.1:6379/0?queue=photos").max_batch_bytes
        '1GiB'
    """

    url: str
    """``redis://[user:password@]host:port/db?queue=NAME`` (or ``rediss://``, ``unix://``)."""
    max_batch_bytes: int | str = "1GiB"
    """Refuse, before fetching it, a batch announced larger than this."""
    username: str | None = None
    """An ACL user, when not in the URL."""
    password: str | None = None
    """A password, when not in the URL (it is redacted in every message)."""

    def __repr__(self) -> str:
        """The fields, with the URL's credentials and the password as ``***``."""
        password = None if self.password is None else "***"
        return (
            f"Source(url={redact_url(self.url)!r}, max_batch_bytes={self.max_batch_bytes!r}, "
            f"username={self.username!r}, password={password!r})"
        )


def redact_url(url: Any) -> str:
    """``url`` for a message: nothing of a password shows, whatever characters it holds.

    The user information (everything up to the last ``@``: a raw ``@``, ``:``, ``/`` or
    ``#`` in a password stays inside it) becomes ``***``, and so does everything from a
    query key that names a secret (``?password=``) on. Text that cannot be read as
    ``scheme://host[:port][/path][?query]`` is all ``***`` after its scheme: a password typed
    where a host was expected is not told apart from one, so neither shows.

    Example:
        >>> from drapps.engines.source import redact_url
        >>> redact_url("redis://:p@ss@10.0.0.5:6379/0?queue=train")
        'redis://***@10.0.0.5:6379/0?queue=train'
        >>> redact_url("redis://:secret-10.0.0.5:6379")
        'redis://***'
    """
    if not isinstance(url, str):
        return f"<a {type(url).__name__} object>"
    scheme, sep, rest = url.partition("://")
    if not sep or not _SCHEME.fullmatch(scheme):
        named = _SCHEME_PREFIX.match(url)
        return f"{named.group()}***" if named else "***"
    at = rest.rfind("@")
    if at >= 0 and _SECRET_KEY.search(rest[:at]):
        return f"{scheme}://***"  # that '@' may sit inside a query's password
    shown = rest[at + 1 :]
    authority = re.split(r"[/?#]", shown, maxsplit=1)[0]
    if not _AUTHORITY.fullmatch(authority):
        return f"{scheme}://***"
    secret = _SECRET_KEY.search(shown)
    if secret is not None:
        shown = shown[: secret.end()] + "***"  # and all after: a raw '&' may be in it
    return f"{scheme}://{'***@' if at >= 0 else ''}{shown}"


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*")
_SCHEME_PREFIX = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")
# a host (a name, an IPv4 address or a bracketed IPv6 one) and an optional port, or nothing
# (unix:///path); not ":..." with no host, which is how a password without its '@' begins
_AUTHORITY = re.compile(r"((\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~\-]+)(:[0-9]+)?)?")
# a query (or fragment) key that names a secret: redis-py reads ?password=
_SECRET_KEY = re.compile(r"[?&;#][^=&;#]*(pass|pwd|secret|token|auth)[^=&;#]*=", re.IGNORECASE)
