// Error by layer: the computed records grouped by module path (ep_module, e.g.
// model.layers.3.mlp), with the largest error, own error and failures of each group, so
// "layer 3's MLP" shows before scrolling 2,000 rows. Selecting a group filters the table
// and the chart; its worst node is one click away.
import { h, fmtNum, num } from "./util.js";

const AUTO_ROWS = 24; // groups shown before the user expands anything
const THROTTLE_MS = 600;

function newNode(path, name) {
  return { path, name, count: 0, failing: 0, maxErr: null, errRow: -1, maxOwn: null, ownRow: -1, children: new Map() };
}

function worse(a, b) {
  return a !== null && (b === null || a > b || (Number.isNaN(a) && !Number.isNaN(b)));
}

/** The module tree of the rows; single-child chains are merged ("model.layers"). */
export function buildTree(store) {
  const root = newNode("", "");
  const mods = store.col("ep_module");
  if (!mods) return root;
  for (let i = 0; i < store.length; i++) {
    if (!store.has(i) || store.isConstant(i)) continue;
    const mod = mods[i];
    if (!mod) continue;
    const e = num(store.get(i, "err_abs"));
    const o = num(store.get(i, "err_abs2"));
    const failing = store.failed(i) || store.get(i, "passed2") === false;
    let node = root;
    const parts = String(mod).split(".");
    const chain = [root];
    for (let k = 0; k < parts.length; k++) {
      const path = parts.slice(0, k + 1).join(".");
      let child = node.children.get(parts[k]);
      if (!child) node.children.set(parts[k], (child = newNode(path, parts[k])));
      node = child;
      chain.push(node);
    }
    for (const n of chain) {
      n.count += 1;
      if (failing) n.failing += 1;
      if (worse(e, n.maxErr)) (n.maxErr = e), (n.errRow = i);
      if (worse(o, n.maxOwn)) (n.maxOwn = o), (n.ownRow = i);
    }
  }
  const merge = (n) => {
    for (const [k, c] of [...n.children]) {
      let m = c;
      while (m.children.size === 1 && [...m.children.values()][0].count === m.count) {
        const only = [...m.children.values()][0];
        m = { ...only, name: `${m.name}.${only.name}` };
      }
      n.children.set(k, m);
      merge(m);
    }
  };
  merge(root);
  return root;
}

export class LayerTree {
  constructor(store, filter, onSelect) {
    this.store = store;
    this.filter = filter;
    this.onSelect = onSelect;
    this.expanded = new Set();
    this.auto = true; // expand by itself until the user toggles something
    this.focus = ""; // module path kept expanded (the culprit's)
    this.body = h("div", { class: "sbs-layers-body" });
    this.summaryEl = h("summary", { text: "Error by layer" });
    // closed at first: open, it pushed the table below the first screen (its summary
    // line says how many modules it holds; a click opens it)
    this.el = h("details", { class: "sbs-layers", open: false, hidden: true }, this.summaryEl, this.body);
    this.el.addEventListener("toggle", () => this.el.open && this.update(true));
    filter.subscribe(() => this.render());
  }

  setFocus(path) {
    if (path && path !== this.focus) {
      this.focus = path;
      this.render();
    }
  }

  update(now) {
    if (now) {
      clearTimeout(this._timer);
      this._timer = null;
      this.tree = buildTree(this.store);
      this.render();
      return;
    }
    if (this._timer) return;
    this._timer = setTimeout(() => this.update(true), THROTTLE_MS);
  }

  /** Open whole levels (every group of a depth, or none) while they fit in AUTO_ROWS. */
  _autoExpand() {
    const open = new Set();
    let visible = this.tree.children.size;
    let level = [...this.tree.children.values()];
    while (level.length) {
      const next = level.flatMap((n) => [...n.children.values()]);
      if (!next.length || visible + next.length > AUTO_ROWS) break;
      for (const n of level) if (n.children.size) open.add(n.path);
      visible += next.length;
      level = next;
    }
    return open;
  }

  render() {
    const tree = this.tree;
    if (!tree || !tree.children.size) {
      this.el.hidden = true;
      return;
    }
    this.el.hidden = false;
    if (this.auto) this.expanded = this._autoExpand();
    if (this.focus) {
      // the culprit's layer is always in view
      const parts = this.focus.split(".");
      for (let k = 1; k < parts.length; k++) this.expanded.add(parts.slice(0, k).join("."));
    }
    let lo = Infinity;
    let hi = -Infinity;
    const visit = (n) => {
      for (const c of n.children.values()) {
        const v = c.maxOwn !== null ? c.maxOwn : c.maxErr;
        if (v > 0 && Number.isFinite(v)) (lo = Math.min(lo, v)), (hi = Math.max(hi, v));
        visit(c);
      }
    };
    visit(tree);
    const span = hi > lo ? Math.log10(hi) - Math.log10(lo) + 1 : 1;
    const bar = (v) => (v > 0 && Number.isFinite(v) ? Math.max(4, (100 * (Math.log10(v) - Math.log10(lo) + 1)) / span) : 0);
    const group = this.filter.state.group;
    const rows = [h("div", { class: "sbs-lrow sbs-lhead" }, h("span", { text: "module" }), h("span", { class: "sbs-num", text: "nodes" }), h("span", { class: "sbs-num", text: "max err" }), h("span", { class: "sbs-num", text: "max own err" }), h("span", { class: "sbs-num", text: "failing" }))];
    const add = (n, depth) => {
      const open = this.expanded.has(n.path);
      const kids = n.children.size;
      const worstOwn = n.maxOwn !== null ? n.maxOwn : n.maxErr;
      const row = h(
        "div",
        { class: `sbs-lrow${n.path === group ? " sbs-lsel" : ""}${n.failing ? " sbs-lfail" : ""}${this.focus && (this.focus === n.path || this.focus.startsWith(`${n.path}.`)) ? " sbs-lfocus" : ""}`, "data-path": n.path },
        h(
          "span",
          { class: "sbs-lname", style: `padding-left:${depth * 14}px` },
          h("button", { class: "sbs-ltoggle", title: open ? "collapse" : "expand", disabled: !kids, onclick: () => this.toggle(n.path) }, kids ? (open ? "▾" : "▸") : "·"),
          h("button", { class: "sbs-link sbs-lgroup", title: `show only ${n.path} in the table and the chart`, onclick: () => this.filter.set({ group: group === n.path ? "" : n.path }) }, n.name),
          h("span", { class: "sbs-lbar", style: `width:${bar(worstOwn)}%` }),
        ),
        h("span", { class: "sbs-num", text: String(n.count) }),
        h("button", { class: "sbs-link sbs-num", title: "select the node with this error", disabled: n.errRow < 0, onclick: () => this.onSelect(n.errRow, "layers") }, fmtNum(n.maxErr) || "–"),
        h("button", { class: "sbs-link sbs-num", title: "select the node with this own error", disabled: n.ownRow < 0, onclick: () => this.onSelect(n.ownRow, "layers") }, fmtNum(n.maxOwn) || "–"),
        h("span", { class: `sbs-num${n.failing ? " sbs-bad" : ""}`, text: String(n.failing) }),
      );
      rows.push(row);
      if (open) for (const c of n.children.values()) add(c, depth + 1);
    };
    for (const c of tree.children.values()) add(c, 0);
    this.body.replaceChildren(...rows);
    const n = tree.children.size;
    this.summaryEl.textContent = `Error by layer (${n} top-level module${n === 1 ? "" : "s"})`;
  }

  toggle(path) {
    this.auto = false;
    if (this.expanded.has(path)) this.expanded.delete(path);
    else this.expanded.add(path);
    this.render();
  }
}
