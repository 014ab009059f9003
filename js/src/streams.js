// The run's two sides step by step: the `timeline` state (Run.timeline(), a generation
// parity's token streams; null for the other kinds, then nothing is drawn). Per batch
// row, torch's tokens above the ONNX model's, one column per step; the step where the
// decodes part is marked, a token that differs is marked, the steps after the parting
// step are dimmed (the two sides then decode different texts). Hovering a token gives
// that step's logits error, the margin between torch's two best logits and the cache's
// error; clicking the parting step (or "show step k") shows that step's node-by-node
// records: they are the run's own records, in the table below (`records_step`).
//
// Tokens decoded by the user's tokenizer are untrusted text: they reach the DOM through
// textContent only (util.js `h`), never as markup.
import { h, fmtNum, num } from "./util.js";

const PARTED_BY = {
  tokens: "another token chosen",
  logits: "the same token, logits beyond tolerance",
  cache: "the same token and logits, but the cache written differs",
};
const MAX_ROWS = 8; // batch rows drawn; the rest are counted

/** A token as shown: its decoded text (whitespace made visible), else its id. */
export function tokenText(side, r, k) {
  const text = side.text && side.text[r] ? side.text[r][k] : null;
  if (typeof text === "string") return text === "" ? "∅" : text.replace(/\n/g, "⏎").replace(/ /g, "·");
  const id = side.tokens[r] ? side.tokens[r][k] : null;
  return id === null || id === undefined ? "" : String(id);
}

/** What hovering token (row r, step k) says: both tokens, the errors, the margin. */
export function stepTitle(tl, r, k) {
  const s = tl.steps[k] || {};
  const lines = [`step ${s.step ?? k}`];
  for (const side of tl.sides) {
    const id = side.tokens[r] ? side.tokens[r][k] : "";
    const text = side.text && side.text[r] ? ` ${JSON.stringify(String(side.text[r][k]))}` : "";
    lines.push(`${side.name}: ${id}${text}`);
  }
  if (s.err_abs !== null && s.err_abs !== undefined) {
    lines.push(`logits max abs error ${fmtNum(s.err_abs)} (${s.passed ? "within" : "beyond"} tolerance)`);
  } else lines.push("logits not compared: the two sides decode different texts by now");
  if (s.margin !== null && s.margin !== undefined) lines.push(`margin between torch's two best logits: ${fmtNum(s.margin)}`);
  if (s.cache_err_abs !== null && s.cache_err_abs !== undefined) {
    lines.push(`cache written: max abs error ${fmtNum(s.cache_err_abs)}${s.cache_worst ? ` (${s.cache_worst})` : ""}`);
  }
  if (k === tl.parted_at) lines.push(`the decodes part here: ${PARTED_BY[tl.parted_by] || tl.parted_by}`);
  return lines.join("\n");
}

/** The one sentence over the streams: where they part and the margin there. */
export function partedText(tl) {
  const n = tl.steps.length;
  if (tl.parted_at === null || tl.parted_at === undefined) return `the two decodes agree on all ${n} steps`;
  const why = PARTED_BY[tl.parted_by] || tl.parted_by || "";
  const err = num(tl.err_abs) !== null ? `, logits error ${fmtNum(tl.err_abs)}` : "";
  const margin = num(tl.margin) !== null ? `, margin between torch's two best logits ${fmtNum(tl.margin)}` : "";
  return `the decodes part at step ${tl.parted_at} of ${n} (${why}${err}${margin})`;
}

export class StreamsView {
  /** `showStep(k)`: show step k's node-by-node records (the run's records) in the table,
   * returns how many rows the table holds. */
  constructor(src, showStep) {
    this.src = src;
    this.showStep = showStep;
    this.shown = null; // the step whose records the user asked for
    this.el = h("div", { class: "sbs-streams", hidden: true });
  }

  render() {
    const tl = this.src.get("timeline");
    if (!tl || !Array.isArray(tl.sides) || !Array.isArray(tl.steps) || !tl.sides.length) {
      this.el.hidden = true;
      this.el.replaceChildren();
      return;
    }
    this.el.hidden = false;
    this.el.classList.toggle("sbs-streams-parted", tl.parted_at !== null && tl.parted_at !== undefined);
    this.el.replaceChildren(this._head(tl), this._grid(tl), this._foot(tl));
  }

  _show(tl, k) {
    if (k !== tl.records_step) return;
    const n = this.showStep(k);
    this.shown = { step: k, rows: n };
    this.render();
  }

  _head(tl) {
    const parted = tl.parted_at !== null && tl.parted_at !== undefined;
    return h(
      "div",
      { class: "sbs-streams-head" },
      h("b", { text: `${tl.unit || "token"} streams` }),
      h("span", { class: `sbs-streams-verdict ${parted ? "sbs-bad" : "sbs-good"}`, text: partedText(tl) }),
      tl.why ? h("div", { class: "sbs-streams-why sbs-muted", text: tl.why }) : null,
      tl.decode_error ? h("div", { class: "sbs-streams-why sbs-bad", text: tl.decode_error }) : null,
    );
  }

  _grid(tl) {
    const n = tl.steps.length;
    const rows = Math.min(MAX_ROWS, (tl.sides[0].tokens || []).length);
    const grid = h("div", { class: "sbs-streams-grid", style: `grid-template-columns: max-content repeat(${n}, max-content)` });
    grid.append(h("span", { class: "sbs-muted", text: "step" }));
    for (let k = 0; k < n; k++) grid.append(h("span", { class: `sbs-step-no${k === tl.parted_at ? " sbs-tok-parted" : ""}`, text: String(k) }));
    for (let r = 0; r < rows; r++) {
      tl.sides.forEach((side, si) => {
        const label = rows > 1 ? `${side.name} · row ${r}` : side.name;
        grid.append(h("span", { class: "sbs-stream-label", "data-side": String(si), text: label }));
        for (let k = 0; k < n; k++) grid.append(this._cell(tl, side, si, r, k));
      });
    }
    const more = (tl.sides[0].tokens || []).length - rows;
    const note = more > 0 ? h("div", { class: "sbs-muted", text: `and ${more} more batch rows` }) : null;
    return h("div", { class: "sbs-streams-scroll" }, grid, note);
  }

  _cell(tl, side, si, r, k) {
    const other = tl.sides[1 - si] || side;
    const a = side.tokens[r] ? side.tokens[r][k] : null;
    const b = other.tokens[r] ? other.tokens[r][k] : null;
    const parted = k === tl.parted_at;
    let cls = "sbs-tok";
    if (a !== b) cls += " sbs-tok-diff";
    if (parted) cls += " sbs-tok-parted";
    if (tl.parted_at !== null && tl.parted_at !== undefined && k > tl.parted_at) cls += " sbs-tok-after";
    const attrs = { class: cls, "data-step": String(k), "data-side": String(si), title: stepTitle(tl, r, k), text: tokenText(side, r, k) };
    if (!parted || tl.records_step !== k) return h("span", attrs);
    return h("button", { ...attrs, onclick: () => this._show(tl, k) });
  }

  _foot(tl) {
    if (tl.parted_at === null || tl.parted_at === undefined) return h("div", { class: "sbs-streams-foot sbs-muted", text: "no step to compare node by node: the run holds no records" });
    const k = tl.parted_at;
    if (tl.records_step !== k) {
      return h("div", { class: "sbs-streams-foot sbs-muted", text: `step ${k} was not compared node by node here: parity.step_run(own_error=True) compares it` });
    }
    const button = h("button", { class: "sbs-btn sbs-streams-show", title: "select the step's culprit in the table below", onclick: () => this._show(tl, k) }, `show step ${k}, node by node`);
    const shown = this.shown && this.shown.step === k
      ? h("span", { class: "sbs-streams-shown", text: `the table below: step ${k} compared node by node on torch's inputs and cache (${this.shown.rows} records)` })
      : h("span", { class: "sbs-muted", text: `the table below holds step ${k} compared node by node (${tl.records} records)` });
    return h("div", { class: "sbs-streams-foot" }, button, shown);
  }
}
