"""The from-scratch transformer: attention, layers, embeddings, stacks and heads, capture and decoding."""

from tfcli.model.attention import KVCache
from tfcli.model.capture import Capture, ModelOutput
from tfcli.model.transformer import TransformerModel, assign_parameters, init_weights

__all__ = ["Capture", "KVCache", "ModelOutput", "TransformerModel", "assign_parameters", "init_weights"]
