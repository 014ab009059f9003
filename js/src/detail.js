// Detail panel of the selected record: its metrics, plus what the kernel sent about the
// node (`details` trait: node_detail, rerun result, replay paths), all shown as text.
import { h, fmtNum, fmtTime } from "./util.js";

const RECORD_FIELDS = [
  ["fx node", "ep_name"],
  ["fx target", "ep_target"],
  ["ONNX node", "onnx_name"],
  ["ONNX op", (s, i) => [s.get(i, "onnx_domain"), s.get(i, "onnx_op_type")].filter(Boolean).join("::")],
  ["output #", "onnx_id_output"],
  ["kind", "kind"],
  ["paired by", "paired_by"],
  ["shape/dtype (torch)", "ep_shape_type"],
  ["shape/dtype (onnx)", "onnx_shape_type"],
  ["verdict", "status"],
  ["abs error", "err_abs", fmtNum],
  ["rel error", "err_rel", fmtNum],
  ["nan/inf mismatches", "err_nan", fmtNum],
  ["|diff| > 0.1", "err_h01", fmtNum],
  ["|diff| > 0.01", "err_h001", fmtNum],
  ["own abs error", "err_abs2", fmtNum],
  ["own rel error", "err_rel2", fmtNum],
  ["own verdict", (s, i) => ({ true: "pass", false: "fail" })[String(s.get(i, "passed2"))] ?? ""],
  ["atol / rtol", (s, i) => (s.get(i, "atol") === null ? "" : `${fmtNum(s.get(i, "atol"))} / ${fmtNum(s.get(i, "rtol"))}`)],
  ["devices", (s, i) => [s.get(i, "ep_device"), s.get(i, "onnx_device")].filter(Boolean).join(" / ")],
  ["time torch / onnx", (s, i) => {
    const t = [s.get(i, "ep_time_run"), s.get(i, "onnx_time_run")];
    if (t.every((x) => x === null || x === undefined)) return "";
    return t.map((x) => (x === null || x === undefined ? "-" : `${(x * 1000).toFixed(3)} ms`)).join(" / ");
  }],
  ["reset", (s, i) => (s.get(i, "reset") ? "continued from the torch value" : "")],
  ["error", "error"],
  ["comment", "comment"],
];

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

function objTable(list) {
  const keys = [];
  for (const o of list) for (const k of Object.keys(o)) if (!keys.includes(k)) keys.push(k);
  const t = h("table", { class: "sbs-mini" });
  t.appendChild(h("tr", {}, ...keys.map((k) => h("th", { text: k }))));
  for (const o of list) {
    t.appendChild(
      h(
        "tr",
        {},
        ...keys.map((k) => {
          const v = o[k];
          const txt = v === null || v === undefined ? "" : typeof v === "number" ? fmtNum(v) : typeof v === "object" ? JSON.stringify(v) : String(v);
          return h("td", { text: txt });
        }),
      ),
    );
  }
  return t;
}

export class DetailPanel {
  constructor(store) {
    this.store = store;
    this.el = h("div", { class: "sbs-detail" }, h("div", { class: "sbs-muted", text: "Click a row or a point to see its detail." }));
  }

  render(i, details, live) {
    const s = this.store;
    this.el.replaceChildren();
    if (i < 0 || i >= s.length) {
      this.el.appendChild(h("div", { class: "sbs-muted", text: "Click a row or a point to see its detail." }));
      return;
    }
    this.el.appendChild(h("div", { class: "sbs-detail-title", text: `#${i} ${s.label(i)}` }));
    const pairs = RECORD_FIELDS.map(([label, key, fmt]) => {
      const v = typeof key === "function" ? key(s, i) : s.get(i, key);
      return [label, fmt ? fmt(v) : v];
    });
    this.el.appendChild(h("div", { class: "sbs-section" }, h("h4", { text: "record" }), dl(pairs)));
    const d = details && details.row === i ? details : null;
    if (!d) {
      if (live && s.isOnnxNode(i)) this.el.appendChild(h("div", { class: "sbs-muted sbs-loading", text: "loading node detail…" }));
      return;
    }
    if (d.node) this.el.appendChild(h("div", { class: "sbs-section sbs-node" }, h("h4", { text: "node" }), dl(Object.entries(d.node))));
    if (d.node_error) this.el.appendChild(h("div", { class: "sbs-error", text: `node detail failed: ${d.node_error}` }));
    if (d.rerun) {
      const r = d.rerun;
      const head = `rerun in torch on ${r.device ?? "?"}${r.time !== undefined && r.time !== null ? ` (${fmtTime(r.time)})` : ""}`;
      const sec = h("div", { class: "sbs-section sbs-rerun" }, h("h4", { text: head }));
      if (r.error) sec.appendChild(h("div", { class: "sbs-error", text: r.error }));
      if (Array.isArray(r.outputs) && r.outputs.length) sec.appendChild(objTable(r.outputs));
      const rest = Object.entries(r).filter(([k]) => !["outputs", "error", "device", "time"].includes(k));
      if (rest.length) sec.appendChild(dl(rest));
      this.el.appendChild(sec);
    }
    if (d.replay) {
      this.el.appendChild(
        h("div", { class: "sbs-section sbs-replay" }, h("h4", { text: "replay saved" }), dl([["bundle", d.replay.bundle], ["replay config", d.replay.config]])),
      );
    }
  }
}
