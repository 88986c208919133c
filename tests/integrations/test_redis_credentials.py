"""Redis passwords never show: in messages, errors and reprs, whatever characters they hold.

No server needed: these check the text drapps writes about a URL, not a connection.
"""

from __future__ import annotations

import random

import pytest

import drapps
from drapps.integrations._redis import check_url, redact
from drapps.integrations.redis_queue import QueueAddress
from drapps.integrations.redis_tier import RedisTier

# Each password is built of marked pieces (Aa1, Bb2, ...) around the characters that used to
# cut a redaction short; no piece may show, so no part of the password does.
PIECES = ("Aa1", "Bb2", "Cc3")
SEPARATORS = ("@", ":", "%40", "/", "?", "#", "&", "=", "@:", " ")
PASSWORDS = [sep.join(PIECES) for sep in SEPARATORS] + ["@Aa1", "Aa1@", "@@Aa1@@", ":Aa1"]


def shows_a_piece(text: str) -> list[str]:
    return [piece for piece in PIECES if piece in text]


def url_forms(password: str) -> list[str]:
    """``password`` where each URL form drapps takes may carry one."""
    forms = [
        f"redis://:{password}@10.0.0.5:6379/0?queue=train",
        f"redis://alice:{password}@10.0.0.5:6379/0",
        f"rediss://:{password}@cache.example.com/2",
        f"unix://:{password}@/run/redis/redis.sock?db=0",
        f"redis://10.0.0.5:6379/0?queue=train&password={password}",
        f"redis://:{password}@10.0.0.5:6379/0?password={password}",
        f"reddis://:{password}@10.0.0.5:6379/0",  # a mistyped scheme
        f"redis:/:{password}@10.0.0.5:6379/0",  # a slash short
    ]
    if "@" not in password:  # with one, the text after it is the host, as redis-py reads it
        forms.append(f"redis://:{password}10.0.0.5:6379/0")  # the '@' left out
    return forms


@pytest.mark.parametrize("password", PASSWORDS)
def test_no_part_of_a_password_is_shown(password: str) -> None:
    for url in url_forms(password):
        shown = redact(url)
        assert shows_a_piece(shown) == [], f"{url!r} -> {shown!r}"


def test_random_passwords_never_show() -> None:
    rng = random.Random(7)  # seeded: a failure repeats
    alphabet = "@:/?#&=%;[] \t" + "abcXYZ0189-._~"
    for _ in range(2000):
        noise = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))
        password = rng.choice(PIECES).join([noise, noise[::-1]]) + rng.choice(PIECES)
        for url in url_forms(password):
            shown = redact(url)
            assert shows_a_piece(shown) == [], f"{url!r} -> {shown!r}"


def test_what_is_not_secret_stays_readable() -> None:
    assert redact("redis://:p@ss:w@rd@10.0.0.5:6379/0?queue=train") == (
        "redis://***@10.0.0.5:6379/0?queue=train"
    )
    assert redact("redis://10.0.0.5:6379/0?queue=train") == "redis://10.0.0.5:6379/0?queue=train"
    assert redact("unix:///run/redis.sock?db=0") == "unix:///run/redis.sock?db=0"
    assert redact("redis://h:1/0?password=x&queue=q") == "redis://h:1/0?password=***"
    assert redact("reddis://:secret@host") == "reddis://***@host"
    # What cannot be read as a URL is secret after its scheme.
    assert redact("redis:/:secret@host") == "redis:***"
    assert redact("redis://:secret-host:6379") == "redis://***"
    assert redact("secret") == "***"
    assert redact(b"redis://:secret@host") == "<a bytes object>"


@pytest.mark.parametrize("password", PASSWORDS)
def test_errors_about_a_url_hide_its_password(password: str) -> None:
    for bad in (f"reddis://:{password}@host:6379/0", f"http://:{password}@host/0"):
        for make in (
            lambda url: drapps.Loader(source=url, batch_size=8),
            lambda url: drapps.Loader(source=drapps.Source(url), batch_size=8),
            lambda url: RedisTier(url),
            lambda url: QueueAddress.parse(url),
            lambda url: check_url(url, "url"),
        ):
            with pytest.raises(ValueError) as info:
                make(bad)
            assert shows_a_piece(str(info.value)) == [], str(info.value)
    with pytest.raises(ValueError, match=r"got 'reddis://\*\*\*@host:6379/0'"):
        drapps.Loader(source="reddis://:secret@host:6379/0", batch_size=8)


@pytest.mark.parametrize("password", PASSWORDS)
def test_reprs_hide_passwords(password: str) -> None:
    url = f"redis://:{password}@10.0.0.5:6379/0?queue=train"
    source = drapps.Source(url, password=password)
    tier = RedisTier(url, password=password)
    address = QueueAddress.parse(url)
    for text in (repr(source), str(source), f"{source}", repr(tier), str(tier), repr(address)):
        assert shows_a_piece(text) == [], text
    assert repr(source) == (
        "Source(url='redis://***@10.0.0.5:6379/0?queue=train', max_batch_bytes='1GiB', "
        "username=None, password='***')"
    )
    assert "10.0.0.5:6379" in repr(tier)
    assert repr(QueueAddress.parse("redis://:Aa1@Bb2@h:1/0?queue=q")) == (
        "QueueAddress(url='redis://***@h:1/0', name='q')"
    )
    assert repr(drapps.Source("redis://h:1/0")).endswith("password=None)")
    # The password itself is still there for the connection.
    assert source.password == password and source.url == url
