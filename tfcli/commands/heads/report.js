// tfcli heads --report page: per detector its top heads and one layer x head heatmap, shaded from 0 to the grid's
// largest score (hover a head for its score, click it or a top head to see its attention on the text where it
// scores highest). Registers itself in window.tfcliRenderers before report.js runs.
// Everything but the clicked head's map is drawn in the page's first script run: only those maps wait for the
// compressed weights to be inflated (asynchronous), so a page printed, screenshot or converted as soon as it has
// loaded shows its grids.
"use strict";
(function () {
  async function renderHeads(section, s, number, LIB) {
    const {el, colour, fmt, quoted, counted, legend, inflate} = LIB;
    const texts = counted(s.texts) + " text" + (s.texts === 1 ? "" : "s");
    section.append(el("h2", {}, s.probe ? "heads on the " + s.probe + " probe (" + s.ids.length + " tokens)" :
                                          "heads over " + texts));
    for (const note of s.notes || []) section.append(el("p", {class: "note"}, note));
    section.append(el("p", {class: "note"}, "Per detector, its top heads, then each head as a cell (rows: layers, " +
      "columns: heads), shaded from 0 to the grid's own largest score, given under it. Hover a head for its score; " +
      "click it, or a top head, to see its attention on the text where it scores highest (lowest, for entropy)."));

    // the maps of the texts where heads score highest, {text index: {text, tokens, maps, values, scale}}, once
    // inflated; until then a clicked head says so and is drawn when they are
    const examples = {};
    let loaded = false;
    const waiting = [];  // the clicks that came before the maps: drawn once they are here
    async function loadExamples() {
      for (const [index, ex] of Object.entries(s.examples || {})) {
        const values = await inflate(ex.weights);
        const maps = {};
        let offset = 0;
        for (const m of ex.maps) {
          maps[m.row + "," + m.head] = {size: m.size, stack: m.stack, offset: offset};
          offset += m.size * m.size;
        }
        // each stack's tokens as the text each stands for (tokens_shown), read out quoted on hover
        examples[index] = {text: ex.text, tokens: ex.tokens_shown, maps: maps, values: values, scale: ex.scale};
      }
      loaded = true;
      for (const draw of waiting.splice(0)) draw();
    }

    const score = (detector, v) => (detector === "entropy" ? v.toFixed(2) + " bits" : fmt(v));
    for (const detector of s.detectors) {
      const grid = s.scores[detector], count = s.counts[detector];
      const box = el("div", {class: "detector", "data-detector": detector});
      box.append(el("h3", {}, s.titles[detector]),
                 el("p", {class: "note"}, counted(count) + " of " + texts + " counted"));
      section.append(box);
      if (!count) continue;
      const bits = detector === "entropy";
      const largest = s.largest[detector], top = largest || 1;  // an all-zero grid stays white
      const detail = el("div", {class: "head-detail"});
      const pick = (r, h) => showHead(detail, detector, r, h, grid[r][h], s.layers[r] + "H" + h);
      // the top heads, as the terminal lists them (the run's --top; entropy lowest first)
      const list = el("ol", {class: "top-heads", "aria-label": "top heads"}, ...(s.top[detector] || []).map((t) => {
        const item = el("li", {"data-head": t.label, title: "click: its attention"}, el("b", {}, t.label), " " + t.written);
        item.addEventListener("click", () => pick(t.row, t.head));
        return item;
      }));
      const headRow = el("tr", {}, el("th", {}, "layer"), ...grid[0].map((_, h) => el("th", {}, String(h))));
      const rows = grid.map((values, r) => el("tr", {}, el("th", {class: "left"}, s.layers[r]), ...values.map((v, h) => {
        const label = s.layers[r] + "H" + h;
        const cell = el("td", {class: "head-cell", "data-head": label,
                               "data-tip": label + ": " + (v === null ? "no text" : score(detector, v)),
                               style: "background:" + colour(v === null ? 0 : v / top)});
        cell.addEventListener("click", () => pick(r, h));
        return cell;
      })));
      box.append(el("div", {class: "top-line"}, el("span", {class: "note"}, "top:"), list),
                 el("table", {class: "head-grid"}, el("thead", {}, headRow), el("tbody", {}, ...rows)),
                 legend(score(detector, largest), (bits ? "mean entropy" : "score") + ": 0 to this grid's largest"),
                 detail);
    }

    function showHead(detail, detector, r, h, v, label) {
      const best = s.best && s.best[detector] ? s.best[detector][r][h] : null;
      if (best === null || best === undefined) {
        detail.replaceChildren(el("p", {class: "note"}, label + ": no map kept (write the report as .html)"));
        return;
      }
      detail.dataset.head = label;
      if (!loaded) {
        detail.replaceChildren(el("p", {class: "note"}, label + ": reading its attention map\u2026"));
        waiting.push(() => { if (detail.dataset.head === label) showHead(detail, detector, r, h, v, label); });
        return;
      }
      const ex = examples[String(best)], m = ex ? ex.maps[r + "," + h] : null;
      if (!m) {
        detail.replaceChildren(el("p", {class: "note"}, label + ": no map kept (write the report as .html)"));
        return;
      }
      const tokens = ex.tokens[m.stack], n = m.size, cell = Math.max(4, Math.min(16, Math.floor(480 / n)));
      const canvas = el("canvas", {class: "heatmap", width: n * cell, height: n * cell,
                                   "aria-label": label + "'s attention: query rows, key columns"});
      const ctx = canvas.getContext("2d");
      const weight = (q, k) => ex.values[m.offset + q * n + k] / ex.scale;
      for (let q = 0; q < n; q++)
        for (let k = 0; k < n; k++) {
          ctx.fillStyle = colour(weight(q, k));
          ctx.fillRect(k * cell, q * cell, cell, cell);
        }
      const readout = el("div", {class: "readout mono"}, "hover the map: query \u2192 key, weight");
      canvas.addEventListener("mousemove", (e) => {
        const box = canvas.getBoundingClientRect();
        const k = Math.floor((e.clientX - box.left) / box.width * n);
        const q = Math.floor((e.clientY - box.top) / box.height * n);
        if (q >= 0 && q < n && k >= 0 && k < n)
          readout.textContent = "query " + q + " " + quoted(tokens[q]) + " \u2192 key " + k + " " + quoted(tokens[k]) +
                                ": " + fmt(weight(q, k));
      });
      const mean = v === null ? "" : " (mean " + score(detector, v) + ")";
      detail.replaceChildren(
        el("p", {}, el("b", {}, label), mean + ": its attention on the text where its " + detector + " score is " +
           (detector === "entropy" ? "lowest" : "highest") + ", " + quoted(ex.text)),
        canvas, readout, legend("1", "attention weight"));
    }

    // drawn above; the page is ready (body[data-ready]) once the maps are too
    await loadExamples();
  }

  window.tfcliRenderers = Object.assign(window.tfcliRenderers || {}, {heads: renderHeads});
})();
