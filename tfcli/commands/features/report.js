// tfcli features --report: draws one text's tokens shaded by a feature (the feature followed, or one picked among
// those in the tokens' top lists), each token's top features and error on hover; or, over texts, the error's means
// and the feature's top activating contexts. From the section's data only (registered before report.js runs).
"use strict";
window.tfcliRenderers = Object.assign(window.tfcliRenderers || {}, {
  features: async function features(section, s, number, LIB) {
    if (s.several) {  // --sae repeated: each SAE's part, one after the other
      for (const part of s.parts) await features(section, part, number, LIB);
      return;
    }
    const {el, shade, fmt, quoted, echoed, label, spaceNote, legend} = LIB;
    const num = (v) => (v === null ? "n/a" : v.toPrecision(3));
    if (s.corpus) {
      section.append(el("h2", {}, s.header[0]), ...s.header.slice(1).map((line) => el("p", {}, line)));
      if (!s.contexts.length) return;
      const largest = Math.max(...s.contexts.map((c) => c.activation)) || 1;
      section.append(el("h3", {}, "the top activating contexts of feature " + s.feature),
        el("table", {class: "labels contexts"},
          el("thead", {}, el("tr", {}, ...["activation", "text", "position", "context"].map((h) => el("th", {}, h)))),
          el("tbody", {}, ...s.contexts.map((c) => {
            const token = el("span", {class: "tok", "data-tip": "text " + c.text + ", position " + c.position + ": " +
                                      quoted(c.token) + ": " + fmt(c.activation)}, label(c.token));
            shade(token, c.activation / largest);
            return el("tr", {}, el("td", {}, c.activation.toFixed(4)), el("td", {}, String(c.text)),
              el("td", {}, String(c.position)),
              el("td", {class: "left"}, el("span", {class: "note"}, c.before.map(label).join(" ") + " "), token,
                 el("span", {class: "note"}, " " + c.after.map(label).join(" "))));
          }))),
        ...spaceNote(s.contexts.flatMap((c) => [...c.before, c.token, ...c.after])));
      return;
    }
    section.append(el("h2", {}, "text " + number + ": " + echoed(s.text)), ...s.header.map((line) => el("p", {}, line)));
    // the feature that shades the tokens: the one followed, else one picked among the tokens' top features
    const listed = new Map();
    s.features.forEach((top) => top.forEach(([i, v]) => listed.set(i, Math.max(listed.get(i) || 0, v))));
    const choices = [...listed.entries()].sort((a, b) => b[1] - a[1]).map(([i]) => i);
    const activation = (k, f) => (s.activations !== null ? s.activations[k] :
      ((s.features[k].find(([i]) => i === f) || [f, 0])[1]));
    const tokens = el("div", {class: "tokens features"});
    const key = el("div", {});
    function draw(f) {
      const values = s.tokens.map((_, k) => activation(k, f));
      const largest = Math.max(0, ...values) || 1;
      tokens.replaceChildren(...s.tokens.map((t, k) => {
        const top = s.features[k].map(([i, v]) => i + ": " + fmt(v)).join(", ") || "none active";
        const span = el("span", {class: "tok", "data-tip": "position " + k + ": " + quoted(t) + " (#" + s.ids[k] +
          "): feature " + f + " " + fmt(values[k]) + "; top features " + top + "; L0 " + s.l0[k] + ", MSE " +
          num(s.mse[k]) + ", explained variance " + num(s.explained_variance[k]) + ", cosine " + num(s.cosine[k])},
          label(t));
        shade(span, values[k] / largest);
        return span;
      }));
      key.replaceChildren(legend(largest.toFixed(3), "feature " + f + "'s activation" +
        (s.activations === null ? " (where it is among the token's top features)" : "")));
    }
    if (s.activations === null && choices.length) {
      const pick = el("select", {}, ...choices.map((i) => el("option", {value: String(i)}, "feature " + i)));
      pick.addEventListener("change", () => draw(Number(pick.value)));
      section.append(el("p", {}, "shade the tokens by ", pick));
    }
    section.append(tokens, key, ...spaceNote(s.tokens),
                   el("p", {class: "note"}, "hover a token for its top features and the SAE's error there"));
    if (s.activations !== null) draw(s.feature);
    else if (choices.length) draw(choices[0]);
  },
});
