// The answer first: the verdict and the culprit (summary["culprit"]) in the user's words
// (their fx node name, module path, source line), the ONNX node and op, its own error
// against the tolerance, why in a sentence, and one click to select it. The source line is
// the innermost frame of the user's or the model library's code (align/provenance.py); the
// whole stack (the node detail's stack_trace) is one click away on the card.
import { h, fmtNum } from "./util.js";

const RULE_WHY = {
  rerun: "its own error (the node rerun on the torch values of its inputs) fails the tolerance: it makes the error, it does not inherit it",
  error: "the node failed to run",
  leaf: "a graph input or weight differs from its torch counterpart: nothing upstream to blame",
  inputs_passed: "it fails while every compared input of its node passes",
  first_failure: "the first value in execution order that fails the tolerance",
};

/** The culprit of a summary. Summaries saved before `culprit` existed give their first
 * own failure, in the same shape. */
export function culpritOf(summary) {
  if (!summary || typeof summary !== "object") return null;
  if ("culprit" in summary) return summary.culprit || null;
  const r = summary.first_own_failure;
  if (!r || typeof r !== "object") return null;
  const rule = summary.first_own_failure_rule || null;
  return {
    ep_name: r.ep_name ?? null,
    ep_user_name: r.ep_user_name ?? null,
    ep_module: r.ep_module ?? null,
    ep_source: r.ep_source ?? null,
    onnx_name: r.onnx_name ?? null,
    onnx_node: null,
    onnx_op_type: r.onnx_op_type ?? null,
    onnx_nodes: null,
    fuses: r.onnx_fuses ?? null,
    own_error: r.err_abs2 ?? r.err_abs ?? null,
    atol: r.atol ?? null,
    rtol: r.rtol ?? null,
    why: RULE_WHY[rule] || null,
    rule,
    step: r.step ?? null,
    kind: r.kind ?? null,
  };
}

export function culpritName(c) {
  return (c && (c.ep_user_name || c.ep_name || c.onnx_name || c.onnx_node)) || "?";
}

const VERDICTS = { pass: "PASS", fail: "FAIL", stopped: "STOPPED", incomplete: "INCOMPLETE", running: "RUNNING" };

export function verdictOf(summary, status) {
  const st = status || {};
  if (st.state === "running") return "running";
  const v = summary && summary.verdict;
  if (v === "pass" && (st.stopped || st.state === "stopped")) return "stopped"; // never a PASS
  return v || (st.state === "stopped" ? "stopped" : st.state === "error" ? "incomplete" : "");
}

function progress(summary, status) {
  const t = (summary && summary.totals) || {};
  const done = t.nodes_done ?? status.done_onnx_nodes;
  const total = t.nodes_total ?? status.total_onnx_nodes;
  return total ? `${done ?? 0} of ${total} ONNX nodes` : "";
}

export class AnswerCard {
  /** `live`: a kernel answers a selection with the node's detail (its stack). */
  constructor(store, onSelect, live = false) {
    this.store = store;
    this.onSelect = onSelect;
    this.live = live;
    this.stacks = new Map(); // row -> the stack trace its node detail carried
    this.stackOpen = false;
    this.last = null; // [summary, status] last rendered
    this.el = h("div", { class: "sbs-card", hidden: true });
  }

  /** The `details` state ({row, node}): keeps the stack of the rows it describes. */
  setDetails(d) {
    const stack = d && d.node && typeof d.node.stack_trace === "string" ? d.node.stack_trace : "";
    if (!stack.trim() || typeof d.row !== "number" || this.stacks.get(d.row) === stack) return;
    this.stacks.set(d.row, stack);
    if (this.last) this.render(...this.last);
  }

  _stackParts(i) {
    const stack = i >= 0 ? this.stacks.get(i) : undefined;
    // no stack known and none to ask for (a static view without the culprit's detail)
    if (!stack && !(this.live && i >= 0 && this.store.isOnnxNode(i))) return [null, null];
    const open = this.stackOpen && !!stack;
    const label = open ? "hide the whole stack" : this.stackOpen ? "loading the stack…" : "whole stack";
    const toggle = h(
      "button",
      {
        class: "sbs-link sbs-card-stack-toggle",
        title: "every frame of the stack that made this node",
        onclick: () => {
          this.stackOpen = !open;
          if (!stack) this.onSelect(i, "card"); // selecting loads the node's detail
          if (this.last) this.render(...this.last);
        },
      },
      label,
    );
    return [toggle, open ? h("pre", { class: "sbs-pre sbs-card-stack", text: stack }) : null];
  }

  /** Row of the culprit (-1: not held). */
  row(c) {
    if (!c) return -1;
    return this.store.find({ step: c.step, onnx_name: c.onnx_name || c.onnx_node, ep_name: c.ep_name });
  }

  render(summary, status) {
    this.last = [summary, status];
    const st = status || {};
    const verdict = verdictOf(summary, st);
    // while it runs, the card answers as soon as a culprit is known: "culprit so far"
    if (!summary || !verdict || (verdict === "running" && !culpritOf(summary))) {
      this.el.hidden = true;
      return;
    }
    this.el.hidden = false;
    this.el.className = `sbs-card sbs-card-${verdict}`;
    const c = culpritOf(summary);
    const cov = coverageOf(summary);
    // a pass over little of the model is no plain pass: "PASS on N of M"
    const badgeText = (VERDICTS[verdict] || verdict.toUpperCase()) + (summary.partial && cov ? ` on ${cov.onnx_covered} of ${cov.onnx_nodes} ONNX nodes` : "");
    const badge = h("span", { class: `sbs-verdict sbs-verdict-${verdict}`, text: badgeText });
    const covLine = cov ? h("div", { class: "sbs-card-coverage sbs-muted", text: `compared: ${coverageText(cov)}` }) : null;
    const prog = verdict === "running" ? progress(null, st) : progress(summary, st); // live counts
    const totals = summary.totals || {};
    const lossLine = precisionLossLine(summary);
    if (!c) {
      const compared = totals.compared ?? "";
      const drifted = totals.drifted || 0;
      const text =
        verdict === "pass" && drifted
          ? `the outputs agree; ${drifted} of ${compared} compared values drift beyond tolerance while every node, rerun on torch's inputs, agrees (rounding the graph amplifies)`
          : verdict === "pass"
          ? `every compared value is within tolerance (${compared} compared${prog ? `, ${prog}` : ""})`
          : verdict === "stopped"
            ? `the run was stopped${prog ? ` after ${prog}` : ""}: no culprit among the ${compared} values compared so far`
            : verdict === "incomplete"
              ? `the run did not finish${prog ? ` (${prog})` : ""}: no culprit among the ${compared} values compared`
              : drifted
                ? `no node makes an error of its own: ${drifted} values drift beyond tolerance while each node, rerun on torch's inputs, agrees`
                : "no culprit could be named";
      this.el.replaceChildren(h("div", { class: "sbs-card-head" }, badge, h("span", { class: "sbs-card-text", text })), ...(covLine ? [covLine] : []), ...(lossLine ? [lossLine] : []));
      return;
    }
    const i = this.row(c);
    const name = culpritName(c);
    const head = h(
      "div",
      { class: "sbs-card-head" },
      badge,
      h("span", { class: "sbs-card-label", text: verdict === "fail" ? "culprit" : verdict === "running" ? `running${prog ? `, ${prog} done` : ""} · culprit so far` : `${verdict}${prog ? ` after ${prog}` : ""} · culprit so far` }),
      h("button", { class: "sbs-link sbs-culprit", title: "select the culprit in the table, the chart and the detail panel", disabled: i < 0, onclick: () => this.onSelect(i, "card") }, name),
      c.ep_module ? h("span", { class: "sbs-card-module", text: c.ep_module }) : null,
    );
    const lines = [];
    const [stackToggle, stackEl] = this._stackParts(i);
    if (c.ep_source || stackToggle) {
      const src = c.ep_source ? h("code", { class: "sbs-card-source", text: c.ep_source }) : null;
      lines.push(["source", h("span", {}, src, src && stackToggle ? " " : null, stackToggle)]);
    }
    const nodes = Array.isArray(c.onnx_nodes) ? c.onnx_nodes.filter(Boolean) : [];
    const value = c.onnx_name && c.onnx_name !== c.onnx_node ? `, value ${c.onnx_name}` : "";
    const onnx = [c.onnx_node ? `node ${c.onnx_node}` : "", c.onnx_op_type ? `(${c.onnx_op_type}${value})` : ""].filter(Boolean).join(" ");
    if (onnx || nodes.length) {
      const lowering = nodes.length > 1 ? ` · its lowering: ${nodes.length} ONNX nodes (${nodes.slice(0, 6).join(", ")}${nodes.length > 6 ? ", …" : ""})` : "";
      lines.push(["ONNX", h("span", { text: `${onnx}${lowering}` })]);
    }
    // a node a graph tool fused: the fx nodes it computes (summary.py Culprit.fuses)
    if (c.fuses) lines.push(["fuses", h("span", { class: "sbs-card-fuses", text: c.fuses })]);
    if (c.own_error !== null && c.own_error !== undefined) {
      const tol = c.atol !== null && c.atol !== undefined ? ` against atol ${fmtNum(c.atol)}${c.rtol !== null && c.rtol !== undefined ? `, rtol ${fmtNum(c.rtol)}` : ""}` : "";
      // "own error" only where an own-error rerun measured it (summary.py Culprit.own_measured)
      lines.push([c.own_measured ? "own error" : "error", h("span", {}, h("b", { class: "sbs-bad", text: fmtNum(c.own_error) }), tol)]);
    }
    if (c.why) lines.push(["why", h("span", { class: "sbs-why", text: c.why })]);
    // saved by onnx-sbs run --replay-culprit (summary.py Culprit.bundle)
    if (c.bundle) lines.push(["bundle", h("code", { class: "sbs-card-bundle", text: c.bundle })]);
    const grid = h("div", { class: "sbs-card-grid" });
    for (const [k, v] of lines) grid.append(h("span", { class: "sbs-muted", text: k }), v);
    this.el.replaceChildren(head, grid, ...(stackEl ? [stackEl] : []), ...(covLine ? [covLine] : []), ...(lossLine ? [lossLine] : []));
  }
}

/** summary.coverage when the run counted any ONNX node (summary.py's Coverage). */
export function coverageOf(summary) {
  const c = summary && summary.coverage;
  return c && c.onnx_nodes ? c : null;
}

/** The nodes whose error is their dtype's rounding, amplified (summary.precision_losses):
 * listed apart from the culprit, never as it. */
function precisionLossLine(summary) {
  const losses = (summary && summary.precision_losses) || [];
  if (!losses.length) return null;
  const count = (summary.totals && summary.totals.precision_loss) || losses.length;
  const names = losses.slice(0, 4).map((r) => `${r.onnx_name} [${r.onnx_op_type}] (${fmtNum(r.err_abs2 ?? r.err_abs)})`).join(", ");
  const more = count > 4 ? ` and ${count - 4} more` : "";
  return h("div", { class: "sbs-card-loss sbs-muted", text: `precision loss: ${names}${more}: their inputs' rounding, amplified by the op; no fault of the export` });
}

/** Coverage.to_text(), in the same words. */
export function coverageText(c) {
  let text = `${c.onnx_compared} of ${c.onnx_nodes} ONNX nodes compared`;
  if (c.onnx_covered > c.onnx_compared) text += ` (${c.onnx_covered} with the rest of their fx node's lowering)`;
  // an ONNX reference (onnx-sbs diff) has no torch nodes (summary.py Coverage.reference_onnx)
  text += `, ${c.torch_compared} of ${c.torch_nodes} ${c.reference_onnx ? "nodes of the reference model" : "torch nodes"}`;
  const why = Object.entries(c.not_compared || {}).sort(([a], [b]) => (a < b ? -1 : 1)).map(([k, n]) => `${n} ${k}`);
  if (why.length) text += `; not compared: ${why.join(", ")}`;
  return text;
}

// "N failing, of which M only inherit their error": the wording of summary.failing_text,
// so a red count never reads as that many culprits (the same in the terminal and reports);
// carried (summary.totals.carried): "decision" (a tie flipped one), "none" (nothing fails
// before them: nothing to inherit), else an error upstream
export function failingText(failed, inherited, carried = "upstream") {
  if (!inherited) return `${failed} failing`;
  if (carried === "decision") return `${failed} failing, of which ${inherited} only carry a flipped decision`;
  if (carried === "none") return `${failed} failing, of which ${inherited} agree with torch when rerun on its inputs (no value before them fails)`;
  return `${failed} failing, of which ${inherited} only inherit their error`;
}
