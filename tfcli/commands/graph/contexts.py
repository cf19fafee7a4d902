"""`graph --contexts FILE`: each feature on a pruned graph labelled by its top activating contexts in a corpus.

Each text of the corpus is read as the graph reads its prompt (core.prompt_ids: a special token first), run through
the model in batches (right-padded, the padding masked), and every pruned feature's activation computed from its
transcoder's input site as the graph computes it (JumpReLU or ReLU of W_enc x + b_enc); its `CONTEXTS` largest over
the corpus are kept (analysis/contexts.py: a context is the token with 10 before and 4 after). Position 0 and the
tokenizer's special tokens are not counted, as the graph leaves position 0's features out. Shapes: B texts, T tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tfcli.analysis.contexts import Context, TopContexts

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.analysis.transcoders import Transcoders
    from tfcli.model.transformer import Transformer
    from tfcli.tokenizer import Tokenizer

CONTEXTS = 3  # contexts kept per feature
BATCH = 16  # corpus texts per forward pass


def activations(transcoders: Transcoders, layer: int, features: list[int], x: Tensor) -> Tensor:
    """The activations (..., k) of layer `layer`'s `features` (k) on its input x (..., d)."""
    import torch

    from tfcli.analysis.transcoders import THRESHOLD

    weights = transcoders.layers[layer]
    at = torch.tensor(features)
    pre = x.float() @ weights["W_enc"][at].T + weights["b_enc"][at]
    if THRESHOLD in weights:
        return pre * (pre > weights[THRESHOLD][at]).to(pre.dtype)
    return torch.relu(pre)


def top_contexts(model: Transformer, tokenizer: Tokenizer, transcoders: Transcoders, features: list[tuple[int, int]],
                 corpus: list[tuple[int, list[int]]], specials: list[int], count: int = CONTEXTS
                 ) -> dict[tuple[int, int], list[Context]]:
    """Each (layer, feature) -> its `count` top activating contexts over `corpus`: (line number, ids) per text, the
    ids a special token first; a context's `text` is its line number. `specials`: the ids not counted."""
    import torch

    from tfcli.analysis.inputs import padded

    by_layer: dict[int, list[int]] = {}
    for layer, feature in dict.fromkeys(features):
        by_layer.setdefault(layer, []).append(feature)
    top = {(layer, feature): TopContexts(count) for layer, members in by_layer.items() for feature in members}
    if not top:
        return {}
    specials = torch.tensor(specials, dtype=torch.long)
    names = [transcoders.input_site(layer) for layer in by_layer]
    for start in range(0, len(corpus), BATCH):
        numbers = [number for number, _ in corpus[start:start + BATCH]]
        rows = [ids for _, ids in corpus[start:start + BATCH]]
        ids, mask = padded(rows, tokenizer, model.device)
        with torch.no_grad():
            _, cache = model.run_with_cache(ids, names=names, attention_mask=mask, logits_to_keep=0)
        counted = mask.bool().cpu() & ~torch.isin(ids.cpu(), specials)
        counted[:, 0] = False
        tokens = [tokenizer.texts(row) for row in rows]
        for layer, members in by_layer.items():
            acts = activations(transcoders, layer, members, cache[transcoders.input_site(layer)].cpu())  # (B, T, k)
            acts = acts.masked_fill(~counted[..., None], 0.0)
            best, where = acts.topk(min(count, acts.shape[1]), dim=1)  # each text's best positions (B, c, k)
            for b in range(len(rows)):
                for k, feature in enumerate(members):
                    for value, position in zip(best[b, :, k].tolist(), where[b, :, k].tolist()):
                        top[layer, feature].add(value, numbers[b], position, tokens[b])
    return {key: kept.best() for key, kept in top.items()}
