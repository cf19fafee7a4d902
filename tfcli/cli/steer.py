"""`tfcli steer`: steering vectors. `steer fit` finds a direction per block from contrast pairs and writes it as
llama.cpp's control-vector GGUF or as safetensors (the core is `tfcli/steer.py`, the file format
`tfcli/analysis/vectors.py`, the view `tfcli/render/steer.py`; docs/steering.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tfcli.cli.common import (ColorOption, DeviceOption, DtypeOption, RevisionOption, SeedOption, WidthOption, app,
                              build, count_bar, emit, note, output_console, tokenizer_of, warn)
from tfcli.errors import usage_error

steer_app = typer.Typer(
    name="steer",
    cls=app.info.cls,  # the root group's error reporting and help layout
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Steering vectors: fit a direction per block from contrast pairs, as a file llama.cpp reads.",
)
app.add_typer(steer_app)


@steer_app.command()
def fit(
    model: Annotated[str | None, typer.Option("--model", "-m", metavar="SRC", help="Model source: a path, a "
                                              "bundled config name or a Hugging Face hub id.",
                                              show_default=False)] = None,
    pairs: Annotated[str | None, typer.Option("--pairs", metavar="FILE", help="JSON Lines, one {\"positive\": TEXT, "
                                              "\"negative\": TEXT} per line (`-`: stdin).",
                                              show_default=False)] = None,
    method: Annotated[str, typer.Option(metavar="METHOD", help="pca-diff (first principal component of the "
                                        "differences), pca-center (of the pair-centred texts) or mean-diff (mean "
                                        "of the differences).")] = "pca-diff",
    layers: Annotated[str | None, typer.Option(metavar="LAYERS", help="The blocks to fit, e.g. 8-11 or -4- or 3,7 "
                                               "(default: every block but 0, which llama.cpp never "
                                               "steers).")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", metavar="PATH", dir_okay=False,
                                                help="Write the vector to PATH: .gguf (llama.cpp's control vector) "
                                                "or .safetensors.", show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite the --output file if it exists.")] = False,
    revision: RevisionOption = None,
    device: DeviceOption = "cpu",
    dtype: DtypeOption = "float32",
    seed: SeedOption = 0,
    json_output: Annotated[bool, typer.Option("--json", help="One JSON object on stdout: layers [{layer, "
                                              "separation, gap}], method, model_hint, width, output.")] = False,
    width: WidthOption = None,
    color: ColorOption = None,
) -> None:
    """Fit a steering vector: per block, the direction of the residual stream (the block's output at each text's
    last token) that separates the positive texts of contrast pairs from their negatives; print how well it
    separates them and write it where llama.cpp reads it (--control-vector).

    \b
    Examples:
      tfcli steer fit -m path/to/model --pairs happy-sad.jsonl -o happy.gguf
      tfcli steer fit -m path/to/model --pairs pairs.jsonl --layers 8-20 \\
          --method mean-diff -o vector.safetensors --json
    """
    from tfcli import steer as core
    from tfcli.analysis.dataset import checked
    from tfcli.analysis.vectors import check_output, write_vector
    from tfcli.render import steer as render
    from tfcli.sources import resolve_source

    out = output_console(width, color)
    if model is None:
        raise usage_error("give --model: the model to fit the vector on")
    if pairs is None:
        raise usage_error("give --pairs FILE: JSON Lines of {\"positive\": ..., \"negative\": ...}")
    if output is None:
        raise usage_error("give --output PATH (.gguf or .safetensors): where the vector is written")
    core.check_method(method)
    check_output(output, force)
    source = resolve_source(model, revision)
    core.check_model(source.config)
    chosen = core.chosen_layers(source.config, layers)
    check_output(output, force, chosen)  # a GGUF cannot hold block 0
    tokenizer = tokenizer_of(source)
    read = checked(pair_lines(pairs), core.PAIR_LINE, lambda line: core.check_pair(source.config, tokenizer, line),
                   False, warn)
    core.check_pairs(read)
    if layers is None:
        note(f"blocks {chosen[0]}-{chosen[-1]}: every block but 0, whose output llama.cpp never steers "
             "(--layers picks others)" if chosen != [0] else "block 0: the model's only block")
    loaded = build(source, device, dtype, seed, "a direction fitted on random weights steers nothing")
    with count_bar("steer fit", "texts") as progress:
        result = core.fit(loaded, tokenizer, read, method, chosen, progress=progress)
    write_vector(output, result.directions, result.model_hint, force)
    result.output = str(output)
    emit([result], out=out, json_output=json_output, record=render.record,
         lines=lambda fitted, number: render.fit_lines(fitted, out.width))


def pair_lines(path: str) -> list[tuple[int, str]]:
    """The numbered lines of the pairs file, its errors said with --pairs (the dataset reader names --dataset)."""
    from tfcli.analysis.dataset import read_lines
    from tfcli.errors import TfcliError

    try:
        return read_lines(path)
    except TfcliError as error:
        if error.parameter == "dataset":
            error.message = "--pairs " + error.message.removeprefix("dataset ")
            error.parameter = None
            error.args = (error.message,)
        raise
