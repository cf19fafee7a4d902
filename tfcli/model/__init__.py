"""The from-scratch transformer: attention, layers, embeddings, stacks and heads, named sites and decoding."""

from tfcli.model.attention import KVCache
from tfcli.model.sites import Sites
from tfcli.model.transformer import ModelOutput, TransformerModel, assign_parameters, init_weights

__all__ = ["KVCache", "ModelOutput", "Sites", "TransformerModel", "assign_parameters", "init_weights"]
