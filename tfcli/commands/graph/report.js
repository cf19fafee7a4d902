// tfcli graph --report: each pruned attribution graph drawn as a grid, a column per position and a row per layer
// (tokens at the bottom, logits at the top; the nodes of one cell spread across it, as render.cells places them); an
// edge's width by its |weight|, blue positive, red negative. Hovering a node shows its label (with --contexts, a
// feature's top contexts in the corpus too); clicking it lists its
// kept inputs and outputs beside the graph. Then the validation table. Drawn from the section's data only.
"use strict";
window.tfcliRenderers = Object.assign(window.tfcliRenderers || {}, {
  graph: async function (section, s, number, LIB) {
    const {el} = LIB;
    const NS = "http://www.w3.org/2000/svg";
    const signed = (v) => (v >= 0 ? "+" : "") + Number(v.toPrecision(3));
    function add(svg, tag, attrs, tip) {
      const node = document.createElementNS(NS, tag);
      for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
      if (tip) node.append(Object.assign(document.createElementNS(NS, "title"), {textContent: tip}));
      svg.append(node);
      return node;
    }
    const colors = {feature: "#333", error: "#999", token: "#2563eb", logit: "#16a34a"};
    function draw(g) {
      section.append(el("h2", {}, g.header[0]), ...g.header.slice(1).map((line) => el("p", {}, line)));
      const cells = {};
      for (const n of g.nodes) (cells[n.x + "," + n.row] = cells[n.x + "," + n.row] || []).push(n);
      // a column per position, as wide as its most crowded cell needs (the last position holds most nodes)
      const dy = 56, pad = 50, counts = g.tokens.map(() => 1);
      for (const members of Object.values(cells)) counts[members[0].x] = Math.max(counts[members[0].x], members.length);
      const columns = counts.map((c) => Math.max(80, 22 * c)), left = [];
      let across = pad;
      for (const w of columns) { left.push(across); across += w; }
      const width = across + pad, height = (g.layers + 2) * dy + 2 * pad;
      const spot = {};
      for (const members of Object.values(cells)) {
        members.forEach((n, k) => {
          spot[n.index] = [left[n.x] + (k + 0.5) / members.length * columns[n.x], height - pad - (n.row + 1.5) * dy];
        });
      }
      const svg = document.createElementNS(NS, "svg");
      svg.setAttribute("width", width);
      svg.setAttribute("height", height);
      svg.setAttribute("class", "graph-grid");
      const byIndex = Object.fromEntries(g.nodes.map((n) => [n.index, n]));
      const largest = Math.max(1e-12, ...g.edges.map((e) => Math.abs(e.weight)));
      const lines = [];
      for (const e of [...g.edges].sort((a, b) => Math.abs(a.weight) - Math.abs(b.weight))) {
        const [x0, y0] = spot[e.source], [x1, y1] = spot[e.target];
        const line = add(svg, "line", {x1: x0, y1: y0, x2: x1, y2: y1, stroke: e.weight >= 0 ? "#2166ac" : "#b2182b",
                                       "stroke-width": (0.4 + 4 * Math.abs(e.weight) / largest).toFixed(2),
                                       "stroke-opacity": 0.6},
                         byIndex[e.source].label + " -> " + byIndex[e.target].label + ": " + signed(e.weight));
        lines.push([e, line]);
      }
      for (let row = -1; row <= g.layers; row++) {
        add(svg, "text", {x: 4, y: height - pad - (row + 1.5) * dy + 4, "font-size": 10, fill: "#666"}).textContent =
          row < 0 ? "tokens" : row === g.layers ? "logits" : "L" + row;
      }
      g.tokens.forEach((t, p) => {
        add(svg, "text", {x: left[p] + columns[p] / 2, y: height - 8, "font-size": 11, "text-anchor": "middle"})
          .textContent = JSON.stringify(t);
      });
      const panel = el("div", {class: "graph-node"}, el("p", {}, "click a node for its inputs and outputs"));
      function show(n) {
        const inputs = g.edges.filter((e) => e.target === n.index), outputs = g.edges.filter((e) => e.source === n.index);
        const list = (title, edges, other) => [el("h3", {}, title + " (" + edges.length + ")"),
          el("table", {class: "labels"}, el("tbody", {}, ...edges.map((e) => el("tr", {},
            el("td", {class: "left"}, byIndex[e[other]].label), el("td", {}, signed(e.weight))))))];
        const facts = ["influence " + signed(n.influence)];
        if (n.activation !== null) facts.push("activation " + signed(n.activation));
        panel.replaceChildren(el("h3", {class: "graph-node-name"}, n.label), el("p", {}, facts.join(", ")),
                              ...(n.contexts ? [el("h3", {}, "top contexts in the corpus"),
                                               el("ul", {}, ...n.contexts.map((c) => el("li", {}, c)))] : []),
                              ...list("inputs", inputs, "source"), ...list("outputs", outputs, "target"));
        for (const [e, line] of lines) {
          const touches = e.source === n.index || e.target === n.index;
          line.setAttribute("stroke-opacity", touches ? 0.95 : 0.12);
        }
      }
      for (const n of g.nodes) {
        const [x, y] = spot[n.index];
        const circle = add(svg, "circle", {cx: x, cy: y, r: 6, fill: colors[n.kind], class: "graph-node-dot",
                                           "data-index": n.index, style: "cursor:pointer"},
                           n.label + ": influence " + signed(n.influence) +
                           (n.contexts ? "\ntop contexts:\n" + n.contexts.join("\n") : ""));
        circle.addEventListener("click", () => show(n));
      }
      section.append(el("div", {style: "display:flex;gap:24px;align-items:flex-start"},
                        el("div", {style: "overflow-x:auto;max-width:72vw"}, svg), panel));
      const v = g.validation;
      if (v) {
        section.append(el("h3", {}, "validation: each feature removed, the change of " + JSON.stringify(v.target) +
                                    " (correlation " + (v.correlation === null ? "undefined" : signed(v.correlation)) + ")"),
          el("table", {class: "labels graph-validation"},
            el("thead", {}, el("tr", {}, ...["feature", "predicted", "direct", "measured"].map((h) => el("th", {}, h)))),
            el("tbody", {}, ...v.nodes.map((n) => el("tr", {},
              el("td", {class: "left"}, byIndex[n.index] ? byIndex[n.index].label :
                 "L" + n.layer + " f" + n.feature + "@" + n.position),
              el("td", {}, signed(n.predicted)), el("td", {}, signed(n.direct)), el("td", {}, signed(n.measured)))))));
      }
    }
    for (const g of s.graphs || [s]) draw(g);
  },
});
