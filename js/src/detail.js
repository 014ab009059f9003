// Detail panel of the selected record: who it is in the user's words, its errors, the
// graph around it, every field, and what the kernel sent about the node (`details`
// trait: node_detail, rerun result, replay paths), all shown as text.
import { h, fmtNum, fmtTime } from "./util.js";
import { drawAround } from "./graph.js";

// Every field, labelled and formatted by the schema (records.py FIELDS), in its order.
function everyField(st, i) {
  return st.schema.fields.map((f) => [f.label || f.name, st.schema.format(f.name, st.get(i, f.name))]);
}

// Key/value grid made of divs: host pages (JupyterLab) style dl/dt/dd their own way.
function dl(pairs) {
  const d = h("div", { class: "sbs-dl" });
  for (const [k, v] of pairs) {
    if (v === "" || v === null || v === undefined) continue;
    d.appendChild(h("div", { class: "sbs-dt", text: k }));
    d.appendChild(valueEl(v));
  }
  return d;
}

function valueEl(v) {
  const dd = (attrs, ...kids) => h("div", { class: "sbs-dd", ...attrs }, ...kids);
  if (v === null || v === undefined) return dd({ text: "" });
  if (typeof v === "number") return dd({ text: fmtNum(v) });
  if (typeof v === "string") return v.includes("\n") ? dd({}, h("pre", { class: "sbs-pre", text: v })) : dd({ text: v });
  if (typeof v === "boolean") return dd({ text: String(v) });
  if (Array.isArray(v)) {
    if (v.length && v.every((x) => x && typeof x === "object" && !Array.isArray(x))) return dd({}, objTable(v));
    return dd({ text: v.map((x) => (typeof x === "object" ? JSON.stringify(x) : String(x))).join(", ") });
  }
  if (typeof v === "object") return dd({}, dl(Object.entries(v)));
  return dd({ text: String(v) });
}

function cellText(v) {
  if (v === null || v === undefined) return "";
  if (typeof v === "number") return fmtNum(v);
  if (typeof v === "boolean") return v ? "yes" : "";
  return typeof v === "object" ? JSON.stringify(v) : String(v);
}

function objTable(list, labels = {}) {
  // the labelled columns in their order first: a restored notebook's state comes back
  // with its keys sorted (nbformat writes JSON that way), the columns must not move
  const keys = Object.keys(labels).filter((k) => list.some((o) => o && k in o));
  for (const o of list) for (const k of Object.keys(o)) if (!keys.includes(k)) keys.push(k);
  const t = h("table", { class: "sbs-mini" });
  t.appendChild(h("tr", {}, ...keys.map((k) => h("th", { text: labels[k] || k.replace(/_/g, " ") }))));
  for (const o of list) t.appendChild(h("tr", {}, ...keys.map((k) => h("td", { text: cellText(o[k]) }))));
  return h("div", { class: "sbs-mini-wrap" }, t);
}

const PAIR_LABELS = { name: "value", ep_name: "torch partner", paired_by: "paired by", initializer: "weight" };

function chip(label, value, cls = "") {
  return h("span", { class: `sbs-kv ${cls}` }, h("span", { class: "sbs-muted", text: `${label} ` }), value);
}

export class DetailPanel {
  /** `actions(i)`: the node's action buttons (live widget only), or null. */
  constructor(store, graph, onSelect, actions) {
    this.store = store;
    this.graph = graph;
    this.onSelect = onSelect;
    this.actions = actions;
    this.width = 360;
    this.el = h("div", { class: "sbs-detail" });
    this.render(-1, null, false);
  }

  render(i, details, live) {
    const st = this.store;
    this.el.replaceChildren();
    if (i < 0 || i >= st.length || !st.has(i)) {
      this.el.appendChild(h("div", { class: "sbs-muted", text: "Click a row, a point or a layer's worst node to see its detail and the graph around it." }));
      return;
    }
    const user = st.userName(i);
    const prepared = st.get(i, "ep_name");
    this.el.appendChild(
      h(
        "div",
        { class: "sbs-detail-title" },
        h("span", { class: "sbs-muted", text: `#${i} ` }),
        h("span", { class: "sbs-detail-name", text: st.label(i) }),
        user && prepared && prepared !== user ? h("span", { class: "sbs-muted", text: ` (prepared: ${prepared})` }) : null,
      ),
    );
    const mod = st.get(i, "ep_module");
    const src = st.get(i, "ep_source");
    if (mod) this.el.appendChild(h("div", { class: "sbs-detail-module", text: mod }));
    if (src) this.el.appendChild(h("pre", { class: "sbs-pre sbs-detail-source", text: src }));
    const op = st.get(i, "onnx_op_type");
    const verdict = st.get(i, "status") || "";
    const ownOk = st.get(i, "passed2");
    const sc = st.schema;
    const label = (k) => sc.label(k, true);
    this.el.appendChild(
      h(
        "div",
        { class: "sbs-detail-metrics" },
        op ? chip(label("onnx_op_type"), op) : null,
        chip(label("err_abs"), fmtNum(st.get(i, "err_abs")) || "–"),
        st.get(i, "err_abs2") !== null ? chip(label("err_abs2"), fmtNum(st.get(i, "err_abs2")), ownOk === false ? "sbs-bad" : "") : null,
        st.get(i, "atol") !== null ? chip(label("atol"), fmtNum(st.get(i, "atol"))) : null,
        chip(label("status"), sc.statusLabel(verdict), `sbs-v sbs-tone-${sc.tone(verdict)}`),
      ),
    );
    const acts = this.actions ? this.actions(i) : null;
    if (acts) this.el.appendChild(acts);
    if (st.isConstant(i)) {
      this.el.appendChild(h("div", { class: "sbs-note", text: "A weight or constant: compared with the torch parameter or constant it pairs with. Rerun and replay act on ONNX nodes: select one of its consumers below." }));
    } else if (!st.isOnnxNode(i)) {
      // a value of one side only says so in its status's words; else it is a graph input
      const spec = st.schema.status(st.get(i, "status"));
      const why = spec && spec.group && spec.doc ? spec.doc : "A graph input or output value: not produced by one ONNX node.";
      this.el.appendChild(h("div", { class: "sbs-note", text: why }));
    }
    if (this.graph.available) {
      const svg = drawAround(this.graph, i, this.width - 16, this.onSelect);
      this.el.appendChild(h("div", { class: "sbs-section sbs-around" }, h("h4", { text: "Around this value" }), svg || h("div", { class: "sbs-muted", text: "not a value of the ONNX graph" })));
    }
    this.el.appendChild(h("details", { class: "sbs-section sbs-record" }, h("summary", { text: "every field" }), dl(everyField(st, i))));
    const d = details && details.row === i ? details : null;
    if (!d) {
      if (live && st.isOnnxNode(i)) this.el.appendChild(h("div", { class: "sbs-muted sbs-loading", text: "loading node detail…" }));
      return;
    }
    if (d.node) this.el.appendChild(this._node(d.node));
    if (d.node_error) this.el.appendChild(h("div", { class: "sbs-note", text: `no node detail: ${d.node_error}` }));
    if (d.rerun) this.el.appendChild(this._rerun(d.rerun));
    if (d.replay) {
      this.el.appendChild(h("div", { class: "sbs-section sbs-replay" }, h("h4", { text: "replay saved" }), dl([["bundle", d.replay.bundle], ["replay config", d.replay.config]])));
    }
  }

  _node(node) {
    const sec = h("div", { class: "sbs-section sbs-node" }, h("h4", { text: `ONNX node ${node.onnx_node || ""}` }));
    const rest = Object.entries(node).filter(([k, v]) => !["inputs", "outputs", "onnx_node", "stack_trace", "ep_node"].includes(k) && v !== null && v !== "" && !(typeof v === "object" && !Object.keys(v).length));
    sec.appendChild(dl(rest));
    if (Array.isArray(node.inputs) && node.inputs.length) sec.appendChild(h("div", { class: "sbs-sub" }, h("div", { class: "sbs-dt", text: "inputs" }), objTable(node.inputs, PAIR_LABELS)));
    if (Array.isArray(node.outputs) && node.outputs.length) sec.appendChild(h("div", { class: "sbs-sub" }, h("div", { class: "sbs-dt", text: "outputs" }), objTable(node.outputs, PAIR_LABELS)));
    if (node.ep_node) sec.appendChild(h("details", {}, h("summary", { text: "fx node" }), h("pre", { class: "sbs-pre", text: node.ep_node })));
    if (node.stack_trace) sec.appendChild(h("details", {}, h("summary", { text: "stack trace" }), h("pre", { class: "sbs-pre", text: node.stack_trace })));
    return sec;
  }

  _rerun(r) {
    const head = `rerun in the torch evaluator on ${r.device ?? "?"}${r.time !== undefined && r.time !== null ? ` (${fmtTime(r.time)})` : ""}`;
    const sec = h("div", { class: "sbs-section sbs-rerun" }, h("h4", { text: head }));
    if (r.error) sec.appendChild(h("div", { class: "sbs-error", text: r.error }));
    if (Array.isArray(r.outputs) && r.outputs.length) {
      sec.appendChild(
        objTable(r.outputs, {
          onnx_name: "value",
          ep_name: "torch partner",
          shape_type: "shape",
          err_abs_vs_torch: "own err (rerun)",
          err_rel_vs_torch: "own rel",
          passed_vs_torch: "passes",
          err_abs_vs_first_run: "vs first run",
          err_rel_vs_first_run: "rel vs first run",
        }),
      );
    }
    // the node's own fields (its name, id, op) are in the node section above, once
    const rest = Object.entries(r).filter(([k]) => !["outputs", "error", "device", "time", "node", "onnx_id_node", "op_type"].includes(k));
    if (rest.length) sec.appendChild(dl(rest));
    return sec;
  }
}
