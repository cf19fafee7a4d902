"""`tfcli patch` over a dataset of pairs (`patch.run_dataset`) against patching done by hand on transformers' own
modules: forward hooks put one site of the clean run (the block's input, the attention's output projection, the
MLP's output, one head's slice of the output projection's input or of the q, k, v projections, one head's softmax
weights inside transformers' eager attention function) into the corrupt run, one whole pass per site and pair, and
the aggregate is computed by hand as TransformerLens's (mean patched - mean corrupt) / (mean clean - mean corrupt).
Tiny GPT-2 and Llama (grouped-query attention) checkpoints saved by transformers inside the tests, on the BERT
vocabulary (30522) so that tfcli reads their texts with its bundled WordPiece tokenizer; the ids are also made here
from that vocabulary file, word by word. Then: pairs of different lengths aligned at their end, the seeded bootstrap
against one done by hand, the aggregate against each pair's own run (`run_ids`), and pairs whose clean and corrupt
texts give the same metric."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest
import torch

import tfcli
from tfcli import runner
from tfcli.commands.patch import core as patch
from tfcli.analysis.dataset import Dataset, Done, lines_of, ratio_of_means
from tfcli.analysis.names import KINDS
from tfcli.analysis.pairs import PAIR_LINE, check_pair
from tfcli.errors import TfcliError
from tfcli.commands.patch.results import columns_of, none_to_nan

ALL_KINDS = ("resid", "attn", "mlp", "heads", "heads-by-position", "q", "k", "v", "pattern")
SIZES = dict(vocab_size=30522, bos_token_id=101, eos_token_id=102, pad_token_id=0)  # BERT's [CLS] and [SEP]
VOCAB = {word: i for i, word in enumerate(
    (Path(tfcli.__file__).parent / "data" / "vocab.txt").read_text(encoding="utf-8").splitlines())}
CONFIGS = {
    "gpt2": ("GPT2LMHeadModel", dict(SIZES, model_type="gpt2", n_embd=32, n_layer=2, n_head=4, n_positions=64)),
    "llama": ("LlamaForCausalLM", dict(SIZES, model_type="llama", hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                                       max_position_embeddings=64)),
}
LAYOUT = {  # the layers, and from a layer its output projection, its MLP and the modules computing q, k, v (the
    # module, and where its columns start in units of the model's width: GPT-2's c_attn writes q, k, v side by side)
    "gpt2": ("transformer.h", "attn.c_proj", "mlp",
             {"q": ("attn.c_attn", 0), "k": ("attn.c_attn", 1), "v": ("attn.c_attn", 2)}),
    "llama": ("model.layers", "self_attn.o_proj", "mlp",
              {"q": ("self_attn.q_proj", 0), "k": ("self_attn.k_proj", 0), "v": ("self_attn.v_proj", 0)}),
}

# IOI-like pairs of the same length (11 tokens with [CLS]): the names swapped
SAME = [("when mary and john went home john gave it to", "mary", "john"),
        ("then anna and paul sat down paul threw it to", "anna", "paul"),
        ("after sarah and james came back james sent it to", "sarah", "james"),
        ("while emma and david walked out david passed it to", "emma", "david")]
# pairs of 10, 11 and 14 tokens
LENGTHS = [("so tom and kate left kate handed it to", "tom", "kate"),
           SAME[0],
           ("then anna and paul sat down by the door paul threw it to", "anna", "paul")]
NAMES = [("mary", "john"), ("anna", "paul"), ("sarah", "james"), ("emma", "david"), ("lucy", "mark"),
         ("kate", "tom"), ("laura", "peter"), ("alice", "frank"), ("susan", "george"), ("helen", "henry"),
         ("jane", "robert"), ("ruth", "michael")]
# the pair whose clean and corrupt give the same logit of "tree": Llama's unembedding row of "tree" is made
# orthogonal to the difference of the two runs' final hidden states at the last position (and small, so that
# float32 rounding leaves the two values equal to far under patch.same_value's 1e-6); patching still moves it
TUNED = ("when lucy and mark ran off mark gave it to", "lucy", "mark")
TUNED_TARGET = "tree"


def swapped(text: str, a: str, b: str) -> str:
    return " ".join({a: b, b: a}.get(word, word) for word in text.split())


def ids_of(text: str) -> list[int]:
    """What a decoder reads of a text on the BERT vocabulary: [CLS] and each word's id (no [SEP])."""
    return [VOCAB["[CLS]"]] + [VOCAB[word] for word in text.split()]


class ByHand:
    """Patching on a transformers model's own modules, with forward hooks (and its eager attention function
    replaced, for the pattern): no tfcli code."""

    def __init__(self, hf, name: str):
        self.hf = hf
        layers, self.o_proj, self.mlp, self.qkv = LAYOUT[name]
        self.layers = hf.get_submodule(layers)
        config = hf.config
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.width = config.hidden_size
        self.size = self.width // self.heads
        self.modeling = importlib.import_module(type(hf).__module__)
        self.original = self.modeling.eager_attention_forward
        self.capture: dict | None = None  # the patterns of the run, kept (the clean run)
        self.pattern: tuple | None = None  # (layer, head, clean pattern) put back in the run
        self.calls = 0

    def attention(self, module, query, key, value, attention_mask, **kwargs):
        output, weights = self.original(module, query, key, value, attention_mask, **kwargs)
        self.calls += 1
        if self.capture is not None:
            self.capture[("pattern", module.layer_idx)] = weights.detach().clone()
        elif self.pattern is not None and module.layer_idx == self.pattern[0]:
            _, head, clean = self.pattern
            weights = weights.clone()
            weights[:, head] = clean[:, head]
            if getattr(module, "num_key_value_groups", 1) > 1:
                value = self.modeling.repeat_kv(value, module.num_key_value_groups)
            output = torch.matmul(weights, value).transpose(1, 2).contiguous()
        return output, weights

    def logits(self, ids: list[int], hooks: list) -> torch.Tensor:
        """(T, V) logits of one run, with `hooks` (module, "pre" | "pre-kwargs" | "post", function) in place."""
        kinds = {"pre": lambda m, f: m.register_forward_pre_hook(f),
                 "pre-kwargs": lambda m, f: m.register_forward_pre_hook(f, with_kwargs=True),
                 "post": lambda m, f: m.register_forward_hook(f)}
        handles = [kinds[how](module, function) for module, how, function in hooks]
        self.modeling.eager_attention_forward = self.attention
        try:
            with torch.no_grad():
                return self.hf(input_ids=torch.tensor([ids])).logits[0]
        finally:
            self.modeling.eager_attention_forward = self.original
            for handle in handles:
                handle.remove()

    def cache(self, ids: list[int]) -> tuple[dict, torch.Tensor]:
        """Every site's value in a run ((T, features) each; the patterns (1, H, T, T)), and its logits."""
        seen: dict = {}
        hooks = []

        def keep(key, output):
            def hook(module, args, out=None):
                seen[key] = (out if output else args[0])[0].clone()
            return hook

        for i, layer in enumerate(self.layers):
            hooks.append((layer, "pre-kwargs", lambda m, args, kwargs, i=i: seen.__setitem__(
                ("resid", i), (args[0] if args else kwargs["hidden_states"])[0].clone())))
            hooks.append((layer.get_submodule(self.o_proj), "pre", keep(("z", i), False)))
            hooks.append((layer.get_submodule(self.o_proj), "post", keep(("attn", i), True)))
            hooks.append((layer.get_submodule(self.mlp), "post", keep(("mlp", i), True)))
            for module in {m for m, _ in self.qkv.values()}:
                hooks.append((layer.get_submodule(module), "post", keep((module, i), True)))
        self.capture = seen
        try:
            logits = self.logits(ids, hooks)
        finally:
            self.capture = None
        assert self.calls, "transformers' eager attention function was not called: the pattern would prove nothing"
        return seen, logits

    def patched(self, clean: dict, ids: list[int], kind: str, layer: int, head: int | None,
                position: int | None) -> torch.Tensor:
        """The logits of the run on `ids` with one site put back from the `clean` cache: `head`'s columns (None:
        all) at `position` (None: every position)."""
        block = self.layers[layer]
        rows = slice(None) if position is None else position

        def put(value, source, columns=slice(None)):
            value = value.clone()
            value[0, rows, columns] = source[rows, columns]
            return value

        if kind == "pattern":
            self.pattern = (layer, head, clean[("pattern", layer)])
            try:
                return self.logits(ids, [])
            finally:
                self.pattern = None
        if kind == "resid":
            def pre(module, args, kwargs):
                x = put(args[0] if args else kwargs["hidden_states"], clean[("resid", layer)])
                return ((x, *args[1:]), kwargs) if args else (args, kwargs | {"hidden_states": x})
            return self.logits(ids, [(block, "pre-kwargs", pre)])
        if kind in ("heads", "heads-by-position"):
            columns = slice(head * self.size, (head + 1) * self.size)
            return self.logits(ids, [(block.get_submodule(self.o_proj), "pre", lambda m, args: (
                put(args[0], clean[("z", layer)], columns), *args[1:]))])
        if kind in ("q", "k", "v"):
            module, part = self.qkv[kind]
            start = part * self.width + head * self.size
            columns = slice(start, start + self.size)
            return self.logits(ids, [(block.get_submodule(module), "post", lambda m, args, out: put(
                out, clean[(module, layer)], columns))])
        module, key = (self.o_proj, "attn") if kind == "attn" else (self.mlp, "mlp")
        return self.logits(ids, [(block.get_submodule(module), "post", lambda m, args, out: put(
            out, clean[(key, layer)]))])


def metric(logits: torch.Tensor, position: int, target: int, foil: int | None) -> float:
    return float(logits[position, target]) - (float(logits[position, foil]) if foil is not None else 0.0)


def hand_pair(hand: ByHand, clean_text: str, corrupt_text: str, target: str, foil: str | None,
              kinds: tuple[str, ...], positions: list[int] | None = None) -> dict:
    """One pair patched by hand: its clean and corrupt values and, per kind, the patched runs' metric values laid
    out as tfcli's grids are (layers, then heads and/or `positions`: default every position); the metric at the
    last token."""
    clean_ids, corrupt_ids = ids_of(clean_text), ids_of(corrupt_text)
    at = len(clean_ids) - 1
    t, f = VOCAB[target], (VOCAB[foil] if foil is not None else None)
    clean, clean_logits = hand.cache(clean_ids)
    out = {"clean": metric(clean_logits, at, t, f), "corrupt": metric(hand.logits(corrupt_ids, []), at, t, f),
           "values": {}}
    positions = range(len(clean_ids)) if positions is None else positions

    def value(kind, layer, head=None, position=None):
        return metric(hand.patched(clean, corrupt_ids, kind, layer, head, position), at, t, f)

    for kind in kinds:
        layers = range(len(hand.layers))
        if kind in ("resid", "attn", "mlp"):
            grid = [[value(kind, layer, None, p) for p in positions] for layer in layers]
        elif kind == "heads-by-position":
            grid = [[[value(kind, layer, h, p) for p in positions] for h in range(hand.heads)] for layer in layers]
        else:
            heads = hand.kv_heads if kind in ("k", "v") else hand.heads
            grid = [[value(kind, layer, h) for h in range(heads)] for layer in layers]
        out["values"][kind] = np.array(grid, dtype=np.float64)
    return out


def hand_aggregate(results: list[dict], kind: str, equal: tuple[int, ...] = ()) -> tuple[np.ndarray, np.ndarray,
                                                                                          np.ndarray]:
    """The ratio of means sum(patched - corrupt) / sum(clean - corrupt) over every pair, and the bounds of the
    share of pairs (not those in `equal`) whose own ratio is at least 0.5: (low, high), apart where a ratio is so
    close to 0.5 that float32 noise may put it on either side."""
    differences = np.stack([r["values"][kind] - r["corrupt"] for r in results])
    gaps = np.array([r["clean"] - r["corrupt"] for r in results])
    score = differences.sum(0) / gaps.sum()
    kept = [i for i in range(len(results)) if i not in equal]
    with np.errstate(divide="ignore", invalid="ignore"):  # an equal pair counted (to show the share would move)
        ratios = differences[kept] / gaps[kept].reshape(-1, *[1] * (differences.ndim - 1))
        margin = (1e-4 / np.abs(gaps[kept])).reshape(ratios.shape[:1] + (1,) * (ratios.ndim - 1))
        return score, (ratios >= 0.5 + margin).mean(0), (ratios >= 0.5 - margin).mean(0)


def grid(result, kind: str) -> np.ndarray:
    return np.array(result.grids[kind], dtype=np.float64)


# ---------------------------------------------------------------- the checkpoints and datasets


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The passes here are tiny (11 tokens, 32 wide) and many: on a busy machine a second thread only waits for a
    core (a pass took 30 times as long with 2 threads under load)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def models(tmp_path_factory, save_hf_model):
    """name -> (transformers model, tfcli model, tfcli tokenizer, ByHand), each built once: biases and norm weights
    random, weights large enough that the scores differ from each other. Llama's row of TUNED_TARGET is set so
    that TUNED's clean and corrupt give the same logit of it."""
    import transformers

    made = {}

    def make(name: str):
        if name not in made:
            cls, settings = CONFIGS[name]
            settings = dict(settings)
            config = transformers.AutoConfig.for_model(settings.pop("model_type"), **settings, initializer_range=0.3)
            path = tmp_path_factory.mktemp(name)
            hf = save_hf_model(getattr(transformers, cls), config, path, perturb=True)
            hand = ByHand(hf, name)
            if name == "llama":
                assert not hf.config.tie_word_embeddings  # the row changes the logit, not the input
                finals = []
                handle = hf.lm_head.register_forward_hook(lambda m, args, out: finals.append(args[0][0, -1].double()))
                hand.logits(ids_of(TUNED[0]), [])
                hand.logits(ids_of(swapped(*TUNED)), [])
                handle.remove()
                difference = finals[0] - finals[1]
                row = torch.randn(hf.config.hidden_size, generator=torch.Generator().manual_seed(0),
                                  dtype=torch.float64) * 0.02
                row -= (row @ difference) / (difference @ difference) * difference
                with torch.no_grad():
                    hf.lm_head.weight[VOCAB[TUNED_TARGET]] = row.float()
                hf.save_pretrained(path)
            made[name] = hf, tfcli.load_model(str(path)), tfcli.load_tokenizer(str(path)), hand
        return made[name]

    return make


def oriented(hand: ByHand, rows: list[tuple[str, str, str]], foil: bool = True) -> list[dict]:
    """Dataset lines from (clean text, name, other name): the corrupt text swaps the two names; target and foil
    ordered so that clean - corrupt (by hand) is positive (without a foil: the name whose logit rises most)."""
    items = []
    for text, a, b in rows:
        clean_ids, corrupt_ids = ids_of(text), ids_of(swapped(text, a, b))
        at = len(clean_ids) - 1
        clean, corrupt = hand.logits(clean_ids, []), hand.logits(corrupt_ids, [])
        gaps = {x: metric(clean, at, VOCAB[x], VOCAB[y] if foil else None) -
                metric(corrupt, at, VOCAB[x], VOCAB[y] if foil else None) for x, y in ((a, b), (b, a))}
        target = max(gaps, key=gaps.get)
        item = {"clean": text, "corrupt": swapped(text, a, b), "target": target}
        if foil:
            item["foil"] = b if target == a else a
        items.append(item)
    return items


def run_dataset(model, tokenizer, pairs, options, columns, resamples, results=None, progress=None):
    """The aggregate of `pairs` as `patch --dataset` makes it (the runner: tfcli/runner.py, whose Envelope counts the
    pairs run: checked here), or of the pairs' given `results` (what the sweep made of each: the aggregate alone)."""
    analysis = patch.PatchDataset(options, columns=columns)
    dataset = Dataset("", pairs, 0, resamples)
    if results is None:
        done = runner.run(analysis, model, tokenizer, dataset, progress=progress)
        assert done.n == done.total == len(pairs) and not done.interrupted and done.resamples == resamples
        return done.value
    return analysis.aggregate(Done(zip(pairs, results)), dataset)


def pairs_of(model, tokenizer, items: list[dict]) -> list:
    pairs = [check_pair(model.config, tokenizer, line) for line in lines_of(items, PAIR_LINE)]
    for pair, item in zip(pairs, items):  # tfcli reads the texts as they are read here
        assert (pair.ids_clean, pair.ids_corrupt) == (ids_of(item["clean"]), ids_of(item["corrupt"]))
    return pairs


def by_hand(hand: ByHand, dataset: str, kinds: tuple[str, ...]) -> tuple[list[dict], list[dict]]:
    """A dataset's lines and each pair patched by hand: `same` (SAME, every position), `lengths` (LENGTHS, at each
    pair's positions under columns aligned at the end)."""
    items = oriented(hand, SAME if dataset == "same" else LENGTHS)
    count = min(len(ids_of(item["clean"])) for item in items)
    results = [hand_pair(hand, item["clean"], item["corrupt"], item["target"], item["foil"], kinds,
                         None if dataset == "same" else end_positions(item, count)) for item in items]
    return items, results


def end_positions(item: dict, count: int) -> list[int]:
    """The positions of a pair under `count` columns aligned at the end: the last `count` tokens, the metric's
    position (the last token) last."""
    end = len(ids_of(item["clean"])) - 1
    return [end - (count - 1 - column) for column in range(count)]


# ---------------------------------------------------------------- 1. the aggregate against patching by hand


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_aggregate_is_the_ratio_of_means_patched_by_hand(name, models):
    """Every site kind, on GPT-2 and on Llama with grouped-query attention (k and v per key/value head): the score
    is (mean patched - mean corrupt) / (mean clean - mean corrupt) over the pairs patched on transformers' modules;
    clean_value and corrupt_value the means of transformers' metric values; restored_share the share of pairs whose
    own (patched - corrupt) / (clean - corrupt) is at least 0.5."""
    _, model, tokenizer, hand = models(name)
    items, results = by_hand(hand, "same", ALL_KINDS)
    pairs = pairs_of(model, tokenizer, items)
    columns = columns_of(pairs, ALL_KINDS, None, None)
    result = run_dataset(model, tokenizer, pairs, patch.PatchOptions(target="", sites=ALL_KINDS), columns, 0)
    assert result.equal == 0 and result.intervals is None
    assert result.clean_value == pytest.approx(np.mean([r["clean"] for r in results]), abs=1e-5)
    assert result.corrupt_value == pytest.approx(np.mean([r["corrupt"] for r in results]), abs=1e-5)
    gaps = [r["clean"] - r["corrupt"] for r in results]
    assert min(gaps) > 0.05 and sum(gaps) > 0.5, gaps  # gaps that make the scores meaningful
    decisive = undecided = 0
    for kind in ALL_KINDS:
        score, low, high = hand_aggregate(results, kind)
        ours = grid(result, kind)
        assert ours.shape == score.shape, kind
        assert np.abs(ours - score).max() <= 1e-4, (kind, np.abs(ours - score).max())
        assert np.abs(score).max() > 0.1 and np.ptp(score) > 0.1, kind  # not all 0: the check could fail
        share = np.array(result.restored_share[kind], dtype=np.float64)
        assert ((share >= low - 1e-12) & (share <= high + 1e-12)).all(), (kind, share, low, high)
        decisive += int((low == high).sum())
        undecided += int((low != high).sum())
    assert undecided <= decisive // 50  # nearly every cell is decided by the hand values
    shares = [v for kind in ALL_KINDS for v in np.ravel(result.restored_share[kind])]
    assert 0 < np.mean(shares) < 1 and {0.25, 0.5, 0.75} & set(shares)  # shares of pairs, neither all nor none


# ---------------------------------------------------------------- 2. pairs of different lengths, aligned at the end


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_columns_aligned_at_the_end_are_each_pairs_positions_counted_back(name, models):
    """Pairs of 10, 11 and 14 tokens with --align end: column -k of the grids aggregates each pair's position
    end - k + 1 (end: its metric's, the last token); 10 columns, the shortest pair's length."""
    kinds = ("resid", "attn", "heads-by-position", "heads")
    _, model, tokenizer, hand = models(name)
    items, results = by_hand(hand, "lengths", kinds)
    pairs = pairs_of(model, tokenizer, items)
    assert sorted(len(p.ids_clean) for p in pairs) == [10, 11, 14]
    with pytest.raises(TfcliError, match="different lengths"):
        columns_of(pairs, kinds, None, None)
    columns = columns_of(pairs, kinds, "end", None)
    result = run_dataset(model, tokenizer, pairs, patch.PatchOptions(target="", sites=kinds), columns, 0)
    count = 10
    assert len(result.grids["resid"][0]) == count and len(result.grids["heads-by-position"][0][0]) == count
    assert [result.column_label(c) for c in range(count)] == [str(-k) for k in range(count, 0, -1)]
    assert result.tokens_clean == [tokenizer.tokens(pairs[0].ids_clean)[p] for p in end_positions(items[0], count)]
    for kind in kinds:
        score, low, high = hand_aggregate(results, kind)
        ours = grid(result, kind)
        assert ours.shape == score.shape, kind
        assert np.abs(ours - score).max() <= 1e-4, (kind, np.abs(ours - score).max())
        share = np.array(result.restored_share[kind], dtype=np.float64)
        assert ((share >= low - 1e-12) & (share <= high + 1e-12)).all(), (kind, share, low, high)
    # the check could fail: counted from the start, the columns would aggregate other positions
    resid = grid(result, "resid")
    assert np.abs(resid).max() > 0.1
    start = hand_pair(hand, items[2]["clean"], items[2]["corrupt"], items[2]["target"], items[2]["foil"],
                      ("resid",), list(range(count)))
    assert np.abs(start["values"]["resid"] - results[2]["values"]["resid"]).max() > 0.1


# ---------------------------------------------------------------- 3. the bootstrap


def hand_interval(differences: np.ndarray, gaps: np.ndarray, resamples: int) -> tuple[np.ndarray, np.ndarray]:
    """The 95% percentile interval of sum(differences) / sum(gaps) over `resamples` draws of the pairs with
    replacement, the draws those of a torch.Generator seeded 0 (as tfcli draws them); numpy's linear quantiles."""
    n = len(gaps)
    drawn = torch.randint(n, (resamples, n), generator=torch.Generator().manual_seed(0)).numpy()  # (B, N)
    statistics = differences[drawn].sum(1) / gaps[drawn].sum(1)[:, None]  # (B, C)
    return np.quantile(statistics, 0.025, axis=0), np.quantile(statistics, 0.975, axis=0)


def test_the_bootstrap_is_seeded_and_is_the_one_done_by_hand(models):
    """12 pairs: two runs give the same intervals; each interval is the percentile interval of the ratio of means
    over the pairs drawn with replacement (torch.Generator().manual_seed(0), as tfcli draws them), computed here
    from each pair's differences as run_dataset gets them (pair_results); each contains its score; no resample, no
    interval."""
    kinds = ("resid", "heads")
    _, model, tokenizer, hand = models("gpt2")
    items = oriented(hand, [(f"when {a} and {b} went home {b} gave it to", a, b) for a, b in NAMES])
    pairs = pairs_of(model, tokenizer, items)
    columns = columns_of(pairs, kinds, None, None)
    options = patch.PatchOptions(target="", sites=kinds)
    singles = list(patch.pair_results(model, tokenizer, pairs, options, columns))  # what run_dataset aggregates
    first = run_dataset(model, tokenizer, pairs, options, columns, 500, results=singles)
    second = run_dataset(model, tokenizer, pairs, options, columns, 500, results=singles)
    assert first.intervals == second.intervals and first.intervals is not None
    assert run_dataset(model, tokenizer, pairs, options, columns, 0).intervals is None
    gaps = np.array([s.clean_value - s.corrupt_value for s in singles])
    assert gaps.min() > 0
    for kind in kinds:
        differences = np.stack([np.ravel(s.grids[kind]) for s in singles]).astype(np.float64)
        low, high = hand_interval(differences, gaps, 500)
        intervals = np.array(first.intervals[kind], dtype=np.float64).reshape(-1, 2)
        assert np.abs(intervals[:, 0] - low).max() <= 1e-9 * max(1.0, np.abs(low).max()), kind
        assert np.abs(intervals[:, 1] - high).max() <= 1e-9 * max(1.0, np.abs(high).max()), kind
        score = np.ravel(first.grids[kind])
        assert (intervals[:, 0] <= score + 1e-12).all() and (score <= intervals[:, 1] + 1e-12).all(), kind
        assert (intervals[:, 1] - intervals[:, 0]).max() > 0.05, kind  # intervals, not points: it could fail
        # another seed's draws give other intervals: the check above could fail
        other = torch.Generator().manual_seed(1)
        drawn = torch.randint(len(gaps), (500, len(gaps)), generator=other).numpy()
        moved = np.quantile(differences[drawn].sum(1) / gaps[drawn].sum(1)[:, None], 0.025, axis=0)
        assert np.abs(moved - low).max() > 1e-6, kind


def test_a_wider_spread_over_the_items_gives_a_wider_interval():
    """The items' differences around half their gaps, spread s times some noise: the resampled statistics are 0.5
    plus s times the same thing (the draws are seeded), so the interval is s times as wide around 0.5."""
    generator = torch.Generator().manual_seed(3)
    gaps = 1.0 + torch.rand(20, generator=generator, dtype=torch.float64)
    noise = torch.randn(20, 3, generator=generator, dtype=torch.float64)
    widths = []
    for spread in (0.5, 1.0, 2.0):
        score, low, high = ratio_of_means(0.5 * gaps[:, None] + spread * noise, gaps, 400)
        assert ((low <= score) & (score <= high)).all()
        widths.append(high - low)
    assert (widths[0] > 0).all()
    torch.testing.assert_close(widths[1], 2 * widths[0], rtol=1e-9, atol=0)
    torch.testing.assert_close(widths[2], 4 * widths[0], rtol=1e-9, atol=0)


# ---------------------------------------------------------------- 4. the dataset against each pair's own run


@pytest.mark.parametrize("name,dataset", [("gpt2", "same"), ("llama", "same"), ("llama", "lengths")])
def test_the_aggregate_is_the_mean_of_each_pairs_own_run(name, dataset, models):
    """run_dataset's scores = mean over pairs of each pair's patched - corrupt / mean of clean - corrupt, to 1e-12,
    for every site kind; its means, shares and counts likewise (pairs of different lengths: at each pair's positions
    counted back from its end). The pairs' differences are those of the batched sweep (pair_results), each equal to
    the pair's own run (run_ids) to 1e-5: test_a_batch_of_pairs_equals_each_pair_alone."""
    kinds = ALL_KINDS
    _, model, tokenizer, hand = models(name)
    items = oriented(hand, SAME if dataset == "same" else LENGTHS)
    pairs = pairs_of(model, tokenizer, items)
    columns = columns_of(pairs, kinds, None if dataset == "same" else "end", None)
    options = patch.PatchOptions(target="", sites=kinds)
    batched = list(patch.pair_results(model, tokenizer, pairs, options, columns))
    result = run_dataset(model, tokenizer, pairs, options, columns, 0, results=batched)
    count = min(len(p.ids_clean) for p in pairs)
    singles = []
    for pair, item, single in zip(pairs, items, batched):
        at = end_positions(item, count)
        assert single.clean_value != single.corrupt_value and single.line == pair.line
        singles.append((single, at))
    n = len(pairs)
    clean = sum(s.clean_value for s, _ in singles) / n
    corrupt = sum(s.corrupt_value for s, _ in singles) / n
    assert result.clean_value == pytest.approx(clean, abs=1e-12, rel=0)
    assert result.corrupt_value == pytest.approx(corrupt, abs=1e-12, rel=0)
    assert result.equal == 0  # the pairs counted: the run's Envelope (run_dataset checks it)
    for kind in kinds:
        axes = KINDS[kind].axes
        values = []
        for single, at in singles:
            cells = np.array(none_to_nan(single.grids[kind]), dtype=np.float64)
            if "position" in axes:
                cells = np.take(cells, at, axis=1 + axes.index("position"))
            values.append(cells)
        differences = np.stack(values)
        gaps = np.array([s.clean_value - s.corrupt_value for s, _ in singles])
        expected = differences.mean(0) / gaps.mean()
        ours = grid(result, kind)
        assert not np.isnan(expected).any() and ours.shape == expected.shape
        assert np.abs(ours - expected).max() <= 1e-12, (kind, np.abs(ours - expected).max())
        share = (differences / gaps.reshape(-1, *[1] * (differences.ndim - 1)) >= 0.5).mean(0)
        assert (np.array(result.restored_share[kind]) == share).all(), kind
    assert np.abs(grid(result, "resid")).max() > 0.1


@pytest.mark.parametrize("name,fast", [("gpt2", True), ("llama", True), ("llama", False)])
def test_a_batch_of_pairs_equals_each_pair_alone(name, fast, models, monkeypatch):
    """The dataset's pairs are patched in batches (their clean, corrupt and patched runs together, run_pairs): each
    pair's differences, clean and corrupt values and attribution estimates equal its own single run (run_ids) to
    1e-5, for every site kind, on the fast sweep and on whole passes. The pairs: three lengths, aligned at the end,
    and two of one length whose texts first differ at different positions (the batch starts its runs of every
    position at the earlier one); the batches are counted, so that a sweep that ran the pairs one by one would fail."""
    kinds = ALL_KINDS
    _, model, tokenizer, hand = models(name)
    items = oriented(hand, LENGTHS + SAME[1:] + [("mary and john went home then john gave it to", "mary", "john")])
    pairs = pairs_of(model, tokenizer, items)
    firsts = {next(i for i, (a, b) in enumerate(zip(p.ids_clean, p.ids_corrupt)) if a != b)
              for p in pairs if len(p.ids_clean) == len(pairs[1].ids_clean)}
    assert len(firsts) == 2  # the batch of one length holds pairs that first differ at two positions
    columns = columns_of(pairs, kinds, "end", None)
    options = patch.PatchOptions(target="", sites=kinds, method="both", fast=fast)
    sizes, run_pairs = [], patch.run_pairs

    def counted(model, tokenizer, batch, *args, **kwargs):
        sizes.append(len(batch))
        return run_pairs(model, tokenizer, batch, *args, **kwargs)

    monkeypatch.setattr(patch, "run_pairs", counted)
    batched = list(patch.pair_results(model, tokenizer, pairs, options, columns))
    assert sorted(sizes) == [1, 1, len(pairs) - 2]  # 10 and 14 tokens alone, the 11-token pairs together
    monkeypatch.setattr(patch, "run_pairs", run_pairs)
    assert [r.line for r in batched] == [p.line for p in pairs]
    worst = 0.0
    for pair, together in zip(pairs, batched):
        positions = [columns.position(pair, c) for c in columns.swept]
        alone = patch.run_ids(model, tokenizer, pair.ids_clean, pair.ids_corrupt,
                              patch.PatchOptions(target=pair.target, foil=pair.foil, sites=kinds, method="both",
                                                 fast=fast, positions=positions), differences=True)
        assert (together.target.id, together.foil.id) == (alone.target.id, alone.foil.id)
        assert together.clean_value == pytest.approx(alone.clean_value, abs=1e-5, rel=0)
        assert together.corrupt_value == pytest.approx(alone.corrupt_value, abs=1e-5, rel=0)
        assert (together.done, together.total, together.unchanged) == (alone.done, alone.total, alone.unchanged)
        for grids in ("grids", "attribution_grids"):
            for kind in kinds:
                ours = np.array(none_to_nan(getattr(together, grids)[kind]), dtype=np.float64)
                theirs = np.array(none_to_nan(getattr(alone, grids)[kind]), dtype=np.float64)
                assert (np.isnan(ours) == np.isnan(theirs)).all(), (grids, kind)
                difference = np.nan_to_num(np.abs(ours - theirs)).max()
                assert difference <= 1e-5, (grids, kind, difference)
                worst = max(worst, difference)
    assert max(np.nanmax(np.abs(np.array(none_to_nan(r.grids["heads"])))) for r in batched) > 0.05


def test_the_progress_of_a_batch_of_pairs_moves_as_its_runs_finish(models):
    """Four pairs patched in one batch: progress(pairs done, pairs) rises in fractions of a pair as the batch's
    patched runs finish, never falls, and ends at 4 of 4."""
    _, model, tokenizer, hand = models("gpt2")
    pairs = pairs_of(model, tokenizer, oriented(hand, SAME))
    seen = []
    run_dataset(model, tokenizer, pairs, patch.PatchOptions(target="", sites=("resid",)),
                      columns_of(pairs, ("resid",), None, None), 0,
                      progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (4, 4) and {total for _, total in seen} == {4}
    assert all(a <= b for (a, _), (b, _) in zip(seen, seen[1:]))
    assert any(0 < done < 4 and done != int(done) for done, _ in seen)


# ---------------------------------------------------------------- 5. pairs whose clean and corrupt are the same


def test_pairs_with_the_same_metric_count_in_the_aggregate_but_not_in_the_share(models):
    """Two of five pairs give the same logit clean and corrupt: one whose texts are the same, and TUNED, whose texts
    differ (Llama's row of "tree" is orthogonal to the difference of its final hidden states, so patching a site
    still moves the logit). Both count in `equal` and in n; the aggregate is the ratio of means over all five, by
    hand; the restored share is over the three others only; clean_value and corrupt_value are means over all five.
    A metric without a foil: a target's logit."""
    kinds = ("resid", "heads")
    _, model, tokenizer, hand = models("llama")
    items = oriented(hand, [SAME[0], SAME[2], SAME[3]], foil=False)
    same = {"clean": SAME[0][0], "corrupt": SAME[0][0], "target": "mary"}
    tuned = {"clean": TUNED[0], "corrupt": swapped(*TUNED), "target": TUNED_TARGET}
    items = items[:2] + [same, items[2], tuned]
    equal = (2, 4)
    results = [hand_pair(hand, item["clean"], item["corrupt"], item["target"], None, kinds) for item in items]
    pairs = pairs_of(model, tokenizer, items)
    columns = columns_of(pairs, kinds, None, None)
    result = run_dataset(model, tokenizer, pairs, patch.PatchOptions(target="", sites=kinds), columns, 0)
    assert (result.equal, result.foil_each, result.target) == (2, False, None)  # 5 pairs: run_dataset checks
    for i, r in enumerate(results):  # by hand too: the same metric clean and corrupt in the two, and only there
        assert (abs(r["clean"] - r["corrupt"]) < 1e-6) == (i in equal), (i, r["clean"], r["corrupt"])
        assert i in equal or r["clean"] - r["corrupt"] > 0.05
    assert max(abs(v) for v in np.ravel(results[4]["values"]["heads"] - results[4]["corrupt"])) > 0.01
    assert result.clean_value == pytest.approx(np.mean([r["clean"] for r in results]), abs=1e-5)
    assert result.corrupt_value == pytest.approx(np.mean([r["corrupt"] for r in results]), abs=1e-5)
    for kind in kinds:
        score, low, high = hand_aggregate(results, kind, equal)
        ours = grid(result, kind)
        assert np.abs(ours - score).max() <= 1e-4, (kind, np.abs(ours - score).max())
        share = np.array(result.restored_share[kind], dtype=np.float64)
        assert ((share >= low - 1e-12) & (share <= high + 1e-12)).all(), (kind, share, low, high)
        assert set(np.ravel(share)) <= {0, 1 / 3, 2 / 3, 1}
    # the checks could fail: leaving TUNED out moves the aggregate; counting the equal pairs moves the share
    without = hand_aggregate([r for i, r in enumerate(results) if i != 4], "heads")[0]
    assert np.abs(without - grid(result, "heads")).max() > 1e-3
    counted = hand_aggregate(results, "heads")[1]
    assert (counted != np.array(result.restored_share["heads"])).any()
