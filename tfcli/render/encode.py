"""Render an `encode` report: rich tables (shapes, attention heatmaps, logit lens), JSON Lines records
and the --save safetensors file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from tfcli.errors import TfcliError

if TYPE_CHECKING:
    from rich.console import Console
    from torch import Tensor

    from tfcli.encode import AttentionMap, TextReport

KIND_TITLES = {"self": "attention", "encoder": "encoder self-attention", "decoder": "decoder self-attention",
               "cross": "cross-attention (decoder query -> encoder key)"}


def short(token: str, width: int = 8) -> str:
    return token if len(token) <= width else token[: width - 1] + "…"


def shapes_table(report: TextReport) -> Table:
    table = Table(title="stages", title_justify="left")
    for header in ("stage", "shape", "dtype", "params", "mean", "std", "norm"):
        table.add_column(header, justify="left" if header in ("stage", "dtype") else "right", no_wrap=True)
    for row in report.stages:
        table.add_row(row.name, "(" + ", ".join(map(str, row.shape)) + ")", row.dtype, f"{row.parameters:,}",
                      f"{row.mean:+.4f}", f"{row.std:.4f}", f"{row.norm:.2f}")
    return table


def heat(value: float) -> str:
    """A background shade for an attention weight in [0, 1] (ignored when colour is off)."""
    level = int(232 + round(min(max(value, 0.0), 1.0) * 23))  # the 24-step grey ramp of 256-colour terminals
    return f"on color({level})" + (" black" if level > 243 else "")


def attention_table(amap: AttentionMap) -> Table:
    """Query rows x key columns, each cell the weight (shaded), and what each query attends to most."""
    head = "mean of heads" if amap.head == "mean" else f"head {amap.head}"
    table = Table(title=f"{KIND_TITLES[amap.kind]}: layer {amap.layer}, {head}", title_justify="left")
    table.add_column("query \\ key", no_wrap=True)
    for token in amap.key_tokens:
        table.add_column(short(token, 6), justify="right")
    table.add_column("attends most to", no_wrap=True)
    for query, weights in zip(amap.query_tokens, amap.weights.tolist()):
        best = max(range(len(weights)), key=weights.__getitem__)
        cells = [Text(f"{w:.2f}", style=heat(w)) for w in weights]
        table.add_row(short(query, 12), *cells, f"{amap.key_tokens[best]} ({weights[best]:.2f})")
    return table


def lens_table(report: TextReport) -> Table:
    table = Table(title="logit lens: top tokens each layer would predict", title_justify="left")
    table.add_column("layer", justify="right")
    positions = report.target_tokens if report.target_tokens is not None else report.tokens
    for token in positions:
        table.add_column(short(token, 10))
    for row in report.lens:
        table.add_row(str(row.layer), *["\n".join(f"{short(tok, 10)} {p:.2g}" for tok, _, p in top) for top in row.top])
    return table


def print_report(console: Console, report: TextReport, number: int) -> None:
    console.print(Text(f"text {number}: {report.text!r}", style="bold"))
    console.print(f"tokens: {' '.join(report.tokens)}")
    if report.target_tokens is not None:
        console.print(f"decoder input: {' '.join(report.target_tokens)}")
    console.print(shapes_table(report))
    for amap in report.attention:
        console.print(attention_table(amap))
    if report.lens:
        console.print(lens_table(report))


def record(report: TextReport, trained: bool) -> dict[str, Any]:
    """The encode JSON Lines record (README, "encode"): text, tokens, ids, shapes, attention (summarised), lens, weights."""
    record: dict[str, Any] = {"text": report.text, "tokens": report.tokens, "ids": report.ids}
    if report.target_ids is not None:
        record |= {"target_tokens": report.target_tokens, "target_ids": report.target_ids}
    record["shapes"] = [{"stage": r.name, "shape": r.shape, "dtype": r.dtype, "params": r.parameters,
                         "mean": round(r.mean, 6), "std": round(r.std, 6), "norm": round(r.norm, 4)}
                        for r in report.stages]
    record["attention"] = [_attention_summary(a) for a in report.attention]
    record["lens"] = [{"layer": row.layer,
                       "top": [[{"token": t, "id": i, "prob": round(p, 6)} for t, i, p in top] for top in row.top]}
                      for row in report.lens]
    record["weights"] = "trained" if trained else "random"
    return record


def _attention_summary(amap: AttentionMap) -> dict[str, Any]:
    """Per query: the key it attends to most and that weight (the full maps go to --save)."""
    values, keys = amap.weights.max(dim=-1)
    return {"kind": amap.kind, "layer": amap.layer, "head": amap.head,
            "max_key": keys.tolist(), "max_weight": [round(v, 6) for v in values.tolist()]}


def check_save_path(path: Path, overwrite: bool) -> None:
    """A --save path must end in .safetensors, sit in an existing folder, and replace a file only with --force."""
    if path.suffix != ".safetensors":
        raise TfcliError(f"--save {path}: the file name must end in .safetensors")
    if path.exists() and not overwrite:
        raise TfcliError(f"{path} already exists", "pass --force to overwrite it, or choose another name")
    if not path.parent.is_dir():
        raise TfcliError(f"--save {path}: the folder {path.parent} does not exist")


def save_tensors(path: Path, tensors: dict[str, Tensor], overwrite: bool) -> None:
    """Write --save FILE.safetensors (checked again: the file may have appeared while the model ran)."""
    from safetensors.torch import save_file

    check_save_path(path, overwrite)
    try:
        save_file(tensors, str(path))
    except OSError as exc:
        raise TfcliError(f"cannot write {path}: {exc.strerror}") from None
