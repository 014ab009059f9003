// The run's buttons (live widget only: a static view has no kernel, so no buttons). They
// are the session's action table (onnx_sbs_nb/notebook/session.py ACTIONS, synced as the `actions`
// state): each entry {name, label, button, needs_node, when, needs, toggle, doc} gives a
// button, in the toolbar or, when it acts on a node (needs_node), beside the selected
// ONNX node in the detail panel. A click asks the kernel through anywidget's
// request/response command; the action line says "working…" until the answer comes.
import { h } from "./util.js";
import { culpritOf } from "./answer.js";

// what a view with no run behind it says instead of its buttons
export const DETACHED =
  "saved view: no run behind it in this kernel (the notebook was saved and opened again), so it has no buttons; run its cell again to use Stop, Export report, Save culprit bundle and the node actions";

// A switch (an entry's `toggle`): the synced trait it flips, whether it is on, the value
// the click sends
const TOGGLES = {
  device: { on: (v) => String(v || "").startsWith("cuda"), next: (on) => (on ? "cpu" : "cuda") },
};

const BUSY = "an action is running";
const WAIT = "wait for the run to end or press Stop";

/** Why action `a` cannot run now ("" when it can). `when`: "running" (only while the run
 * goes), "ended" (not while it runs), "any"; `needs`: "cuda", "culprit". */
function whyNot(a, { src, running, busy }) {
  if (a.when === "running") return running ? "" : "the run is not running";
  if (a.needs === "cuda" && !src.get("cuda_available")) return src.get("cuda_reason") || "CUDA is not available";
  if (a.when === "ended" && running) return WAIT;
  if (busy) return BUSY;
  if (a.needs === "culprit" && !culpritOf(src.get("summary"))) return "the run names no culprit";
  return "";
}

const enable = (b, why) => {
  b.disabled = !!why;
  b.title = why || "";
};

export class ActionBar {
  /** `selected()`: the selected row, sent with each request; `picker`: the input picker
   * that leads the toolbar; `onBacked(backed)`: once the kernel said whether a run backs
   * the view. */
  constructor(src, store, { selected, picker, onBacked }) {
    this.src = src;
    this.store = store;
    this.live = !!src.live;
    this.selected = selected;
    this.picker = picker;
    this.onBacked = onBacked;
    this.pending = null; // {name}: the action asked last, while its answer has not come
    this.shown = null; // {name, state, message}: the last answer, as the action line says it
    // a view drawn from a saved notebook has no run behind it: null while unknown, then
    // the kernel's answer to src.probe() (no answer: not backed, the buttons are withdrawn)
    this.backed = this.live && typeof src.probe === "function" ? null : this.live;
    const table = Array.isArray(src.get("actions")) ? src.get("actions") : [];
    this.table = table.filter((a) => a && typeof a.name === "string");
    this.buttons = new Map(); // toolbar button -> its table entry
    this.nodeButtons = new Map(); // the selected node's buttons -> their entries
    this.actionEl = h("span", { class: "sbs-action" });
    this.reasonEl = h("span", { class: "sbs-reason" });
    // said instead of the buttons when no run backs the view (a received notebook)
    this.detachedEl = h("span", { class: "sbs-detached", hidden: true, text: DETACHED });
    for (const a of this.table) if (!a.needs_node) this.buttons.set(this._button(a), a);
    this.el = this.live ? h("div", { class: "sbs-toolbar" }, picker.el, ...this.buttons.keys(), this.reasonEl, this.actionEl, this.detachedEl) : null;
    // Rerun / Save replay, beside the node they act on; only for ONNX node outputs
    this.nodeActions = this.live && this.table.some((a) => a.needs_node) ? (i) => this._nodeBar(i) : null;
  }

  _button(a) {
    const toggle = TOGGLES[a.toggle];
    const extra = () => (toggle ? { [a.toggle]: toggle.next(toggle.on(this.src.get(a.toggle))) } : {});
    return h("button", { class: `sbs-btn sbs-btn-${a.button || a.name}`, onclick: () => this.act(a.name, extra()) }, a.label || a.name);
  }

  _nodeBar(i) {
    if (!this.store.isOnnxNode(i) || this.backed === false) return null;
    this.nodeButtons.clear();
    for (const a of this.table) if (a.needs_node) this.nodeButtons.set(this._button(a), a);
    const bar = h("div", { class: "sbs-node-actions" }, ...this.nodeButtons.keys());
    queueMicrotask(() => this.render());
    return bar;
  }

  running() {
    return (this.src.get("status") || {}).state === "running";
  }

  /** Whether each button can run now, and what a view with no run behind it shows. */
  render() {
    if (!this.live) return;
    const src = this.src;
    const gone = this.backed === false;
    for (const b of this.buttons.keys()) b.hidden = gone;
    this.reasonEl.hidden = gone;
    this.detachedEl.hidden = !gone;
    if (gone) {
      this.picker.el.hidden = true;
      for (const b of this.nodeButtons.keys()) b.hidden = true;
    }
    const now = { src, running: this.running(), busy: this.pending !== null };
    for (const [b, a] of this.buttons) {
      enable(b, whyNot(a, now));
      const toggle = TOGGLES[a.toggle];
      if (!toggle) continue;
      const on = toggle.on(src.get(a.toggle));
      b.textContent = `${a.label || a.name}: ${on ? "on" : "off"}`;
      b.classList.toggle("sbs-on", on);
    }
    const cudaOk = !!src.get("cuda_available");
    this.reasonEl.textContent = cudaOk ? "" : `CUDA unavailable: ${src.get("cuda_reason") || "no GPU"}`;
    for (const [b, a] of this.nodeButtons) if (b.isConnected) enable(b, whyNot(a, now));
  }

  /** The action line: the action asked, working or answered. */
  renderAction() {
    const el = this.actionEl;
    let a = this.pending ? { name: this.pending.name, state: "working", message: "" } : this.shown;
    // Stop is answered at once, the run ends a node later: then say what it kept
    if (!this.pending && a && a.name === "stop" && a.state === "done") {
      const st = this.src.get("status") || {};
      if (st.state === "stopped") a = { ...a, message: `stopped; ${st.rows ?? this.store.count} rows kept` };
    }
    el.className = "sbs-action";
    if (!a || !a.name) {
      el.textContent = "";
    } else if (a.state === "working") {
      el.classList.add("sbs-working");
      el.textContent = `${a.name}: working…`;
    } else if (a.state === "error") {
      el.classList.add("sbs-failed");
      el.textContent = `${a.name} failed: ${a.message || ""}`;
    } else {
      el.classList.add("sbs-done");
      el.textContent = `${a.name}: ${a.message || "done"}`;
    }
    this.render();
  }

  /** One of the session's actions, asked through anywidget's request/response command:
   * "working…" until its answer comes, then the answer. */
  async act(name, extra = {}) {
    if (!this.live) return;
    const token = { name };
    this.pending = token;
    this.renderAction();
    let answer;
    try {
      // asked again at each click: a kernel that did not answer may have come back
      if (this.backed !== true && (await this.checkBacked()) === false) {
        if (this.pending === token) this.pending = null;
        this.shown = { name, state: "error", message: DETACHED };
        this.renderAction();
        return;
      }
      answer = await this.src.action({ name, row: this.selected(), ...extra });
    } catch (e) {
      const late = e && (e.name === "TimeoutError" || e.name === "AbortError");
      answer = { name, state: "error", message: late ? "no answer from the kernel (is it running? a saved notebook's view has none)" : String(e) };
    }
    if (this.pending === token) this.pending = null;
    this.shown = answer && typeof answer === "object" ? answer : { name, state: "error", message: "no answer" };
    this.renderAction();
  }

  async checkBacked() {
    this.backed = await this.src.probe();
    this.render();
    this.onBacked(this.backed);
    return this.backed;
  }

  /** A run still going in the kernel is live whatever a busy kernel answers; a finished
   * one is asked at once, so a received notebook says so before any click. */
  start() {
    if (this.backed === null && !this.running()) this.checkBacked();
  }
}
