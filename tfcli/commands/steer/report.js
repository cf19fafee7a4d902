// tfcli steer sweep --report: one prompt's sweep (registered before report.js runs): strength against effect and
// cost (KL) as a small chart, and each strength's continuation beside its numbers.
"use strict";
window.tfcliRenderers = Object.assign(window.tfcliRenderers || {}, {
  steer: async function (section, s, number, LIB) {
    const {el, echoed} = LIB;
    const steps = [...s.steps].sort((a, b) => a.strength - b.strength);
    const withEffect = s.effect !== null;
    section.append(el("h2", {}, "prompt " + number + ": " + echoed(s.prompt)),
                   ...s.header.map((line) => el("p", {class: "note"}, line)));

    // the chart: strengths along x; effect (blue, left scale) and KL (orange, right scale), each on its own range
    const W = 460, H = 236, left = 56, right = 56, top = 28, bottom = 36;
    const NS = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(NS, "svg");
    svg.setAttribute("width", W);
    svg.setAttribute("height", H);
    svg.setAttribute("class", "sweep-chart");
    const add = (tag, attrs, text) => {
      const node = document.createElementNS(NS, tag);
      for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
      if (text !== undefined) node.textContent = text;
      svg.append(node);
      return node;
    };
    const xs = steps.map((t) => t.strength);
    const [x0, x1] = [Math.min(...xs), Math.max(...xs)];
    const x = (v) => left + (x1 === x0 ? 0.5 : (v - x0) / (x1 - x0)) * (W - left - right);
    const scale = (values) => {
      let [lo, hi] = [Math.min(...values), Math.max(...values)];
      if (hi === lo) { lo -= 1; hi += 1; }
      return (v) => top + (1 - (v - lo) / (hi - lo)) * (H - top - bottom);
    };
    add("line", {x1: left, y1: H - bottom, x2: W - right, y2: H - bottom, stroke: "#888"});
    for (const t of steps) {
      add("line", {x1: x(t.strength), y1: H - bottom, x2: x(t.strength), y2: H - bottom + 4, stroke: "#888"});
      add("text", {x: x(t.strength), y: H - bottom + 16, "text-anchor": "middle", "font-size": 11},
          (t.strength > 0 ? "+" : "") + t.strength);
    }
    add("text", {x: (W - left - right) / 2 + left, y: H - 4, "text-anchor": "middle", "font-size": 11}, "strength");
    const series = [["kl", "#e6550d", "KL (cost)", W - right + 6, "start"]];
    if (withEffect) series.unshift(["effect", "#2171b5", "effect", left - 6, "end"]);
    for (const [key, colour, name, labelX, anchor] of series) {
      const values = steps.map((t) => t[key]);
      const y = scale(values);
      add("polyline", {points: steps.map((t) => x(t.strength) + "," + y(t[key])).join(" "), fill: "none",
                       stroke: colour, "stroke-width": 2});
      for (const t of steps) {
        add("circle", {cx: x(t.strength), cy: y(t[key]), r: 3, fill: colour}).append(
          Object.assign(document.createElementNS(NS, "title"), {textContent: name + " at " + t.strength + ": " + t[key].toFixed(4)}));
      }
      for (const v of [Math.min(...values), Math.max(...values)])
        add("text", {x: labelX, y: y(v) + 4, "text-anchor": anchor, "font-size": 10, fill: colour}, v.toFixed(3));
      add("text", {x: labelX, y: 12, "text-anchor": anchor, "font-size": 10, fill: colour}, name);
    }
    section.append(el("div", {}, svg));

    // a row per strength: its numbers and its continuation, whole
    section.append(el("table", {class: "labels sweep"},
      el("thead", {}, el("tr", {}, el("th", {}, "strength"), ...(withEffect ? [el("th", {}, "effect")] : []),
                                   el("th", {}, "KL"), el("th", {class: "left"}, "continuation"))),
      el("tbody", {}, ...steps.map((t) => el("tr", {},
        el("td", {}, (t.strength > 0 ? "+" : "") + t.strength),
        ...(withEffect ? [el("td", {}, (t.effect >= 0 ? "+" : "") + t.effect.toFixed(3))] : []),
        el("td", {}, t.kl.toFixed(3)),
        el("td", {class: "left continuation"}, t.text))))));
  },
});
