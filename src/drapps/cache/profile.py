"""Measuring each codec on the cache's own first samples: stored size, encode and decode time.

The controller's codec rule (``drapps.control.codec_rule``) weighs these against the measured
cost of making a sample, so the codec is chosen from this dataset's numbers, not from a table.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from drapps.cache.codec import Codec
from drapps.cache.entry import Uncacheable, pack, unpack
from drapps.cache.none import Raw

SAMPLES = 8
"""Samples a profile is measured on."""


class ProfileRecorder:
    """Accumulates ``[stored bytes, encode ms, decode ms]`` per codec over :data:`SAMPLES`."""

    def __init__(self, codecs: Sequence[Codec], min_psnr: float | None) -> None:
        self.codecs = list(codecs)
        self.min_psnr = min_psnr
        self.samples = 0
        self.sums = {c.name: [0.0, 0.0, 0.0] for c in self.codecs}

    def add(self, sample: Any) -> bool:
        """Measure every codec on ``sample``; True once :data:`SAMPLES` are measured. A sample
        no entry can hold is not measured (the cache does not keep it either): that depends
        on its structure alone, so the first codec refuses it before anything is counted."""
        fallback = Raw()
        decoders = {c.name: c for c in (*self.codecs, fallback)}
        for codec in self.codecs:
            t0 = time.perf_counter()
            try:
                packed = pack(sample, codec, fallback, self.min_psnr)
            except Uncacheable:
                return False
            t1 = time.perf_counter()
            unpack(bytearray(packed.data), decoders)
            t2 = time.perf_counter()
            total = self.sums[codec.name]
            total[0] += len(packed.data)
            total[1] += 1000 * (t1 - t0)
            total[2] += 1000 * (t2 - t1)
        self.samples += 1
        return self.samples >= SAMPLES

    def result(self) -> dict[str, list[float]]:
        n = max(1, self.samples)
        return {name: [round(v / n, 4) for v in total] for name, total in self.sums.items()}
