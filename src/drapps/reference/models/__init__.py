"""The recipes' models, written so their block stacks can be checkpointed and sharded."""

from drapps.reference.models.gpt2 import GPT2, GPT2Config
from drapps.reference.models.resnet import ResNet

__all__ = ["GPT2", "GPT2Config", "ResNet"]
