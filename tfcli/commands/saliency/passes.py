"""The passes of `tfcli saliency` (core.py) over texts, each read and checked as a `Prompt`
(tfcli/analysis/inputs.py): the passes of texts of one length read at one position, a site's value replaced by rows
of each text's own (`Passes`), and the first of them (`first_pass`: the site's values on the texts and their
baselines, and the metric on each); integrated gradients' points and weights (`quadrature`), attention rollout and
the --faithfulness curves of a text.

Shapes: N texts, T tokens, d the site's width (its trailing dimensions, flattened), S steps, R rows of a pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tfcli.commands.saliency.faithfulness import Curves, curves
from tfcli.analysis.inputs import Prompt
from tfcli.analysis.metric import Token, token_of

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.model import TransformerModel
    from tfcli.tokenizer import Tokenizer

TOKENS_PER_PASS = 8192  # rows x tokens of one pass (the integration's steps go in passes of this many)


def quadrature(steps: int, integration: str) -> tuple[list[float], list[float]]:
    """Captum's points and weights on [0, 1] (approximation_methods): Gauss-Legendre's, or riemann_trapezoid's
    (points 0 to 1, weights 1/n with the two ends halved)."""
    if integration == "gausslegendre":
        import numpy as np

        points, weights = np.polynomial.legendre.leggauss(steps)
        return (0.5 * (1 + points)).tolist(), (0.5 * weights).tolist()
    import torch

    weights = [1 / steps] * steps
    weights[0] /= 2
    weights[-1] /= 2
    return torch.linspace(0, 1, steps).tolist(), weights


class Passes:
    """The passes of N texts of one length, read at one position: their ids (N, T), the site whose value the rows
    of a pass replace, and the metric of each text read from the output: a token's or label's logit (difference),
    or the norm of the mean-pooled output. A pass's rows are each of a text (`texts` (R,), default the first)."""

    def __init__(self, model: TransformerModel, prompts: list[Prompt], site: str, logprob: bool = False):
        import torch

        self.model, self.prompts, self.prompt, self.site, self.logprob = model, prompts, prompts[0], site, logprob
        self.ids = torch.tensor([prompt.ids for prompt in prompts], device=model.device)
        self.head = model.config.head
        if self.head == "none":
            last = len(model.output_stack.blocks) - 1
            self.final = "final_norm.out" if model.has_final_norm else f"blocks.{last}.resid_post"
        self.targets: Tensor | None = None  # (N,) ids, set once the targets are known (after the first pass)
        self.foils: Tensor | None = None
        self.rows_per_pass = max(1, TOKENS_PER_PASS // len(self.prompt.ids))

    def one(self, text: int) -> Passes:
        """The passes of one of the texts alone, its metric kept."""
        alone = Passes(self.model, [self.prompts[text]], self.site, self.logprob)
        alone.targets, alone.foils = (None if t is None else t[text:text + 1] for t in (self.targets, self.foils))
        return alone

    def run(self, rows: Tensor | None, grad: bool, names: list[str] = (), hooks: dict | None = None,
            ids: Tensor | None = None, texts: Tensor | None = None
            ) -> tuple[Tensor | None, dict[str, Tensor], Tensor | None]:
        """One pass of R rows: the site replaced by `rows` (R, T, ...) (None: the pass of `ids`, default the texts');
        the metric (R,) float64 (None before the targets are known), the cache of `names`, and the logits."""
        import torch

        if texts is None:
            texts = torch.zeros(len(ids) if ids is not None else 1 if rows is None else len(rows), dtype=torch.long,
                                device=self.ids.device)
        ids = self.ids[texts] if ids is None else ids
        hooks = dict(hooks or {})
        if rows is not None:
            hooks[self.site] = lambda value: rows
        names = list(names) + ([self.final] if self.head == "none" else [])
        keep = {}
        if self.head in ("lm", "mlm") and self.prompt.position is not None:
            keep["logits_to_keep"] = len(self.prompt.ids) - self.prompt.position
        logits, cache = self.model.run_with_cache(ids, names, hooks=hooks or None, grad=grad, **keep)
        return self.measure(logits, cache, texts), cache, logits

    def measure(self, logits: Tensor | None, cache: dict[str, Tensor], texts: Tensor) -> Tensor | None:
        """(R,) float64: the metric of a pass whose rows are of `texts` (R,)."""
        if self.head == "none":
            return cache[self.final].double().mean(1).norm(dim=-1)
        if self.targets is None:
            return None
        logits = (logits[:, 0] if self.prompt.position is not None else logits).double()
        logits = logits.log_softmax(-1) if self.logprob else logits
        value = logits.gather(1, self.targets[texts, None])[:, 0]
        return value - logits.gather(1, self.foils[texts, None])[:, 0] if self.foils is not None else value

    def values(self, rows: Tensor) -> Tensor:
        """(R, T, ...) rows of the first text -> (R,) float64: the metric of each row, in passes of rows_per_pass."""
        import torch

        return torch.cat([self.run(rows[start:start + self.rows_per_pass], False)[0]
                          for start in range(0, len(rows), self.rows_per_pass)])

    def gradients(self, rows: Tensor, texts: Tensor) -> Tensor:
        """(R, T, ...) rows of `texts` (R,) -> the gradient of each row's metric with respect to the row."""
        import torch

        grads = []
        for start in range(0, len(rows), self.rows_per_pass):
            chunk = rows[start:start + self.rows_per_pass].detach().requires_grad_()
            value = self.run(chunk, True, texts=texts[start:start + self.rows_per_pass])[0]
            grads.append(torch.autograd.grad(value.sum(), chunk)[0])
        return torch.cat(grads)


def first_pass(passes: Passes, tokenizer: Tokenizer) -> tuple[Tensor, Tensor, Tensor, Tensor, list[Token | None]]:
    """The texts and their baselines as one pass of 2N rows: the site's values on each, x and x' (N, T, ...), f(x)
    and f(x') (N,), and the targets (the model's top prediction on a text where none was given)."""
    import torch

    model, prompts, n = passes.model, passes.prompts, len(passes.prompts)
    ids = torch.tensor([p.ids for p in prompts] + [p.baseline or p.ids for p in prompts], device=model.device)
    hooks = None
    if any(p.baseline is None for p in prompts):  # zero token embeddings at the tokens that are not special ones
        kept = torch.tensor([[1.0] * len(p.ids) for p in prompts] + [[float(s or p.baseline is not None) for s in
                                                                      p.special] for p in prompts], device=model.device)
        hooks = {"embed": lambda value: value * kept[..., None].to(value.dtype)}
    texts = torch.arange(2 * n, device=model.device) % n
    _, cache, logits = passes.run(None, False, [passes.site], hooks, ids, texts)
    targets = [p.target for p in prompts]
    if passes.head in ("lm", "mlm", "classifier"):
        for i, prompt in enumerate(prompts):
            if targets[i] is None:
                top = int((logits[i, 0] if prompt.position is not None else logits[i]).double().argmax())
                targets[i] = token_of(tokenizer, top) if passes.head != "classifier" else \
                    Token(model.config.label_names[top], top)
        passes.targets = torch.tensor([t.id for t in targets], device=model.device)
        passes.foils = None if prompts[0].foil is None else torch.tensor([p.foil.id for p in prompts],
                                                                         device=model.device)
    values, site = passes.measure(logits, cache, texts), cache[passes.site]
    return site[:n], site[n:], values[:n], values[n:], targets


def rollout(passes: Passes) -> Tensor:
    """(T,) float64: Abnar and Zuidema's attention rollout, the row of the position read (the mean of the rows
    where the head pools every token: a classifier's mean pooling, or no head)."""
    import torch

    from tfcli.analysis.names import every_block

    names = every_block(passes.model, "attn.pattern")
    _, cache, _ = passes.run(None, False, names)
    length = len(passes.prompt.ids)
    eye = torch.eye(length, dtype=torch.float64, device=passes.ids.device)
    product = eye
    for name in names:
        attention = cache[name][0].double().mean(0) + eye  # (T, T): heads' mean, plus the residual's identity
        product = (attention / attention.sum(-1, keepdim=True)) @ product
    config = passes.model.config
    if passes.prompt.position is not None:
        return product[passes.prompt.position]
    if config.head == "none" or config.classifier_pooling == "mean":
        return product.mean(0)
    return product[0]


def faithfulness(passes: Passes, x: Tensor, baseline: Tensor, attributions: Tensor, seed: int) -> Curves:
    """--faithfulness of one text: its tokens that are not special ones deleted and inserted in the attributions'
    order and in random ones (seeded from `seed` and the text's line)."""
    positions = [p for p, s in enumerate(passes.prompt.special) if not s]
    return curves(passes.values, x, baseline, attributions, positions, (seed * 1_000_003 + passes.prompt.line))
