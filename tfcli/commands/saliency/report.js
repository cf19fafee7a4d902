// tfcli saliency --report: draws one text's attributions (or a dataset's mean shares per aligned position), from
// the section's data only (registered before report.js runs). Signed values on one diverging scale: blue raises,
// red lowers the metric; the darker, the larger the share.
"use strict";
window.tfcliRenderers = Object.assign(window.tfcliRenderers || {}, {
  saliency: async function (section, s, number, LIB) {
    const {el, echoed, quoted, label, spaceNote} = LIB;
    const signed = (v) => (v >= 0 ? "+" : "") + v.toFixed(4);
    const percent = (v) => (v >= 0 ? "+" : "") + (100 * v).toFixed(1) + "%";
    // v in [-1, 1] -> white to blue (positive) or red (negative)
    function diverging(v) {
      const t = Math.min(Math.abs(v), 1), end = v >= 0 ? [33, 102, 172] : [178, 24, 43];
      return "rgb(" + end.map((c) => Math.round(255 + (c - 255) * t)).join(",") + ")";
    }
    // a shaded cell's style: white text where the background is dark enough that black would read poorly
    const shaded = (v) => "background:" + diverging(v) + (Math.abs(v) > 0.6 ? ";color:#fff" : "");
    const dataset = s.dataset !== undefined;
    if (s.rows !== undefined) {  // a continuation: a row per token of it, a column per token read, shaded per row
      section.append(el("h2", {}, "text " + number + ": " + echoed(s.text) + " + " + echoed(s.continuation)),
                     ...s.header.map((line) => el("p", {}, line)));
      const read = s.token_texts.slice(0, -1);
      section.append(el("table", {class: "labels matrix"},
        el("thead", {}, el("tr", {}, el("th", {}, "token"), el("th", {}, "value"),
                                     ...read.map((t, p) => el("th", {"data-tip": p + ": " + quoted(t)}, label(t))))),
        el("tbody", {}, ...s.rows.map((row) => {
          const largest = Math.max(0, ...row.attributions.map(Math.abs)) || 1;
          return el("tr", {}, el("td", {class: "left"}, quoted(row.target.text)), el("td", {}, signed(row.value)),
            ...read.map((t, p) => p < row.attributions.length ? el("td", {
              style: "background:" + diverging(row.attributions[p] / largest),
              "data-tip": quoted(row.target.text) + " from " + quoted(t) + ": " + signed(row.attributions[p])}, "") :
              el("td", {}, "")));
        }))), ...spaceNote(s.token_texts));
      return;
    }
    if (dataset) {
      // the interval's column only where there were resamples (as the terminal has it)
      const interval = s.bootstrap ? ["95% interval"] : [];
      const spread = (r) => s.bootstrap ? [el("td", {}, "[" + percent(r.low) + ", " + percent(r.high) + "]")] : [];
      section.append(el("h2", {}, s.header[0]), ...s.header.slice(1).map((line) => el("p", {}, line)));
      const largest = Math.max(0, ...s.columns.map((c) => Math.abs(c.mean))) || 1;
      section.append(el("table", {class: "labels columns"},
        el("thead", {}, el("tr", {}, ...["offset", "token", "mean share", "std", ...interval].map((h) => el("th", {}, h)))),
        el("tbody", {}, ...s.columns.map((c) => el("tr", {},
          el("td", {}, String(c.offset)), el("td", {class: "left"}, c.token === null ? "(varies)" : quoted(c.token)),
          el("td", {style: shaded(c.mean / largest)}, percent(c.mean)),
          el("td", {}, (100 * c.std).toFixed(1) + "%"),
          ...spread(c))))));
      // the same per kind of token (the metric's target and foil tokens, the position read, special, other)
      const most = Math.max(0, ...s.kinds.map((k) => Math.abs(k.mean))) || 1;
      section.append(el("h3", {}, "by kind of token"), el("table", {class: "labels kinds"},
        el("thead", {}, el("tr", {}, ...["kind", "texts", "mean share", "std", ...interval].map((h) => el("th", {}, h)))),
        el("tbody", {}, ...s.kinds.map((k) => el("tr", {},
          el("td", {class: "left"}, k.kind), el("td", {}, String(k.texts)),
          el("td", {style: shaded(k.mean / most)}, percent(k.mean)),
          el("td", {}, (100 * k.std).toFixed(1) + "%"),
          ...spread(k))))));
    } else {
      section.append(el("h2", {}, "text " + number + ": " + echoed(s.text)), ...s.header.map((line) => el("p", {}, line)));
      const largest = Math.max(0, ...s.shares.map(Math.abs)) || 1;
      // each token shaded by its share; its attribution, share, id and vocabulary entry on hover
      section.append(el("div", {class: "tokens saliency"}, ...s.token_texts.map((t, k) => el("span", {
        class: "tok", style: shaded(s.shares[k] / largest) + (k === s.position ? ";border-color:#e6550d" : ""),
        "data-tip": "position " + k + ": " + quoted(t) + " (#" + s.ids[k] + ", " + quoted(s.tokens[k]) + "): " +
                    signed(s.attributions[k]) + ", " + percent(s.shares[k]) + " of the absolute sum"}, label(t)))),
        ...spaceNote(s.token_texts),
        el("p", {class: "note"}, "blue raises, red lowers " + s.quantity + "; hover a token for its attribution"));
      if (s.faithfulness !== null) {
        const f = s.faithfulness, a = f.areas;
        section.append(el("h3", {}, "faithfulness"), el("p", {},
          "deletion area " + signed(a.deletion) + " (random " + signed(a.random_deletion) + "): lower is more faithful; " +
          "insertion area " + signed(a.insertion) + " (random " + signed(a.random_insertion) + "): higher is more faithful"));
        const names = ["deletion", "random_deletion", "insertion", "random_insertion"];
        section.append(el("table", {class: "labels curves"},
          el("thead", {}, el("tr", {}, el("th", {}, "tokens"), el("th", {class: "left"}, "deleted/restored"),
                                       ...names.map((n) => el("th", {}, n.replace("_", " "))))),
          el("tbody", {}, ...f.deletion.map((_, k) => el("tr", {}, el("td", {}, String(k)),
            el("td", {class: "left"}, k === 0 ? "" : quoted(s.token_texts[f.order[k - 1]])),
            ...names.map((n) => el("td", {}, signed(f[n][k]))))))));
      }
    }
    if (dataset && s.faithfulness !== null) {
      const areas = s.faithfulness.areas;
      section.append(el("h3", {}, "faithfulness: the areas under the curves"), el("table", {class: "labels areas"},
        el("tbody", {}, ...Object.keys(areas).map((n) => el("tr", {}, el("td", {class: "left"}, n.replace("_", " ")),
          el("td", {}, signed(areas[n].mean)), el("td", {}, "std " + areas[n].std.toFixed(4)),
          el("td", {}, areas[n].low === null ? "" : "[" + signed(areas[n].low) + ", " + signed(areas[n].high) + "]"))))),
        el("p", {}, "the deletion area is below the random one in " + s.faithfulness.deletion_beats_random + " of " + s.n + " texts"));
    }
  },
});
