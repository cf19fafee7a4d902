"""`tfcli task`: write a task's dataset (ioi, greater-than, induction, facts) for a model's tokenizer, the JSON Lines
that `--dataset FILE` reads. Only the model's config and tokenizer are read: no model is built. The generators are
`tfcli.commands.task.core`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tfcli.commands.task.core import DEFAULT_N, TASKS
from tfcli.cli.app import app
from tfcli.cli.console import say, warn
from tfcli.cli.session import tokenizer_of
from tfcli.cli.options import AT_LEAST_ONE, RunOptions, shared_options
from tfcli.errors import check_output_file, replace_atomically


@app.command()
@shared_options(without=("device", "dtype", "json_output", "report", "width", "color"), default_model="gpt2-small",
                model="The model whose tokenizer the dataset is for (default: the bundled `gpt2-small`, whose "
                      "tokenizer is the bundled BERT WordPiece). Only its config and tokenizer are read.",
                seed="Seed of the draws: the same seed, the same lines (--n N: the first N of a longer run).",
                force="Overwrite the --output file if it exists.")
def task(
    name: Annotated[str, typer.Argument(metavar="TASK", help=f"The task: {', '.join(TASKS)}.", show_default=False)],
    n: Annotated[int, typer.Option("--n", metavar="N", callback=AT_LEAST_ONE,
                                   help="Lines to write (distinct clean prompts).")] = DEFAULT_N,
    output: Annotated[Path | None, typer.Option("--output", "-o", metavar="PATH", dir_okay=False,
                                                help="Write the lines to PATH (default: stdout).")] = None,
    *,
    run: RunOptions,
) -> None:
    """Write a task's dataset for a model's tokenizer: JSON Lines of {"clean", "corrupt", "target", "foil"}, the
    file `--dataset` reads.

    Tasks: ioi (indirect-object identification, Wang et al. 2022), greater-than (Hanna et al. 2023), induction (a
    repeated random sequence of words) and facts (a subject's city, capital, language, sport, ..., from the table
    tfcli ships). Every line is checked on the tokenizer: target and foil one token each, what the clean prompt reads
    next, and clean and corrupt prompts as many tokens long.

    \b
    Examples:
      tfcli task ioi --model path/to/gpt2 --n 200 --output ioi.jsonl
      tfcli task facts --model SmolLM2-135M-Instruct.Q4_1.gguf --seed 1
      tfcli task greater-than -m path/to/gpt2 | head -3
    """
    from tfcli.commands.task import core as tasks
    from tfcli.render.jsonl import dumps, write_jsonl
    from tfcli.sources import resolve_source

    tasks.check_task(name)
    if output is not None:
        check_output_file(output, run.force)
    source = resolve_source(run.model, run.revision)
    tokenizer = tokenizer_of(source)
    if source.config.architecture != "decoder":
        warn(f"{source.config.name} is not a decoder: these prompts ask for the next token, read at the last position")
    lines = tasks.generate(name, tokenizer, source.config, n, run.seed)
    if output is None:
        write_jsonl(lines)
        return
    text = "".join(dumps(line) + "\n" for line in lines)
    replace_atomically(output, lambda temporary: Path(temporary).write_text(text, encoding="utf-8"))
    say(f"wrote {len(lines)} {name} lines for {tokenizer.name} (seed {run.seed}) to {output}",
        whole=[str(output), tokenizer.name])
