"""``stragglers``: the image pipeline where a few samples cost far more than the rest.

Most photos are ImageNet-sized (500x400); 2% are 6-megapixel (3000x2000), which take an
order of magnitude longer to read and decode. Every read also goes through storage with a
heavy-tailed latency (:class:`~drapps.bench.throttle.TailedReads`: 3% of reads wait 40 ms
times a Pareto draw). The ops are the ``image`` workload's; what differs is the spread of
per-sample costs, so one slow sample can hold a whole batch, and every batch behind it.
Every system reads through :meth:`StragglersWorkload.reads`, tf.data too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from drapps.bench.data import make_jpeg_folder
from drapps.bench.throttle import IoThrottle, TailedReads
from drapps.bench.workloads.image import ImageWorkload

_IMAGES = {"smoke": 48, "quick": 1024, "default": 2400}
LARGE = (0.02, (3000, 2000))
"""Share of the photos that are large, and their size."""
TAIL_SHARE, TAIL_MS = 0.03, 40.0


class StragglersWorkload(ImageWorkload):
    name = "stragglers"
    summary = (
        "JPEGs 500x400 with 2% at 3000x2000, reads with a heavy-tailed latency (3% wait "
        "40 ms x Pareto 1.5) -> decode -> RandomResizedCrop 224 -> flip -> uint8 NCHW; batch 32"
    )
    batch_size = 32
    step_ms = 40.0

    @classmethod
    def prepare(cls, data_dir: Path, size: str, seed: int) -> dict[str, Any]:
        folder = make_jpeg_folder(data_dir, _IMAGES[size], seed=seed, large=LARGE)
        return {"folder": str(folder), "samples": _IMAGES[size]}

    def reads(self, throttle: IoThrottle | None) -> TailedReads:
        """Reads with the heavy-tailed latency, through ``throttle`` too when given."""
        return TailedReads(TAIL_SHARE, TAIL_MS, throttle)
