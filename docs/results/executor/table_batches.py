"""A table in memory whose batches come from one call (``__getitems__``, as Hugging Face's
datasets and torch's ``Subset`` have): what each loader makes of it. 200,000 rows of 16
float32 features and a label; ``__getitems__`` returns the batch's rows as one dict of tensors
(taken as it is by a collate_fn that keeps it); batches of 256 shuffled, one warm epoch and
two timed, each loader in a fresh interpreter, ``ROUNDS`` interleaved rounds (default 3),
median rows/s. drapps with ``seed=0`` stands for any loader that draws per sample (the call
is seeded once a batch).

    .venv/bin/python docs/results/executor/table_batches.py
"""

import statistics

from interleaved import rates, runs

SYSTEMS = ["dataloader-0", "drapps-0", "dataloader-2", "drapps-2", "drapps-auto", "drapps-seed"]

CHILD = r"""
import sys, time, torch, drapps
from torch.utils.data import DataLoader

class Table(torch.utils.data.Dataset):
    def __init__(self):
        self.x = torch.randn(200_000, 16)
        self.y = torch.randint(0, 10, (200_000,))
    def __len__(self):
        return len(self.y)
    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i]}
    def __getitems__(self, indices):
        return {"x": self.x[indices], "y": self.y[indices]}

def as_given(batch):
    return batch

torch.set_num_threads(1)
name = sys.argv[1]
kind, _, count = name.rpartition("-")
table = Table()
args = dict(batch_size=256, shuffle=True, collate_fn=as_given)
if kind == "dataloader":
    loader = DataLoader(table, num_workers=int(count), **args)
elif name == "drapps-auto":
    loader = drapps.Loader(table, **args)
elif name == "drapps-seed":
    loader = drapps.Loader(table, num_workers=2, seed=0, **args)
else:
    loader = drapps.Loader(table, num_workers=int(count), **args)
for batch in loader:
    assert isinstance(batch, dict)
start = time.perf_counter()
for _ in range(2):
    for batch in loader:
        pass
print(2 * len(table) / (time.perf_counter() - start))
"""


def main() -> None:
    got = rates(CHILD, SYSTEMS, "rows/s")
    print("| loader | rows/s (median) | runs |")
    print("|---|---:|---|")
    for system, values in got.items():
        print(f"| {system} | {statistics.median(values):,.0f} | {runs(values)} |")


if __name__ == "__main__":
    main()
