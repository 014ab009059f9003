// The status line: the run's state, verdict, progress, worst error, failing count and a
// link to the culprit. Rendering it also renders the answer card, focuses the layer tree
// on the culprit's module and, with nothing selected yet, selects the culprit once.
import { h, fmtNum, fmtTime } from "./util.js";
import { culpritOf, culpritName, failingText, verdictOf } from "./answer.js";

export class StatusLine {
  /** `view`: {card, layers, select(i, source), selected()}: the parts it updates. */
  constructor(src, store, view) {
    this.src = src;
    this.store = store;
    this.view = view;
    this.autoSelected = false;
    this.el = h("div", { class: "sbs-status" });
  }

  _parts(st, sm, c) {
    const state = st.state || (st.finished ? "finished" : "idle");
    const parts = [h("span", { class: `sbs-badge sbs-${state}`, text: state })];
    const verdict = sm ? verdictOf(sm, st) : "";
    if (verdict && verdict !== "running") parts.push(h("span", { class: `sbs-verdict sbs-verdict-${verdict}`, text: verdict.toUpperCase() }));
    const many = st.extra && st.extra.inputs_done !== undefined ? st.extra : null;
    if (many) parts.push(h("span", { class: "sbs-inputs-progress", text: `${many.inputs_done}${many.inputs_total ? `/${many.inputs_total}` : ""} inputs` }));
    if (st.total_onnx_nodes) parts.push(h("span", { class: "sbs-progress", text: `${st.done_onnx_nodes ?? 0}/${st.total_onnx_nodes} ONNX nodes` }));
    parts.push(h("span", { class: "sbs-nrows", text: `${this.store.count} records` }));
    if (st.elapsed) parts.push(h("span", { text: fmtTime(st.elapsed) }));
    if (st.max_err_abs) parts.push(h("span", { class: "sbs-worst", text: `worst ${fmtNum(st.max_err_abs)}${st.max_err_name ? ` at ${st.max_err_name}` : ""}` }));
    parts.push(h("span", { class: `sbs-failing${st.failures ? " sbs-bad" : ""}`, text: failingText(st.failures ?? 0, (sm && sm.totals && (sm.totals.inherited ?? sm.totals.drifted)) || 0, (sm && sm.totals && sm.totals.carried) || "upstream") }));
    if (c) {
      const i = this.view.card.row(c);
      parts.push(h("span", { class: "sbs-answer" }, "culprit: ", h("button", { class: "sbs-link", title: "select the culprit", onclick: () => this.view.select(i, "link"), disabled: i < 0 }, culpritName(c))));
    }
    return parts;
  }

  render() {
    const { card, layers, select, selected } = this.view;
    const st = this.src.get("status") || {};
    const sm = this.src.get("summary") || null;
    const c = sm ? culpritOf(sm) : null;
    this.el.replaceChildren(...this._parts(st, sm, c));
    if (st.error) this.el.appendChild(h("details", { class: "sbs-error" }, h("summary", { text: "the run raised an exception" }), h("pre", { class: "sbs-pre", text: st.error })));
    card.render(sm, st);
    if (c && c.ep_module) layers.setFocus(c.ep_module);
    // the answer in view: with nothing selected yet, the culprit is (its detail and graph)
    if (c && selected() < 0 && !this.autoSelected) {
      this.autoSelected = true;
      const i = card.row(c);
      if (i >= 0) queueMicrotask(() => selected() < 0 && select(i, "card"));
    }
  }
}
