"""GPT-2 (Radford et al. 2019): pre-norm transformer decoder with tied input/output embeddings."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class GPT2Config:
    """Model shape; the defaults are GPT-2 small (124M parameters)."""

    vocab_size: int = 50257
    """Token ids in [0, vocab_size)."""
    block_size: int = 1024
    """Longest sequence (learned positions)."""
    n_layer: int = 12
    """Transformer blocks."""
    n_head: int = 12
    """Attention heads per block."""
    n_embd: int = 768
    """Model width; must divide by ``n_head``."""
    dropout: float = 0.0
    """Dropout on embeddings, attention output and MLP output."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return F.dropout(self.proj(y), self.dropout, self.training)


class Block(nn.Module):
    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.n_embd)
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        y = self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return x + F.dropout(y, self.dropout, self.training)


class GPT2(nn.Module):
    """GPT-2 language model; ``forward(ids)`` returns logits over the vocabulary.

    The blocks form one ``nn.Sequential`` (``self.blocks``) so that
    :func:`~drapps.train.checkpoint_blocks` can segment them.

    Example:
        >>> import torch
        >>> model = GPT2(GPT2Config(vocab_size=100, block_size=16, n_layer=2, n_head=2, n_embd=8))
        >>> model(torch.zeros(1, 16, dtype=torch.long)).shape
        torch.Size([1, 16, 100])
    """

    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.blocks = nn.Sequential(*[Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.apply(self._init)
        # GPT-2's scaled init of the residual projections keeps the residual stream's variance
        # independent of depth.
        for name, param in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(param, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        if t > self.config.block_size:
            raise ValueError(f"sequence of {t} tokens exceeds block_size {self.config.block_size}")
        positions = torch.arange(t, device=ids.device)
        x = self.wte(ids) + self.wpe(positions)
        x = self.ln_f(self.blocks(x))
        return x @ self.wte.weight.T  # tied output embedding
