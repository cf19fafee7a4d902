"""Capture every tfcli command's outputs, to check that a refactor leaves them byte-identical (issue 59).

    python benchmarks/capture_outputs.py TREE OUT_DIR [--only SUBSTRING ...]
    python benchmarks/capture_outputs.py --compare DIR_A DIR_B

The first form runs a fixed list of tfcli command lines (CASES below: every command and mode, on tiny YAML configs
with random weights, a few seconds each) with the `tfcli` package of the checkout TREE, each as `python -m tfcli ...`
in a subprocess with PYTHONPATH=TREE, and stores per case, in OUT_DIR/<case>/: `command` (the command line),
`stdout`, `stderr`, `exit_code` and `files/...`, every file the case wrote or changed in its scratch folder (--report
pages and figures, --save tensors, --graph-out graphs, task datasets, SAEs, steering vectors).

Each case runs in its own scratch folder, always /tmp/tfcli-capture/<case> (the inputs, written by this script, in
/tmp/tfcli-capture/inputs), so that the paths the outputs name are the same on every run; the environment is set
explicitly (COLUMNS, LANG, TERM, OMP_NUM_THREADS=1, HF_HUB_OFFLINE=1, NO_COLOR and TFCLI_* unset; one case sets
NO_COLOR). An editable install of tfcli maps `tfcli.configs` (the bundled configs) to its own checkout whatever
PYTHONPATH says: a sitecustomize.py put on PYTHONPATH after TREE drops that finder, and the script checks that
`tfcli` and its bundled configs are TREE's before it runs anything.

Normalised, and only this (what varies between two runs of one tree, checked by running one tree twice, or with
where TREE lies):
- the scratch root and TREE's path are written `$SCRATCH` and `$TREE`;
- timings: sae train's `36,438 tokens/s` (`<N> tokens/s`), JSON's `"seconds"` and `"tokens_per_second"` (`"<N>"`),
  and the plain progress line a run of over a minute writes to a log (dropped; no case runs that long);
- SVG figures: matplotlib's `<dc:date>`, and the ids it draws at random per figure (`id="p1a2b3c4d5e"`,
  `url(#p...)`, `xlink:href="#m..."`, `id="image..."`), numbered by first appearance (`id1`, `id2`, ...), which
  keeps what refers to what;
- .safetensors files: the header's `__metadata__` object, which the safetensors library writes in a random key
  order, has its keys sorted (the tensors and everything else are kept as written).
Runs share the scratch root: one run at a time.

The second form compares two such folders: it prints each case whose files differ, with the head of a unified diff
of each differing file, and exits 1 if any differ (0 if none). To check a refactor:

    git worktree add /tmp/before <commit before>
    python benchmarks/capture_outputs.py /tmp/before /tmp/cap-before
    python benchmarks/capture_outputs.py . /tmp/cap-after
    python benchmarks/capture_outputs.py --compare /tmp/cap-before /tmp/cap-after
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

SCRATCH = Path("/tmp/tfcli-capture")
INPUTS = SCRATCH / "inputs"
HOOK = SCRATCH / "hook"  # sitecustomize.py: drops the editable install's finder
TEXT_SUFFIXES = {"", ".txt", ".json", ".jsonl", ".html", ".svg", ".yaml", ".csv", ".md"}

SMALL = ("hidden_size: 32\nnum_hidden_layers: 2\nnum_attention_heads: 2\nintermediate_size: 64\n"
         "max_position_embeddings: 64\n")
CONFIGS = {  # tiny random models, seconds faster than the bundled 12-layer ones (tests/conftest.py's)
    "dec.yaml": "architecture: decoder\n" + SMALL + "norm_position: pre\ntype_vocab_size: 0\nembedding_norm: false\n"
                "final_norm: true\nhead: lm\ntie_word_embeddings: true\neos_token_id: 102\n",
    "cls.yaml": "architecture: encoder\n" + SMALL + "head: classifier\nlabels: [negative, neutral, positive]\n",
    "encdec.yaml": "architecture: encoder-decoder\n" + SMALL + "num_decoder_layers: 2\nnorm_position: pre\n"
                   "type_vocab_size: 0\nhead: lm\ntie_word_embeddings: false\ndecoder_start_token_id: 101\n"
                   "eos_token_id: 102\n",
}
HF_GPT2 = """import sys, torch
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
config = GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=30522, bos_token_id=101,
                    eos_token_id=102, pad_token_id=0)
config._attn_implementation = "eager"
GPT2LMHeadModel(config).save_pretrained(sys.argv[1])
"""
HOOK_CODE = """import sys
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")
                    and "__editable__" not in getattr(f, "__name__", "")]
"""

CLEAN = "When Mary and John went to the store, John gave a drink to"
CORRUPT = "When John and Mary went to the store, Mary gave a drink to"
TEXTS = ["time flies like an arrow", "The animal didn't cross the street because it was too tired"]
GOOD_PAIRS = [  # (clean, corrupt, target, foil) in the bundled WordPiece, whose names are one token each
    (CLEAN, "When Anna and Paul went to the store, Mark gave a drink to", "mary", "john"),
    ("Then, Sarah and David had fun at the school. David gave a ring to",
     "Then, Laura and Peter had fun at the school. James gave a ring to", "sarah", "david"),
    ("After Linda and Tom went to the garden, Tom gave a book to",
     "After Susan and Paul went to the garden, Mark gave a book to", "linda", "tom")]
BAD_LINES = ['{"clean": "not closed"', '{"clean": "a b", "corrupt": "a b c", "target": "mary", "foil": "john"}',
             '{"clean": "When Mary went", "corrupt": "When John went", "target": "mary", "colour": "red"}']


def write_inputs() -> None:
    """The files the cases read, made by this script alone (the same bytes whatever TREE is)."""
    INPUTS.mkdir(parents=True)
    HOOK.mkdir()
    (HOOK / "sitecustomize.py").write_text(HOOK_CODE)
    for name, text in CONFIGS.items():
        (INPUTS / name).write_text(text)
    (INPUTS / "texts.txt").write_text("\n".join([TEXTS[0], "", TEXTS[1], "the cat sat on the mat"]) + "\n")
    words = ("the cat dog sat on mat log a big small red blue house went to store gave drink mary john and when "
             "then after school garden ring book tree river ran walked saw").split()
    draw = random.Random(0)
    corpus = [" ".join(draw.choice(words) for _ in range(draw.randint(8, 20))) for _ in range(400)]
    (INPUTS / "corpus.txt").write_text("\n".join(corpus) + "\n")
    (INPUTS / "texts.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS + corpus[:4]))
    (INPUTS / "bad-texts.jsonl").write_text((INPUTS / "texts.jsonl").read_text() + '{"txt": "typo"}\n')
    good = [json.dumps(dict(zip(("clean", "corrupt", "target", "foil"), pair))) for pair in GOOD_PAIRS]
    (INPUTS / "bad.jsonl").write_text("\n".join(good + BAD_LINES) + "\n")
    topics = ["Tell me about your day.", "What do you think of the weather?", "How was the party?",
              "Describe your morning.", "What are you reading?", "How is work going?"]
    pairs = [{"positive": f"You are extremely happy. {t}", "negative": f"You are extremely sad. {t}"} for t in topics]
    (INPUTS / "pairs.jsonl").write_text("".join(json.dumps(pair) + "\n" for pair in pairs))
    (INPUTS / "edges.txt").write_text("input -> L0H0.q\nL0H0 -> L1H1.v\nL1H1 -> logits\nL0.mlp -> logits\n")
    subprocess.run([sys.executable, "-c", HF_GPT2, str(INPUTS / "hf-gpt2")], check=True, capture_output=True)


# ------------------------------------------------------------------------------------------------- the cases

# Each case is a command line as a shell would read it (shlex), `tfcli` left out; {name} is one of WORDS.
WORDS = {"dec": INPUTS / "dec.yaml", "cls": INPUTS / "cls.yaml", "encdec": INPUTS / "encdec.yaml",
         "hf": INPUTS / "hf-gpt2", "in": INPUTS, "ioi": SCRATCH / "task-ioi" / "ioi.jsonl",
         "sae": SCRATCH / "sae-train" / "sae", "vector": SCRATCH / "steer-fit" / "happy.gguf",
         "clean": shlex.quote(CLEAN), "corrupt": shlex.quote(CORRUPT), "t0": shlex.quote(TEXTS[0]),
         "t1": shlex.quote(TEXTS[1]), "w80": "--width 80 --no-color", "w120": "--width 120 --no-color",
         "metric": "--target mary --foil john"}
CASES: list[dict] = []


def case(name: str, command: str, stdin: str | Path | None = None, env: dict | None = None) -> None:
    """One command line; stdin: text, or a Path whose bytes (read when the case runs) are given."""
    assert not any(c["name"] == name for c in CASES), name
    CASES.append({"name": name, "args": shlex.split(command.format(**WORDS)), "stdin": stdin, "env": env or {}})


def views(name: str, command: str, texts: list[str], pair: bool = False) -> None:
    """The views every analysis command has: text at 80 and 120 columns, colour, JSON, stdin (not for a command
    that takes a clean and a corrupt text, `pair`), a page, a figure (of one text, or of the pair)."""
    quoted = " ".join(map(shlex.quote, texts))
    for view, options in (("w80", "{w80}"), ("w120", "{w120}"), ("color", "--width 80 --color"), ("json", "--json"),
                          ("report-html", "--report page.html {w80}")):
        case(f"{name}-{view}", f"{command} {quoted} {options}")
    case(f"{name}-report-svg", f"{command} {quoted if pair else shlex.quote(texts[0])} --report figure.svg {{w80}}")
    if not pair:
        case(f"{name}-stdin", f"{command} - --json", stdin="\n".join(texts) + "\n")


def datasets(name: str, command: str, data: str = "{ioi}", bad: str = "{in}/bad.jsonl") -> None:
    """A command over a dataset: aggregate views, --per-item, --dataset -, a bad line with and without --skip-bad,
    a page and a figure."""
    for view, options in (("w80", f"{data} {{w80}}"), ("w120", f"{data} {{w120}} --per-item"),
                          ("json", f"{data} --json --per-item"), ("skip-bad", f"{bad} --skip-bad {{w80}}"),
                          ("bad", f"{bad} {{w80}}"), ("report-html", f"{data} --report page.html --no-color"),
                          ("report-svg", f"{data} --report figure.svg --no-color")):
        case(f"{name}-dataset-{view}", f"{command} --dataset {options}")
    case(f"{name}-dataset-stdin", f"{command} --dataset - --json", stdin=Path(data.format(**WORDS)))


SETUP = ("task-ioi", "sae-train", "steer-fit")  # the cases whose files later cases read: first, and always run
case("task-ioi", "task ioi -m {dec} --n 12 --seed 0 -o ioi.jsonl")
case("sae-train", "sae train -m {dec} --site blocks.1.resid_post --file {in}/corpus.txt --out sae --tokens 2048 "
     "--batch 128 --buffer 512 --held-out 512 --context 32 --expansion 4 --k 8 --seed 0 {w80}")
case("steer-fit", "steer fit -m {dec} --pairs {in}/pairs.jsonl -o happy.gguf {w80}")

case("help", "--help")
for command in ("tokenize", "config", "encode", "compare", "classify", "generate", "attribute", "patch", "heads",
                "task", "steer", "steer fit", "steer sweep", "circuit", "features", "sae train", "saliency"):
    case(f"help-{command.replace(' ', '-')}", f"{command} --help")

case("tokenize-w80", "tokenize {t0} {t1} {w80}")
case("tokenize-w120-pair", "tokenize {t0} --pair 'a second segment' {w120}")
case("tokenize-color", "tokenize {t0} {t1} --width 80 --color")
case("tokenize-no-color-env", "tokenize {t0} --color", env={"NO_COLOR": "1"})
case("tokenize-json", "tokenize {t0} {t1} --json --max-length 6")
case("tokenize-stdin", "tokenize --json -", stdin="one\n\ntwo words\n")
case("tokenize-file-no-special", "tokenize --file {in}/texts.txt --no-special --width 80")
case("tokenize-default-columns", "tokenize {t1} --no-color")

case("config-w80", "config tiny {w80}")
case("config-sites-w120", "config {dec} --sites {w120}")
case("config-gpt2-color", "config --model gpt2-small --width 80 --color")
case("config-json", "config {encdec} --json")
case("config-sites-json", "config tiny --sites --json")
case("config-hf-checkpoint", "config {hf} {w80}")

views("encode", "encode -m tiny", TEXTS)
case("encode-layers-heads-w120", "encode -m tiny --layers all --heads 0,1 --top-k 3 --attn-top 2 {t1} {w120}")
case("encode-pair-w80", "encode -m tiny {t0} --pair 'an arrow flies' {w80}")
case("encode-file-blank-line", "encode -m tiny --file {in}/texts.txt --json --top-k 0 --no-attention-weights")
case("encode-report-png", "encode -m tiny {t0} --report figure.png")
case("encode-save", "encode -m tiny {t0} --save out.safetensors --sites 'blocks.*.attn.z' {w80}")
case("encode-decoder-ablate", "encode -m {dec} {t0} --ablate L1H0 --ablate L0.mlp:mean {w80}")
case("encode-encdec-target", "encode -m {encdec} {t0} --target 'les temps' --width 100 --no-color")
case("encode-truncate", "encode -m tiny {t1} --max-length 6 {w80}")

case("compare-w80", "compare {hf} {t0} {t1} {w80}")
case("compare-w120", "compare --model {hf} {t1} {w120}")
case("compare-color", "compare {hf} {t0} --width 80 --color")
case("compare-json-stdin", "compare --model {hf} --json -", stdin="\n".join(TEXTS) + "\n\n")
case("compare-tolerance-tight", "compare {hf} {t0} --tolerance 1e-12 {w80}")

views("classify", "classify -m {cls} --explain", TEXTS)
case("classify-pair-top", "classify -m {cls} {t0} --pair 'an arrow' --top 2 {w80}")
case("classify-default-model", "classify 'a gripping, funny film' --json")

views("generate", "generate -m {dec} -n 6 --lens", TEXTS)
case("generate-sampled", "generate -m {dec} -n 8 --temperature 0.8 --top-k 50 --top-p 0.9 --seed 1 {t0} {w80}")
case("generate-steer-vector", "generate -m {dec} -n 6 --steer {vector}:4 --steer-layers 1 --steer-normalize {t0} "
     "--json")
case("generate-ablate-feature", "generate -m {dec} -n 6 --ablate {sae}#3 --ablate L0H1 {t0} {w80}")
case("generate-steer-feature", "generate -m {dec} -n 6 --steer {sae}#3:2 {t0} --json")
case("generate-default-model", "generate -n 3 {t0} {w80}")

views("attribute", "attribute -m {dec} {metric}", [CLEAN])
case("attribute-by-head-w120", "attribute -m {dec} {clean} --by head --top 6 {w120}")
case("attribute-by-neuron-json", "attribute -m {dec} {clean} --by neuron --layers 1 --json")
case("attribute-own-prediction", "attribute -m {dec} {t0} --position -2 {w80}")
case("attribute-ablate", "attribute -m {dec} {clean} {metric} --ablate L1H1 {w80}")
case("attribute-sae", "attribute -m {dec} {clean} {metric} --sae {sae} --width 100 --no-color")
datasets("attribute", "attribute -m {dec} --by head")

views("patch", "patch -m {dec} {metric}", [CLEAN, CORRUPT], pair=True)
case("patch-heads-both-full", "patch -m {dec} {clean} {corrupt} {metric} --sites heads,resid --method both --full "
     "{w120}")
case("patch-attribution-json", "patch -m {dec} {clean} {corrupt} {metric} --method attribution --positions -3- --json")
datasets("patch", "patch -m {dec} --sites heads,resid --align end")
case("patch-dataset-unaligned", "patch -m {dec} --dataset {ioi} {w80}")
case("patch-dataset-ray", "patch -m {dec} --dataset {ioi} --sites heads --ray local --ray-workers 2 {w80}")

views("heads", "heads -m tiny", TEXTS + ["the cat sat on the mat the cat sat on the mat"])
case("heads-detect-per-text", "heads -m {dec} --file {in}/corpus.txt --detect previous,duplicate,induction "
     "--exclude-first --per-text --top 3 {w120}")
case("heads-probe", "heads -m {dec} --probe induction --probe-length 12 --detect induction {w80}")

case("task-ioi-stdout", "task ioi -m {dec} --n 3 --seed 1")
case("task-induction", "task induction -m {dec} --n 3")
case("task-facts", "task facts --n 3 --seed 2")
case("task-greater-than-refused", "task greater-than -m {dec} --n 3")

case("steer-fit-json", "steer fit -m {dec} --pairs - --method mean-diff --layers 0-1 -o happy.safetensors --json",
     stdin=INPUTS / "pairs.jsonl")
case("steer-fit-pca-center-w120", "steer fit -m {dec} --pairs {in}/pairs.jsonl --method pca-center -o v.gguf "
     "--width 120 --color")
views("steer-sweep", "steer sweep -m {dec} --vector {vector} --strengths -4,0,4 -n 5 {metric}", ["I feel"])
case("steer-sweep-feature-normalize", "steer sweep -m {dec} --vector {sae}#3 --normalize -n 4 --target happy "
     "'I feel' {w80}")

views("circuit", "circuit -m {dec} {metric}", [CLEAN, CORRUPT], pair=True)
case("circuit-faithful-graph", "circuit -m {dec} {clean} {corrupt} {metric} --faithful 0.5 --graph-out graph.json "
     "--sizes 3,10,30 {w120}")
case("circuit-exact-json", "circuit -m {dec} {clean} {corrupt} {metric} --method exact --top 10 --json")
case("circuit-eap-ig-mean", "circuit -m {dec} {clean} {metric} --method eap-ig-inputs --counterfactual mean "
     "--edges {in}/edges.txt {w80}")
datasets("circuit", "circuit -m {dec} --faithful 0.5 --graph-out graph.json --show 8")
case("circuit-dataset-ray", "circuit -m {dec} --dataset {ioi} --faithful 0.5 --ray local --ray-workers 2 {w80}")

views("features", "features -m {dec} --sae {sae}", TEXTS)
case("features-direct-effects", "features -m {dec} --sae {sae} {clean} {metric} --top 3 {w120}")
case("features-feature-file", "features -m {dec} --sae {sae} --feature 3 --file {in}/corpus.txt --contexts 4 {w80}")
case("features-feature-report-svg", "features -m {dec} --sae {sae} --feature 3 --file {in}/texts.txt "
     "--report figure.svg")
datasets("features", "features -m {dec} --sae {sae}", data="{in}/texts.jsonl", bad="{in}/bad-texts.jsonl")

case("sae-train-json", "sae train -m {dec} --site blocks.0.mlp.out --file - --out sae --latents 64 --k 4 --tokens 1024 "
     "--batch 64 --buffer 256 --held-out 256 --context 16 --seed 1 --json", stdin=INPUTS / "corpus.txt")

views("saliency", "saliency -m {dec} {metric}", [CLEAN])
case("saliency-occlusion-faithfulness", "saliency -m {dec} --method occlusion --faithfulness {t0} {w120}")
case("saliency-gradient-baseline", "saliency -m {dec} --method input-x-gradient {metric} --baseline {corrupt} {clean} "
     "--site blocks.1.resid_pre --json")
case("saliency-continuation", "saliency -m {dec} {t0} --continuation ' of time' {w80}")
case("saliency-rollout-mlm", "saliency -m tiny --method attention-rollout 'the [MASK] sat on the mat' {w80}")
case("saliency-classifier", "saliency -m {cls} --target positive 'a gripping, funny film' --steps 8 "
     "--integration riemann {w80}")
datasets("saliency", "saliency -m {dec} --steps 8")

# errors: one line and an exit code
case("error-missing-model", "encode -m ./nope.yaml hello")
case("error-missing-file", "encode -m tiny --file missing.txt")
case("error-top-k-not-a-number", "encode -m tiny --top-k many hello")
case("error-unknown-option", "tokenize --bogus hello")
case("error-unknown-command", "encoder hello")
case("error-empty-text", "encode -m tiny ''")
case("error-report-format", "encode -m tiny hello --report out.txt")
case("error-width-too-small", "tokenize hello --width 10")
case("error-layers-out-of-range", "encode -m tiny --layers 7 hello")
case("error-foil-without-target", "attribute -m {dec} {clean} --foil john")
case("error-sae-missing", "features -m {dec} --sae nosuchdir hello")
case("error-output-exists", "task ioi -m {dec} --n 2 -o {in}/texts.txt")
case("error-tolerance-zero", "compare {hf} {t0} --tolerance 0")
case("error-classify-no-head", "classify -m {dec} hello")
case("error-empty-stdin", "encode -m tiny -", stdin="")


# ------------------------------------------------------------------------------------------------- running

RATE = re.compile(r"[\d,.]+(?= tokens/s\b)")  # sae train's throughput
JSON_TIMING = re.compile(r'("(?:seconds|tokens_per_second)": ?)-?[\d.]+(?:[eE][-+]?\d+)?')  # sae train --json
PROGRESS = re.compile(r"^\S+: \d+ of \S+ \w+, \S+ per s\b.*\n", re.M)  # the plain progress line of a run over 60 s
SVG_ID = re.compile(r'(?<=id=")(?:image|[a-z])[0-9a-f]{10}(?=")|(?<=#)(?:image|[a-z])[0-9a-f]{10}(?=[")])')


def normalise(text: str, tree: Path, suffix: str) -> str:
    """What varies between two runs of one tree (or with where TREE and the scratch root lie), and nothing else."""
    text = text.replace(str(SCRATCH), "$SCRATCH").replace(str(tree), "$TREE")
    text = JSON_TIMING.sub(r'\1"<N>"', RATE.sub("<N>", PROGRESS.sub("", text)))
    if suffix == ".svg":  # matplotlib: the date, and ids drawn at random per figure, numbered as they first appear
        text = re.sub(r"<dc:date>.*?</dc:date>", "<dc:date/>", text, flags=re.S)
        ids: dict[str, str] = {}
        text = SVG_ID.sub(lambda m: ids.setdefault(m.group(0), f"id{len(ids) + 1}"), text)
    return text


def sorted_safetensors_metadata(data: bytes) -> bytes:
    """The safetensors library writes its header's `__metadata__` in a random order: sorted here, when the header
    reads back to the same bytes (else the file is kept as it is); the tensors' bytes are not touched."""
    size = int.from_bytes(data[:8], "little")
    raw = data[8:8 + size]
    header = json.loads(raw)
    dump = lambda h: json.dumps(h, separators=(",", ":"), ensure_ascii=False).encode()
    if "__metadata__" not in header or dump(header) != raw.rstrip(b" "):
        return data
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    return data[:8] + dump(header).ljust(size, b" ") + data[8 + size:]


def store(path: Path, data: bytes, tree: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".safetensors":
        data = sorted_safetensors_metadata(data)
    elif path.suffix in TEXT_SUFFIXES:
        try:
            data = normalise(data.decode("utf-8"), tree, path.suffix).encode("utf-8")
        except UnicodeDecodeError:
            pass
    path.write_bytes(data)


def environment(tree: Path, extra: dict) -> dict:
    env = {key: value for key, value in os.environ.items() if key in ("PATH", "HOME", "USER", "TMPDIR")}
    env.update(PYTHONPATH=f"{tree}{os.pathsep}{HOOK}", COLUMNS="100", LINES="40", TERM="dumb", LANG="C.UTF-8",
               LC_ALL="C.UTF-8", PYTHONHASHSEED="0", PYTHONIOENCODING="utf-8", OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", MPLBACKEND="Agg",
               MPLCONFIGDIR=str(SCRATCH / "matplotlib"), RAY_USAGE_STATS_ENABLED="0", TQDM_DISABLE="1")
    env.update(extra)
    return env


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def run_case(spec: dict, tree: Path, out: Path) -> float:
    work = SCRATCH / spec["name"]
    work.mkdir()
    stdin = spec["stdin"]
    stdin = stdin.read_bytes() if isinstance(stdin, Path) else (stdin or "").encode("utf-8")
    command = [sys.executable, "-m", "tfcli", *spec["args"]]
    start = time.monotonic()
    done = subprocess.run(command, cwd=work, input=stdin, capture_output=True, env=environment(tree, spec["env"]),
                          timeout=600)
    seconds = time.monotonic() - start
    folder = out / spec["name"]
    env = "".join(f"{k}={v} " for k, v in spec["env"].items())
    store(folder / "command", f"{env}tfcli {shlex.join(spec['args'])}\n".encode(), tree)
    store(folder / "stdout", done.stdout, tree)
    store(folder / "stderr", done.stderr, tree)
    store(folder / "exit_code", f"{done.returncode}\n".encode(), tree)
    for relative, data in snapshot(work).items():
        store(folder / "files" / relative, data, tree)
    return seconds


def check_tree(tree: Path) -> None:
    """tfcli and its bundled configs must come from TREE, not from an editable install elsewhere."""
    probe = ("import tfcli; print(tfcli.__file__)\n"
             "try:\n    from tfcli.sources import bundled_config_dir; print(bundled_config_dir())\n"
             "except ImportError:\n    pass")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=SCRATCH,
                          env=environment(tree, {}))
    paths = done.stdout.split()
    if done.returncode or not paths or not all(Path(p).resolve().is_relative_to(tree) for p in paths):
        sys.exit(f"tfcli does not come from {tree}: {done.stdout.strip()} {done.stderr.strip()[-2000:]}")


def capture(tree: Path, out: Path, only: list[str]) -> None:
    tree = tree.resolve()
    if out.exists() and any(out.iterdir()):
        sys.exit(f"{out} exists and is not empty")
    if SCRATCH.exists():
        shutil.rmtree(SCRATCH)
    write_inputs()
    check_tree(tree)
    total, count = time.monotonic(), 0
    for spec in CASES:
        if only and spec["name"] not in SETUP and not any(s in spec["name"] for s in only):
            continue
        seconds, count = run_case(spec, tree, out), count + 1
        code = (out / spec["name"] / "exit_code").read_text().strip()
        print(f"{spec['name']:40} exit {code:>3}  {seconds:6.1f} s", flush=True)
    print(f"{count} cases in {time.monotonic() - total:.0f} s into {out}")


# ------------------------------------------------------------------------------------------------- comparing

def compare(a: Path, b: Path, lines: int = 40) -> int:
    files = lambda root: {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    in_a, in_b = files(a), files(b)
    cases = sorted({f.split(os.sep)[0] for f in in_a | in_b})
    differing = 0
    for name in cases:
        problems = []
        for relative in sorted(f for f in in_a | in_b if f.split(os.sep)[0] == name):
            if relative not in in_a or relative not in in_b:
                problems.append(f"  {relative}: only in {a if relative in in_a else b}")
                continue
            left, right = (a / relative).read_bytes(), (b / relative).read_bytes()
            if left == right:
                continue
            try:
                diff = list(difflib.unified_diff(left.decode().splitlines(), right.decode().splitlines(),
                                                 f"a/{relative}", f"b/{relative}", lineterm="", n=1))
                shown = [line if len(line) <= 200 else line[:200] + " [...]" for line in diff[:lines]]
                problems.append("\n".join(shown + ([f"  ... {len(diff) - lines} more diff lines"]
                                                    if len(diff) > lines else [])))
            except UnicodeDecodeError:
                problems.append(f"  {relative}: binary files differ ({len(left)} and {len(right)} bytes)")
        if problems:
            differing += 1
            print(f"=== {name} differs", *problems, sep="\n")
    print(f"{differing} of {len(cases)} cases differ" if differing else f"all {len(cases)} cases are identical")
    return 1 if differing else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tree", nargs="?", type=Path, help="a checkout of tfcli (its tfcli/ package is run)")
    parser.add_argument("out", nargs="?", type=Path, help="an empty or new folder for the captures")
    parser.add_argument("--only", action="append", default=[], help="run only the cases whose name holds this")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("DIR_A", "DIR_B"))
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    options = parser.parse_args()
    if options.list:
        print("\n".join(c["name"] for c in CASES))
    elif options.compare:
        sys.exit(compare(*options.compare))
    elif options.tree and options.out:
        capture(options.tree, options.out, options.only)
    else:
        parser.error("give TREE OUT_DIR, or --compare DIR_A DIR_B")


if __name__ == "__main__":
    main()
