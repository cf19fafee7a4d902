// tfcli attribute --report: draws one text's direct logit attribution (registered before report.js runs).
// Values are signed: one diverging scale, blue raises and red lowers the quantity, the same in every view.
"use strict";
window.tfcliRenderers = Object.assign(window.tfcliRenderers || {}, {
  attribute: async function (section, s, number, LIB) {
    const {el, echoed, quoted, label, spaceNote} = LIB;
    const signed = (v) => (v >= 0 ? "+" : "") + v.toFixed(4);
    // v in [-1, 1] -> white to blue (positive) or red (negative)
    function diverging(v) {
      const t = Math.min(Math.abs(v), 1), end = v >= 0 ? [33, 102, 172] : [178, 24, 43];
      return "rgb(" + end.map((c) => Math.round(255 + (c - 255) * t)).join(",") + ")";
    }
    function bar(value, largest) {
      const width = largest ? Math.round(Math.abs(value) / largest * 160) : 0;
      return el("span", {style: "display:inline-block;height:10px;width:" + width + "px;background:" +
                                diverging(value >= 0 ? 1 : -1)});
    }
    const readout = el("div", {class: "readout"}, "\u00a0");

    const dataset = s.dataset !== undefined;  // the aggregate over a dataset: each component's mean and spread
    // over a dataset, what a component's spread is: its standard deviation and 95% interval over the prompts
    const spread = (c) => !dataset ? "" : " (std " + c.std.toFixed(4) +
      (c.low === null ? "" : ", 95% interval [" + signed(c.low) + ", " + signed(c.high) + "]") + ")";
    if (dataset) {
      section.append(el("h2", {}, s.header[0]), ...s.header.slice(1).map((line, k) => el("p", {class: k === 1 ? "note" : ""}, line)));
    } else {
      section.append(el("h2", {}, "text " + number + ": " + echoed(s.text)));
      const cap = s.softcap === null ? "" : " (before the final soft cap at " + s.softcap + ")";
      section.append(el("p", {}, "the " + s.quantity + " at position " + s.position + " " + quoted(s.tokens_shown[s.position]) +
        " (#" + s.ids[s.position] + "): model's value" + cap + " " + signed(s.logit) + "; sum of the " + s.components.length + " components " +
        signed(s.total) + " (differ by " + Math.abs(s.total - s.logit).toExponential(1) + ")"));
      // each token's text (tokens_shown), a space as \u2423; its vocabulary entry and id on hover
      section.append(el("div", {class: "tokens"}, ...s.tokens_shown.map((t, k) => el("span", {
        class: "tok", style: k === s.position ? "border-color:#e6550d;font-weight:600" : "",
        "data-tip": "position " + k + ": " + quoted(t) + " (#" + s.ids[k] + ")"}, label(t)))), ...spaceNote(s.tokens_shown));
    }

    // --sae: what each SAE's site holds is split into its features, as the terminal says
    for (const sae of s.saes || []) {
      const active = dataset ? sae.active.toFixed(1) + " active, a mean over the prompts" : sae.active + " active";
      section.append(el("p", {}, "--sae " + sae.path + ": what " + sae.site + " holds, split into its features (" + sae.label +
        "#N; " + active + "), the rest of its reconstruction (" + sae.label + ".sae_rest) and its error (" +
        sae.label + ".sae_error)"));
    }

    // per layer, as the terminal's table (the rows made in Python, `layer_rows`): the embeddings, what each layer's
    // attention (heads and bias) and MLP write, as signed bars, the final biases; and the running total
    const rows = s.per_layer, cell = (v) => (v === null ? "" : signed(v));
    const largest = Math.max(0, ...rows.flatMap((r) => [r.attention, r.mlp]).filter((v) => v !== null).map(Math.abs));
    section.append(el("h3", {}, "per layer"), el("table", {class: "labels per-layer"},
      el("thead", {}, el("tr", {}, el("th", {class: "left"}, "layer"), el("th", {}, "attention"), el("th", {}),
                                   el("th", {}, "mlp"), el("th", {}), el("th", {}, "running total"))),
      el("tbody", {}, ...rows.map((r) => el("tr", {},
        el("td", {class: "left"}, r.label),
        el("td", {}, cell(r.attention)), el("td", {class: "left"}, r.attention === null ? "" : bar(r.attention, largest)),
        el("td", {}, cell(r.mlp)), el("td", {class: "left"}, r.mlp === null ? "" : bar(r.mlp, largest)),
        el("td", {}, signed(r.total)))))));

    // the run's --top largest components, as the terminal lists them, and the rest summed
    const sorted = [...s.components].sort((a, b) => Math.abs(b.value) - Math.abs(a.value));
    const ranked = sorted.slice(0, s.top), rest = sorted.slice(s.top);
    const top = ranked.length ? Math.abs(ranked[0].value) : 0;
    section.append(el("h3", {}, "the " + ranked.length + " largest components"), el("table", {class: "labels components"},
      el("tbody", {}, ...ranked.map((c) => el("tr", {}, el("td", {class: "left"}, c.name), el("td", {}, signed(c.value)),
                                                 ...(dataset ? [el("td", {}, "std " + c.std.toFixed(4)),
                                                                el("td", {}, c.low === null ? "" : "[" + signed(c.low) + ", " + signed(c.high) + "]")] : []),
                                                 el("td", {class: "left"}, bar(c.value, top)))))));
    if (rest.length)
      section.append(el("p", {class: "note other"}, "the other " + rest.length + ": " +
                        signed(rest.reduce((sum, c) => sum + c.value, 0)) + " in all"));

    if (s.by === "head") {  // the layer x head grid, hover for the value
      const heads = {};
      const byHead = {};
      for (const c of s.components) if (c.head !== null) { heads[c.layer + "," + c.head] = c.value; byHead[c.layer + "," + c.head] = c; }
      const values = Object.values(heads), scale = Math.max(...values.map(Math.abs)) || 1;
      const rows = [...new Set(s.components.filter((c) => c.head !== null).map((c) => c.layer))];
      const head = el("tr", {}, el("th", {}, "layer"), ...Array.from({length: s.heads}, (_, h) => el("th", {}, "H" + h)));
      const body = rows.map((l) => el("tr", {}, el("th", {}, String(l)), ...Array.from({length: s.heads}, (_, h) => {
        const v = heads[l + "," + h];
        const cell = el("td", {class: "head-cell", "data-head": "L" + l + "H" + h,
                               style: "width:22px;height:18px;background:" + (v === undefined ? "#fff" : diverging(v / scale))});
        cell.addEventListener("mouseenter", () => {
          readout.textContent = "L" + l + "H" + h + ": " + signed(v) + spread(byHead[l + "," + h]);
        });
        return cell;
      })));
      section.append(el("h3", {}, "each head"),
        el("p", {class: "note"}, "Rows layers, columns heads; blue raises, red lowers the " + s.quantity +
          ", the deepest colour " + signed(scale) + " in size. Hover a head for its value."),
        el("table", {class: "head-grid", style: "border-collapse:collapse"}, el("thead", {}, head), el("tbody", {}, ...body)),
        readout);
    }
  },
});
