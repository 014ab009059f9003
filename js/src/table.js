// Virtualised records table: only the rows in view exist in the DOM (a fixed pool reused
// on scroll), so 20,000 rows scroll as smoothly as 20. Its columns fit the width it is
// given: the name, the errors and the verdict always show; the others fold away (every
// field is in the detail panel) instead of a horizontal scroll.
import { h, num } from "./util.js";

export const ROW_H = 22;
const OVERSCAN = 8;
const SCROLLBAR = 14;

function shapeText(st, i) {
  const a = st.get(i, "ep_shape_type") || "";
  const b = st.get(i, "onnx_shape_type") || "";
  if (!a || !b || a === b) return a || b;
  return `${a} | ${b}`;
}

function verdictText(st, i) {
  const v = st.get(i, "status") || "";
  const label = st.schema.statusLabel(v);
  const p2 = st.get(i, "passed2");
  if (p2 === false) return `${label} · own fail`;
  if (p2 === true && st.failed(i)) return `${label} · own ok`;
  return label;
}

// How some fields draw in a cell, beyond their format: the user's name with its module
// (so the module needs no column of its own), both shapes, the verdict with the own one.
// Labels, formats, order and priorities come from the schema (records.py FIELDS).
const CELLS = {
  step: { text: (st, i) => String(i), sort: (st, i) => i },
  ep_user_name: {
    flex: 3,
    name: true,
    absorbs: "ep_module",
    text: (st, i) => st.userName(i),
    sort: (st, i) => st.get(i, "ep_module") ?? st.userName(i) ?? null,
  },
  onnx_name: { flex: 2 },
  onnx_shape_type: { text: shapeText, sort: shapeText },
  status: {
    text: verdictText,
    sort: verdictText,
    cls: (st, i) => {
      const v = st.get(i, "status");
      return `sbs-v sbs-tone-${st.schema.tone(v)}${st.get(i, "passed2") === false ? " sbs-v-ownfail" : ""}`;
    },
  },
};

const NUMERIC = new Set(["num", "int", "seconds"]);

/** One table column of a schema field (its label, format, priority and width). */
function column(schema, f) {
  const key = f.name;
  const numeric = NUMERIC.has(f.fmt);
  const base = {
    key,
    label: f.short || f.label || key,
    w: f.width || (numeric ? 70 : 100),
    pri: f.priority,
    numeric,
    text: (st, i) => schema.format(key, st.get(i, key)),
    sort: numeric
      ? (st, i) => {
          const v = num(st.get(i, key));
          return v === null ? null : Number.isNaN(v) ? Infinity : v;
        }
      : (st, i) => st.get(i, key) ?? null,
  };
  return { ...base, ...(CELLS[key] || {}) };
}

/** The table's columns, in schema order. pri: the order in which they are kept as the
 * width shrinks (0: always); flex: the column takes a share of the width left over. */
export function tableColumns(schema) {
  const cols = schema.columns().map((f) => column(schema, f));
  const absorbed = new Set(cols.map((c) => c.absorbs).filter(Boolean));
  return cols.filter((c) => !absorbed.has(c.key));
}

/** The columns of `all` that fit in `width` px (in table order), highest priority first kept. */
export function fitColumns(all, width) {
  const avail = width - SCROLLBAR;
  const byPri = [...all].sort((a, b) => a.pri - b.pri);
  const keep = new Set();
  let used = 0;
  for (const c of byPri) {
    if (c.pri > 0 && used + c.w > avail) continue;
    keep.add(c.key);
    used += c.w;
  }
  const cols = all.filter((c) => keep.has(c.key));
  // very narrow: the name gives up width before anything scrolls sideways
  if (used > avail) return cols.map((c) => (c.name ? { ...c, w: Math.max(72, c.w - (used - avail)) } : c));
  return cols;
}

export class VirtualTable {
  constructor(store, filter, onSelect) {
    this.store = store;
    this.filter = filter;
    this.onSelect = onSelect;
    this.columns = tableColumns(store.schema);
    this.view = [];
    this.selected = -1;
    this.sortKey = null;
    this.sortDir = 1;
    this.pool = [];
    this.maxHeight = 440;
    this.header = h("div", { class: "sbs-thead" });
    this.body = h("div", { class: "sbs-tbody" });
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
    this.el = h("div", { class: "sbs-table" }, this.viewport);
    this.setWidth(900);
  }

  /** Lay the columns out for a table `width` px wide. */
  setWidth(width) {
    const cols = fitColumns(this.columns, width);
    const template = cols.map((c) => (c.flex ? `minmax(${c.w}px, ${c.flex}fr)` : `${c.w}px`)).join(" ");
    if (template === this.template) return;
    this.cols = cols;
    this.template = template;
    this.header.style.gridTemplateColumns = this.template;
    this.headCells = cols.map((c) => h("div", { class: `sbs-th${c.numeric ? " sbs-num" : ""}`, title: `sort by ${c.label}`, onclick: () => this.toggleSort(c.key) }, c.label));
    this.header.replaceChildren(...this.headCells);
    this._marks();
    for (const tr of this.pool) tr.remove();
    this.pool = [];
    this._schedule();
  }

  _key(ev) {
    if (ev.key !== "ArrowDown" && ev.key !== "ArrowUp") return;
    ev.preventDefault();
    const pos = this.view.indexOf(this.selected);
    const next = ev.key === "ArrowDown" ? Math.min(this.view.length - 1, pos + 1) : Math.max(0, pos - 1);
    if (this.view[next] !== undefined) this.onSelect(this.view[next], "keyboard");
  }

  _sort() {
    if (!this.sortKey) return;
    const col = this.columns.find((c) => c.key === this.sortKey);
    if (!col) return; // a sort saved by a view with other columns
    const st = this.store;
    const keys = new Array(st.length);
    for (const i of this.view) keys[i] = col.sort(st, i);
    const dir = this.sortDir;
    this.view.sort((a, b) => {
      const x = keys[a];
      const y = keys[b];
      if (x === y) return a - b;
      if (x === null || x === undefined) return 1; // missing values last either way
      if (y === null || y === undefined) return -1;
      return (x < y ? -1 : 1) * dir;
    });
  }

  /** Rebuild the whole view (filters or sort changed, rows replaced). */
  refresh() {
    this.view = [];
    for (let i = 0; i < this.store.length; i++) if (this.filter.pass(i)) this.view.push(i);
    this._sort();
    this._schedule();
  }

  /** Rows `from`.. were appended: extend the view without redoing it when unsorted. */
  appended(from) {
    for (let i = from; i < this.store.length; i++) if (this.filter.pass(i)) this.view.push(i);
    if (this.sortKey) this._sort();
    this._schedule();
  }

  /** Sort and scroll, to carry over to a view re-created for the same model. */
  snapshot() {
    return { sortKey: this.sortKey, sortDir: this.sortDir, scrollTop: this.viewport.scrollTop };
  }

  restore(st) {
    if (!st) return;
    if (st.sortKey) {
      this.sortKey = st.sortKey;
      this.sortDir = st.sortDir || 1;
      this._marks();
    }
    this.refresh();
    if (st.scrollTop) requestAnimationFrame(() => (this.viewport.scrollTop = st.scrollTop));
  }

  _changed() {
    if (this.onState) this.onState(this.snapshot());
  }

  toggleSort(key) {
    const col = this.columns.find((c) => c.key === key);
    if (this.sortKey === key) this.sortDir = -this.sortDir;
    else {
      this.sortKey = key;
      this.sortDir = col.numeric && key !== "step" ? -1 : 1;
    }
    this._marks();
    this._sort();
    this._schedule();
    this._changed();
  }

  _marks() {
    if (!this.headCells) return;
    this.cols.forEach((c, k) => {
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

  _row() {
    const tr = h("div", { class: "sbs-tr" });
    tr.style.gridTemplateColumns = this.template;
    tr._cells = this.cols.map((c) => {
      const cell = tr.appendChild(h("div", { class: `sbs-td${c.numeric ? " sbs-num" : ""}` }));
      if (c.name) {
        cell._name = cell.appendChild(h("span", { class: "sbs-name" }));
        cell._mod = cell.appendChild(h("span", { class: "sbs-module" }));
      }
      return cell;
    });
    tr._idx = -1;
    return tr;
  }

  _fill(tr, i) {
    const st = this.store;
    this.cols.forEach((c, j) => {
      const cell = tr._cells[j];
      if (c.name) {
        const name = st.userName(i);
        const mod = st.get(i, "ep_module") || "";
        // an ONNX-only value has no fx name: its ONNX name stands in, marked as such
        cell._name.textContent = name || st.get(i, "onnx_name") || "—";
        cell._name.classList.toggle("sbs-onnx-only", !name);
        cell._mod.textContent = mod;
        const prepared = st.get(i, "ep_name");
        cell.title = [name, prepared && prepared !== name ? `(prepared: ${prepared})` : "", mod].filter(Boolean).join("  ");
      } else {
        cell.textContent = c.text(st, i);
        cell.title = cell.textContent;
      }
      cell.className = `sbs-td${c.numeric ? " sbs-num" : ""}${c.name ? " sbs-namecell" : ""}${c.cls ? ` ${c.cls(st, i)}` : ""}`;
    });
  }

  /** Draw the rows in view; returns how many row elements are in the DOM. */
  render() {
    const n = this.view.length;
    this.body.style.height = `${n * ROW_H}px`;
    // as tall as its rows, up to maxHeight: no empty box under a short table
    this.viewport.style.height = `${Math.max(3, Math.min(n, Math.floor(this.maxHeight / ROW_H))) * ROW_H + ROW_H + 2}px`;
    if (this.onCount) this.onCount(n, this.store.count);
    const height = this.viewport.clientHeight || this.maxHeight;
    const first = Math.max(0, Math.floor(this.viewport.scrollTop / ROW_H) - OVERSCAN);
    const count = Math.max(0, Math.min(n - first, Math.ceil(height / ROW_H) + 2 * OVERSCAN));
    while (this.pool.length < count) {
      const tr = this._row();
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
      if (tr._idx !== i) {
        tr._idx = i;
        tr.dataset.row = i;
        tr.dataset.kind = this.store.get(i, "kind") || "";
        this._fill(tr, i);
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
