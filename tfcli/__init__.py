"""tfcli: see inside a transformer's forward pass.

`load_model` and `load_tokenizer` are imported on first use, so `import tfcli` stays light (no torch).
"""

__version__ = "0.1.0"

_LAZY = {"load_model": "tfcli.api", "load_tokenizer": "tfcli.tokenizer.loading"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tfcli' has no attribute {name!r}")


__all__ = ["__version__", "load_model", "load_tokenizer"]
