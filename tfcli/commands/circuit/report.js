// tfcli circuit --report: the circuit as a layered graph (a row per layer, input at the bottom, logits at the top;
// heads then the MLP across; an edge's width by its |score|, blue positive, red negative, its numbers on hover),
// beside the faithfulness curve; then the edges of largest |score|. With --positions spans an edge has its `span`
// (its hover says it; an edge kept at several spans is drawn once per span). Several methods (`s.compared`): each
// method's curve on one chart, a table of the curves and one of the paired differences (`compared`). Drawn from the
// section's data only.
"use strict";
const NS_SVG = "http://www.w3.org/2000/svg";
function compared(section, s, LIB) {
  const {el} = LIB;
  const count = (n) => n.toLocaleString("en-US");
  const share = (p) => p ? p.faithfulness.toFixed(3) + (p.interval ? " [" + p.interval[0].toFixed(3) + ", " +
    p.interval[1].toFixed(3) + "]" : "") : "";
  const signed = (v) => (v >= 0 ? "+" : "") + v.toFixed(3);
  section.append(el("h2", {}, s.header[0]), ...s.header.slice(1).map((line) => el("p", {}, line)));
  for (const m of s.methods) {
    section.append(el("p", {}, el("b", {style: "color:" + m.colour}, m.method), ": " + m.words),
                   ...m.lines.map((line) => el("p", {style: "margin-left:1.5em"}, line)));
  }
  const add = (svg, tag, attrs, tip) => {
    const node = document.createElementNS(NS_SVG, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (tip) node.append(Object.assign(document.createElementNS(NS_SVG, "title"), {textContent: tip}));
    svg.append(node);
    return node;
  };
  const points = s.methods.flatMap((m) => m.curve);
  if (points.length) {
    const cw = 520, ch = 280, cp = 44, chart = document.createElementNS(NS_SVG, "svg");
    chart.setAttribute("width", cw);
    chart.setAttribute("height", ch);
    const xs = points.map((p) => Math.log10(p.edges)), lo = Math.min(...xs), hi = Math.max(...xs, lo + 1);
    const values = points.flatMap((p) => [p.faithfulness, ...(p.interval || [])]);
    const ylo = Math.min(0, ...values), yhi = Math.max(1, ...values);
    const X = (v) => cp + (Math.log10(v) - lo) / (hi - lo) * (cw - 2 * cp);
    const Y = (v) => ch - cp - (v - ylo) / (yhi - ylo) * (ch - 2 * cp);
    add(chart, "line", {x1: cp, y1: Y(1), x2: cw - cp, y2: Y(1), stroke: "#bbb", "stroke-dasharray": "3 3"});
    s.methods.forEach((m, k) => {
      const shift = (k - (s.methods.length - 1) / 2) * 4;  // side by side, so that the intervals do not overlap
      add(chart, "polyline", {points: m.curve.map((p) => (X(p.edges) + shift) + "," + Y(p.faithfulness)).join(" "),
                              fill: "none", stroke: m.colour});
      for (const p of m.curve) {
        if (p.interval) add(chart, "line", {x1: X(p.edges) + shift, x2: X(p.edges) + shift, y1: Y(p.interval[0]),
                                            y2: Y(p.interval[1]), stroke: m.colour, "stroke-opacity": 0.6});
        add(chart, "circle", {cx: X(p.edges) + shift, cy: Y(p.faithfulness), r: 4, fill: m.colour},
            m.method + ", " + count(p.edges) + " edges: faithfulness " + share(p));
      }
      add(chart, "text", {x: cw - cp + 4, y: cp + 14 * k, "font-size": 10, fill: m.colour}).textContent = m.method;
    });
    const sizes = [...new Set(points.map((p) => p.edges))].sort((a, b) => a - b);
    for (const size of sizes) {
      add(chart, "text", {x: X(size), y: ch - cp + 14, "font-size": 10, "text-anchor": "middle"}).textContent = count(size);
    }
    for (const v of [ylo, yhi, 1, 0].filter((v, i, all) => all.indexOf(v) === i)) {
      add(chart, "text", {x: cp - 4, y: Y(v) + 3, "font-size": 10, "text-anchor": "end"}).textContent = v.toFixed(2);
    }
    add(chart, "text", {x: cw / 2, y: ch - 6, "font-size": 11, "text-anchor": "middle"}).textContent = "edges";
    add(chart, "text", {x: 4, y: cp - 14, "font-size": 11}).textContent = "faithfulness";
    section.append(el("div", {}, chart));
    const table = (title, heads, rows) => section.append(el("h3", {}, title), el("table", {class: "labels"},
      el("thead", {}, el("tr", {}, ...heads.map((h) => el("th", {}, h)))),
      el("tbody", {}, ...rows.map((row) => el("tr", {}, ...row.map((cell) => el("td", {}, cell)))))));
    table("faithfulness of each method's greedy circuits by size [95% interval]", ["edges", ...s.methods.map((m) => m.method)],
          sizes.map((size) => [count(size), ...s.methods.map((m) => share(m.curve.find((p) => p.edges === size)))]));
    const pairs = [...new Set(s.differences.map((d) => d.method + " - " + d.minus))];
    table("paired differences of faithfulness (the same pairs resampled for both) [95% interval]", ["edges", ...pairs],
          sizes.map((size) => [count(size), ...pairs.map((name) => {
            const d = s.differences.find((d) => d.edges === size && d.method + " - " + d.minus === name);
            return d ? signed(d.difference) + (d.interval ? " [" + signed(d.interval[0]) + ", " + signed(d.interval[1]) + "]" : "") : "";
          })]));
  }
}
window.tfcliRenderers = Object.assign(window.tfcliRenderers || {}, {
  circuit: async function (section, s, number, LIB) {
    if (s.compared) return compared(section, s, LIB);
    const {el} = LIB;
    const NS = "http://www.w3.org/2000/svg";
    const signed = (v) => (v >= 0 ? "+" : "") + v.toFixed(4);  // the terminal's precision
    function svgOf(width, height) {
      const svg = document.createElementNS(NS, "svg");
      svg.setAttribute("width", width);
      svg.setAttribute("height", height);
      svg.setAttribute("class", "circuit-graph");
      return svg;
    }
    function add(svg, tag, attrs, tip) {
      const node = document.createElementNS(NS, tag);
      for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
      if (tip) node.append(Object.assign(document.createElementNS(NS, "title"), {textContent: tip}));
      svg.append(node);
      return node;
    }
    section.append(el("h2", {}, s.header[0]), ...s.header.slice(1).map((line) => el("p", {}, line)));
    // where a node is drawn: column (heads 0..H-1, the MLP at H + 0.5), row (input -1, layers, logits L)
    const place = (name) => {
      const m = /^L(\d+)(?:H(\d+)|\.mlp)/.exec(name);
      if (!m) return name === "input" ? [s.heads / 2, -1] : [s.heads / 2, s.layers];
      return [m[2] === undefined ? s.heads + 0.5 : Number(m[2]), Number(m[1])];
    };
    const dx = 46, dy = 44, pad = 40;
    const width = (s.heads + 2) * dx + 2 * pad, height = (s.layers + 2) * dy + 2 * pad;
    const at = ([x, y]) => [pad + (x + 0.5) * dx, height - pad - (y + 1) * dy];
    const graph = svgOf(width, height);
    const largest = Math.max(1e-12, ...s.edges.map((e) => Math.abs(e.score)));
    for (const e of [...s.edges].sort((a, b) => Math.abs(a.score) - Math.abs(b.score))) {
      const [x0, y0] = at(place(e.sender)), [x1, y1] = at(place(e.receiver));
      // an edge within one column (MLP -> MLP, a head to the same head index) bows out to the right, further the more
      // layers it spans, and one within a row (a head into its layer's MLP) bows up, so that neither is drawn over
      // the column's or the row's other edges
      const column = x0 === x1, row = y0 === y1;
      const bow = column ? Math.min(pad + dx, 14 + 0.3 * Math.abs(y1 - y0)) :
        row ? Math.min(0.8 * dy, 8 + 0.15 * Math.abs(x1 - x0)) : 0;
      const [cx, cy] = [(x0 + x1) / 2 + (column ? 2 * bow : 0), (y0 + y1) / 2 - (row ? 2 * bow : 0)];
      add(graph, "path", {d: `M${x0},${y0} Q${cx},${cy} ${x1},${y1}`, fill: "none",
                          stroke: e.score >= 0 ? "#2166ac" : "#b2182b",
                          "stroke-width": (0.5 + 5 * Math.abs(e.score) / largest).toFixed(2), "stroke-opacity": 0.7},
          e.sender + " -> " + e.receiver + (e.span ? " at span " + e.span : "") + ": " + signed(e.score));
    }
    for (const name of [...s.nodes.filter((n) => n !== "logits"), "logits"]) {
      const [x, y] = at(place(name));
      add(graph, "circle", {cx: x, cy: y, r: 5, fill: "#222"}, name);
      add(graph, "text", {x: x + 7, y: y - 6, "font-size": 10}).textContent = name;
    }
    for (let layer = -1; layer <= s.layers; layer++) {
      add(graph, "text", {x: 2, y: at([0, layer])[1] + 4, "font-size": 10, fill: "#666"}).textContent =
        layer < 0 ? "input" : layer === s.layers ? "logits" : "L" + layer;
    }
    // the curve: faithfulness against edges (log scale), with the intervals; the circuit picked, ringed
    const count = (n) => n.toLocaleString("en-US");  // 27,787, as the terminal writes it
    const cw = 300, ch = 220, cp = 40, curve = svgOf(cw, ch);
    if (s.curve.length) {
      const points = s.measured ? [...s.curve, s.measured] : s.curve;
      const xs = points.map((p) => Math.log10(p.edges)), lo = Math.min(...xs), hi = Math.max(...xs, lo + 1);
      const values = points.flatMap((p) => [p.faithfulness, ...(p.interval || [])]);
      const ylo = Math.min(0, ...values), yhi = Math.max(1, ...values);
      const X = (v) => cp + (Math.log10(v) - lo) / (hi - lo) * (cw - 2 * cp);
      const Y = (v) => ch - cp - (v - ylo) / (yhi - ylo) * (ch - 2 * cp);
      add(curve, "line", {x1: cp, y1: Y(1), x2: cw - cp, y2: Y(1), stroke: "#bbb", "stroke-dasharray": "3 3"});
      add(curve, "polyline", {points: s.curve.map((p) => X(p.edges) + "," + Y(p.faithfulness)).join(" "),
                              fill: "none", stroke: "#333"});
      // the sizes' labels, right to left, leaving out one that would overlap the label drawn to its right
      let right = Infinity;
      for (const p of [...s.curve].reverse()) {
        if (p.interval) add(curve, "line", {x1: X(p.edges), x2: X(p.edges), y1: Y(p.interval[0]), y2: Y(p.interval[1]),
                                            stroke: "#999"});
        add(curve, "circle", {cx: X(p.edges), cy: Y(p.faithfulness), r: 4, fill: "#333"},
            count(p.edges) + " edges, " + count(p.nodes) + " nodes: faithfulness " + p.faithfulness.toFixed(3) +
            (p.interval ? " [" + p.interval[0].toFixed(3) + ", " + p.interval[1].toFixed(3) + "]" : ""));
        if (right - X(p.edges) >= 8 * count(p.edges).length) {
          add(curve, "text", {x: X(p.edges), y: ch - cp + 14, "font-size": 10, "text-anchor": "middle"}).textContent = count(p.edges);
          right = X(p.edges);
        }
      }
      if (s.measured) {
        const m = s.measured;
        if (m.interval) add(curve, "line", {x1: X(m.edges), x2: X(m.edges), y1: Y(m.interval[0]), y2: Y(m.interval[1]),
                                            stroke: "#2563eb"});
        add(curve, "circle", {cx: X(m.edges), cy: Y(m.faithfulness), r: 7, fill: "none", stroke: "#2563eb",
                              "stroke-width": 2},
            "the circuit: " + count(m.edges) + " edges, " + count(m.nodes) + " nodes: faithfulness " + m.faithfulness.toFixed(3) +
            (m.interval ? " [" + m.interval[0].toFixed(3) + ", " + m.interval[1].toFixed(3) + "]" : ""));
        add(curve, "text", {x: X(m.edges), y: Y(m.faithfulness) - 11, "font-size": 10, "text-anchor": "middle",
                            fill: "#2563eb"}).textContent = "circuit: " + count(m.edges);
      }
      const drawn = [];  // the faithfulness axis: its ends, then 1 and 0 where they do not overlap another label
      for (const v of [ylo, yhi, 1, 0]) {
        if (drawn.some((y) => Math.abs(Y(v) - y) < 12)) continue;
        add(curve, "text", {x: cp - 4, y: Y(v) + 3, "font-size": 10, "text-anchor": "end"}).textContent = v.toFixed(2);
        drawn.push(Y(v));
      }
      add(curve, "text", {x: cw / 2, y: ch - 6, "font-size": 11, "text-anchor": "middle"}).textContent = "edges";
      add(curve, "text", {x: 4, y: cp - 10, "font-size": 11}).textContent = "faithfulness";
    }
    section.append(el("div", {class: "circuit-row", style: "display:flex;gap:24px;align-items:flex-start"},
                      el("div", {}, graph), el("div", {}, curve)));
    section.append(el("h3", {}, "the edges of largest |score|"),
      el("table", {class: "labels"},
        el("thead", {}, el("tr", {}, ...["#", "sender", "receiver", "score", "in circuit"].map((h) => el("th", {}, h)))),
        el("tbody", {}, ...s.top.map((e, i) => el("tr", {}, el("td", {}, String(i + 1)),
          el("td", {class: "left"}, e.sender), el("td", {class: "left"}, e.receiver),
          el("td", {}, signed(e.score)), el("td", {}, e.in_circuit ? "yes" : ""))))));
  },
});
