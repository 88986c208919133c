"""Lightning DDP on CPU with a drapps.Loader from a LightningDataModule (tests/test_distributed.py).

Usage: ``python lightning_ddp.py OUT_DIR``; Lightning starts the second rank itself.
"""

from __future__ import annotations

import json
import sys

import torch

import drapps

try:
    import lightning.pytorch as pl
except ImportError:  # the standalone package
    import pytorch_lightning as pl  # type: ignore[no-redef]


class Indexed:
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full((4,), float(i)), i


class Data(pl.LightningDataModule):
    def train_dataloader(self) -> drapps.Loader:
        return drapps.Loader(Indexed(), batch_size=8, shuffle=True, num_workers=2)


class Model(pl.LightningModule):
    def __init__(self, out: str) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.out = out
        self.seen: dict[int, list[int]] = {}

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        x, index = batch
        self.seen.setdefault(self.current_epoch, []).extend(int(i) for i in index)
        return self.layer(x).pow(2).mean()

    def on_train_end(self) -> None:
        with open(f"{self.out}/rank{self.global_rank}.json", "w") as file:
            json.dump({"rank": self.global_rank, "seen": self.seen}, file)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    trainer = pl.Trainer(
        accelerator="cpu",
        strategy="ddp",
        devices=2,
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Model(sys.argv[1]), datamodule=Data())
