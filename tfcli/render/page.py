"""`--report PAGE.html`: one self-contained page (CSS, JavaScript and data inline, no network reference) that
draws a run's results: the attention maps with a layer/head selector, hover readout and head view, the logit
lens grid and the stages (encode); the steps and the lens grid (generate); the label probabilities and the
attention strip (classify).

The page's code is `tfcli/data/report.js` and `report.css`; this module turns the report objects into the
JSON it reads. Attention weights travel compactly: rounded to 3 decimals (integers 0-1000 as uint16),
gzip-compressed and base64-encoded; the browser inflates them with its built-in DecompressionStream.
"""

from __future__ import annotations

import base64
import gzip
import html
import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tfcli.classify import Classification
    from tfcli.encode import TextReport
    from tfcli.generate import Generation
    from tfcli.render.run_info import RunInfo
    from tfcli.tokenizer import Tokenizer

ASSETS = Path(__file__).resolve().parent.parent / "data"
WEIGHT_SCALE = 1000  # weights are stored as round(weight * 1000): three decimals


def page(run: RunInfo, items: list[Any], tokenizer: Tokenizer | None = None) -> str:
    """The whole page for a run of `run.command` over its report objects (one section each)."""
    builders = {"encode": encode_section, "classify": classify_section,
                "generate": lambda item: generate_section(item, tokenizer)}
    build = builders.get(run.command) or analysis_module(run.command).page_section
    data = {"run": asdict(run), "sections": [build(item) for item in items]}
    # "</" cannot end the script element early once written as "<\/" (still the same JSON string)
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    css = (ASSETS / "report.css").read_text(encoding="utf-8")
    # an analysis command's drawing code (report-attribute.js, ...) registers itself before report.js runs
    scripts = [ASSETS / f"report-{run.command}.js", ASSETS / "report.js"]
    script = "".join(path.read_text(encoding="utf-8") for path in scripts if path.exists())
    title = html.escape(f"tfcli {run.command}: {run.model}")
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n<title>{title}</title>\n'
            f"<style>\n{css}</style>\n</head>\n<body>\n"
            f'<noscript>This report draws itself with JavaScript; please allow it for this file.</noscript>\n'
            f'<script id="tfcli-data" type="application/json">{payload}</script>\n'
            f"<script>\n{script}</script>\n</body>\n</html>\n")


def analysis_module(command: str) -> Any:
    """The render module of an analysis command (`tfcli.render.attribute`, ...): its `page_section(item)` gives a
    section's data, its `figure(item, run)` draws a figure."""
    import importlib

    return importlib.import_module(f"tfcli.render.{command}")


def pack_weights(matrices: list[Any]) -> str:
    """(queries, keys) weight tensors -> base64 of gzip of their values rounded to 3 decimals, as
    little-endian uint16 (0-1000), one matrix after another, row by row."""
    import torch

    if not matrices:
        return ""
    flat = torch.cat([m.detach().float().cpu().reshape(-1) for m in matrices])
    values = (flat.clamp(0, 1) * WEIGHT_SCALE).round().to(torch.int32).numpy().astype("<u2")
    return base64.b64encode(gzip.compress(values.tobytes(), compresslevel=6, mtime=0)).decode("ascii")


def encode_section(report: TextReport) -> dict[str, Any]:
    """One text of `encode`: tokens, stages, every attention map (the mean's heads too, when kept), lens."""
    token_lists = {"tokens": report.tokens}
    if report.target_tokens is not None:
        token_lists["target"] = report.target_tokens

    def list_name(tokens: list[str]) -> str:
        return "target" if tokens is report.target_tokens else "tokens"

    maps, matrices = [], []
    for amap in report.attention:
        heads = [(amap.head, amap.weights)]
        if amap.heads is not None:
            heads += list(enumerate(amap.heads))
        for head, weights in heads:
            maps.append({"kind": amap.kind, "layer": amap.layer, "head": head, "rows": weights.shape[0],
                         "cols": weights.shape[1], "query": list_name(amap.query_tokens),
                         "key": list_name(amap.key_tokens)})
            matrices.append(weights)
    vocabulary: dict[str, int] = {}  # the lens's tokens, each stored once
    lens = [{"layer": row.layer,
             "top": [[[vocabulary.setdefault(token, len(vocabulary)), _round(p)] for token, _, p in top]
                     for top in row.top]}
            for row in report.lens]
    # a truncated text: what the model read (the terminal shows the same), and how much that is of the whole
    cut = None if report.read_text is None and report.read_pair is None else {
        "tokens": len(report.ids), "of_tokens": report.untruncated_length, "characters": len(report.shown_text),
        "of_characters": len(report.text)}
    return {"text": report.shown_text, "cut": cut, "tokens": token_lists,
            "stages": [[s.name, s.shape, s.dtype, s.parameters, s.mean, s.std, s.norm] for s in report.stages],
            "attention": {"maps": maps, "weights": pack_weights(matrices), "scale": WEIGHT_SCALE},
            "lens": {"positions": "target" if report.target_tokens is not None else "tokens", "rows": lens,
                     "vocabulary": list(vocabulary), "through": report.lens_through,
                     "predicts": report.lens_predicts}}


def generate_section(result: Generation, tokenizer: Tokenizer) -> dict[str, Any]:
    """One prompt of `generate`: its JSON record (steps with token, prob, alternatives, lens) and the text."""
    from tfcli.render.generate import record

    return record(result, tokenizer) | {"full_text": result.full_text, "stopped_at_eos": result.stopped_at_eos}


def classify_section(result: Classification) -> dict[str, Any]:
    """One text of `classify`: its JSON record (labels, probs, prediction, explain)."""
    from tfcli.render.classify import record

    return record(result)


def _round(p: float) -> float:
    return float(f"{p:.3g}")
