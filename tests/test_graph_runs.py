"""`tfcli graph`'s validation (the graph's predicted effect of removing a feature against the effect measured in the
model) against a hand computation on transformers' modules, and several prompts through the runner (--file, stdin,
each its graph and files, Ctrl-C keeping the graphs finished)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from test_graph import PROMPT, gemma2, llama, load_layers, modules_of, tfcli_graph  # noqa: F401 (fixtures)
from test_report_browser import browser  # noqa: F401 (a fixture)
from tfcli.commands.graph import core

PROMPTS = [PROMPT, "a big red bird flew over the house", "the dog saw a cat in the park"]


def hand_measured(hf, folder, output_hook: str, ids: list[int], features, values, vector) -> list[float]:
    """Each feature removed on transformers' modules: a forward hook lowers its layer's MLP output (or, for
    hook_mlp_out in Gemma 2, the post-feedforward norm's output) at its position by activation x W_dec row; the change
    of the final norm's output at the last position dotted with `vector`."""
    _, outputs, _, norm = modules_of(hf, output_hook)
    layers = load_layers(folder)

    def read() -> float:
        seen = {}
        handle = norm.register_forward_hook(lambda module, args, output: seen.__setitem__("x", output))
        with torch.no_grad():
            hf(torch.tensor([ids]))
        handle.remove()
        return float(seen["x"][0, -1] @ vector)

    base, effects = read(), []
    for (layer, position, feature), value in zip(features.tolist(), values.tolist()):
        def removed(module, args, output, layer=layer, position=position, feature=feature, value=value):
            output = output.clone()
            output[0, position] -= value * layers[layer]["W_dec"][feature]
            return output
        handle = outputs[layer].register_forward_hook(removed)
        effects.append(read() - base)
        handle.remove()
    return effects


def hand_predicted(graph) -> np.ndarray:
    """The graph's prediction written out: feature rows divided by their activation (an active feature's activation
    moves with its pre-activation), -(I - M)^-1 at the first logit's row, every feature node's column."""
    a = graph.adjacency.double().numpy().copy()
    n = graph.n_features
    a[:n] /= graph.activation_values[graph.selected].double().numpy()[:, None]
    inverse = np.linalg.inv(np.eye(len(a)) - a)
    return -inverse[len(a) - len(graph.logit_ids), :n]


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_validation_equals_the_hand_computation(family, request):
    path, hf, transcoders = request.getfixturevalue(family)
    graph = tfcli_graph(path, transcoders, core.GraphOptions(validate=6))
    found = graph.validation
    influence = graph.pruned.node_influence[:graph.n_features]
    assert found.nodes == torch.argsort(influence, descending=True)[:6].tolist()  # the most influential features
    active = graph.selected[torch.tensor(found.nodes)]
    unembed = hf.lm_head.weight.detach()
    vector = unembed[graph.logit_ids[0]] - unembed.mean(0)
    hook = "mlp.hook_out" if family == "llama" else "hook_mlp_out"
    measured = hand_measured(hf, transcoders, hook, graph.ids, graph.active_features[active],
                             graph.activation_values[active], vector)
    scale = max(abs(value) for value in measured)
    assert scale > 1e-3  # removing them moves the target
    assert np.abs(np.array(found.measured) - measured).max() <= 1e-4 * max(scale, 1.0)
    predicted = hand_predicted(graph)[found.nodes]
    assert np.abs(np.array(found.predicted) - predicted).max() <= 1e-4 * np.abs(predicted).max()
    direct = -graph.adjacency[-len(graph.logit_ids), found.nodes].double().numpy()
    assert np.allclose(found.direct, direct) and not np.allclose(found.predicted, found.direct)  # paths matter
    assert found.correlation == pytest.approx(np.corrcoef(predicted, measured)[0, 1], abs=1e-6)


def test_validation_in_the_view_and_json(llama, cli):
    path, _, transcoders = llama
    result = cli("graph", "-m", str(path), "--transcoders", str(transcoders), "--validate", "4", "--json", PROMPT)
    assert result.exit_code == 0, result.stderr
    found = json.loads(result.stdout)["validation"]
    graph = tfcli_graph(path, transcoders, core.GraphOptions(validate=4))
    assert set(found) == {"target", "nodes", "correlation"} and found["target"] == graph.logit_labels[0]
    assert [node["index"] for node in found["nodes"]] == graph.validation.nodes
    assert all(set(node) == {"index", "layer", "position", "feature", "predicted", "direct", "measured"}
               for node in found["nodes"])
    assert [node["measured"] for node in found["nodes"]] == pytest.approx(graph.validation.measured, abs=1e-6)
    shown = cli("graph", "-m", str(path), "--transcoders", str(transcoders), "--validate", "4", "--width", "80",
                PROMPT)
    screen = " ".join(shown.stdout.split())
    assert f"correlation {graph.validation.correlation:+.3f}" in screen
    for index, measured in zip(graph.validation.nodes, graph.validation.measured):
        node = core.node_of(graph, index)
        assert f"L{node.layer} f{node.feature}@{node.position} '{node.text}' predicted" in screen
        assert f"measured {measured:+.4g}" in screen
    none = cli("graph", "-m", str(path), "--transcoders", str(transcoders), "--validate", "0", "--json", PROMPT)
    assert json.loads(none.stdout)["validation"] is None


def test_several_prompts_each_their_graph(llama, cli, tmp_path):
    """--file and stdin: a JSON line per prompt, each the prompt's own graph; the view shows each graph and a line per
    graph; --graph-out and --save numbered per prompt."""
    path, _, transcoders = llama
    file = tmp_path / "prompts.txt"
    file.write_text("\n".join(PROMPTS) + "\n")
    out, saved = tmp_path / "g.json", tmp_path / "g.safetensors"
    args = ("graph", "-m", str(path), "--transcoders", str(transcoders), "--validate", "2")
    result = cli(*args, "--json", "--file", str(file), "--graph-out", str(out), "--save", str(saved))
    assert result.exit_code == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    alone = [tfcli_graph(path, transcoders, core.GraphOptions(validate=2), text=text) for text in PROMPTS]
    assert [record["text"] for record in records] == PROMPTS
    for record, graph in zip(records, alone):
        assert record["ids"] == graph.ids and record["replacement_score"] == pytest.approx(graph.replacement, abs=1e-6)
        assert [node["index"] for node in record["nodes"]] == graph.pruned.node_mask.nonzero()[:, 0].tolist()
    from safetensors.torch import load_file

    for number, graph in enumerate(alone, 1):
        front = json.loads((tmp_path / f"g-{number}.json").read_text())
        assert front["metadata"]["prompt"] == graph.text
        assert torch.equal(load_file(str(tmp_path / f"g-{number}.safetensors"))["adjacency"], graph.adjacency)
    assert not out.exists() and not saved.exists()
    piped = cli(*args, "--json", "-", input="\n".join(PROMPTS[:2]) + "\n")
    assert piped.exit_code == 0 and piped.stdout.splitlines() == result.stdout.splitlines()[:2]
    shown = cli(*args, "--width", "100", *PROMPTS[:2])
    assert shown.exit_code == 0, shown.stderr
    assert shown.stdout.count("replacement score") == 2 and "2 graphs" in shown.stdout
    screen = " ".join(shown.stdout.split())
    for graph in alone[:2]:
        assert f"replacement {graph.replacement:.3f} completeness {graph.completeness:.3f}" in screen


def test_ctrl_c_keeps_the_graphs_finished(llama, cli, tmp_path, monkeypatch):
    path, _, transcoders = llama
    attribute, calls = core.attribute, []

    def interrupted(*args, **kwargs):
        calls.append(args[3])
        if len(calls) == 3:
            raise KeyboardInterrupt
        return attribute(*args, **kwargs)
    monkeypatch.setattr(core, "attribute", interrupted)
    out = tmp_path / "g.json"
    result = cli("graph", "-m", str(path), "--transcoders", str(transcoders), "--validate", "0", "--json",
                 "--graph-out", str(out), *PROMPTS)
    assert result.exit_code == 130 and "interrupted: 2 prompts finished" in result.stderr
    assert [json.loads(line)["text"] for line in result.stdout.splitlines()] == PROMPTS[:2]
    assert (tmp_path / "g-1.json").exists() and (tmp_path / "g-2.json").exists()
    assert not (tmp_path / "g-3.json").exists()


def test_progress_counts_the_backward_batches(llama):
    """The runner's progress moves within a prompt, a step per batch of backward passes, to the whole prompt."""
    path, _, transcoders = llama
    from tfcli.analysis.transcoders import check_transcoders, read_transcoders
    from tfcli.api import load_tokenizer_for
    from tfcli.sources import resolve_source
    import tfcli

    model, source = tfcli.load_model(str(path)), resolve_source(str(path))
    tokenizer, read = load_tokenizer_for(source), read_transcoders(transcoders)
    check_transcoders(read, source.config)
    analysis = core.GraphAnalysis(read, core.GraphOptions(batch_size=16, validate=0))
    prompts = [core.Prompt(text, core.prompt_ids(source.config, tokenizer, text, print)) for text in PROMPTS[:2]]
    seen: list[float] = []
    graphs = list(analysis.results(model, tokenizer, prompts, seen.append))
    n_active = len(graphs[0].active_features)
    steps = 1 + -(-n_active // 16)  # the logit rows, then each batch of feature rows
    assert seen[:steps] == sorted(seen[:steps]) and 0 < seen[0] < 1 and seen[steps - 1] == 1.0
    assert len(seen) == steps + 1 + -(-len(graphs[1].active_features) // 16) and seen[-1] == 2.0


def test_report_page_in_chromium(llama, cli, tmp_path, browser):  # noqa: F811 (browser: test_report_browser's)
    """--report PAGE.html, opened offline in Chromium: a dot per kept node, its label on hover, a click lists its kept
    inputs and outputs with their weights (the JSON's edges), the validation table; nothing fetched. Several prompts:
    a graph each; a figure for several refused."""
    from test_report_browser import open_page

    path, _, transcoders = llama
    args = ("graph", "-m", str(path), "--transcoders", str(transcoders), "--validate", "4")
    page_path, figure = tmp_path / "graph.html", tmp_path / "graph.svg"
    assert cli(*args, "--report", str(page_path), PROMPT).exit_code == 0
    record = json.loads(cli(*args, "--json", PROMPT).stdout)
    page = open_page(browser, page_path)
    assert page.requests == [page_path.as_uri()] and not page.errors
    dots = page.locator(".graph-node-dot")
    assert dots.count() == len(record["nodes"])
    feature = next(n for n in record["nodes"] if n["kind"] == "feature")
    label = f"L{feature['layer']} f{feature['feature']}@{feature['position']} '{feature['text']}'"
    dot = page.locator(f'.graph-node-dot[data-index="{feature["index"]}"]')
    assert dot.locator("title").text_content().startswith(label + ": influence")
    dot.click()
    assert page.locator(".graph-node-name").text_content() == label
    inputs = [e for e in record["edges"] if e["target"] == feature["index"]]
    outputs = [e for e in record["edges"] if e["source"] == feature["index"]]
    panel = page.locator(".graph-node").text_content()
    assert f"inputs ({len(inputs)})" in panel and f"outputs ({len(outputs)})" in panel and inputs and outputs
    assert page.locator(".graph-validation tbody tr").count() == 4
    page.close()
    several = tmp_path / "graphs.html"
    assert cli(*args, "--report", str(several), *PROMPTS[:2]).exit_code == 0
    page = open_page(browser, several)
    assert page.locator("svg.graph-grid").count() == 2 and not page.errors
    page.close()
    assert cli(*args, "--report", str(figure), PROMPT).exit_code == 0
    assert "<svg" in figure.read_text() and "replacement" in figure.read_text()
    refused = cli(*args, "--report", str(tmp_path / "two.svg"), *PROMPTS[:2])
    assert refused.exit_code == 2 and "several prompts go on a page" in " ".join(refused.stderr.split())
