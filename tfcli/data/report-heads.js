// tfcli heads --report page: one layer x head heatmap per detector (hover a head for its score, click it to see its
// attention on the text where it scores highest). Registers itself in window.tfcliRenderers before report.js runs.
"use strict";
(function () {
  async function renderHeads(section, s, number, LIB) {
    const {el, colour, fmt, quoted, counted, legend, inflate} = LIB;
    const texts = counted(s.texts) + " text" + (s.texts === 1 ? "" : "s");
    section.append(el("h2", {}, s.probe ? "heads on the " + s.probe + " probe (" + s.ids.length + " tokens)" :
                                          "heads over " + texts));
    for (const note of s.notes || []) section.append(el("p", {class: "note"}, note));
    section.append(el("p", {class: "note"}, "Each cell is a head (rows: layers, columns: heads), shaded by its score " +
      "from 0 to 1 (entropy: from 0 to the largest, in bits). Hover a head for its score; click it to see its " +
      "attention on the text where it scores highest (lowest, for entropy)."));
    // the maps of the texts where heads score highest: {text index: {row,head: {size, values, offset}}}
    const examples = {};
    for (const [index, ex] of Object.entries(s.examples || {})) {
      const values = await inflate(ex.weights);
      const maps = {};
      let offset = 0;
      for (const m of ex.maps) {
        maps[m.row + "," + m.head] = {size: m.size, stack: m.stack, offset: offset};
        offset += m.size * m.size;
      }
      examples[index] = {text: ex.text, tokens: ex.tokens, maps: maps, values: values, scale: ex.scale};
    }
    for (const detector of s.detectors) {
      const grid = s.scores[detector], count = s.counts[detector];
      const box = el("div", {class: "detector", "data-detector": detector});
      box.append(el("h3", {}, s.titles[detector]),
                 el("p", {class: "note"}, counted(count) + " of " + texts + " counted"));
      section.append(box);
      if (!count) continue;
      const bits = detector === "entropy";
      let top = 1;
      if (bits) top = Math.max(...grid.flat().filter((v) => v !== null)) || 1;
      const detail = el("div", {class: "head-detail"});
      const head = el("tr", {}, el("th", {}, "layer"), ...grid[0].map((_, h) => el("th", {}, String(h))));
      const rows = grid.map((row, r) => el("tr", {}, el("th", {class: "left"}, s.layers[r]), ...row.map((v, h) => {
        const label = s.layers[r] + "H" + h;
        const text = v === null ? "no text" : (bits ? v.toFixed(2) + " bits" : fmt(v));
        const cell = el("td", {class: "head-cell", "data-tip": label + ": " + text,
                               style: "background:" + colour(v === null ? 0 : v / top) + ";cursor:pointer;" +
                                      "width:1.4em;height:1.4em;padding:0"});
        cell.addEventListener("click", () => showHead(detail, detector, r, h, v, label));
        return cell;
      })));
      box.append(el("table", {class: "head-grid"}, el("thead", {}, head), el("tbody", {}, ...rows)),
                 legend(bits ? top.toFixed(2) + " bits" : "1", bits ? "mean entropy" : "score"), detail);
    }

    function showHead(detail, detector, r, h, v, label) {
      const best = s.best && s.best[detector] ? s.best[detector][r][h] : null;
      const ex = best === null || best === undefined ? null : examples[String(best)];
      const m = ex ? ex.maps[r + "," + h] : null;
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
      const score = v === null ? "" : " (mean " + (detector === "entropy" ? v.toFixed(2) + " bits" : fmt(v)) + ")";
      detail.replaceChildren(
        el("p", {}, el("b", {}, label), score + ": its attention on the text where its " + detector + " score is " +
           (detector === "entropy" ? "lowest" : "highest") + ", " + quoted(ex.text)),
        canvas, readout, legend("1", "attention weight"));
    }
  }

  window.tfcliRenderers = Object.assign(window.tfcliRenderers || {}, {heads: renderHeads});
})();
