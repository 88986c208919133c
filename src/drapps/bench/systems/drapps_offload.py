"""``drapps-offload``: the image pipeline cut before the decode, a share of each batch decoded in
the device stage (nvJPEG on a GPU) and the rest in the workers.

The workload's Pipeline (``DecodeJPEG -> ToCHWTensor -> RandomResizedCrop(224) ->
RandomHorizontalFlip`` over the JPEG bytes) runs with ``split=0`` and ``workers="auto"``;
one case per offload share: ``0`` (every sample made in the workers), ``0.5``, ``1`` (every
sample decoded in the stage: the workers only read bytes), ``auto`` (the controller moves the
share), and ``auto-all`` (the controller moves the split, the share and the workers from the
defaults). Opt-in (named with ``--systems``); ``drapps bench --device cuda`` runs the stage on
the GPU.
"""

from __future__ import annotations

from typing import Any

import drapps
from drapps.bench.systems.drapps_split import PlacementSystem

SHARES = ("0", "0.5", "1", "auto", "auto-all")


class DrappsOffload(PlacementSystem):
    name = "drapps-offload"
    summary = "the image pipeline cut before the decode, at fixed offload shares and 'auto'"
    placements = SHARES

    def options(self, placement: str) -> dict[str, Any]:
        if placement == "auto-all":
            return {"split": "auto", "offload": "auto", "workers": "auto"}
        share = placement if placement == "auto" else float(placement)
        return {"split": 0, "offload": share, "workers": "auto"}

    def ends(self, loader: drapps.Loader) -> str:
        return f"{super().ends(loader)}/{loader.stats().offload:.2f}"
