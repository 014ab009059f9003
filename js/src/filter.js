// What the table and the chart show: one filter for both (text, op, verdict, layer,
// weights and constants folded or listed), and the bar of controls that sets it.
import { h } from "./util.js";

// the choices every run has; then one per status (or group of statuses) of the schema
const FIXED_VERDICTS = [
  ["", "all verdicts"],
  ["failing", "failing"],
  ["ownfail", "own error fails"],
];

/** The verdict filter's choices, [value, label], from the schema's statuses. */
export function verdictChoices(schema) {
  return [...FIXED_VERDICTS, ...schema.verdictChoices()];
}

// fields the text filter looks in: the user's names first
const TEXT_FIELDS = ["ep_user_name", "ep_name", "ep_module", "onnx_name", "onnx_op_type", "ep_target", "ep_source", "onnx_fx_node"];

export class ViewFilter {
  constructor(store) {
    this.store = store;
    this.state = { text: "", op: "", verdict: "", group: "", constants: false };
    this.subs = new Set();
    this._hay = []; // per row, the lowercased text the text filter looks in
  }

  _haystack(i) {
    let hay = this._hay[i];
    if (hay === undefined) {
      const s = this.store;
      hay = TEXT_FIELDS.map((k) => String(s.get(i, k) ?? "")).join("\u0000").toLowerCase();
      this._hay[i] = hay;
    }
    return hay;
  }

  /** Rows were replaced (not only appended): forget what was read from them. */
  invalidate() {
    this._hay = [];
  }

  set(patch) {
    Object.assign(this.state, patch);
    for (const cb of this.subs) cb(this.state);
  }

  subscribe(cb) {
    this.subs.add(cb);
    return () => this.subs.delete(cb);
  }

  pass(i) {
    const s = this.store;
    if (!s.has(i)) return false;
    const f = this.state;
    if (!f.constants && s.isConstant(i)) return false;
    if (f.group) {
      const m = s.get(i, "ep_module") || "";
      if (m !== f.group && !m.startsWith(`${f.group}.`)) return false;
    }
    if (f.op && s.get(i, "onnx_op_type") !== f.op) return false;
    if (f.verdict) {
      if (f.verdict === "failing") {
        if (!s.failed(i)) return false;
      } else if (f.verdict === "ownfail") {
        if (s.get(i, "passed2") !== false) return false;
      } else if (!s.schema.matches(s.get(i, "status"), f.verdict)) return false;
    }
    if (f.text && !this._haystack(i).includes(f.text.toLowerCase())) return false;
    return true;
  }
}

/** Counts of the weights and constants, for the one line that stands for them. */
export function constantCounts(store) {
  let n = 0;
  let compared = 0;
  let differ = 0;
  // weights that differ by design (a BatchNorm folded into them) while their consumers
  // agree: compared, and counted apart from those that fail
  let folded = 0;
  for (let i = 0; i < store.length; i++) {
    if (!store.has(i) || !store.isConstant(i)) continue;
    n += 1;
    const spec = store.schema.status(store.get(i, "status"));
    if (spec && spec.by_design) {
      folded += 1;
      compared += 1;
    } else if (spec && spec.compared) compared += 1;
    if (store.failed(i)) differ += 1;
  }
  return { n, compared, differ, folded };
}

export class FilterBar {
  constructor(store, filter) {
    this.store = store;
    this.filter = filter;
    this.opTypes = new Set();
    this.opSelect = h("select", { class: "sbs-f-op", title: "filter by op type", onchange: () => filter.set({ op: this.opSelect.value }) }, h("option", { value: "", text: "all ops" }));
    this.verdictSelect = h("select", { class: "sbs-f-verdict", title: "filter by verdict", onchange: () => filter.set({ verdict: this.verdictSelect.value }) });
    for (const [v, label] of verdictChoices(store.schema)) this.verdictSelect.appendChild(h("option", { value: v, text: label }));
    this._timer = null;
    this.textInput = h("input", {
      class: "sbs-f-text",
      type: "search",
      placeholder: "filter: name, module, op…",
      title: "matches fx node names, module paths, ONNX names, op types, targets and source lines",
      oninput: () => {
        clearTimeout(this._timer);
        this._timer = setTimeout(() => {
          this._timer = null;
          filter.set({ text: this.textInput.value });
        }, 120);
      },
    });
    this.groupChip = h("span", { class: "sbs-chip", hidden: true });
    this.countEl = h("span", { class: "sbs-count" });
    this.constLine = h("div", { class: "sbs-constants" });
    this.el = h("div", { class: "sbs-filters" }, h("div", { class: "sbs-filter-row" }, this.textInput, this.opSelect, this.verdictSelect, this.groupChip, this.countEl), this.constLine);
    filter.subscribe(() => this.sync());
  }

  /** Show the filter's state (set elsewhere too: a layer click, a restored view). */
  sync() {
    const f = this.filter.state;
    // what the user is typing wins over the state (its update is on its way)
    if (this._timer === null && this.textInput.value !== f.text && document.activeElement !== this.textInput) this.textInput.value = f.text;
    this.verdictSelect.value = f.verdict;
    this.opSelect.value = f.op;
    this.groupChip.hidden = !f.group;
    if (f.group) {
      this.groupChip.replaceChildren(
        h("span", { class: "sbs-muted", text: "layer " }),
        h("span", { class: "sbs-chip-name", text: f.group }),
        h("button", { class: "sbs-chip-x", title: "show every layer", onclick: () => this.filter.set({ group: "" }) }, "×"),
      );
    }
    this.renderConstants();
  }

  renderConstants() {
    const { n, compared, differ, folded } = constantCounts(this.store);
    if (!n) {
      this.constLine.replaceChildren();
      return;
    }
    const shown = this.filter.state.constants;
    const what = `${n} weight${n === 1 ? "" : "s"} and constants`;
    const verdict = differ ? h("span", { class: "sbs-bad", text: `${differ} differ${differ === 1 ? "s" : ""}` }) : h("span", { class: "sbs-good", text: folded ? "none fails" : "none differs" });
    const byDesign = folded ? h("span", { class: "sbs-muted", text: `, ${folded} differ${folded === 1 ? "s" : ""} by design (the exporter changed or folded ${folded === 1 ? "it" : "them"}; ${folded === 1 ? "its consumer agrees" : "their consumers agree"})` }) : null;
    this.constLine.replaceChildren(
      h("span", { text: `${what} (${compared} compared): ` }),
      verdict,
      ...(byDesign ? [byDesign] : []),
      " ",
      h("button", { class: "sbs-link sbs-constants-toggle", onclick: () => this.filter.set({ constants: !shown }) }, shown ? "hide them" : "list them"),
    );
  }

  /** New op types seen from row `from` on. */
  collectOps(from) {
    let grew = false;
    const ops = this.store.col("onnx_op_type") || [];
    for (let i = from; i < ops.length; i++) {
      const op = ops[i];
      if (op && !this.opTypes.has(op)) {
        this.opTypes.add(op);
        grew = true;
      }
    }
    if (!grew) return;
    const current = this.filter.state.op;
    while (this.opSelect.options.length > 1) this.opSelect.remove(1);
    for (const op of [...this.opTypes].sort()) this.opSelect.appendChild(h("option", { value: op, text: op }));
    this.opSelect.value = current;
  }

  setCount(shown, total) {
    this.countEl.textContent = shown === total ? `${shown} rows` : `${shown} of ${total} rows`;
  }
}
