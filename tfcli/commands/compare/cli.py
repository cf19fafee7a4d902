"""tfcli compare: the command line (its options, its session, its output)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from tfcli.cli.app import app
from tfcli.cli.console import output_console, say, warn
from tfcli.cli.output import View, emit
from tfcli.cli.session import inputs, noted, started
from tfcli.cli.options import POSITIVE, FileOption, RunOptions, shared_options
from tfcli.errors import usage_error
from tfcli.texts import CappedWarnings, tokenized

@app.command()
@shared_options(without=("seed", "report", "force"),
                dtype="float32, float16 or bfloat16: both models run in it.")
def compare(
    arguments: Annotated[list[str] | None, typer.Argument(metavar="SRC TEXT", show_default=False,
                                                          help="A checkpoint directory (config.json + weights), unless "
                                                          "--model gives it, then texts; `-` alone reads stdin.")] = None,
    file: FileOption = None,
    tolerance: Annotated[float | None, typer.Option(metavar="T", callback=POSITIVE, show_default=False,
                                                    help="Largest difference that counts as a match (default: 1e-4 "
                                                    "in float32; in bfloat16 0.05 and in float16 0.01 of each "
                                                    "tensor's largest value).")] = None,
    *,
    run: RunOptions,
) -> None:
    """Run transformers' own model on the same checkpoint and texts; print each tensor's max abs difference.
    Exits 1 when a difference exceeds --tolerance.

    \b
    Examples:
      tfcli compare path/to/checkpoint "time flies like an arrow"
      tfcli compare --model path/to/checkpoint --json - < texts.txt
    """
    from tfcli.commands.compare import core, render

    arguments = list(arguments or [])
    model = run.model
    if model is None:
        if not arguments:
            raise usage_error("no model source given", "tfcli compare SRC TEXT... or tfcli compare --model SRC TEXT...")
        model = arguments.pop(0)
    elif arguments and _names_a_model(arguments[0], model):
        raise usage_error("give the model source once: as SRC or with --model, not both",
                          f"with --model every argument is a text: tfcli compare --model {model} TEXT...")
    out = output_console(run.width, run.color)
    texts_in = inputs(arguments or None, file)
    batches = started(texts_in.batches(1))
    models = core.load(model, run.device, run.revision, run.dtype)
    noted(models.tokenizer)
    positions = models.resolved.config.max_position_embeddings
    truncated = CappedWarnings(warn, "texts truncated")
    chunks = (tokenized(models.tokenizer, batch, positions, truncated) for batch in batches)
    worst, failed, tolerance_said = 0.0, 0, ""

    def judged(comparisons: Iterator[core.Comparison]) -> Iterator[core.Comparison]:
        """The same comparisons, the largest difference and the failures counted on the way."""
        nonlocal worst, failed, tolerance_said
        for comparison in comparisons:
            worst = max(worst, comparison.worst_failure)
            failed += not comparison.matches
            tolerance_said = render.tolerance_words(comparison)
            yield comparison

    count = emit(judged(core.run_all(models, chunks, tolerance)),
                 View(out, render.record, lambda comparison, number: render.compare_lines(comparison, number,
                                                                                          out.width), spaced=True),
                 run.json_output, truncated=truncated)
    if failed:
        which = f"in {failed} of {count} texts " if count > 1 else ""
        say(f"largest difference {worst:.3g} {which}exceeds {tolerance_said}")
        raise typer.Exit(1)


def _names_a_model(argument: str, model: str) -> bool:
    """Whether compare's first text is in fact a model source (the --model one again, or a checkpoint path): the
    mistake `tfcli compare ckpt --model ckpt hi`, which would otherwise run the path as a text."""
    if argument == model:
        return True
    path = Path(argument)
    try:
        return (path.is_dir() and (path / "config.json").is_file()) or (
            path.is_file() and path.suffix.lower() in (".json", ".yaml", ".yml", ".gguf", ".safetensors", ".bin"))
    except OSError:  # a text too long to be a path
        return False
