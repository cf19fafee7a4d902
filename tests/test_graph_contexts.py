"""`tfcli graph --contexts FILE`: each feature on the pruned graph labelled by its top activating contexts in a corpus,
against a hand computation on transformers' modules (a forward hook reads each layer's MLP input, the transcoder's
weights applied by hand, each text run alone: no padding); in the terminal view, the --json record and the --report
page's hover label; a missing corpus refused."""

from __future__ import annotations

import json

import pytest
import torch

from test_graph import PROMPT, encode, llama, load_layers, modules_of  # noqa: F401 (a fixture)
from test_report_browser import browser  # noqa: F401 (a fixture)

# line 3 blank (skipped: the line numbers stay the file's); texts of different lengths (a batch is padded)
CORPUS = ["the cat sat on the mat", "a big red bird flew over the house and the tree", "",
          "the dog ran to the park", "it was a red house in the park with a big tree",
          "the bird saw the cat and the dog", "of it by with the mat"]
SPECIALS = {0, 1, 2}  # <unk>, <s>, </s>


def hand_contexts(path, hf, folder, features: list[tuple[int, int]], count: int = 3) -> dict:
    """Each (layer, feature) -> its `count` largest activations over the corpus as (line, position, activation,
    token): each text tokenised by the tokenizer file with <s> put first, run alone through `hf`, the MLP input read
    by a forward hook, W_enc x + b_enc through the JumpReLU; position 0 and special tokens not counted."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    inputs, _, _, _ = modules_of(hf, "mlp.hook_out")
    layers = load_layers(folder)
    found = {key: [] for key in features}
    for line, text in enumerate(CORPUS, 1):
        if not text.strip():
            continue
        ids = [1, *tokenizer.encode(text, add_special_tokens=False).ids]
        seen = {}
        handles = [module.register_forward_hook(lambda m, args, out, i=i: seen.__setitem__(i, out[0]))
                   for i, module in enumerate(inputs)]
        with torch.no_grad():
            hf(torch.tensor([ids]))
        for handle in handles:
            handle.remove()
        for layer, feature in dict.fromkeys(features):  # a feature firing at two positions is two nodes
            acts = encode(layers[layer], seen[layer])[:, feature]  # (T,)
            for position in range(1, len(ids)):
                if ids[position] not in SPECIALS and acts[position] > 0:
                    found[layer, feature].append((line, position, float(acts[position]),
                                                  tokenizer.id_to_token(ids[position])))
    return {key: sorted(values, key=lambda v: -v[2])[:count] for key, values in found.items()}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("graph-contexts") / "corpus.txt"
    path.write_text("\n".join(CORPUS) + "\n")
    return path


def test_contexts_equal_the_hand_computation(llama, cli, corpus):
    path, hf, transcoders = llama
    result = cli("graph", "-m", str(path), "--transcoders", str(transcoders), "--validate", "0", "--contexts",
                 str(corpus), "--json", PROMPT)
    assert result.exit_code == 0, result.stderr
    nodes = json.loads(result.stdout)["nodes"]
    features = [node for node in nodes if node["kind"] == "feature"]
    assert len(features) >= 2
    assert all(node["contexts"] is None for node in nodes if node["kind"] != "feature")
    hand = hand_contexts(path, hf, transcoders, [(node["layer"], node["feature"]) for node in features])
    assert sum(len(found) for found in hand.values()) >= 4  # the corpus activates the graph's features
    for node in features:
        ours, theirs = node["contexts"], hand[node["layer"], node["feature"]]
        assert [(c["line"], c["position"]) for c in ours] == [(line, position) for line, position, _, _ in theirs]
        assert [c["activation"] for c in ours] == pytest.approx([a for _, _, a, _ in theirs], rel=1e-4, abs=1e-5)
        assert [c["token"].strip() for c in ours] == [token for _, _, _, token in theirs]
        for c in ours:  # the tokens around it: up to 10 before, 4 after, from the text's own
            words = ["<s>", *CORPUS[c["line"] - 1].split()]
            assert [t.strip() for t in c["before"]] == words[max(0, c["position"] - 10):c["position"]]
            assert [t.strip() for t in c["after"]] == words[c["position"] + 1:c["position"] + 5]
    plain = cli("graph", "-m", str(path), "--transcoders", str(transcoders), "--validate", "0", "--json", PROMPT)
    assert all(node["contexts"] is None for node in json.loads(plain.stdout)["nodes"])


@pytest.mark.parametrize("width", [80, 120])
def test_contexts_in_the_view(llama, cli, corpus, width):
    path, _, transcoders = llama
    args = ("graph", "-m", str(path), "--transcoders", str(transcoders), "--validate", "0", "--contexts", str(corpus))
    nodes = json.loads(cli(*args, "--json", PROMPT).stdout)["nodes"]
    shown = cli(*args, "--width", str(width), "--no-color", PROMPT)
    assert shown.exit_code == 0 and all(len(line) <= width for line in shown.stdout.splitlines())
    screen = " ".join(shown.stdout.split())
    for node in (n for n in nodes if n["kind"] == "feature"):
        head = f"L{node['layer']} f{node['feature']}@{node['position']} '{node['text']}'"
        block = screen[screen.index(head):]
        block = block[:block.index(" <- ")] if " <- " in block else block
        for c in node["contexts"]:
            assert f"line {c['line']}@{c['position']} {c['activation']:.3g}: " in block
            assert f"[{c['token'].replace(' ', '␣')}]" in block
        if not node["contexts"]:
            assert "in the corpus: active on no token" in block


def test_contexts_on_the_page_hover(llama, cli, corpus, tmp_path, browser):  # noqa: F811 (browser)
    from test_report_browser import open_page

    path, _, transcoders = llama
    args = ("graph", "-m", str(path), "--transcoders", str(transcoders), "--validate", "0", "--contexts", str(corpus))
    page_path = tmp_path / "graph.html"
    assert cli(*args, "--report", str(page_path), PROMPT).exit_code == 0
    nodes = json.loads(cli(*args, "--json", PROMPT).stdout)["nodes"]
    feature = next(n for n in nodes if n["kind"] == "feature" and n["contexts"])
    page = open_page(browser, page_path)
    title = page.locator(f'.graph-node-dot[data-index="{feature["index"]}"] title').text_content()
    lines = title.split("\n")
    assert lines[1] == "top contexts:" and len(lines) == 2 + len(feature["contexts"])
    for line, c in zip(lines[2:], feature["contexts"]):
        assert line.startswith(f"line {c['line']}@{c['position']} {c['activation']:.3g}: ")
        assert f"{''.join(c['before'])}[{c['token']}]{''.join(c['after'])}" in line
    page.close()


def test_a_missing_corpus_is_one_error_line(llama, cli, tmp_path, no_model_built):
    path, _, transcoders = llama
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n")
    for corpus, words in ((tmp_path / "nowhere.txt", "no such file"), (empty, "holds no text")):
        result = cli("graph", "-m", str(path), "--transcoders", str(transcoders), "--contexts", str(corpus), PROMPT)
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert result.exit_code == 1 and len(errors) == 1 and words in errors[0], result.stderr
        assert "Traceback" not in result.stderr
