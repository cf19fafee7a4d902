"""`--report PAGE.html`: one self-contained page (CSS, JavaScript and data inline, no network reference) that
draws a run's results: the attention maps with a layer/head selector, hover readout and head view, the logit
lens grid and the stages (encode); the steps and the lens grid (generate); the label probabilities and the
attention strip (classify); attribute's, patch's and heads' own views.

The page's code is `tfcli/data/report.js` (and a command's own, `tfcli/commands/<command>/report.js`) and `report.css`;
the JSON it reads holds a section per report object, made by the command's renderer, `tfcli.commands.<command>.render`,
found by name: its `page_section(item, tokenizer)`. Attention weights travel compactly: rounded to 3 decimals (integers
0-1000 as uint16), gzip-compressed and base64-encoded (`pack_weights`); the browser inflates them with its built-in
DecompressionStream.
"""

from __future__ import annotations

import base64
import gzip
import html
import importlib
import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tfcli.render.run_info import RunInfo
    from tfcli.tokenizer import Tokenizer

ASSETS = Path(__file__).resolve().parent.parent / "data"
COMMANDS = ASSETS.parent / "commands"
WEIGHT_SCALE = 1000  # weights are stored as round(weight * 1000): three decimals


def page(run: RunInfo, items: list[Any], tokenizer: Tokenizer | None = None,
         section: Callable[[Any, Tokenizer | None], dict[str, Any]] | None = None) -> str:
    """The whole page for a run of `run.command` over its report objects: one section each, from `section` (None:
    the command's renderer's, `tfcli.commands.<command>.render.page_section`)."""
    section = section or importlib.import_module(f"tfcli.commands.{run.command}.render").page_section
    data = {"run": asdict(run), "sections": [section(item, tokenizer) for item in items]}
    # "</" cannot end the script element early once written as "<\/" (still the same JSON string)
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    css = (ASSETS / "report.css").read_text(encoding="utf-8")
    # an analysis command's drawing code (commands/attribute/report.js, ...) registers itself before report.js runs
    scripts = [COMMANDS / run.command / "report.js", ASSETS / "report.js"]
    script = "".join(path.read_text(encoding="utf-8") for path in scripts if path.exists())
    title = html.escape(f"tfcli {run.command}: {run.model}")
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n<title>{title}</title>\n'
            f"<style>\n{css}</style>\n</head>\n<body>\n"
            f'<noscript>This report draws itself with JavaScript; please allow it for this file.</noscript>\n'
            f'<script id="tfcli-data" type="application/json">{payload}</script>\n'
            f"<script>\n{script}</script>\n</body>\n</html>\n")


def pack_weights(matrices: list[Any]) -> str:
    """(queries, keys) weight tensors -> base64 of gzip of their values rounded to 3 decimals, as
    little-endian uint16 (0-1000), one matrix after another, row by row."""
    import torch

    if not matrices:
        return ""
    flat = torch.cat([m.detach().float().cpu().reshape(-1) for m in matrices])
    values = (flat.clamp(0, 1) * WEIGHT_SCALE).round().to(torch.int32).numpy().astype("<u2")
    return base64.b64encode(gzip.compress(values.tobytes(), compresslevel=6, mtime=0)).decode("ascii")
