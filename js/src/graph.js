// The ONNX graph around a node: its producers and consumers, two hops each way, drawn
// small with their errors coloured; a click moves the selection there. The adjacency
// comes with the state (`graph` trait, onnx_sbs_nb/reports/view_state.py graph_state), so this
// works in a saved notebook or an offline report too.
import { decodeColumn } from "./rows.js";
import { h, s, fmtNum } from "./util.js";

const SOURCE_OPS = new Set(["initializer", "input", "Constant"]);
const PER_COLUMN = 4;
const BOX_H = 34;
const GAP_Y = 8;

export class Graph {
  constructor(state, store) {
    const g = state && typeof state === "object" ? state : {};
    this.values = Array.isArray(g.values) ? g.values : [];
    const n = this.values.length;
    this.ops = decodeColumn(g.op, n);
    const flat = Array.isArray(g.parents) ? g.parents : [];
    this.pStart = new Int32Array(n + 1);
    const idx = [];
    let k = 0;
    for (let v = 0; v < n; v++) {
      this.pStart[v] = idx.length;
      const c = flat[k++] | 0;
      for (let j = 0; j < c; j++) idx.push(flat[k++] | 0);
    }
    this.pStart[n] = idx.length;
    this.pIdx = Int32Array.from(idx);
    this.index = new Map();
    this.values.forEach((name, v) => this.index.set(name, v));
    this.store = store;
    this._children = null;
    this._records = null;
    this._recordsAt = -1;
  }

  get available() {
    return this.values.length > 0;
  }

  parents(v) {
    return Array.from(this.pIdx.subarray(this.pStart[v], this.pStart[v + 1]));
  }

  children(v) {
    if (!this._children) {
      const n = this.values.length;
      const lists = Array.from({ length: n }, () => []);
      for (let c = 0; c < n; c++) for (let k = this.pStart[c]; k < this.pStart[c + 1]; k++) lists[this.pIdx[k]].push(c);
      this._children = lists.map((l) => [...new Set(l)]);
    }
    return this._children[v] || [];
  }

  /** The record of value `v` (-1: none yet), from the rows held now. */
  recordOf(v) {
    const st = this.store;
    if (this._recordsAt !== st.count) {
      this._records = new Map();
      const names = st.col("onnx_name") || [];
      for (let i = 0; i < names.length; i++) if (st.has(i) && names[i] && !this._records.has(names[i])) this._records.set(names[i], i);
      this._recordsAt = st.count;
    }
    const r = this._records.get(this.values[v]);
    return r === undefined ? -1 : r;
  }

  valueOf(i) {
    const name = this.store.get(i, "onnx_name");
    const v = name ? this.index.get(name) : undefined;
    return v === undefined ? -1 : v;
  }

  isSource(v) {
    return SOURCE_OPS.has(this.ops[v]);
  }

  /** Five columns (2 hops up, the node, 2 hops down), each at most PER_COLUMN values,
   * computed values before weights and constants; `more` counts what was left out. */
  around(v) {
    const rank = (list) => [...list].sort((a, b) => Number(this.isSource(a)) - Number(this.isSource(b)));
    const hop = (from, next, seen) => {
      const out = [];
      for (const a of from) for (const b of next(a)) if (!seen.has(b)) (seen.add(b), out.push(b));
      return out;
    };
    const seen = new Set([v]);
    const p1 = hop([v], (x) => this.parents(x), seen);
    const p2 = hop(p1.filter((x) => !this.isSource(x)), (x) => this.parents(x), seen);
    const c1 = hop([v], (x) => this.children(x), seen);
    const c2 = hop(c1, (x) => this.children(x), seen);
    const cols = [rank(p2), rank(p1), [v], rank(c1), rank(c2)];
    return { cols: cols.map((c) => c.slice(0, PER_COLUMN)), more: cols.map((c) => Math.max(0, c.length - PER_COLUMN)) };
  }
}

function stateOf(st, i) {
  if (i < 0) return "none";
  const status = st.get(i, "status");
  if (st.get(i, "passed2") === false || st.schema.own(status)) return "own";
  if (st.schema.failing(status)) return "fail";
  if (st.schema.tone(status) === "good") return "ok";
  return "none";
}

function clip(text, chars) {
  return text.length <= chars ? text : `${text.slice(0, Math.max(1, chars - 1))}…`;
}

const HEADS = ["2 up", "inputs", "this", "users", "2 down"];

/** The SVG of the neighbourhood of row `i` (null when the row is not in the graph): data
 * flows left to right in a wide panel, top to bottom in a narrow one. */
export function drawAround(graph, i, width, onSelect) {
  const v = graph.valueOf(i);
  if (v < 0) return null;
  const st = graph.store;
  const { cols, more } = graph.around(v);
  const across = width >= 560; // five columns side by side, else five rows
  const widest = Math.max(...cols.map((c) => c.length), 1);
  const boxW = across ? Math.max(64, Math.floor(width / 5) - 12) : Math.min(170, Math.floor((width - 8) / Math.max(widest, 2)) - 8);
  const chars = Math.floor((boxW - 8) / 6.1);
  const HEAD = 14;
  const pos = new Map();
  let W;
  let H;
  if (across) {
    const colW = boxW + 12;
    W = colW * 5;
    H = Math.ceil((widest + (more.some((m) => m) ? 0.6 : 0)) * (BOX_H + GAP_Y) + GAP_Y + HEAD);
    cols.forEach((col, c) => {
      const top = HEAD + (H - HEAD - col.length * (BOX_H + GAP_Y) + GAP_Y) / 2;
      col.forEach((x, k) => pos.set(x, { x: c * colW + 6, y: top + k * (BOX_H + GAP_Y), c }));
    });
  } else {
    const rowH = BOX_H + 26;
    W = Math.max(width - 4, (boxW + 8) * widest);
    H = rowH * 5;
    cols.forEach((col, c) => {
      const left = (W - col.length * (boxW + 8) + 8) / 2;
      col.forEach((x, k) => pos.set(x, { x: left + k * (boxW + 8), y: c * rowH + HEAD, c }));
    });
  }
  const svg = s("svg", { class: "sbs-graph", width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img" });
  svg.appendChild(s("title", { text: "producers and consumers of the selected value, two hops each way; click one to select it" }));
  HEADS.forEach((t, c) => {
    const more_ = more[c] ? ` (+${more[c]} more)` : "";
    const attrs = across ? { x: c * (boxW + 12) + (boxW + 12) / 2, y: 10, "text-anchor": "middle" } : { x: 2, y: c * (BOX_H + 26) + 10 };
    svg.appendChild(s("text", { class: "sbs-g-head", ...attrs, text: `${t}${more_}` }));
  });
  // edges between neighbouring columns (rows), under the boxes
  for (const [b, pb] of pos) {
    for (const a of graph.parents(b)) {
      const pa = pos.get(a);
      if (!pa || pa.c !== pb.c - 1) continue;
      let d;
      if (across) {
        const [x1, y1, x2, y2] = [pa.x + boxW, pa.y + BOX_H / 2, pb.x, pb.y + BOX_H / 2];
        d = `M${x1},${y1} C${x1 + 10},${y1} ${x2 - 10},${y2} ${x2},${y2}`;
      } else {
        const [x1, y1, x2, y2] = [pa.x + boxW / 2, pa.y + BOX_H, pb.x + boxW / 2, pb.y];
        d = `M${x1},${y1} C${x1},${y1 + 10} ${x2},${y2 - 10} ${x2},${y2}`;
      }
      svg.appendChild(s("path", { class: "sbs-g-edge", d }));
    }
  }
  for (const [x, p] of pos) {
    const r = graph.recordOf(x);
    const state = stateOf(st, r);
    const name = r >= 0 ? st.label(r) : graph.values[x];
    const op = graph.ops[x] || "";
    const own = r >= 0 ? st.num(r, "err_abs2") : null;
    const err = r >= 0 ? st.num(r, "err_abs") : null;
    const metric = own !== null ? `own ${fmtNum(own)}` : err !== null ? `err ${fmtNum(err)}` : r >= 0 ? st.schema.statusLabel(st.get(r, "status")) : "no record";
    const cls = `sbs-g-node sbs-g-${state}${x === v ? " sbs-g-center" : ""}${r >= 0 && x !== v ? " sbs-g-link" : ""}`;
    const g = s("g", { class: cls, transform: `translate(${p.x},${p.y})`, "data-row": r });
    g.appendChild(s("title", { text: `${name}\n${graph.values[x]} (${op})\n${metric}${r >= 0 ? `\nrow #${r}` : ""}` }));
    g.appendChild(s("rect", { width: boxW, height: BOX_H, rx: 4 }));
    g.appendChild(s("text", { class: "sbs-g-name", x: 4, y: 14, text: clip(name, chars) }));
    g.appendChild(s("text", { class: "sbs-g-meta", x: 4, y: 28, text: clip(`${op} · ${metric}`, chars) }));
    if (r >= 0 && x !== v) g.addEventListener("click", () => onSelect(r, "graph"));
    svg.appendChild(g);
  }
  return h("div", { class: "sbs-graph-wrap" }, svg);
}
