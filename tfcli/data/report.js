// tfcli --report page: draws the data in #tfcli-data. Plain DOM and canvas, no library, no network.
// When everything is drawn, <body data-ready="1"> (tests and scripts wait for it).
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("tfcli-data").textContent);
  const RAMP = [[255, 255, 255], [198, 219, 239], [107, 174, 214], [33, 113, 181], [8, 48, 107]];

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (name === "class") node.className = value;
      else if (name === "style") node.style.cssText = value;
      else node.setAttribute(name, value);
    }
    for (const child of children) if (child !== null && child !== undefined) node.append(child);
    return node;
  }

  // t in [0, 1] -> [r, g, b] along the white-to-navy ramp
  function rgb(t) {
    const x = Math.min(Math.max(t, 0), 1) * (RAMP.length - 1), i = Math.min(Math.floor(x), RAMP.length - 2), f = x - i;
    return RAMP[i].map((c, k) => Math.round(c + (RAMP[i + 1][k] - c) * f));
  }
  function colour(t) { return "rgb(" + rgb(t).join(",") + ")"; }
  function shade(node, t) { node.style.background = colour(t); node.style.color = t > 0.55 ? "#fff" : ""; }
  function fmt(p) { return p >= 0.001 || p === 0 ? p.toFixed(3) : p.toExponential(1); }
  function quoted(token) { return JSON.stringify(token); }
  // a text a heading names (the input, not a result), quoted, in at most about three lines, as the terminal echoes
  // it: a longer one shows its beginning and its end around " ... ", cut at spaces
  const ECHO = 360;
  function echoed(text) {
    if (text.length <= ECHO) return quoted(text);
    const half = ECHO / 2, start = text.slice(0, half), end = text.slice(-half);
    const head = start.includes(" ") ? start.slice(0, start.lastIndexOf(" ")) : start;
    const tail = end.includes(" ") ? end.slice(end.indexOf(" ") + 1) : end;
    return quoted(head).slice(0, -1) + " ... " + quoted(tail).slice(1) + " (" + counted(text.length) + " characters)";
  }
  // a token's text where it stands unquoted (a list of tokens, a grid's header), as the terminal shows it: each
  // space as ␣ (" Mary" -> "␣Mary"), control characters escaped ("\n"); `...spaceNote(texts)` says what ␣ is
  const ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"};
  function label(text) {
    return text.replace(/[\u0000-\u001f\u007f-\u009f]/g,
                        (c) => ESCAPES[c] || "\\x" + c.charCodeAt(0).toString(16).padStart(2, "0")).replace(/ /g, "\u2423");
  }
  function spaceNote(texts) {
    return texts.some((t) => t.includes(" ")) ? [el("p", {class: "note"}, "\u2423 = a space")] : [];
  }
  function counted(n) { return n.toLocaleString("en-US"); }
  // "0 [white-to-navy ramp] top (what)": the key to a shading; `mark` (in [0, 1]) is drawn on the ramp
  function legend(top, what, mark) {
    const ramp = el("span", {class: "ramp"},
      mark === undefined ? null : el("span", {class: "mark", style: "left:calc(" + (100 * mark).toFixed(2) + "% - 1px)"}));
    return el("div", {class: "legend"}, "0", ramp, el("span", {class: "legend-max"}, top),
              el("span", {class: "legend-what"}, what));
  }

  // ---------------------------------------------------------------- tooltip: [data-tip] elements and canvases
  const tip = el("div", {id: "tip", role: "tooltip"});
  tip.hidden = true;
  document.body.append(tip);
  function showTip(text, x, y) {
    tip.textContent = text;
    tip.hidden = false;
    const w = tip.offsetWidth, h = tip.offsetHeight;
    tip.style.left = Math.min(x + 14, window.innerWidth - w - 4) + "px";
    tip.style.top = (y + 16 + h > window.innerHeight ? y - h - 8 : y + 16) + "px";
  }
  function hideTip() { tip.hidden = true; }
  document.addEventListener("mouseover", (e) => {
    const target = e.target.closest && e.target.closest("[data-tip]");
    if (target) showTip(target.dataset.tip, e.clientX, e.clientY);
  });
  document.addEventListener("mouseout", (e) => {
    if (e.target.closest && e.target.closest("[data-tip]")) hideTip();
  });

  // ---------------------------------------------------------------- data
  async function inflate(base64) {
    if (!base64) return new Uint16Array(0);
    if (typeof DecompressionStream === "undefined")
      throw new Error("this browser lacks DecompressionStream (Chrome 80+, Firefox 113+, Safari 16.4+ have it)");
    const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    const buffer = await new Response(stream).arrayBuffer();
    const view = new DataView(buffer), values = new Uint16Array(buffer.byteLength / 2);
    for (let i = 0; i < values.length; i++) values[i] = view.getUint16(2 * i, true);  // little-endian
    return values;
  }

  // ---------------------------------------------------------------- header
  function header(run) {
    const kind = run.trained ? "trained" : "random";  // the badge's style
    // a checkpoint may have been saved from a random init: say where its weights come from, not that they are
    // trained. The description's first word ("loaded from ...", "random (seed 0), ...") is the badge
    const space = run.weights.indexOf(" "), first = space < 0 ? run.weights : run.weights.slice(0, space);
    // a long argument (a whole text) is shortened in the command line; the full one is on hover and below
    const short = run.short_command_line || run.command_line;
    const command = el("dd", {}, el("code", {class: "command", title: run.command_line}, short));
    if (short !== run.command_line)
      command.append(el("details", {class: "full-command"},
        el("summary", {}, "the full command line (" + counted(run.command_line.length) + " characters)"),
        el("code", {}, run.command_line)));
    const dl = el("dl", {},
      el("dt", {}, "model"), el("dd", {}, run.model),
      el("dt", {}, "source"), el("dd", {}, run.source),
      el("dt", {}, "weights"), el("dd", {}, el("span", {class: "badge " + kind}, first),
                                   space < 0 ? "" : run.weights.slice(space)),
      el("dt", {}, "tfcli"), el("dd", {}, run.version),
      el("dt", {}, "command"), command);
    return el("header", {}, el("h1", {}, "tfcli " + run.command), dl);
  }

  // each token's text (a section's tokens_shown), a space as \u2423 (`spaceNote` says so), quoted on hover
  function tokenLine(tokens) {
    return el("div", {class: "tokens"}, ...tokens.map((t, i) => el("span", {class: "tok", "data-tip": "position " + i + ": " + quoted(t)}, label(t))));
  }

  // ---------------------------------------------------------------- encode: attention
  const KINDS = {self: "self-attention", encoder: "encoder self-attention", decoder: "decoder self-attention",
                 cross: "cross-attention (decoder query \u2192 encoder key)"};
  const headName = (h) => (h === "mean" ? "mean of heads" : "head " + h);

  function attentionView(s, maps, scale, detail) {
    const tokensOf = (m, side) => s.tokens_shown[m[side]];  // the text each token stands for
    const kinds = [...new Set(maps.map((m) => m.kind))];
    const kindSel = el("select", {class: "kind"}, ...kinds.map((k) => el("option", {value: k}, KINDS[k])));
    const layerSel = el("select", {class: "layer"});
    const headSel = el("select", {class: "head"});
    // one absolute scale by default, as the terminal's and the figures': a weight has the same colour in every map
    const scaleSel = el("select", {class: "scale"}, el("option", {value: "one"}, "0 to 1 (the same for every map)"),
                        el("option", {value: "map"}, "0 to this map's largest weight (stretched)"));
    const controls = el("div", {class: "controls"},
      kinds.length > 1 ? el("label", {}, "attention", kindSel) : null,
      el("label", {}, "layer", layerSel), el("label", {}, "head", headSel), el("label", {}, "colour", scaleSel));
    const canvas = el("canvas", {class: "heatmap", "aria-label": "attention heatmap: query rows, key columns"});
    const readout = el("div", {class: "readout mono"});
    const key = legend("", "");
    const left = el("div", {class: "col left"}), right = el("div", {class: "col right"});
    const lines = el("canvas", {class: "lines"});
    const headview = el("div", {},
      el("div", {class: "headview-caption"}, "head view: queries \u2192 keys, a line's opacity is its weight; click a token"),
      el("div", {class: "headview"}, left, lines, right));
    const focusLine = el("p", {class: "focus"});
    const state = {map: null, focus: null, geometry: null};

    function choices(kind, layer) {
      return maps.filter((m) => m.kind === kind && (layer === undefined || m.layer === layer));
    }
    function fillLayers() {
      const layers = [...new Set(choices(kindSel.value).map((m) => m.layer))];
      // at first, the layer the terminal shows in full: the last one (of those asked for with --layers)
      const first = layerSel.options.length === 0;
      const shown = layers.filter((l) => !detail || detail.includes(l));
      const keep = first ? (shown.length ? shown[shown.length - 1] : layers[layers.length - 1]) : Number(layerSel.value);
      layerSel.replaceChildren(...layers.map((l) => el("option", {value: l}, String(l))));
      if (layers.includes(keep)) layerSel.value = String(keep);
      fillHeads();
    }
    function fillHeads() {
      const heads = choices(kindSel.value, Number(layerSel.value)).map((m) => String(m.head));
      const keep = headSel.value;
      headSel.replaceChildren(...heads.map((h) => el("option", {value: h}, headName(h === "mean" ? h : Number(h)))));
      if (heads.includes(keep)) headSel.value = keep;
      pick();
    }
    function pick() {
      state.map = choices(kindSel.value, Number(layerSel.value)).find((m) => String(m.head) === headSel.value);
      if (state.focus && !(state.focus.index < (state.focus.side === "query" ? state.map.rows : state.map.cols))) state.focus = null;
      draw();
    }
    function weight(m, i, j) { return m.values[i * m.cols + j] / scale; }
    function largest(m) { let top = 1; for (const v of m.values) if (v > top) top = v; return top / scale; }
    // the weight that gets the darkest colour: the map's largest, or 1
    function darkest(m) { return scaleSel.value === "one" ? 1 : largest(m); }

    function drawHeatmap() {
      const m = state.map, queries = tokensOf(m, "query"), keys = tokensOf(m, "key");
      const cell = Math.max(5, Math.min(28, Math.floor(560 / Math.max(m.rows, m.cols))));
      const font = Math.min(12, cell - 2), labelled = font >= 7;
      const ctx = canvas.getContext("2d");
      ctx.font = font + "px system-ui, sans-serif";
      const widest = (tokens) => Math.max(0, ...tokens.map((t) => ctx.measureText(label(t)).width));
      // too many tokens for their labels: every `every`-th position number instead
      const every = labelled ? 1 : (cell >= 8 ? 5 : 10), indexFont = 10;
      const x0 = labelled ? Math.ceil(widest(queries)) + 8 : 26, y0 = labelled ? Math.ceil(widest(keys)) + 8 : 26;
      const width = x0 + m.cols * cell + 2, height = y0 + m.rows * cell + 2, ratio = window.devicePixelRatio || 1;
      canvas.width = width * ratio; canvas.height = height * ratio;
      canvas.style.width = width + "px"; canvas.style.height = height + "px";
      ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
      ctx.font = font + "px system-ui, sans-serif";
      const top = darkest(m);
      for (let i = 0; i < m.rows; i++)
        for (let j = 0; j < m.cols; j++) {
          ctx.fillStyle = colour(weight(m, i, j) / top);
          ctx.fillRect(x0 + j * cell, y0 + i * cell, cell, cell);
        }
      if (labelled) {
        ctx.fillStyle = "#1b1f24"; ctx.textBaseline = "middle"; ctx.textAlign = "right";
        queries.forEach((t, i) => ctx.fillText(label(t), x0 - 4, y0 + (i + 0.5) * cell));
        ctx.save(); ctx.rotate(-Math.PI / 2); ctx.textAlign = "left";
        keys.forEach((t, j) => ctx.fillText(label(t), -y0 + 4, x0 + (j + 0.5) * cell));
        ctx.restore();
      } else {
        ctx.fillStyle = "#5b6470"; ctx.font = indexFont + "px system-ui, sans-serif"; ctx.textBaseline = "middle";
        ctx.textAlign = "right";
        for (let i = 0; i < m.rows; i += every) ctx.fillText(String(i), x0 - 4, y0 + (i + 0.5) * cell);
        ctx.textAlign = "center"; ctx.textBaseline = "bottom";
        for (let j = 0; j < m.cols; j += every) ctx.fillText(String(j), x0 + (j + 0.5) * cell, y0 - 4);
      }
      if (state.focus) {
        ctx.strokeStyle = "#e6550d"; ctx.lineWidth = 2;
        const f = state.focus.index;
        if (state.focus.side === "query") ctx.strokeRect(x0, y0 + f * cell, m.cols * cell, cell);
        else ctx.strokeRect(x0 + f * cell, y0, cell, m.rows * cell);
      }
      state.geometry = {x0, y0, cell};
      Object.assign(canvas.dataset, {x0, y0, cell, rows: m.rows, cols: m.cols});
      key.querySelector(".legend-max").textContent = fmt(top);
      key.querySelector(".legend-what").textContent = scaleSel.value === "one" ? "" : "(this map's largest weight: stretched)";
    }

    function drawHeadView() {
      const m = state.map, queries = tokensOf(m, "query"), keys = tokensOf(m, "key"), f = state.focus;
      const top = darkest(m);  // the other column's tokens take the colours of the heatmap's row or column
      const column = (node, tokens, side) => node.replaceChildren(...tokens.map((t, i) => {
        const span = el("span", {"data-side": side, "data-index": i}, label(t));
        if (f && f.side === side && f.index === i) span.classList.add("picked");
        else if (f && f.side !== side) {
          const w = side === "key" ? weight(m, f.index, i) : weight(m, i, f.index);
          shade(span, w / top); span.dataset.tip = fmt(w);
        }
        return span;
      }));
      column(left, queries, "query"); column(right, keys, "key");
      const row = 18, width = 150, height = Math.max(m.rows, m.cols) * row, ratio = window.devicePixelRatio || 1;
      lines.width = width * ratio; lines.height = height * ratio;
      lines.style.width = width + "px"; lines.style.height = height + "px";
      const ctx = lines.getContext("2d");
      ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
      ctx.lineWidth = 1.6;
      for (let i = 0; i < m.rows; i++) {
        if (f && f.side === "query" && f.index !== i) continue;
        for (let j = 0; j < m.cols; j++) {
          if (f && f.side === "key" && f.index !== j) continue;
          const a = weight(m, i, j);  // absolute: a query's lines add up to 1
          if (a < 0.01) continue;
          ctx.strokeStyle = "rgba(33,113,181," + a.toFixed(3) + ")";
          ctx.beginPath(); ctx.moveTo(0, (i + 0.5) * row); ctx.lineTo(width, (j + 0.5) * row); ctx.stroke();
        }
      }
    }

    // the clicked token's strongest links, its own side's first; in self-attention (queries and keys are the
    // same tokens) the other direction too, so one click answers both "attends to" and "attended by"
    function describeFocus() {
      const m = state.map, f = state.focus;
      if (!f) { focusLine.textContent = "Click a token in the head view (or a heatmap row) to see what it attends to and what attends to it."; return; }
      const sides = m.query === m.key ? (f.side === "query" ? ["query", "key"] : ["key", "query"]) : [f.side];
      focusLine.replaceChildren(...sides.map((side) => {
        const mine = tokensOf(m, side)[f.index], others = tokensOf(m, side === "query" ? "key" : "query");
        const ranked = others.map((t, k) => [t, k, side === "query" ? weight(m, f.index, k) : weight(m, k, f.index)])
          .sort((a, b) => b[2] - a[2]).slice(0, 6);
        const what = side === "query" ? " (query " + f.index + ") attends most to: " : " (key " + f.index + ") is attended most by: ";
        return el("span", {class: side}, quoted(mine) + what + ranked.map(([t, k, w]) => label(t) + " [" + k + "] " + fmt(w)).join(", "));
      }));
    }

    function draw() { drawHeatmap(); drawHeadView(); describeFocus(); }

    function cellAt(e) {
      const box = canvas.getBoundingClientRect(), g = state.geometry, m = state.map;
      const j = Math.floor((e.clientX - box.left - g.x0) / g.cell), i = Math.floor((e.clientY - box.top - g.y0) / g.cell);
      return i >= 0 && j >= 0 && i < m.rows && j < m.cols ? [i, j] : null;
    }
    canvas.addEventListener("mousemove", (e) => {
      const at = cellAt(e);
      if (!at) { hideTip(); readout.textContent = ""; return; }
      const [i, j] = at, m = state.map;
      const text = "query " + quoted(tokensOf(m, "query")[i]) + " [" + i + "] \u2192 key " + quoted(tokensOf(m, "key")[j]) +
        " [" + j + "]: " + weight(m, i, j).toFixed(3);
      readout.textContent = text;
      showTip(text, e.clientX, e.clientY);
    });
    canvas.addEventListener("mouseleave", () => { hideTip(); readout.textContent = ""; });
    canvas.addEventListener("click", (e) => {
      const at = cellAt(e);
      if (at) toggleFocus("query", at[0]);
    });
    for (const column of [left, right])
      column.addEventListener("click", (e) => {
        const span = e.target.closest("span[data-side]");
        if (span) toggleFocus(span.dataset.side, Number(span.dataset.index));
      });
    function toggleFocus(side, index) {
      const f = state.focus;
      state.focus = f && f.side === side && f.index === index ? null : {side, index};
      draw();
    }

    kindSel.addEventListener("change", fillLayers);
    layerSel.addEventListener("change", fillHeads);
    headSel.addEventListener("change", pick);
    scaleSel.addEventListener("change", draw);
    fillLayers();
    return el("div", {class: "attention"}, el("h3", {}, "attention"), controls,
      el("div", {class: "views"}, el("div", {class: "heatmap-box"}, canvas, key, readout), headview), focusLine);
  }

  // A layers x columns grid of top tokens (their texts, a space as \u2423), each cell shaded by its probability (0 to 1),
  // the top list on hover; a long token widens its column (never cut).
  function grid(caption, columns, rows, what) {
    const table = el("table", {class: "grid"},
      el("thead", {}, el("tr", {}, el("th", {class: "left"}, caption),
        ...columns.map((c, k) => el("th", {"data-tip": k + ": " + quoted(c)}, label(c))))));
    const body = el("tbody");
    for (const row of rows) {
      const tr = el("tr", {}, el("th", {class: "left"}, row.label));
      row.cells.forEach((cell) => {
        const td = el("td", {"data-tip": cell.tip}, label(cell.token));
        shade(td, cell.prob);
        tr.append(td);
      });
      body.append(tr);
    }
    table.append(body);
    return el("div", {}, el("div", {class: "scroll"}, table),
              ...spaceNote(columns.concat(...rows.map((row) => row.cells.map((cell) => cell.token)))),
              legend("1", what || "probability of the top token"));
  }

  function lensView(s) {
    const positions = s.tokens_shown[s.lens.positions], vocabulary = s.lens.vocabulary_shown;
    const rows = s.lens.rows.map((row) => ({
      label: "layer " + row.layer,
      cells: row.top.map((top, p) => ({
        token: vocabulary[top[0][0]], prob: top[0][1],
        tip: "layer " + row.layer + ", position " + p + " " + quoted(positions[p]) + "\n" +
             top.map(([t, prob], k) => (k + 1) + ". " + quoted(vocabulary[t]) + " " + fmt(prob)).join("\n"),
      })),
    }));
    const hover = "; hover for the top " + s.lens.rows[0].top[0].length + ".";
    const note = s.lens.predicts
      ? "What each layer would predict at each position: its output through " + s.lens.through +
        "; the top token, shaded by its probability" + hover
      : "Each layer's output at each position through " + s.lens.through + ": the model has no LM head, so this is " +
        "not a prediction (it mostly shows the input token itself); the top token, shaded by its probability" + hover;
    return el("div", {class: "lens"}, el("h3", {}, "logit lens"), el("p", {class: "note"}, note),
      grid("layer \\ position", positions, rows));
  }

  function stagesTable(stages) {
    const head = ["stage", "shape", "dtype", "params", "mean", "std", "norm"];
    const signed = (x) => (x >= 0 ? "+" : "") + x.toFixed(4);
    return el("div", {class: "stages"}, el("h3", {}, "stages"), el("div", {class: "scroll"}, el("table", {},
      el("thead", {}, el("tr", {}, ...head.map((h, k) => el("th", {class: k === 0 || k === 2 ? "left" : ""}, h)))),
      el("tbody", {}, ...stages.map(([name, shape, dtype, params, mean, std, norm]) => el("tr", {},
        el("td", {class: "left"}, name), el("td", {}, "(" + shape.join(", ") + ")"), el("td", {class: "left"}, dtype),
        el("td", {}, params.toLocaleString("en-US")), el("td", {}, signed(mean)), el("td", {}, std.toFixed(4)),
        el("td", {}, norm.toFixed(2))))))));
  }

  async function renderEncode(section, s, number) {
    // a truncated text shows as the model read it, with how much that is of the whole
    let heading = "text " + number + ": ";
    if (s.cut) {
      const parts = [counted(s.cut.tokens) + " of its " + counted(s.cut.of_tokens) + " tokens"];
      if (s.cut.characters < s.cut.of_characters)
        parts.push(counted(s.cut.characters) + " of " + counted(s.cut.of_characters) + " characters");
      heading = "text " + number + ", as the model read it (" + parts.join("; ") + "): ";
    }
    section.append(el("h2", {}, heading + echoed(s.text)), tokenLine(s.tokens_shown.tokens));
    if (s.tokens_shown.target) section.append(el("p", {class: "note"}, "decoder input:"), tokenLine(s.tokens_shown.target));
    section.append(...spaceNote(s.tokens_shown.tokens.concat(s.tokens_shown.target || [])));
    const maps = s.attention.maps;
    if (maps.length) {
      const values = await inflate(s.attention.weights);
      let offset = 0;
      for (const m of maps) { m.values = values.subarray(offset, offset + m.rows * m.cols); offset += m.rows * m.cols; }
      section.append(attentionView(s, maps, s.attention.scale, DATA.run.detail));
    }
    if (s.lens.rows.length) section.append(lensView(s));
    section.append(stagesTable(s.stages));
  }

  // ---------------------------------------------------------------- generate
  // the text as it reads on, its generated end (`added`) marked when it is the text's end
  function textBlock(full, added) {
    const cut = added && full.endsWith(added) ? full.length - added.length : full.length;
    return el("div", {class: "text-block"}, full.slice(0, cut),
              cut < full.length ? el("span", {class: "new", title: "generated"}, full.slice(cut)) : null);
  }
  function renderGenerate(section, s, number) {
    const steps = s.steps;
    const ended = s.stopped_at_eos ? "stopped at end of sequence" : steps.length + " new tokens";
    section.append(el("h2", {}, "prompt " + number + ": " + echoed(s.prompt)),
      el("p", {class: "note"}, ended + " (underlined); probabilities are the model's (softmax of the logits, before temperature and filtering)"),
      textBlock(s.full_text, s.text));
    const alternatives = (step) => step.top.filter((t) => t.id !== step.id).map((t) => quoted(t.token) + " " + fmt(t.prob)).join("  ");
    section.append(el("h3", {}, "steps"), el("div", {class: "scroll"}, el("table", {},
      el("thead", {}, el("tr", {}, el("th", {}, "step"), el("th", {class: "left"}, "token"), el("th", {}, "id"),
        el("th", {}, "prob"), el("th", {class: "left"}, ""), el("th", {class: "left"}, "top alternatives"))),
      el("tbody", {}, ...steps.map((step) => el("tr", {},
        el("td", {}, String(step.step)), el("td", {class: "left mono"}, quoted(step.token) + (step.eos ? " (end)" : "")),
        el("td", {}, String(step.id)), el("td", {}, fmt(step.prob)),
        el("td", {class: "left"}, el("span", {class: "bar", style: "width:" + Math.round(step.prob * 80) + "px"})),
        el("td", {class: "left mono"}, alternatives(step))))))));
    if (steps.length && steps[0].lens) {
      const layers = steps[0].lens.length;
      const rows = [];
      for (let layer = 0; layer < layers; layer++)
        rows.push({label: layer === 0 ? "emb" : "layer " + layer, cells: steps.map((step) => {
          const guess = step.lens[layer];
          return {token: guess.token, prob: guess.prob,
                  tip: (layer === 0 ? "embeddings" : "layer " + layer) + ", step " + step.step + " (chose " + quoted(step.token) +
                       ")\ntop: " + quoted(guess.token) + " " + fmt(guess.prob)};
        })});
      section.append(el("h3", {}, "logit lens"),
        el("p", {class: "note"}, "What each layer's hidden state would have predicted at each step (through the final norm and the LM head), shaded by probability."),
        grid("layer \\ step", steps.map((step) => step.token), rows));
    }
  }

  // ---------------------------------------------------------------- classify
  function renderClassify(section, s, number) {
    section.append(el("h2", {}, "text " + number + ": " + echoed(s.text)));
    const ranked = s.labels.map((label, k) => [label, s.probs[k]]).sort((a, b) => b[1] - a[1]);
    section.append(el("table", {class: "labels"},
      el("thead", {}, el("tr", {}, el("th", {class: "left"}, "label"), el("th", {}, "prob"), el("th", {}), el("th", {}))),
      el("tbody", {}, ...ranked.map(([label, p]) => el("tr", {},
        el("td", {class: "left" + (label === s.prediction ? " prediction" : "")}, label), el("td", {}, p.toFixed(4)),
        el("td", {class: "left"}, el("span", {class: "bar", style: "width:" + Math.round(p * 240) + "px"})),
        el("td", {class: "left prediction"}, label === s.prediction ? "\u25c0 prediction" : ""))))));
    if (s.explain) {
      // the absolute scale, 0 to 1, as the terminal's and the figure's: near-uniform attention looks faint
      const e = s.explain, even = 1 / e.tokens.length;
      const where = e.layers.length === 1 ? "layer " + e.layers[0] : "layers " + e.layers[0] + "-" + e.layers[e.layers.length - 1];
      section.append(el("h3", {}, "why"),
        el("p", {class: "note"}, "What the first token (the one the classifier reads) attends to in " + where +
           ", mean over heads, shaded from 0 to 1; hover a token for its weight. Spread evenly, each token would get 1/" +
           e.tokens.length + " = " + fmt(even) + " (the orange mark)."),
        el("div", {class: "tokens explain"}, ...e.tokens_shown.map((t, k) => {
          const span = el("span", {class: "tok", "data-tip": quoted(t) + " [" + k + "]: " + fmt(e.weights[k])}, label(t));
          shade(span, e.weights[k]);
          return span;
        })), ...spaceNote(e.tokens_shown), legend("1", "weight; orange: 1/n = " + fmt(even) + ", the largest here " + fmt(Math.max(...e.weights)), even));
    }
  }

  // ---------------------------------------------------------------- page
  // an analysis command's script (report-attribute.js, ...) has put its renderer in window.tfcliRenderers; it
  // draws with the helpers in LIB
  const LIB = {el, rgb, colour, shade, fmt, quoted, echoed, label, spaceNote, counted, legend, inflate};
  const RENDER = Object.assign({encode: renderEncode, generate: renderGenerate, classify: renderClassify},
                               window.tfcliRenderers || {});
  async function main() {
    document.body.append(header(DATA.run));
    const what = ["generate", "steer"].includes(DATA.run.command) ? "prompt" : "text";
    if (DATA.sections.length > 1)
      document.body.append(el("nav", {}, ...DATA.sections.map((s, k) => el("a", {href: "#" + what + "-" + (k + 1)}, what + " " + (k + 1)))));
    for (const [k, s] of DATA.sections.entries()) {
      const section = el("section", {class: "report", id: what + "-" + (k + 1)});
      document.body.append(section);
      await RENDER[DATA.run.command](section, s, k + 1, LIB);
    }
    document.body.dataset.ready = "1";
  }
  main().catch((error) => {
    document.body.append(el("p", {class: "error"}, "could not draw this report: " + error.message));
    document.body.dataset.ready = "error";
  });
})();
