"""`tfcli circuit --positions spans` (position-aware edges) against the same quantities computed by hand on
transformers' own modules (the tiny GPT-2 and Llama of test_circuit.py, its `Hand` run): each (edge, span) pair's EAP
and EAP-IG score is the per-position product (counterfactual - clean sender output) . (gradient at the receiver's
own input) summed over the span's positions, the positions written here by hand from the words; a clean and corrupt
text of different lengths read through the hand alignment; a circuit of (edge, span) pairs patched by hand, a node's
output put back at the positions of the spans its edges are kept at; and the command's bad input."""

from __future__ import annotations

import json

import pytest
import torch

import tfcli
from tfcli.commands.circuit import edges as core
from tfcli.commands.circuit import spans

from test_circuit import (PARTS, Hand, checkpoints, hand_counter, metric, receiver_grads,  # noqa: F401 (a fixture)
                          ungrouped)
from test_report_browser import browser  # noqa: F401 (a fixture)

NAMES = ("io", "s1", "s2", "end")  # the words of each role, by hand: word index in the text
CLEAN = [("when mary and john went to the store john gave a drink to", "mary", "john"),
         ("then anna and tom went to the park tom gave a ball to", "anna", "tom")]
# the second corrupt text is a word longer (`so` before `then`): its positions after the start token are one further
CORRUPT = ["when john and mary went to the store mary gave a drink to",
           "so then tom and anna went to the park anna gave a ball to"]
ROLE_WORDS = {"io": 1, "s1": 3, "s2": 8, "end": 12}  # in the clean texts (and the first corrupt one)


def char_spans(text: str, shift: int = 0) -> dict[str, list[int]]:
    """The roles' character ranges of a text whose role words are at ROLE_WORDS (+ shift words)."""
    words, starts, at = text.split(), [], 0
    for word in words:
        at = text.index(word, at)
        starts.append(at)
        at += len(word)
    return {name: [starts[i + shift], starts[i + shift] + len(words[i + shift])] for name, i in ROLE_WORDS.items()}


def lines():
    return [{"clean": clean, "corrupt": corrupt, "target": target, "foil": foil,
             "spans": {"clean": char_spans(clean), "corrupt": char_spans(corrupt, k)}}
            for k, ((clean, target, foil), corrupt) in enumerate(zip(CLEAN, CORRUPT))]


def hand_positions() -> dict[str, list[int]]:
    """Each span's clean positions, by hand: the start token is position 0, word i is position i + 1."""
    named = {name: [i + 1] for name, i in ROLE_WORDS.items()}
    used = {p for positions in named.values() for p in positions}
    return named | {"other": [p for p in range(14) if p not in used]}


HAND_SOURCE = [list(range(14)), [0] + [p + 1 for p in range(1, 14)]]  # the corrupt position of each clean one


def span_batch(model, tokenizer, kind="corrupt"):
    from tfcli.analysis.dataset import lines_of
    from tfcli.analysis.pairs import PAIR_LINE

    pairs = [spans.check_span_pair(model.config, tokenizer, line, kind == "corrupt")
             for line in lines_of(lines(), PAIR_LINE)]
    graph = core.graph_of(model.config)
    graph = spans.SpanGraph(graph.layers, graph.heads, graph.parallel, spans.schema_of(pairs))
    return graph, spans.span_batch_of(model, tokenizer, pairs, graph)


def hand_aligned(hand, b):
    """(clean outputs (B, T, S, d), counterfactual outputs (B, T, S, d), the corrupt run's parts aligned), each clean
    position reading the corrupt position HAND_SOURCE gives it."""
    index = torch.tensor(HAND_SOURCE)
    with torch.no_grad():
        _, clean, _ = hand.run(b.clean, {})
        _, corrupt, parts = hand.run(b.corrupt, {})

    def take(x):
        return torch.stack([x[i, index[i]] for i in range(len(index))])
    return clean, take(corrupt), {key: take(value) for key, value in parts.items()}


def hand_span_eap(hand, b, graph, steps=None, kind="corrupt"):
    """(B, S, R, K): per position (counterfactual - clean) . the gradient at each receiver's own input, summed over
    each span's hand positions; with `steps`, the gradient averaged over the inputs counterfactual + k / steps (clean
    - counterfactual). `kind` mean: test_circuit's hand means (each text's own, position 0 kept)."""
    clean, counter, _ = hand_aligned(hand, b) if kind == "corrupt" else hand_counter(hand, b, kind)
    points = [None] if steps is None else \
        [counter[:, :, 0] + k / steps * (clean[:, :, 0] - counter[:, :, 0]) for k in range(1, steps + 1)]
    grads = {}
    for start in points:
        for r, g in receiver_grads(hand, b, start).items():
            grads[r] = grads.get(r, 0) + g / len(points)
    base = graph.base
    stacked = torch.stack([grads[r] for r in range(len(base.receivers))], 2)
    per_position = torch.einsum("btsd,btrd->bsrt", (counter - clean).double(), stacked.double())
    positions = hand_positions()
    return torch.stack([per_position[..., positions[name]].sum(-1) for name in graph.spans], -1) * \
        base.mask[:, :, None]


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_span_scores_are_the_hand_computation(name, checkpoints):
    path, hf = checkpoints(name)
    model, tokenizer = tfcli.load_model(str(path)), tfcli.load_tokenizer(str(path))
    graph, b = span_batch(model, tokenizer)
    assert graph.spans == (*NAMES, "other") and b.corrupt.shape[1] == b.clean.shape[1] + 1
    assert b.source.tolist() == HAND_SOURCE and not b.identity
    hand = Hand(name, ungrouped(hf) if name == "llama" else hf, graph.base)
    count = len(graph.spans)
    expected = hand_span_eap(hand, b, graph)
    scores = spans.scores_of(model, b, graph, "eap", 1)[2].view(*expected.shape)
    scale = expected.abs().max()
    assert scale > 1e-3 and all(int((expected[..., k] != 0).sum()) > graph.base.edge_count // 2
                                 for k in range(count))  # every span's edges differ
    assert (scores - expected).abs().max() <= 1e-5 * scale
    two = spans.scores_of(model, b, graph, "eap-ig-inputs", 2)[2].view(*expected.shape)
    assert (two - hand_span_eap(hand, b, graph, steps=2)).abs().max() <= 1e-5 * scale
    assert (two - scores).abs().max() > 1e-3 * scale
    mean = spans.scores_of(model, b, graph, "eap", 1, "mean")[2].view(*expected.shape)
    assert (mean - hand_span_eap(hand, b, graph, kind="mean")).abs().max() <= 1e-5 * scale
    assert (mean - scores).abs().max() > 1e-3 * scale
    # the first pair reads its corrupt text position for position: its scores summed over the spans are EAP's
    first = core.batch_of(model, tokenizer, spans_pairs(model, tokenizer)[:1])
    blind = core.scores_of(model, first, "eap", 1)[2][0]
    assert (scores[0].sum(-1) - blind).abs().max() <= 1e-5 * scale


def spans_pairs(model, tokenizer):
    from tfcli.analysis.dataset import lines_of
    from tfcli.analysis.pairs import PAIR_LINE

    return [spans.check_span_pair(model.config, tokenizer, line, True) for line in lines_of(lines(), PAIR_LINE)]


def hand_patched(name, hf, graph, ids, parts, keep_at):
    """The metric's logits of a run of `ids` in which each sender's output is its own at the positions of
    `keep_at[sender]` (B, T) bool and the counterfactual's (`parts`, as Hand.run gives them) elsewhere: the circuit
    of all its edges at those positions' spans."""
    layers_path, _, o_proj, _, mlp, _ = PARTS[name]
    heads, handles = graph.heads, []
    layers = hf.get_submodule(layers_path)

    def mixed(s, out, counter):
        keep = keep_at.get(s, torch.zeros(out.shape[:2], dtype=torch.bool))
        return torch.where(keep[..., None], out, counter)

    def first(module, args, kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        x = mixed(0, x, parts[0])
        return ((x, *args[1:]), kwargs) if args else (args, kwargs | {"hidden_states": x})
    handles.append(layers[0].register_forward_pre_hook(first, with_kwargs=True))
    for layer, block in enumerate(layers):
        base = 1 + layer * (heads + 1)

        def z_hook(module, args, base=base):
            z = args[0].clone()
            size = z.shape[-1] // heads
            counter = parts[("z", base)]
            for h in range(heads):
                cols = slice(h * size, (h + 1) * size)
                z[..., cols] = mixed(base + h, z[..., cols], counter[..., cols])
            return (z, *args[1:])
        handles.append(block.get_submodule(o_proj).register_forward_pre_hook(z_hook))
        handles.append(block.get_submodule(mlp).register_forward_hook(
            lambda m, args, out, s=base + heads: mixed(s, out, parts[s])))
    try:
        with torch.no_grad():
            return hf(input_ids=ids).logits
    finally:
        for handle in handles:
            handle.remove()


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_span_faithfulness_patches_each_edge_at_its_spans_only(name, checkpoints):
    """A circuit of every edge out of some senders at some spans: patched by tfcli as (edge, span) pairs, it is the
    run in which each sender's output is its own at its spans' positions and the counterfactual's elsewhere."""
    path, hf = checkpoints(name)
    model, tokenizer = tfcli.load_model(str(path)), tfcli.load_tokenizer(str(path))
    graph, b = span_batch(model, tokenizer)
    base = graph.base
    kept = {"input": NAMES + ("other",), "L0H1": ("io", "s2"), "L0.mlp": ("end", "other"), "L1H2": ("s1", "end"),
            "L1H3": ("s1", "s2", "end", "other"), "L1.mlp": ("end",)}
    chosen = torch.zeros_like(graph.mask)
    for sender, at in kept.items():
        s = base.senders.index(sender)
        for span in at:
            k = graph.spans.index(span)
            chosen[s, k::len(graph.spans)] = base.mask[s]
    full, empty = graph.mask.clone(), torch.zeros_like(graph.mask)
    clean_value, empty_value, values = spans.circuit_metrics(model, b, graph, [full, empty, chosen])
    _, _, parts = hand_aligned(Hand(name, hf, base), b)
    positions = hand_positions()
    keep_at = {}
    for sender, at in kept.items():
        mask = torch.zeros(b.clean.shape, dtype=torch.bool)
        for span in at:
            mask[:, positions[span]] = True
        keep_at[base.senders.index(sender)] = mask
    patched = metric(hand_patched(name, hf, base, b.clean, parts, keep_at), b).double()
    nothing = metric(hand_patched(name, hf, base, b.clean, parts, {}), b).double()
    with torch.no_grad():
        clean = metric(hf(input_ids=b.clean).logits, b).double()
        corrupt_first = metric(hf(input_ids=b.corrupt).logits, b).double()[0]  # the first pair's own (right-padded)
    scale = clean.abs().max()
    assert torch.allclose(values[:, 0], clean, atol=1e-5 * scale) and torch.allclose(clean_value, clean, atol=1e-4)
    assert torch.allclose(values[:, 1], nothing, atol=1e-5 * scale)
    assert torch.allclose(empty_value, nothing, atol=1e-5 * scale)
    assert float(empty_value[0] - corrupt_first).__abs__() <= 1e-5 * scale  # aligned position for position: corrupt
    assert torch.allclose(values[:, 2], patched, atol=1e-5 * scale)
    assert (patched - clean).abs().min() > 1e-3 and (patched - nothing).abs().min() > 1e-3
    # kept at every span, the same senders' edges are the position-blind circuit of edges out of them
    everywhere = chosen.clone()
    for sender in kept:
        s = base.senders.index(sender)
        everywhere[s] = graph.mask[s]
    assert (spans.circuit_metrics(model, b, graph, [everywhere], ends=False)[2][:, 0] - patched).abs().max() > 1e-3


def test_task_spans_make_the_graph_and_read_back(cli, tmp_path, checkpoints):
    """A dataset of `tfcli task ioi` lines through the command: JSON keys, sizes in (edge, span) pairs, an --edges
    file at spans measured as given, and --graph-out's edges at spans read back by --edges."""
    path, _ = checkpoints("gpt2")
    dataset = tmp_path / "pairs.jsonl"
    dataset.write_text("\n".join(json.dumps(line) for line in lines() * 3) + "\n")
    out = tmp_path / "graph.json"
    run = cli("circuit", "-m", str(path), "--dataset", str(dataset), "--positions", "spans", "--sizes", "5,50",
              "--top", "40", "--graph-out", str(out), "--json")
    assert run.exit_code == 0, run.stderr
    record = json.loads(run.stdout)
    assert record["positions"] == "spans" and record["spans"] == [*NAMES, "other"]
    assert record["size_unit"] == "edge-span"
    assert record["graph"]["edges"] == 5 * record["graph"]["model_edges"] == len(record["edges"])
    inside = [e for e in record["edges"] if e["in_circuit"]]
    assert len(inside) == record["circuit"]["edges"] == 40 and {e["span"] for e in record["edges"]} == set(NAMES) | {
        "other"}
    written = json.loads(out.read_text())
    assert written["cfg"]["spans"] == record["spans"]
    assert sum(edge["in_graph"] for edge in written["edges"].values()) == 40
    again = json.loads(cli("circuit", "-m", str(path), "--dataset", str(dataset), "--positions", "spans", "--sizes",
                           "5", "--edges", str(out), "--json").stdout)
    assert again["circuit"]["edges"] == 40
    assert again["circuit"]["faithfulness"] == pytest.approx(record["circuit"]["faithfulness"], abs=1e-9)
    edges = tmp_path / "edges.txt"
    edges.write_text("input -> logits@end\nL1.mlp -> logits\n")  # one at a span, one at all five
    one = json.loads(cli("circuit", "-m", str(path), "--dataset", str(dataset), "--positions", "spans", "--sizes",
                         "5", "--edges", str(edges), "--json").stdout)
    assert one["circuit"]["edges"] == 6
    view = cli("circuit", "-m", str(path), "--dataset", str(dataset), "--positions", "spans", "--sizes", "5",
               "--edges", str(edges), "--width", "80")
    flat = " ".join(view.stdout.split())
    assert "6 (edge, span) pairs" in flat and "(edge, span) pairs between" not in flat
    assert "each at 5 spans (io, s1, s2, end, other)" in flat and max(map(len, view.stdout.splitlines())) <= 80


def bad(cli, tmp_path, path, rows, *extra, code=2):
    dataset = tmp_path / "bad.jsonl"
    dataset.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    run = cli("circuit", "-m", str(path), "--dataset", str(dataset), "--positions", "spans", "--sizes", "5", *extra)
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert run.exit_code == code and len(errors) == 1 and "Traceback" not in run.stderr, run.stderr
    return errors[0]


def test_bad_spans_are_one_error_line(cli, tmp_path, checkpoints):
    path, _ = checkpoints("gpt2")
    good = lines()
    plain = {key: value for key, value in good[0].items() if key != "spans"}
    assert "no `spans`" in bad(cli, tmp_path, path, [plain])
    uncovered = json.loads(json.dumps(good[0]))
    uncovered["spans"]["clean"]["io"] = [4, 5]  # the space after `when`
    assert "covers no token" in bad(cli, tmp_path, path, [uncovered])
    unaligned = json.loads(json.dumps(good[0]))
    unaligned["spans"]["corrupt"]["extra"] = unaligned["spans"]["corrupt"].pop("end")
    assert "are not the corrupt one's" in bad(cli, tmp_path, path, [unaligned])
    swapped = json.loads(json.dumps(good[0]))
    io, s1 = swapped["spans"]["corrupt"]["io"], swapped["spans"]["corrupt"]["s1"]
    swapped["spans"]["corrupt"]["io"], swapped["spans"]["corrupt"]["s1"] = s1, io  # s1 before io in corrupt only
    assert "do not align" in bad(cli, tmp_path, path, [swapped])
    other_schema = json.loads(json.dumps(good[1]))
    for side in ("clean", "corrupt"):
        other_schema["spans"][side]["name"] = other_schema["spans"][side].pop("io")
    assert "share one schema" in bad(cli, tmp_path, path, [good[0], other_schema])
    overlapping = json.loads(json.dumps(good[0]))
    overlapping["spans"]["clean"]["s1"] = [5, 20]
    assert "overlap" in bad(cli, tmp_path, path, [overlapping])
    reserved = json.loads(json.dumps(good[0]))
    reserved["spans"]["clean"]["other"] = reserved["spans"]["clean"].pop("end")
    assert "not `other`" in bad(cli, tmp_path, path, [reserved])
    edges = tmp_path / "edges.txt"
    edges.write_text("input -> logits@nowhere\n")
    assert "no span `nowhere`" in bad(cli, tmp_path, path, good, "--edges", str(edges), code=1)  # a file's fault
    assert "eap or eap-ig-inputs" in bad(cli, tmp_path, path, good, "--method", "exact")
    assert "one method at a time" in bad(cli, tmp_path, path, good, "--method", "eap,eap-ig-inputs")
    run = cli("circuit", "-m", str(path), "--edges", str(edges), "--dataset", str(tmp_path / "bad.jsonl"))
    assert run.exit_code == 1 and "--positions spans" in run.stderr and "Traceback" not in run.stderr
    single = cli("circuit", "-m", str(path), "--positions", "spans", "--target", "mary", CLEAN[0][0], CORRUPT[0])
    assert single.exit_code == 2 and "--dataset" in single.stderr and "Traceback" not in single.stderr


def test_the_page_draws_edges_at_spans(cli, tmp_path, checkpoints, browser):
    """--report with --positions spans: the page draws the circuit's (edge, span) pairs, each saying its span on
    hover, with no script error."""
    from test_report_browser import open_page

    path, _ = checkpoints("gpt2")
    dataset = tmp_path / "pairs.jsonl"
    dataset.write_text("\n".join(json.dumps(line) for line in lines() * 3) + "\n")
    page_path = tmp_path / "circuit.html"
    run = cli("circuit", "-m", str(path), "--dataset", str(dataset), "--positions", "spans", "--sizes", "5",
              "--top", "12", "--report", str(page_path))
    assert run.exit_code == 0, run.stderr
    page = open_page(browser, page_path)
    assert page.errors == []
    tips = page.eval_on_selector_all(".circuit-graph path title", "nodes => nodes.map(n => n.textContent)")
    assert len(tips) == 12 and all(" at span " in tip for tip in tips), tips
    assert "(edge, span) pairs" in page.text_content("body")
