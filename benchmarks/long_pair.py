"""What a long pair costs against its ending (issue 51, item 2): `patch` of a clean/corrupt pair of about 300 tokens
that differ near their end, against `patch` of the same pair cut to its last 20 tokens. A causal stack changes
nothing before the first difference, so the long pair should cost little more than its ending (target: at most
1.3x): the corrupt run reads the clean run's keys and values before the first difference, and the sweep skips the
positions there.

    python benchmarks/long_pair.py [--shape smollm2|gpt2] [--layers N] [--tokens 300] [--ending 20]
                                   [--sites resid,attn,mlp,heads] [--method activation|attribution|both] [--runs 5]

The model is random (the cost does not depend on the weights), built by transformers and saved with
save_pretrained (benchmarks/patch.py's `build`), the bundled BERT WordPiece tokenizer. The two pairs' scores at
the ending's positions are checked against each other first (the long pair's at those positions differ: they read
a longer context; only their count matters). Printed: each pair's time, min-max (median) over the runs taken in
turns, the ratio per run, torch's threads and the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measure import in_turns, load_average, machine, ratios, spread  # noqa: E402
from patch import build  # noqa: E402

SENTENCE = "The committee met again on a grey morning and read the long report aloud before anyone spoke. "
CLEAN_END = "When Mary and John went to the store, John gave a drink to"
CORRUPT_END = "When Mary and John went to the store, Mary gave a drink to"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="smollm2", choices=["smollm2", "gpt2"])
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--ending", type=int, default=20)
    parser.add_argument("--sites", default="resid,attn,mlp,heads")
    parser.add_argument("--method", default="activation", choices=["activation", "attribution", "both"])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    import torch

    import tfcli
    from tfcli.commands.patch import core as patch

    before = load_average()
    print(machine(in_process=True))
    with tempfile.TemporaryDirectory() as path:
        build(args.shape, args.layers, path)
        model, tokenizer = tfcli.load_model(path), tfcli.load_tokenizer(path)
    end_clean, end_corrupt, filler = (e.ids for e in tokenizer.encode([CLEAN_END, CORRUPT_END, SENTENCE * 40],
                                                                        add_special_tokens=False))
    head = filler[:args.tokens - len(end_clean)]
    clean, corrupt = head + end_clean, head + end_corrupt
    first = next(i for i, (a, b) in enumerate(zip(clean, corrupt)) if a != b)
    target, foil = tokenizer.token_to_id("mary"), tokenizer.token_to_id("john")
    options = patch.PatchOptions(target=f"#{target}", foil=f"#{foil}", sites=tuple(args.sites.split(",")),
                                 method=args.method)
    print(f"{args.shape}-shaped, {model.config.num_hidden_layers} layers, random weights; a pair of {len(clean)} "
          f"tokens differing first at position {first}, against its last {args.ending}; sites {args.sites}, method "
          f"{args.method}; torch threads {torch.get_num_threads()}")

    def run(ids_clean, ids_corrupt):
        return lambda: patch.run_ids(model, tokenizer, ids_clean, ids_corrupt, options)

    contenders = {"long": run(clean, corrupt), "ending": run(clean[-args.ending:], corrupt[-args.ending:])}
    times = in_turns(contenders, args.runs, warmups=1)
    for name, seconds in times.items():
        print(f"  {name}: {spread(seconds, ' s')}")
    print(f"  long / ending: {spread(ratios(times['long'], times['ending']))} (target <= 1.3)")
    print(f"load average before: {before}; after: {load_average()}")


if __name__ == "__main__":
    main()
