"""The options the commands share: their types (`Annotated` Typer options, declared once here and named in each
command's signature), the checks on their values (`AT_LEAST_ONE`, ...), and the objects they reach a core as
(`RunOptions`, `DatasetOptions`, Ray's settings).
"""

from __future__ import annotations

import copy
import functools
import inspect
import os
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from tfcli.errors import usage_error
from tfcli.render.layout import MIN_WIDTH
from tfcli.texts import Inputs


def requires(test: Callable[[Any], bool], requirement: str):
    """An option callback: a usage error naming the option when a given value fails `test`."""

    def check(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
        if value is not None and not test(value):
            raise usage_error(f"{param.opts[0]} {requirement}, got {value}")
        return value

    return check


AT_LEAST_ONE = requires(lambda value: value >= 1, "must be at least 1")
NOT_NEGATIVE = requires(lambda value: value >= 0, "must be at least 0")
POSITIVE = requires(lambda value: value > 0, "must be positive")
PROBABILITY = requires(lambda value: 0 < value <= 1, "must be in (0, 1]")
SEED_RANGE = requires(lambda value: 0 <= value < 2**64, "must be between 0 and 2**64 - 1")
WIDE_ENOUGH = requires(lambda value: value >= MIN_WIDTH, f"must be at least {MIN_WIDTH}")


TextsArgument = Annotated[
    list[str] | None,
    typer.Argument(metavar="TEXT", help="Texts to process; `-` alone reads stdin, one text per line.",
                   show_default=False),
]
FileOption = Annotated[Path | None, typer.Option("--file", "-f", metavar="FILE", dir_okay=False,
                                                 help="Read texts from FILE, one per line.")]
ModelOption = Annotated[
    str | None,
    typer.Option("--model", "-m", metavar="SRC", help="Model source: a path, a bundled config name or a Hugging Face hub id."),
]
RevisionOption = Annotated[str | None, typer.Option(metavar="REV", help="Branch, tag or commit of a Hugging Face hub model.")]
JsonOption = Annotated[bool, typer.Option("--json", help="JSON Lines on stdout, one object per text.")]
DeviceOption = Annotated[str, typer.Option(metavar="DEVICE", help="auto, cpu, cuda, cuda:N or mps.")]
DtypeOption = Annotated[str, typer.Option(metavar="DTYPE", help="float32, float16 or bfloat16.")]
SeedOption = Annotated[int, typer.Option(metavar="N", help="Seed of the random weights when the model has none.",
                                         callback=SEED_RANGE)]
PairOption = Annotated[str | None, typer.Option(metavar="TEXT", help="Second segment, paired with every text.")]
# no range check here: the smallest useful N depends on the tokenizer's special tokens, which it checks (one message)
MaxLengthOption = Annotated[int | None, typer.Option("--max-length", metavar="N",
                                                     help="Truncate texts to at most N tokens (default: the model's "
                                                     "positions).")]
ReportOption = Annotated[Path | None, typer.Option(
    "--report", metavar="PATH", dir_okay=False,
    help="Also write the results to PATH: an interactive page (.html) or a figure (.svg, .png, .pdf).")]
ReportForceOption = Annotated[bool, typer.Option("--force", help="Overwrite the --report file if it exists.")]
DatasetOption = Annotated[str | None, typer.Option(
    "--dataset", metavar="FILE", help="Run over a dataset instead: JSON Lines, one item per line (`-`: stdin); "
    "prints the aggregate with its spread (docs/datasets.md).")]
SkipBadOption = Annotated[bool, typer.Option("--skip-bad", help="With --dataset: skip the lines that cannot be used "
                                             "(saying why on stderr) instead of refusing the dataset.")]
BootstrapOption = Annotated[int | None, typer.Option(metavar="N", help="With --dataset: resamples of the 95% "
                                                     "bootstrap interval over items (default 1000; 0: none).")]
PerItemOption = Annotated[bool, typer.Option("--per-item", help="With --dataset: first each item's result, as a "
                                             "single run prints it, then the aggregate.")]
WidthOption = Annotated[int | None, typer.Option(
    "--width", metavar="N", callback=WIDE_ENOUGH,
    help="Lay tables out for N columns (default: $COLUMNS, else the terminal's width, else 120).")]
ColorOption = Annotated[bool | None, typer.Option(
    "--color/--no-color", show_default=False,
    help="Colour on or off (default: on when stdout is a terminal and NO_COLOR is unset).")]

# the metric of an analysis that reads a logit (or the difference of two), declared once: a command whose words
# differ says its help its own way with `with_help`; with --dataset each line has its own (`DatasetFlags.each_line_has`)
TargetOption = Annotated[str | None, typer.Option(
    metavar="TOKEN", show_default=False, help="The token whose logit is the metric (\" Mary\" with its leading space "
    "for byte-level BPE, or #ID; with --dataset: each line's).")]
FoilOption = Annotated[str | None, typer.Option(metavar="TOKEN", help="The metric is the difference of the logits "
                                                "target - foil.")]
PositionOption = Annotated[int | None, typer.Option(metavar="N", help="The position the metric is read at, negative "
                                                    "counting from the end (default: the last token).")]

AblateOption = Annotated[list[str] | None, typer.Option(
    "--ablate", metavar="SITE[:zero|mean]", help="Run with a component removed: a head (L23H3), a sublayer's output "
    "(L5.mlp, L5.attn) or any site name, * allowed; zeroed, or :mean (its mean over the text's positions); an "
    "SAE's feature, SAE#N (SAE#N=V: clamped to V), its error term kept; repeatable.")]


RayOption = Annotated[str | None, typer.Option(
    "--ray", metavar="ADDRESS", help="Spread the dataset over a Ray cluster: its address (ray://HOST:10001, auto) "
    "or `local` (one on this machine); default $TFCLI_RAY_ADDRESS (docs/ray.md).")]
RayWorkersOption = Annotated[int | None, typer.Option("--ray-workers", metavar="N", help="With --ray: workers, each "
                                                      "with the model loaded (default: one per CPU of the cluster).")]
RayGpusOption = Annotated[float | None, typer.Option("--ray-gpus-per-worker", metavar="G", help="With --ray: GPUs "
                                                     "per worker (the model goes on its GPU).")]


def ray_settings(address: str | None, workers: int | None, gpus: float | None, dataset: bool, what: str):
    """--ray (or $TFCLI_RAY_ADDRESS where the command runs a dataset) and its options, checked (tfcli.cluster);
    None for a run on this process."""
    from tfcli.cluster import check_settings

    if not dataset:
        if address is not None or workers is not None or gpus is not None:
            raise usage_error(f"--ray and its options are for {what}")
        return None
    return check_settings(address or os.environ.get("TFCLI_RAY_ADDRESS") or None, workers, gpus)


@dataclass(kw_only=True)
class RunOptions:
    """The options every command that builds a model shares (`SHARED`), as one object: the model (--model as given,
    or the command's default; --revision), how it is built (--device, --dtype, --seed) and how the results are shown
    (--json, --report, --force, --width, --color)."""

    model: str | None
    revision: str | None
    device: str
    dtype: str
    seed: int
    json_output: bool
    report: Path | None
    force: bool
    width: int | None = None
    color: bool | None = None

    def spec(self):
        """What a Ray worker needs to build the model as this process does (tfcli.cluster)."""
        from tfcli.cluster import spec_of

        return spec_of(self.model, self.revision, self.device, self.dtype, self.seed)


# the options every command that builds a model shares, declared once: name -> (option type, default)
SHARED = {"model": (ModelOption, None), "revision": (RevisionOption, None), "device": (DeviceOption, "cpu"),
          "dtype": (DtypeOption, "float32"), "seed": (SeedOption, 0), "json_output": (JsonOption, False),
          "report": (ReportOption, None), "force": (ReportForceOption, False), "width": (WidthOption, None),
          "color": (ColorOption, None)}


def shared_options(without: tuple[str, ...] = (), default_model: str | None = None, dataset: bool = False,
                   **helps: str):
    """A command's decorator (under @app.command()): the command's options gain the SHARED ones but those
    `without`, each with its help said the command's own way where `helps` has it (`json_output="..."`), and the
    command gets them as one object, its parameter `run: RunOptions` (the model `default_model` when none is
    given). With `dataset`, also the DATASET ones (but those `without`), as its parameter `data: DatasetFlags`."""
    groups = ([DATASET] if dataset else []) + [SHARED]

    def declare(command: Callable) -> Callable:
        own = inspect.signature(command, eval_str=True)
        params = [param for name, param in own.parameters.items() if name not in ("run", "data")]
        for name, (kind, default) in [item for group in groups for item in group.items()]:
            if name not in without:
                kind = with_help(kind, helps[name]) if name in helps else kind
                params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                                annotation=kind))

        @functools.wraps(command)
        def with_shared(**given: Any) -> Any:
            shared = {name: given.pop(name, default) for name, (_, default) in SHARED.items()}
            shared["model"] = shared["model"] or default_model
            if dataset:
                given["data"] = DatasetFlags(**{name: given.pop(name, default)
                                                for name, (_, default) in DATASET.items()})
            return command(**given, run=RunOptions(**shared))

        with_shared.__signature__ = own.replace(parameters=params)  # what Typer reads the options from
        with_shared.__annotations__ = {}
        return with_shared

    return declare


def with_help(kind: Any, text: str) -> Any:
    """An `Annotated` option type with another help text."""
    base, info = typing.get_args(kind)
    info = copy.copy(info)
    info.help = text
    return Annotated[base, info]


# --dataset and the options that go with it, which every analysis over many items shares (`shared_options`)
DATASET = {"dataset": (DatasetOption, None), "bootstrap": (BootstrapOption, None), "per_item": (PerItemOption, False),
           "skip_bad": (SkipBadOption, False), "ray": (RayOption, None), "ray_workers": (RayWorkersOption, None),
           "ray_gpus_per_worker": (RayGpusOption, None)}


@dataclass
class DatasetFlags:
    """--dataset and the options that go with it, as given (DATASET)."""

    dataset: str | None = None
    bootstrap: int | None = None
    per_item: bool = False
    skip_bad: bool = False
    ray: str | None = None
    ray_workers: int | None = None
    ray_gpus_per_worker: float | None = None

    def only_with_a_dataset(self, *names: str) -> None:
        """A usage error for the first of these options (`bootstrap`, `per_item`, `skip_bad`) given without
        --dataset."""
        for name in names:
            if self.dataset is None and getattr(self, name) not in (None, False):
                raise usage_error(f"--{name.replace('_', '-')} is for a --dataset")

    def each_line_has(self, **given: Any) -> None:
        """With --dataset: a usage error for the first of these options given (`target=...`), which each line of the
        dataset has its own."""
        for name, value in given.items():
            if self.dataset is not None and value is not None:
                raise usage_error(f"--{name} is read from each line of the dataset", f"give `{name}` in the lines")

    def cluster(self, many: bool, what: str):
        """--ray's settings, checked (`ray_settings`): None for a run on this process; refused where the run is not
        over many items (`many` False; `what`: what --ray is for)."""
        return ray_settings(self.ray, self.ray_workers, self.ray_gpus_per_worker, many, what)

    def options(self, cluster, texts: Inputs | None = None) -> DatasetOptions:
        """What the runner reads (`run_dataset`): this dataset, or `texts`, on `cluster` (None: this process)."""
        return DatasetOptions(path=self.dataset, bootstrap=self.bootstrap, per_item=self.per_item,
                              skip_bad=self.skip_bad, ray=cluster, texts=texts)


@dataclass(kw_only=True)
class DatasetOptions:
    """--dataset and the options that go with it: --bootstrap, --per-item, --skip-bad and --ray's settings; or,
    instead of a dataset's `path`, `texts` (the arguments, stdin or --file), each read as the line {"text": TEXT}."""

    path: str | None
    bootstrap: int | None
    per_item: bool
    skip_bad: bool
    ray: Any  # tfcli.cluster.RaySettings, or None: this process
    texts: Inputs | None = None
