// Virtualised records table: only the rows in view exist in the DOM (a fixed pool reused
// on scroll), so 20,000 rows scroll as smoothly as 20.
import { h, fmtNum, num, FAILING } from "./util.js";

const ROW_H = 22;
const OVERSCAN = 8;

function shapeText(s, i) {
  const a = s.get(i, "ep_shape_type") || "";
  const b = s.get(i, "onnx_shape_type") || "";
  if (!a || !b || a === b) return a || b;
  return `${a} | ${b}`;
}

function verdictText(s, i) {
  const st = s.get(i, "status") || "";
  const p2 = s.get(i, "passed2");
  if (p2 === false) return `${st} · own fail`;
  if (p2 === true && FAILING.has(st)) return `${st} · own ok`;
  return st;
}

function numCol(key, label, w) {
  return {
    key,
    label,
    w,
    numeric: true,
    text: (s, i) => fmtNum(s.get(i, key)),
    sort: (s, i) => {
      const v = num(s.get(i, key));
      return v === null ? null : Number.isNaN(v) ? Infinity : v;
    },
  };
}

function textCol(key, label, w) {
  return { key, label, w, text: (s, i) => s.get(i, key) ?? "", sort: (s, i) => s.get(i, key) ?? null };
}

export const COLUMNS = [
  { key: "row", label: "#", w: 56, numeric: true, text: (s, i) => String(i), sort: (s, i) => i },
  textCol("ep_name", "fx node", 190),
  textCol("onnx_name", "ONNX node", 190),
  textCol("onnx_op_type", "op", 110),
  { key: "shape", label: "shape / dtype", w: 180, text: shapeText, sort: shapeText },
  numCol("err_abs", "err abs", 84),
  numCol("err_rel", "err rel", 84),
  numCol("err_abs2", "own err", 84),
  numCol("err_nan", "nan", 56),
  {
    key: "status",
    label: "verdict",
    w: 150,
    text: verdictText,
    sort: verdictText,
    cls: (s, i) => `sbs-v-${s.get(i, "status") || "none"}${s.get(i, "passed2") === false ? " sbs-v-ownfail" : ""}`,
  },
  textCol("kind", "kind", 64),
  textCol("paired_by", "paired by", 84),
];

export const VERDICTS = [
  ["", "all verdicts"],
  ["failing", "failing"],
  ["ownfail", "own error fails"],
  ["ok", "ok"],
  ["fail", "fail"],
  ["shape_mismatch", "shape mismatch"],
  ["dtype_mismatch", "dtype mismatch"],
  ["error", "error"],
  ["unpaired", "unpaired"],
  ["not_compared", "not compared"],
];

export class VirtualTable {
  constructor(store, onSelect) {
    this.store = store;
    this.onSelect = onSelect;
    this.view = [];
    this.selected = -1;
    this.sortKey = null;
    this.sortDir = 1;
    this.filter = { op: "", verdict: "", text: "" };
    this.opTypes = new Set();
    this.pool = [];
    this.template = COLUMNS.map((c) => `${c.w}px`).join(" ");
    this.totalWidth = COLUMNS.reduce((a, c) => a + c.w, 0);
    this._build();
  }

  _build() {
    this.opSelect = h("select", { class: "sbs-f-op", title: "filter by op type", onchange: () => this.setFilter({ op: this.opSelect.value }) }, h("option", { value: "", text: "all ops" }));
    this.verdictSelect = h("select", { class: "sbs-f-verdict", title: "filter by verdict", onchange: () => this.setFilter({ verdict: this.verdictSelect.value }) });
    for (const [v, label] of VERDICTS) this.verdictSelect.appendChild(h("option", { value: v, text: label }));
    let timer = null;
    this.textInput = h("input", {
      class: "sbs-f-text",
      type: "search",
      placeholder: "filter names…",
      oninput: () => {
        clearTimeout(timer);
        timer = setTimeout(() => this.setFilter({ text: this.textInput.value }), 120);
      },
    });
    this.countEl = h("span", { class: "sbs-count" });
    this.filters = h("div", { class: "sbs-filters" }, this.opSelect, this.verdictSelect, this.textInput, this.countEl);

    this.header = h("div", { class: "sbs-thead", style: `grid-template-columns:${this.template};width:${this.totalWidth}px` });
    this.headCells = COLUMNS.map((c) => {
      const cell = h("div", { class: `sbs-th${c.numeric ? " sbs-num" : ""}`, title: `sort by ${c.label}`, onclick: () => this.toggleSort(c.key) }, c.label);
      this.header.appendChild(cell);
      return cell;
    });
    this.body = h("div", { class: "sbs-tbody", style: `width:${this.totalWidth}px` });
    this.viewport = h("div", { class: "sbs-viewport", tabindex: "0" }, this.header, this.body);
    this.viewport.addEventListener("scroll", () => {
      this._schedule();
      this._changed();
    });
    this.viewport.addEventListener("keydown", (ev) => this._key(ev));
    this.body.addEventListener("click", (ev) => {
      const r = ev.target.closest(".sbs-tr");
      if (r && r._idx !== undefined && r._idx >= 0) this.onSelect(r._idx, "table");
    });
    this.el = h("div", { class: "sbs-table" }, this.filters, this.viewport);
  }

  _key(ev) {
    if (ev.key !== "ArrowDown" && ev.key !== "ArrowUp") return;
    ev.preventDefault();
    const pos = this.view.indexOf(this.selected);
    const next = ev.key === "ArrowDown" ? Math.min(this.view.length - 1, pos + 1) : Math.max(0, pos - 1);
    if (this.view[next] !== undefined) this.onSelect(this.view[next], "keyboard");
  }

  _pass(i) {
    const s = this.store;
    if (!s.has(i)) return false;
    const f = this.filter;
    if (f.op && s.get(i, "onnx_op_type") !== f.op) return false;
    if (f.verdict) {
      const st = s.get(i, "status");
      if (f.verdict === "failing") {
        if (!FAILING.has(st)) return false;
      } else if (f.verdict === "ownfail") {
        if (s.get(i, "passed2") !== false) return false;
      } else if (f.verdict === "unpaired") {
        if (st !== "unpaired_ep" && st !== "unpaired_onnx") return false;
      } else if (st !== f.verdict) return false;
    }
    if (f.text) {
      const t = f.text.toLowerCase();
      const hay = ["ep_name", "onnx_name", "onnx_op_type", "ep_target"].map((k) => String(s.get(i, k) ?? "").toLowerCase());
      if (!hay.some((x) => x.includes(t))) return false;
    }
    return true;
  }

  _sort() {
    if (!this.sortKey) return;
    const col = COLUMNS.find((c) => c.key === this.sortKey);
    const s = this.store;
    const keys = new Map();
    for (const i of this.view) keys.set(i, col.sort(s, i));
    const dir = this.sortDir;
    this.view.sort((a, b) => {
      const x = keys.get(a);
      const y = keys.get(b);
      if (x === y) return a - b;
      if (x === null || x === undefined) return 1; // missing values last either way
      if (y === null || y === undefined) return -1;
      return (x < y ? -1 : 1) * dir;
    });
  }

  _collectOps(from) {
    let grew = false;
    for (let i = from; i < this.store.length; i++) {
      const op = this.store.get(i, "onnx_op_type");
      if (op && !this.opTypes.has(op)) {
        this.opTypes.add(op);
        grew = true;
      }
    }
    if (!grew) return;
    const current = this.opSelect.value;
    while (this.opSelect.options.length > 1) this.opSelect.remove(1);
    for (const op of [...this.opTypes].sort()) this.opSelect.appendChild(h("option", { value: op, text: op }));
    this.opSelect.value = current;
  }

  /** Rebuild the whole view (filters or sort changed, rows replaced). */
  refresh() {
    this.opTypes.clear();
    this._collectOps(0);
    this.view = [];
    for (let i = 0; i < this.store.length; i++) if (this._pass(i)) this.view.push(i);
    this._sort();
    this._schedule();
  }

  /** Rows `from`.. were appended: extend the view without redoing it when unsorted. */
  appended(from) {
    this._collectOps(from);
    for (let i = from; i < this.store.length; i++) if (this._pass(i)) this.view.push(i);
    if (this.sortKey) this._sort();
    this._schedule();
  }

  setFilter(patch) {
    Object.assign(this.filter, patch);
    this.refresh();
    this._changed();
  }

  /** Filters, sort and scroll, to carry over to a view re-created for the same model. */
  snapshot() {
    return { filter: { ...this.filter }, sortKey: this.sortKey, sortDir: this.sortDir, scrollTop: this.viewport.scrollTop };
  }

  restore(st) {
    if (!st || !st.filter) return;
    this.filter = { ...this.filter, ...st.filter };
    this.textInput.value = this.filter.text || "";
    this.verdictSelect.value = this.filter.verdict || "";
    if (st.sortKey) {
      this.sortKey = st.sortKey;
      this.sortDir = st.sortDir || 1;
      this._marks();
    }
    this.refresh();
    this.opSelect.value = this.filter.op || "";
    if (st.scrollTop) requestAnimationFrame(() => (this.viewport.scrollTop = st.scrollTop));
  }

  _changed() {
    if (this.onState) this.onState(this.snapshot());
  }

  toggleSort(key) {
    const col = COLUMNS.find((c) => c.key === key);
    if (this.sortKey === key) this.sortDir = -this.sortDir;
    else {
      this.sortKey = key;
      this.sortDir = col.numeric && key !== "row" ? -1 : 1;
    }
    this._marks();
    this._sort();
    this._schedule();
    this._changed();
  }

  _marks() {
    COLUMNS.forEach((c, k) => {
      const mark = c.key === this.sortKey ? (this.sortDir > 0 ? " ▲" : " ▼") : "";
      this.headCells[k].textContent = c.label + mark;
    });
  }

  setSelected(i, scroll) {
    this.selected = i;
    if (scroll) this.scrollTo(i);
    this._schedule();
  }

  scrollTo(i) {
    const pos = this.view.indexOf(i);
    if (pos < 0) return;
    const top = pos * ROW_H;
    const vh = this.viewport.clientHeight - ROW_H;
    const cur = this.viewport.scrollTop;
    if (top < cur || top > cur + vh - ROW_H) this.viewport.scrollTop = Math.max(0, top - vh / 2);
  }

  _schedule() {
    if (this._raf) return;
    const run = () => {
      this._raf = null;
      this.render();
    };
    this._raf = typeof requestAnimationFrame === "function" ? requestAnimationFrame(run) : setTimeout(run, 16);
  }

  /** Draw the rows in view; returns how many row elements are in the DOM. */
  render() {
    const n = this.view.length;
    this.body.style.height = `${n * ROW_H}px`;
    const total = this.store.count;
    this.countEl.textContent = n === total ? `${n} rows` : `${n} of ${total} rows`;
    const height = this.viewport.clientHeight || 360;
    const first = Math.max(0, Math.floor(this.viewport.scrollTop / ROW_H) - OVERSCAN);
    const count = Math.min(n - first, Math.ceil(height / ROW_H) + 2 * OVERSCAN);
    while (this.pool.length < count) {
      const tr = h("div", { class: "sbs-tr", style: `grid-template-columns:${this.template}` });
      tr._cells = COLUMNS.map((c) => tr.appendChild(h("div", { class: `sbs-td${c.numeric ? " sbs-num" : ""}` })));
      tr._idx = -1;
      this.pool.push(tr);
      this.body.appendChild(tr);
    }
    for (let k = 0; k < this.pool.length; k++) {
      const tr = this.pool[k];
      if (k >= count) {
        tr.style.display = "none";
        tr._idx = -1;
        tr.classList.remove("sbs-sel");
        continue;
      }
      const i = this.view[first + k];
      tr.style.display = "";
      tr.style.top = `${(first + k) * ROW_H}px`;
      if (tr._idx !== i || tr._stale) {
        tr._idx = i;
        COLUMNS.forEach((c, j) => {
          const cell = tr._cells[j];
          cell.textContent = c.text(this.store, i);
          cell.title = cell.textContent;
          cell.className = `sbs-td${c.numeric ? " sbs-num" : ""}${c.cls ? ` ${c.cls(this.store, i)}` : ""}`;
        });
      }
      tr.classList.toggle("sbs-sel", i === this.selected);
      tr.classList.toggle("sbs-fail", this.store.failed(i));
    }
    return count;
  }

  /** Rows were replaced by an equal-length full list: redraw every pooled row. */
  invalidate() {
    for (const tr of this.pool) tr._idx = -1;
  }
}
