// A run over many inputs: which one the views show (the worst over all, or one input's
// own records, which the kernel runs again). Leads the live toolbar; a static view and a
// view with no run behind it have no picker.
import { h } from "./util.js";

export class InputsPicker {
  /** `usable()`: whether a run backs the view (the picker asks the kernel to run). */
  constructor(src, usable) {
    this.src = src;
    this.usable = usable;
    this.el = h("select", { class: "sbs-inputs", title: "show the worst over all inputs, or one input's own records" });
    this.el.addEventListener("change", () => {
      const info = src.get("inputs");
      if (!info) return;
      const v = this.el.value === "" ? null : Number(this.el.value);
      src.setInputs({ ...info, shown: v });
    });
  }

  render() {
    const src = this.src;
    const el = this.el;
    const info = src.live && this.usable() ? src.get("inputs") : null;
    el.hidden = !info;
    if (!info) return;
    const failing = new Set(info.failing || []);
    const names = info.names || [];
    const n = info.done || info.total || 0;
    const opts = [h("option", { value: "", text: `worst over ${n} inputs${failing.size ? ` (${failing.size} failing)` : ""}` })];
    for (let i = 0; i < n; i++) {
      const name = names[i] ? ` (${names[i]})` : "";
      opts.push(h("option", { value: String(i), text: `input ${i}${name}${failing.has(i) ? " \u2717 fails" : ""}` }));
    }
    el.replaceChildren(...opts);
    el.value = info.shown === null || info.shown === undefined ? "" : String(info.shown);
    el.disabled = (src.get("status") || {}).state === "running";
  }
}
