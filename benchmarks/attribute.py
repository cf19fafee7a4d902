"""What direct logit attribution costs: `attribute` against `encode` on the same text and model, in one process.

    python benchmarks/attribute.py [--model SRC] [--runs N] [--by component|head|neuron]

Both run their core pipeline (tfcli.commands.encode.core.run with its defaults, tfcli.commands.attribute.core.run) on
the same tokenized text, warmed up, in turns, so that load from other processes hits both alike; printed: each one's
time, min-max (median) over the runs, and the run-by-run ratio attribute / encode (target <= 1.3), with the load
average. Default model: the bundled gpt2-small (random weights: the cost does not depend on them) and a 45-token
sentence.
"""

from __future__ import annotations

import argparse
import time

from measure import load_average, machine, ratios, spread

TEXT = ("When Mary and John went to the store on the corner of the old market street, John gave a drink to his "
        "friend, and then they walked home together in the rain while the lights of the town came on")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2-small")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--by", default="head")
    args = parser.parse_args()

    import tfcli
    from tfcli.commands.attribute import core as attribute
    from tfcli.commands.encode import core as encode

    model, tokenizer = tfcli.load_model(args.model), tfcli.load_tokenizer(args.model)
    encodings = tokenizer.encode([TEXT])
    options = encode.check_options(model.config, None, None, encode.DEFAULT_TOP_K)
    attribute_options = attribute.AttributeOptions(by=args.by)

    def run_encode() -> float:
        start = time.perf_counter()
        list(encode.run(model, tokenizer, [encodings], options, None, max_capture_mb=1024))
        return time.perf_counter() - start

    def run_attribute() -> float:
        start = time.perf_counter()
        list(attribute.run(model, tokenizer, [encodings], attribute_options))
        return time.perf_counter() - start

    for _ in range(2):  # warm-up (and the packed kernels, from each layer's second product on)
        run_encode(), run_attribute()
    times: dict[str, list[float]] = {"encode": [], "attribute": []}
    for _ in range(args.runs):
        times["encode"].append(run_encode())
        times["attribute"].append(run_attribute())
    print(machine(in_process=True))
    print(f"{args.model}, {len(encodings[0].ids)} tokens, attribute --by {args.by}; {load_average()}")
    for name, seconds in times.items():
        print(f"{name}: {spread(seconds, ' ms', 1e3, 1)}")
    print(f"attribute / encode: {spread(ratios(times['attribute'], times['encode']))} (target <= 1.3)")


if __name__ == "__main__":
    main()
