// tfcli patch --report PAGE.html: one heat grid per site kind (rows layers, columns positions or heads), signed
// scores on a diverging scale (blue restores the clean value, red works against it, white: no effect), the value
// written in each cell and on hover; with --method both, the attribution estimate's grid beside each (the two
// halves of the page, scrolled together when wider than that), and the top sites of each kind. What needs saying
// (a small gap, the sites scored 0 without a run, the positions swept, an interruption) comes in the data, as the
// terminal says it. Registered for report.js, which draws the page's frame and calls it once per section.
"use strict";
window.tfcliRenderers = Object.assign(window.tfcliRenderers || {}, {
  patch: async function (section, s, number, LIB) {
    const {el, echoed, quoted, label, spaceNote} = LIB;
    const BLUE = [33, 102, 172], RED = [178, 24, 43], WHITE = [247, 247, 247];
    // a score -> background on a scale symmetric about 0, full colour at |score| >= top
    function diverging(node, value, top) {
      if (value === null) { node.style.background = "#eee"; return; }
      const t = Math.min(Math.abs(value) / top, 1), end = value >= 0 ? BLUE : RED;
      node.style.background = "rgb(" + WHITE.map((c, k) => Math.round(c + (end[k] - c) * t)).join(",") + ")";
      node.style.color = t > 0.6 ? "#fff" : "";
    }
    // a number signed as the terminal writes it: +0.58 in a cell, +0.5782 where four digits are shown
    function signed(v, digits = 2) {
      return v === null || v === undefined ? "" : (v >= 0 ? "+" : "") + v.toFixed(digits);
    }
    const stackOf = (site) => (site.startsWith("encoder.") || site.startsWith("decoder.")) ? site.split(".")[0] : "";
    const differing = new Set(s.dataset !== undefined ? s.varying : s.differing), swept = new Set(s.positions);
    // over a dataset, a cell's hover also says its bootstrap interval and the share of pairs it restores
    function spread(site, cell) {
      if (s.dataset === undefined) return "";
      const at = (grid) => cell.reduce((g, k) => (g === null || g === undefined ? null : g[k]), grid);
      const interval = s.intervals ? at(s.intervals[site]) : null, share = at(s.restored_share[site]);
      return (interval ? "\n95% interval: [" + signed(interval[0], 4) + ", " + signed(interval[1], 4) + "]" : "") +
             (share !== null ? "\nrestores half of its pair's difference in " + Math.round(100 * share) + "% of pairs" : "");
    }
    // a column: its position (and * where the texts differ) over its token's text (*_shown, a space as \u2423), and
    // what hover says of it
    function positions(site) {
      const decoder = stackOf(site) === "decoder" && s.decoder_tokens_shown;
      if (s.dataset !== undefined && !decoder) {  // a dataset's columns: positions (or counted back from the metric's)
        return s.tokens_clean_shown.map((t, k) => ({
          label: [s.columns[k] + (differing.has(k) ? "*" : ""), label(t)],
          tip: "position " + s.columns[k] + ": " + quoted(t) + " in the first pair" +
               (differing.has(k) ? " (the pairs' tokens differ here)" : ""),
          swept: swept.has(k),
        }));
      }
      return (decoder ? s.decoder_tokens_shown : s.tokens_clean_shown).map((t, k) => ({
        label: [k + (!decoder && differing.has(k) ? "*" : ""), label(t)],
        tip: k + ": clean " + quoted(t) + (decoder ? "" : " (#" + s.ids_clean[k] + ")") +
             (!decoder && s.ids_corrupt[k] !== s.ids_clean[k] ? ", corrupt " + quoted(s.tokens_corrupt_shown[k]) +
              " (#" + s.ids_corrupt[k] + ")" : ""),
        swept: decoder || swept.has(k),
      }));
    }
    // rows (label, values), columns (label, tip) -> a table with hover readouts
    function heatGrid(title, corner, columns, rows, top, what, site) {
      const head = el("tr", {}, el("th", {class: "left"}, corner),
        ...columns.map((c) => el("th", {"data-tip": c.tip}, ...[].concat(...c.label.map((part, k) => k ? [el("br"), part] : [part])))));
      const body = el("tbody");
      for (const row of rows) {
        const tr = el("tr", {}, el("th", {class: "left"}, row.label));
        row.values.forEach((v, k) => {
          const missing = columns[k].swept === false ? "not patched (--positions)" : "not computed (interrupted)";
          const td = el("td", {"data-tip": title + "\n" + row.tip + ", " + columns[k].tip + "\n" + what + ": " +
                                (v === null ? missing : signed(v, 4)) + (what === "score" ? spread(site, row.cell.concat([k])) : "")},
                        signed(v));
          diverging(td, v, top);
          tr.append(td);
        });
        body.append(tr);
      }
      return el("div", {class: "scroll"}, el("table", {class: "grid patch-grid"}, el("thead", {}, head), body));
    }
    function gridView(site, grid, what) {
      const axes = s.kinds[site].axes.join(",");  // what a layer's row holds: positions, heads, or heads of positions
      let columns, rows, corner;
      if (axes === "head,position") {
        columns = positions(site);
        rows = grid.flatMap((layer, l) => layer.map((values, h) => ({label: "L" + l + "H" + h, cell: [l, h],
                                                                     tip: "layer " + l + ", head " + h, values})));
        corner = "layer, head";
      } else if (axes === "position") {
        columns = positions(site);
        rows = grid.map((values, l) => ({label: String(l), cell: [l], tip: "layer " + l, values}));
        corner = "layer";
      } else {
        columns = grid[0].map((_, h) => ({label: ["H" + h], tip: "head " + h}));
        rows = grid.map((values, l) => ({label: String(l), cell: [l], tip: "layer " + l, values}));
        corner = "layer";
      }
      const flat = rows.flatMap((r) => r.values).filter((v) => v !== null);
      const top = Math.max(1, ...flat.map(Math.abs));
      const view = heatGrid(site, corner, columns, rows, top, what, site);
      view.append(key(top));  // each grid's own scale
      return view;
    }
    // the two halves of a pair scroll together: the same columns stay side by side
    function together(a, b) {
      const follow = (from, to) => from.addEventListener("scroll", () => {
        if (to.scrollLeft !== from.scrollLeft) to.scrollLeft = from.scrollLeft;
      });
      follow(a, b);
      follow(b, a);
    }
    function key(top) {
      const ramp = el("span", {class: "ramp"});
      ramp.style.background = "linear-gradient(to right, rgb(" + RED + "), rgb(" + WHITE + "), rgb(" + BLUE + "))";
      const shown = Number.isInteger(top) ? String(top) : top.toFixed(2);
      return el("div", {class: "legend"}, "-" + shown, ramp, "+" + shown,
                el("span", {class: "legend-what"}, "score: 1 restores the clean value, 0 no effect, negative works against it"));
    }
    if (s.dataset !== undefined) {  // the aggregate over a dataset: what the view says above its grids
      section.append(el("h2", {}, s.header[0]), ...s.header.slice(1).map((line, k) => el("p", {class: k ? "note" : ""}, line)));
    } else {
      const where = s.position === null ? "" : " at position " + s.position + " " +
        quoted((s.decoder_tokens_shown || s.tokens_clean_shown)[s.position]) +
        (s.decoder_tokens_shown ? "" : " (#" + s.ids_clean[s.position] + ")");
      section.append(
        el("h2", {}, "pair " + number + ": " + echoed(s.clean) + " vs " + echoed(s.corrupt)),
        el("p", {}, "The " + s.quantity + where + ": clean " + signed(s.clean_value, 4) + ", corrupt " +
                    signed(s.corrupt_value, 4) + ". Each cell: (patched - corrupt) / (clean - corrupt). Positions marked * " +
                    "differ between the texts."));
    }
    section.append(
      el("p", {class: "note"}, {activation: "Activation patching: each site of the corrupt run replaced by the clean run's, one at a time.",
                                attribution: "Attribution patching: the first-order estimate (clean - corrupt) \u00b7 gradient, from one backward pass.",
                                both: "Activation patching (left) beside its attribution estimate (right)."}[s.method]),
      ...s.notes.map((n) => el("p", {class: n.style === "yellow" ? "note patch-warning" : "note"}, n.text)),
      ...(Object.values(s.kinds).some((k) => k.axes.includes("position")) ?
          spaceNote((s.tokens_clean_shown || []).concat(s.decoder_tokens_shown || [])) : []));
    const what = s.method === "attribution" ? "estimate" : "score";
    for (const site of Object.keys(s.grids)) {
      const box = el("div", {class: "patch-site"}, el("h3", {}, site));
      const reached = s.reached[site];
      const missing = el("p", {class: "note"}, "not reached: the sweep was interrupted before this kind's first patched run");
      if (s.attribution_grids) {
        const c = s.correlations[site];
        const left = reached ? gridView(site, s.grids[site], "score") : missing;
        const right = gridView(site, s.attribution_grids[site], "estimate");
        if (reached) together(left, right);
        box.append(el("p", {class: "note"}, reached && c && c.r !== null ? "correlation of the two: r = " + signed(c.r, 3) + " over " + c.n + " sites" : ""),
          el("div", {class: "views patch-views"}, el("div", {}, el("h4", {}, "activation"), left),
                                                   el("div", {}, el("h4", {}, "attribution estimate"), right)));
      } else {
        box.append(reached ? gridView(site, s.grids[site], what) : missing);
      }
      section.append(box);
    }
    if (s.top.length) {
      const spreads = s.dataset !== undefined ? (s.intervals ? ["95% interval", "restored"] : ["restored"]) : [];
      const head = ["site", "where", what].concat(spreads, s.attribution_grids ? ["attribution"] : []);
      const topRows = s.top.map((t) => el("tr", {},
        el("td", {class: "left"}, t.site), el("td", {class: "left"}, t.where), el("td", {}, signed(t.score, 4)),
        ...(spreads.length === 2 ? [el("td", {}, t.interval)] : []), ...(spreads.length ? [el("td", {}, t.restored)] : []),
        s.attribution_grids ? el("td", {}, signed(t.attribution, 4)) : null));
      const kinds = new Set(s.top.map((t) => t.site)).size;
      section.append(el("h3", {}, "the " + s.top_each + " largest scores" + (kinds > 1 ? " of each site kind" : "")),
        el("div", {class: "scroll"}, el("table", {},
          el("thead", {}, el("tr", {}, ...head.map((h, k) => el("th", {class: k < 2 ? "left" : ""}, h)))),
          el("tbody", {}, ...topRows))));
    }
  },
});
