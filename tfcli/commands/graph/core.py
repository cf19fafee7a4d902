"""The attribution graph of a prompt through per-layer transcoders, as circuit-tracer 0.5.0 computes it
(circuit_tracer/attribution/attribute.py, context_nnsight.py, targets.py; the replacement model's
setup_attribution and configure_gradient_flow).

The local replacement model: each MLP replaced by its transcoder, whose error (the MLP's output minus the
reconstruction) is a node per layer and position; attention patterns and norm divisors frozen at their values on
the prompt. The model is then linear from the nodes' vectors to every feature's encoder and every logit, and an
edge is a direct effect: for a target t (a feature's encoder row w_enc at its input site and position, or a logit's
demeaned unembedding row at the final norm's output and the last position) and a source s writing vector v_s (a
feature's decoder row times its activation at its output site, an error vector, a token's embedding) at its
position, A[t, s] = v_s . d(w_t . x_t) / d(site_s). One backward pass gives a batch of targets' rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from tfcli.analysis.dataset import LineSpec
from tfcli.errors import usage_error

if TYPE_CHECKING:
    from torch import Tensor

    from tfcli.analysis.dataset import Dataset, Done, Line
    from tfcli.analysis.metric import Token
    from tfcli.analysis.transcoders import Transcoders
    from tfcli.config import ModelConfig
    from tfcli.model.transformer import Transformer
    from tfcli.tokenizer import Tokenizer

UPDATE_INTERVAL = 4  # circuit-tracer's: batches of feature rows between re-rankings (with --max-feature-nodes)
PREFIX_POSITIONS = 16  # the prefixes' passes held at once: at most this many prompts' positions in all


@dataclass(kw_only=True)
class GraphOptions:
    """What to attribute and how to prune: circuit-tracer's defaults."""

    target: Token | None = None  # one logit (or, with foil, the difference target - foil); None: the top logits
    foil: Token | None = None
    max_logits: int = 10
    logit_probability: float = 0.95
    max_feature_nodes: int | None = None  # None: every active feature
    batch_size: int = 64
    node_threshold: float = 0.8
    edge_threshold: float = 0.98
    validate: int = 10  # feature nodes whose removal is predicted and measured (validation.py); 0: none


@dataclass
class Graph:
    """One prompt's graph. Node order (rows targets, columns sources): the selected features (n), errors (layer-major:
    layer * T + position), tokens (T), logits (K)."""

    text: str
    ids: list[int]  # (T,), a special token first
    tokens: list[str]  # each position's text
    active_features: Tensor  # (n_active, 3) long: layer, position, feature
    activation_values: Tensor  # (n_active,)
    selected: Tensor  # (n,) long: the active features that are nodes (all, or the --max-feature-nodes most influential)
    adjacency: Tensor  # (N, N) float32
    logit_ids: list[int]  # (K,) the targets' token ids (the target's for a difference)
    logit_labels: list[str]  # (K,) each target's text (`" Paris"`, or `" Mary" - " John"`)
    logit_probabilities: Tensor  # (K,) the softmax probabilities (1.0 for a difference)
    n_layers: int
    transcoders: dict
    options: GraphOptions
    pruned: object = None  # influence.Pruned
    replacement: float = 0.0
    completeness: float = 0.0
    validation: object = None  # validation.Validation, with options.validate
    contexts: dict | None = None  # with --contexts: (layer, feature) -> its top contexts in the corpus (contexts.py)
    notes: list[str] = field(default_factory=list)

    @property
    def n_features(self) -> int:
        return len(self.selected)

    @property
    def n_positions(self) -> int:
        return len(self.ids)


def check_options(config: ModelConfig, options: GraphOptions) -> None:
    """What can be refused before a model is built."""
    from tfcli.analysis.metric import check_head

    if config.architecture != "decoder":
        raise usage_error(f"{config.name} is an {config.architecture}: attribution graphs are for decoders (each "
                          "position reads only the ones before it)", "use a decoder-only model")
    check_head(config, ("lm",), "an attribution graph reads an LM head's logits", "use a decoder with an LM head")
    if options.foil is not None and options.target is None:
        raise usage_error("--foil goes with --target: the graph's one target is the logit difference target - foil")


def special_ids(tokenizer: Tokenizer) -> list[int]:
    """The ids of the tokenizer's special tokens (its added tokens marked special), in id order."""
    added = getattr(tokenizer.backend, "get_added_tokens_decoder", None)
    found = {i for i, token in added().items() if token.special} if added is not None else set()
    found |= {i for i in (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) if i is not None}
    return sorted(found)


def prompt_ids(config: ModelConfig, tokenizer: Tokenizer, text: str, warn: Callable[[str], None]) -> list[int]:
    """circuit-tracer's token convention (ensure_tokenized): the text without special tokens, a special token put
    first unless it starts with one (the tokenizer's BOS, else its pad, else its EOS, else any special token, the
    first whose id is not 0). Position 0's features and error are then left out of the graph."""
    ids = tokenizer.encode([text], add_special_tokens=False)[0].ids
    if not ids:
        raise usage_error("the prompt is empty: there is nothing to attribute", "give a text")
    specials = special_ids(tokenizer)
    if ids[0] in specials:
        return ids
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else config.bos_token_id
    first = next((i for i in (bos, tokenizer.pad_token_id, tokenizer.eos_token_id, *specials) if i), None)
    if first is None:
        warn("the tokenizer has no special token to put first: the first token's features are left out")
        return ids
    return [first, *ids]


@dataclass
class Targets:
    """The logit nodes: ids (K,), labels, probabilities (K,), vectors (K, d) to read the final norm's output with."""

    ids: list[int]
    labels: list[str]
    probabilities: Tensor
    vectors: Tensor


def targets_of(model: Transformer, tokenizer: Tokenizer, logits: Tensor, options: GraphOptions) -> Targets:
    """circuit-tracer's AttributionTargets: the top logits up to a cumulative probability of `logit_probability`, at
    most `max_logits` (or the given target), each with its unembedding row minus the vocabulary's mean row; a
    difference target - foil has the difference of the rows and weight 1. logits (V,) at the last position."""
    import torch

    from tfcli.tokenizer import text_of

    unembed = model.lm_head.unembed.weight.detach().float()  # (V, d)
    probabilities = torch.softmax(logits.float(), dim=-1)
    if options.target is not None and options.foil is not None:
        vector = unembed[options.target.id] - unembed[options.foil.id]
        label = f"{options.target.text!r} - {options.foil.text!r}"
        return Targets([options.target.id], [label], torch.ones(1), vector[None])
    if options.target is not None:
        chosen = torch.tensor([options.target.id])
    else:
        top, top_ids = torch.topk(probabilities, min(options.max_logits, len(probabilities)))
        cutoff = int(torch.searchsorted(torch.cumsum(top, 0), options.logit_probability)) + 1
        chosen = top_ids[:cutoff]
    vectors = unembed[chosen] - unembed.mean(dim=0, keepdim=True)
    ids = chosen.tolist()
    return Targets(ids, [text_of(tokenizer, i) for i in ids], probabilities[chosen], vectors)


@dataclass
class Nodes:
    """What the forward pass on the prompt finds: active features (n, 3) and their values (n,), their encoder rows
    (n, d) and decoder rows times activation (n, d), the errors (L, T, d), the tokens' vectors (T, d), the logits
    at the last position (V,)."""

    features: Tensor
    values: Tensor
    encoders: Tensor
    decoders: Tensor
    errors: Tensor
    tokens: Tensor
    logits: Tensor
    writes: Tensor | None = None  # a cross-layer transcoder's (cross_layer.py): (m, 2) each decoders row's node, layer


_SITE_NAMES: WeakKeyDictionary = WeakKeyDictionary()  # a model -> its site names (site_names)


def site_names(model: Transformer) -> list[str]:
    """Every site a pass of `model` reaches, its attention patterns and norms' scales among them (what
    `model.site_shapes()` lists), from one pass of the model on one token, remembered per model: not site_shapes'
    pass on the meta device, whose first run imports torch._dynamo (about a second). The pass runs with autograd, as
    the replacement model's do: a pass without would count towards packing the weights for inference
    (model/linear.py), the next plain pass would pack them (0.2 s on SmolLM2) and the passes with autograd unpack
    them again."""
    import torch

    from tfcli.model.sites import Sites

    names = _SITE_NAMES.get(model)
    if names is None:
        sites = Sites(keep=lambda name: True, hooks={"blocks.0.resid_pre": lambda value: value.requires_grad_()})
        with torch.enable_grad():
            model(torch.zeros(1, 1, dtype=torch.long, device=model.device), sites=sites)
        names = _SITE_NAMES[model] = list(sites.cache)
    return names


def readout_site(model: Transformer) -> str:
    """Where a logit's vector is read: the final norm's output (the head's input)."""
    return "final_norm.out" if model.has_final_norm else f"blocks.{model.config.num_hidden_layers - 1}.resid_post"


def find_nodes(model: Transformer, transcoders: Transcoders, ids: Tensor) -> Nodes:
    """One plain pass on ids (1, T): every layer's transcoder activations (position 0's zeroed, as circuit-tracer's
    zero_positions), the errors (MLP output - reconstruction, position 0's zero) and the token vectors (what the
    first block reads: the embeddings, scaled where the model scales them)."""
    import torch

    if transcoders.cross_layer:
        from tfcli.commands.graph import cross_layer

        return Nodes(**cross_layer.node_fields(model, transcoders, ids))
    layers = range(transcoders.n_layers)
    names = ["blocks.0.resid_pre", *(transcoders.input_site(l) for l in layers),
             *(transcoders.output_site(l) for l in layers)]
    with torch.no_grad():
        logits, cache = model.run_with_cache(ids, names=names, logits_to_keep=1)
        acts, errors = [], []
        for layer in layers:
            x = cache[transcoders.input_site(layer)][0].float()
            act = transcoders.encode(layer, x)
            act[:1] = 0
            errors.append(cache[transcoders.output_site(layer)][0].float() - transcoders.decode(layer, act, x))
            errors[-1][:1] = 0
            acts.append(act)
        stacked = torch.stack(acts)  # (L, T, F)
        features = stacked.nonzero()  # (n, 3), in (layer, position, feature) order, as a coalesced sparse tensor's
        values = stacked[features[:, 0], features[:, 1], features[:, 2]]
        encoders = torch.empty(len(features), transcoders.d_model)
        decoders = torch.empty(len(features), transcoders.d_model)
        for layer in layers:
            at = features[:, 0] == layer
            encoders[at] = transcoders.layers[layer]["W_enc"][features[at, 2]]
            decoders[at] = transcoders.layers[layer]["W_dec"][features[at, 2]] * values[at, None]
    return Nodes(features, values, encoders, decoders, torch.stack(errors),
                 cache["blocks.0.resid_pre"][0].float(), logits[0, -1].float())


def values_only(model: Transformer, hooks: dict) -> list:
    """With every pattern frozen, a self-attention's queries and keys reach no target: each block's fused q, k, v
    projection is taken out of the autograd graph (a forward hook on it, returned to be removed) and its values put
    back in through their own rows of the weight (a hook on the `attn.v` site, added to `hooks`: the same values).
    The backward passes then multiply by the values' rows alone (SmolLM2: 192 of 960) and build no zero gradients for
    the queries and keys."""
    import torch.nn.functional as F

    from tfcli.model.attention import Attention

    if model.config.architecture != "decoder":
        return []
    handles, inputs = [], []  # inputs: the projection's input, from its forward hook to the v site's (next in order)

    def taken_out(module, args, output):
        inputs.append(args[0])
        return output.detach()

    for layer, block in enumerate(model.output_stack.blocks):
        attention, name = block._modules.get("attn"), f"blocks.{layer}.attn.v"
        if type(attention) is not Attention or attention.cross or name in hooks:
            continue
        start = (attention.heads + attention.kv_heads) * attention.head_dim  # the values' rows: q, k, then v

        def values(value: Tensor, projection=attention.qkv, start: int = start) -> Tensor:
            """value (B, T, G, D): the same values, live through the values' rows of the projection alone."""
            bias = projection.bias
            live = F.linear(inputs.pop(), projection.weight[start:], None if bias is None else bias[start:])
            live = live.view(value.shape)
            return value.detach() + (live - live.detach())

        hooks[name] = values
        handles.append(attention.qkv.register_forward_hook(taken_out))
    return handles


class Replacement:
    """The local replacement model's pass with autograd over the prompt (one row): every attention pattern and norm
    divisor detached, each MLP's output site replaced by its value detached (plus the live skip term, where the
    transcoders have one). The model is then linear from its sources to its targets, so `rows_of` reads a batch of
    targets' rows from one backward pass of the one row, batched over the targets (autograd's is_grads_batched,
    vmap): what circuit-tracer computes with a forward pass of `batch` copies, without the copies' forward pass,
    their logits or their saved activations."""

    def __init__(self, model: Transformer, transcoders: Transcoders, ids: Tensor, nodes: Nodes):
        """ids (1, T') the prompt's first T' tokens; nodes: the whole prompt's."""
        self.transcoders, self.nodes = transcoders, nodes
        self.layers = range(transcoders.n_layers)
        self.readout = readout_site(model)
        self.cache: dict[str, Tensor] = {}  # the targets' sites and the sources, from the pass with autograd
        inputs: dict[int, Tensor] = {}

        def detached(value: Tensor) -> Tensor:
            return value.detach()

        def kept(name: str, layer: int | None = None, leaf: bool = False):
            def hook(value: Tensor) -> Tensor | None:
                if leaf:  # where the sources' gradients start (a leaf: no .grad kept anywhere else)
                    value = value.detach().requires_grad_()
                self.cache[name] = value
                if layer is not None:
                    inputs[layer] = value
                return value if leaf else None
            return hook

        def frozen_output(layer: int):
            def hook(value: Tensor) -> Tensor:
                skip = transcoders.skip_of(layer, inputs[layer])
                value = value.detach().requires_grad_() if skip is None else skip + (value - skip).detach()
                self.cache[transcoders.output_site(layer)] = value
                return value
            return hook

        hooks = {name: detached for name in site_names(model) if name.endswith((".attn.pattern", ".scale"))}
        hooks["blocks.0.resid_pre"] = kept("blocks.0.resid_pre", leaf=True)
        hooks[self.readout] = kept(self.readout)
        for layer in self.layers:
            hooks[transcoders.input_site(layer)] = kept(transcoders.input_site(layer), layer)
            hooks[transcoders.output_site(layer)] = frozen_output(layer)
        import torch

        handles = values_only(model, hooks)
        try:
            with torch.enable_grad():
                model.run_with_hooks(ids, hooks, logits_to_keep=0)
        finally:
            for handle in handles:
                handle.remove()
        outputs = [self.cache[transcoders.output_site(layer)] for layer in self.layers]
        self.sources = [*outputs, self.cache["blocks.0.resid_pre"]]
        self.length = ids.shape[1]  # a prefix of the prompt: the sources at later positions have no effect here
        self.groups: list[tuple[int, int, int, int]] = []  # layer, position, the features' first and last + 1
        if nodes.writes is None:  # features in (layer, position, feature) order: each (layer, position) a run
            places = nodes.features[:, 0] * len(nodes.tokens) + nodes.features[:, 1]
            found, counts = torch.unique_consecutive(places, return_counts=True)
            ends = torch.cumsum(counts, 0)
            self.groups = [(place // len(nodes.tokens), place % len(nodes.tokens), end - count, end)
                           for place, count, end in zip(found.tolist(), counts.tolist(), ends.tolist())
                           if place % len(nodes.tokens) < self.length]

    def rows_of(self, sites: list[str], positions: Tensor, vectors: Tensor) -> Tensor:
        """Targets (b of them): each reads `vectors[i]` (d,) at site `sites[i]`, position `positions[i]` -> their rows
        (b, n + L*T + T) over the sources (features, errors, tokens)."""
        import torch

        b, nodes = len(sites), self.nodes
        outputs, seeds = [], []
        for site in dict.fromkeys(sites):
            at = torch.tensor([i for i, s in enumerate(sites) if s == site])
            value = self.cache[site]  # (1, T, d)
            seed = torch.zeros(b, *value.shape, dtype=value.dtype, device=value.device)
            seed[at, 0, positions[at]] = vectors[at].to(value.device, value.dtype)
            outputs.append(value)
            seeds.append(seed)
        grads = torch.autograd.grad(outputs, self.sources, seeds, retain_graph=True, allow_unused=True,
                                    is_grads_batched=True)
        grads = [torch.zeros(b, *source.shape[1:]) if g is None else g[:, 0].float()
                 for g, source in zip(grads, self.sources)]  # each (b, T, d)
        features = torch.zeros(b, len(nodes.features))
        if nodes.writes is not None:
            from tfcli.commands.graph.cross_layer import feature_columns

            features = feature_columns(grads, b, nodes, self.length)
        for layer, position, start, end in self.groups:  # a product per (layer, position): its features alone
            features[:, start:end] = grads[layer][:, position] @ nodes.decoders[start:end].T
        errors = torch.zeros(b, len(self.layers), len(nodes.tokens))
        tokens = torch.zeros(b, len(nodes.tokens))
        for layer in self.layers:  # (no stacked copy of the gradients)
            errors[:, layer, :self.length] = (grads[layer] * nodes.errors[layer, :self.length]).sum(-1)
        tokens[:, :self.length] = (grads[-1] * nodes.tokens[:self.length]).sum(-1)
        return torch.cat([features, errors.flatten(1), tokens], dim=1)


class Prefixes:
    """The replacement passes over the prompt's prefixes, made as the targets need them: a target at position p reads
    only positions <= p, so its backward pass runs over the first p + 1 tokens alone (on a 6-token prompt a third of
    the work less; on a long one nearly half). The least recently used are dropped past `limit` positions held."""

    def __init__(self, model: Transformer, transcoders: Transcoders, prompt: Tensor, nodes: Nodes, limit: int):
        self.model, self.transcoders, self.prompt, self.nodes, self.limit = model, transcoders, prompt, nodes, limit
        self.made: dict[int, Replacement] = {}

    def rows_of(self, sites: list[str], positions: Tensor, vectors: Tensor) -> Tensor:
        """Replacement.rows_of on the shortest prefix that holds every position of the batch."""
        length = int(positions.max()) + 1
        made = self.made.pop(length, None)
        if made is None:
            while self.made and sum(self.made) + length > self.limit:
                self.made.pop(next(iter(self.made)))
            made = Replacement(self.model, self.transcoders, self.prompt[:, :length], self.nodes)
        self.made[length] = made
        return made.rows_of(sites, positions, vectors)


def attribute(model: Transformer, tokenizer: Tokenizer, transcoders: Transcoders, text: str, ids: list[int],
              options: GraphOptions, progress: Callable[[int, int], None] = lambda done, total: None) -> Graph:
    """The graph of one prompt (ids (T,), a special token first), pruned and scored; `progress(rows done, rows)`."""
    import torch

    from tfcli.analysis.transcoders import place_transcoders
    from tfcli.commands.graph import influence, validation
    from tfcli.tokenizer import text_of

    place_transcoders(transcoders, model.config, site_names(model))
    device = model.device
    prompt = torch.tensor([ids], device=device)
    nodes = find_nodes(model, transcoders, prompt)
    targets = targets_of(model, tokenizer, nodes.logits, options)
    n_active, n_positions, n_layers = len(nodes.features), len(ids), transcoders.n_layers
    n_logits = len(targets.ids)
    logit_offset = n_active + (n_layers + 1) * n_positions
    total_nodes = logit_offset + n_logits
    wanted = n_active if options.max_feature_nodes is None else min(options.max_feature_nodes, n_active)
    rows = max(1, min(options.batch_size, max(wanted, n_logits)))
    replacement = Prefixes(model, transcoders, prompt, nodes, PREFIX_POSITIONS * n_positions)
    readout = readout_site(model)
    edges = torch.zeros(wanted + n_logits, total_nodes)
    row_nodes = torch.zeros(wanted + n_logits, dtype=torch.long)
    for start in range(0, n_logits, rows):
        end = min(start + rows, n_logits)
        edges[start:end, :logit_offset] = replacement.rows_of(
            [readout] * (end - start), torch.full((end - start,), n_positions - 1), targets.vectors[start:end])
        row_nodes[start:end] = torch.arange(start, end) + logit_offset
    progress(n_logits, n_logits + wanted)
    filled, visited, done = n_logits, torch.zeros(n_active, dtype=torch.bool), 0
    by_place = nodes.features[:, 1] * n_layers + nodes.features[:, 0]  # batches by position, then layer
    while done < wanted:
        if wanted == n_active:
            pending = torch.arange(n_active)
        else:
            influences = influence.partial_influences(edges[:filled], targets.probabilities, row_nodes[:filled])
            ranked = torch.argsort(influences[:n_active], descending=True)
            pending = ranked[~visited[ranked]][:min(UPDATE_INTERVAL * rows, wanted - done)]
        pending = pending[torch.argsort(by_place[pending], stable=True)]  # the same rows, in other batches
        for start in range(0, len(pending), rows):
            batch = pending[start:start + rows]
            done += len(batch)
            layers, positions = nodes.features[batch, 0], nodes.features[batch, 1]
            edges[filled:filled + len(batch), :logit_offset] = replacement.rows_of(
                [transcoders.input_site(int(l)) for l in layers], positions, nodes.encoders[batch])
            row_nodes[filled:filled + len(batch)] = batch
            visited[batch] = True
            filled += len(batch)
            progress(n_logits + done, n_logits + wanted)
    selected = torch.where(visited)[0]
    if wanted < n_active:
        edges = edges[:, torch.cat([selected, torch.arange(n_active, total_nodes)])]
    edges = edges[row_nodes.argsort()]
    size = edges.shape[1]
    adjacency = torch.zeros(size, size)
    adjacency[:wanted] = edges[:wanted]
    adjacency[size - n_logits:] = edges[wanted:]
    graph = Graph(text, ids, [text_of(tokenizer, i) for i in ids], nodes.features, nodes.values, selected, adjacency,
                  targets.ids, targets.labels, targets.probabilities, n_layers, transcoders.described(), options)
    graph.pruned = influence.prune(adjacency, targets.probabilities, wanted, n_positions, options.node_threshold,
                                   options.edge_threshold)
    graph.replacement, graph.completeness = influence.scores(adjacency, targets.probabilities, wanted, n_layers,
                                                             n_positions)
    del replacement  # the backward passes' graph, before the interventions
    if options.validate:
        graph.validation = validation.validate(model, transcoders, graph, targets.vectors[0], readout_site(model),
                                               options.validate)
    return graph


@dataclass
class Node:
    """One node of the graph as the views name it: kind (feature, error, token, logit), layer (None for tokens and
    logits), position, feature (features only), its text (the token at its position, a logit's target), its
    activation (features), its probability (logits) and its influence on the logits."""

    index: int
    kind: str
    layer: int | None
    position: int
    feature: int | None
    text: str
    activation: float | None
    probability: float | None
    influence: float


def node_of(graph: Graph, index: int) -> Node:
    """Node `index` of the adjacency's order."""
    n, positions = graph.n_features, graph.n_positions
    errors_end = n + graph.n_layers * positions
    influence = float(graph.pruned.node_influence[index])
    if index < n:
        active = int(graph.selected[index])
        layer, position, feature = (int(v) for v in graph.active_features[active])
        return Node(index, "feature", layer, position, feature, graph.tokens[position],
                    float(graph.activation_values[active]), None, influence)
    if index < errors_end:
        layer, position = divmod(index - n, positions)
        return Node(index, "error", layer, position, None, graph.tokens[position], None, None, influence)
    if index < errors_end + positions:
        position = index - errors_end
        return Node(index, "token", None, position, None, graph.tokens[position], None, None, influence)
    k = index - errors_end - positions
    return Node(index, "logit", None, positions - 1, None, graph.logit_labels[k], None,
                float(graph.logit_probabilities[k]), influence)


def kept_nodes(graph: Graph) -> list[Node]:
    """The pruned graph's nodes, in the adjacency's order."""
    return [node_of(graph, int(i)) for i in graph.pruned.node_mask.nonzero()[:, 0]]


def kept_edges(graph: Graph) -> list[tuple[int, int, float]]:
    """The pruned graph's edges (source, target, weight) between kept nodes, largest |weight| first."""
    mask = graph.pruned.edge_mask & graph.pruned.node_mask[:, None] & graph.pruned.node_mask[None, :]
    targets, sources = mask.nonzero(as_tuple=True)
    weights = graph.adjacency[targets, sources]
    order = weights.abs().argsort(descending=True).tolist()
    return [(int(sources[i]), int(targets[i]), float(weights[i])) for i in order]


def fires_at(graph: Graph) -> dict[tuple[int, int], list[int]]:
    """Each (layer, feature) active in the prompt -> the positions where it fires."""
    where: dict[tuple[int, int], list[int]] = {}
    for layer, position, feature in graph.active_features.tolist():
        where.setdefault((layer, feature), []).append(position)
    return where


GRAPH_LINE = LineSpec(("text",), ())


@dataclass
class Prompt:
    """One prompt as the graph reads it: its text and ids (a special token first)."""

    text: str
    ids: list[int]


@dataclass
class Graphs:
    """The graphs of the prompts that finished, in order (Ctrl-C: those finished before it)."""

    graphs: list[Graph]


@dataclass
class GraphAnalysis:
    """`graph` as the runner runs it (tfcli/runner.py): an item is a prompt, its result the prompt's Graph, the
    aggregate the Graphs that finished. `warn` (a module-level function: the analysis stays picklable) is told when a
    tokenizer has no special token to put first."""

    transcoders: Transcoders
    options: GraphOptions
    warn: Callable[[str], None] | None = None
    corpus: list[tuple[int, list[int]]] | None = None  # --contexts: (line number, ids) per text
    command, unit, line, block, streams = "graph", "prompts", GRAPH_LINE, None, False

    def check(self, config: ModelConfig, tokenizer: Tokenizer, line: Line) -> Prompt:
        text = line.fields["text"]
        return Prompt(text, prompt_ids(config, tokenizer, text, self.warn or (lambda message: None)))

    def check_items(self, prompts: list[Prompt]) -> None:
        pass

    def results(self, model: Transformer, tokenizer: Tokenizer, prompts: list[Prompt],
                progress: Callable[[float], None] | None) -> Iterator[Graph]:
        """Each prompt's graph in turn; `progress` in fractions of a prompt, a step per batch of backward passes."""
        for number, prompt in enumerate(prompts):
            def told(done: int, total: int, start: int = number) -> None:
                if progress is not None:
                    progress(start + done / max(total, 1))
            graph = attribute(model, tokenizer, self.transcoders, prompt.text, prompt.ids, self.options, told)
            if self.corpus is not None:
                from tfcli.commands.graph.contexts import top_contexts

                features = [(node.layer, node.feature) for node in kept_nodes(graph) if node.kind == "feature"]
                graph.contexts = top_contexts(model, tokenizer, self.transcoders, features, self.corpus,
                                              special_ids(tokenizer))
            yield graph

    def shown(self, result: Graph) -> Graph:
        return result

    def aggregate(self, done: Done, dataset: Dataset) -> Graphs:
        return Graphs([graph for _, graph in done])
