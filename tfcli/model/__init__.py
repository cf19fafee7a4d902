"""The from-scratch transformer: attention, layers, embeddings, stacks and heads."""

from tfcli.model.attention import KVCache
from tfcli.model.transformer import Capture, ModelOutput, Stage, TransformerModel, init_weights

__all__ = ["Capture", "KVCache", "ModelOutput", "Stage", "TransformerModel", "init_weights"]
