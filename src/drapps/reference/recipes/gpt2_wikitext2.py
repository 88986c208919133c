"""GPT-2 on WikiText-2 raw files, GPT-2 BPE tokens, perplexity on the validation split."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from drapps.datasets.wikitext import WikiText
from drapps.reference.models.gpt2 import GPT2, GPT2Config
from drapps.reference.recipes._base import Recipe

_MODELS = {
    "gpt2-small": GPT2Config(),
    "gpt2-mini": GPT2Config(block_size=256, n_layer=4, n_head=4, n_embd=256),
    "gpt2-tiny": GPT2Config(block_size=64, n_layer=2, n_head=2, n_embd=32),
}


class GPT2WikiText2(Recipe):
    name = "gpt2-wikitext2"
    summary = (
        "GPT-2 (small/mini/tiny) on WikiText-2 raw files with GPT-2 BPE, validation perplexity"
    )
    quality = "perplexity"
    higher_is_better = False
    models = tuple(_MODELS)
    micro_batch = 32
    items_unit = "tokens"

    def dataset(self, data: Path, train: bool, model: str) -> Any:
        self.check_model(model)
        seq_len = _MODELS[model].block_size
        return WikiText(data, "train" if train else "valid", seq_len=seq_len)

    def model(self, name: str) -> nn.Module:
        self.check_model(name)
        return GPT2(_MODELS[name])

    def loss_sum(self, model: nn.Module, batch: Any, device: torch.device) -> torch.Tensor:
        ids, labels = batch
        labels = labels.to(device, non_blocking=True)
        logits = model(ids.to(device, non_blocking=True))
        loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="sum")
        return loss

    def evaluate_batch(
        self, model: nn.Module, batch: Any, device: torch.device
    ) -> tuple[float, int, int]:
        return float(self.loss_sum(model, batch, device)), 0, self.items(batch)

    def score(self, loss_sum: float, correct: int, items: int) -> float:
        return math.exp(min(loss_sum / items, 50.0))
