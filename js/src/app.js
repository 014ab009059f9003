// Lays out the view and links its parts. `src` abstracts where the state lives: a live
// anywidget model (index.js `render`) or a plain object (index.js `renderStatic`).
//
// The parts, each in its own module: the status line (status.js), the toolbar with the
// session's actions and the input picker (actions.js, inputs.js), the answer card
// (answer.js), a run's two sides step by step (streams.js), the chart (chart.js), the layer tree (layers.js), the filter bar and the
// table (filter.js, table.js), the detail panel (detail.js). mount() only makes them,
// places them and routes the model's changes to them.
//
// The layout follows the width of the view's own container (not the window): wide, the
// chart, the layers and the table sit beside the detail panel; narrow, everything stacks
// and the table keeps its name, error, own error and verdict columns.
import css from "./style.css";
import { h, onWidth } from "./util.js";
import { VirtualTable } from "./table.js";
import { Chart } from "./chart.js";
import { DetailPanel } from "./detail.js";
import { FilterBar, ViewFilter } from "./filter.js";
import { Graph } from "./graph.js";
import { LayerTree } from "./layers.js";
import { AnswerCard, culpritOf } from "./answer.js";
import { ActionBar } from "./actions.js";
import { InputsPicker } from "./inputs.js";
import { StatusLine } from "./status.js";
import { StreamsView } from "./streams.js";
import { watchTheme } from "./theme.js";

export { DETACHED } from "./actions.js";
export const WIDE = 980; // px of the view's own width from which the detail panel sits beside

export function mount(el, src) {
  const store = src.store;
  const live = !!src.live;
  let selected = typeof src.get("selected") === "number" ? src.get("selected") : -1;

  const filter = new ViewFilter(store);
  const graph = new Graph(src.get("graph"), store);
  // filters, sort and scroll survive a re-created view of the same model
  const viewState = src.viewState || {};
  if (viewState.filter) filter.state = { ...filter.state, ...viewState.filter };
  filter.subscribe(() => (viewState.filter = { ...filter.state }));
  const select = (i, source) => {
    if (typeof i !== "number" || i < -1 || i >= store.length || (i >= 0 && !store.has(i))) return;
    if (i >= 0 && !filter.pass(i)) {
      // what the user asked for must be in view: lift the filters that hide it
      const patch = {};
      if (store.isConstant(i)) patch.constants = true;
      filter.set(patch);
      if (!filter.pass(i)) filter.set({ text: "", op: "", verdict: "", group: "" });
    }
    const changed = i !== selected;
    selected = i;
    table.setSelected(i, source !== "table");
    chart.setSelected(i);
    renderDetail();
    if (changed && source !== "model") src.setSelected(i);
  };

  // ---- the parts
  const picker = new InputsPicker(src, () => actions.backed !== false);
  const actions = new ActionBar(src, store, {
    selected: () => selected,
    picker,
    onBacked: (backed) => {
      picker.render();
      if (backed === false) renderDetail(); // no "loading node detail…" that never loads
    },
  });
  actions.start();
  const card = new AnswerCard(store, (i) => select(i, "card"), live);
  const bar = new FilterBar(store, filter);
  const table = new VirtualTable(store, filter, select);
  table.onCount = (n, total) => bar.setCount(n, total);
  const chart = new Chart(store, filter, select);
  const layers = new LayerTree(store, filter, select);
  const detail = new DetailPanel(store, graph, select, actions.nodeActions);
  const status = new StatusLine(src, store, { card, layers, select, selected: () => selected });
  // the parting step's records are the run's: showing them selects its culprit in the table
  const streams = new StreamsView(src, () => {
    const i = card.row(culpritOf(src.get("summary")));
    select(i >= 0 ? i : store.length ? 0 : -1, "streams");
    table.el.scrollIntoView({ block: "nearest" });
    return store.count;
  });
  const renderDetail = () => {
    detail.render(selected, src.get("details"), live && actions.backed !== false);
    card.setDetails(src.get("details"));
    actions.render();
  };
  filter.subscribe(() => {
    table.refresh();
    chart.update(true);
  });

  const side = h("div", { class: "sbs-side" }, detail.el);
  const left = h("div", { class: "sbs-left" }, chart.picker, chart.el, layers.el, bar.el, table.el);
  const main = h("div", { class: "sbs-main" }, left, side);
  const root = h("div", { class: `sbs-root${live ? " sbs-live" : " sbs-static"}` }, h("style", { text: css }), status.el, actions.el, card.el, streams.el, main);
  el.appendChild(root);

  const parts = { store, filter, bar, table, chart, layers, detail, side, status, actions, picker, streams, renderDetail };
  const offs = [...followWidth(root, parts), ...followModel(src, parts, select, () => selected)];
  if (!live) table.maxHeight = Math.max(360, Math.min(900, (window.innerHeight || 800) - 120));

  bar.collectOps(0);
  bar.sync();
  if (viewState.table) table.restore(viewState.table);
  else table.refresh();
  table.onState = (st) => (viewState.table = st);
  layers.update(true);
  chart.update(true);
  status.render();
  streams.render();
  actions.renderAction();
  picker.render();
  if (selected >= 0) select(selected, "model");
  else renderDetail();
  if (live) src.requestMissing();

  return {
    root,
    table,
    chart,
    layers,
    filter,
    graph,
    select,
    destroy() {
      for (const off of offs) off && off();
      chart.destroy();
      root.remove();
    },
  };
}

/** The container's width, whatever the window does (JupyterLab side panels): wide or
 * narrow layout, the chart's height and width, the table's and the detail panel's. */
function followWidth(root, { chart, table, detail, side, renderDetail }) {
  let wide = null;
  return [
    onWidth(root, (w) => {
      const isWide = w >= WIDE;
      if (isWide !== wide) {
        wide = isWide;
        root.classList.toggle("sbs-wide", isWide);
        root.classList.toggle("sbs-narrow", !isWide);
      }
      chart.height = isWide ? 320 : 300;
    }),
    onWidth(chart.el, (w) => chart.resize(w)),
    onWidth(table.el, (w) => table.setWidth(w)),
    onWidth(side, (w) => {
      if (Math.abs(w - detail.width) > 8) {
        detail.width = w;
        renderDetail();
      }
    }),
    watchTheme(() => chart.retheme()),
  ];
}

/** The model's changes, each to the parts that show it; returns the unsubscribers. */
function followModel(src, parts, select, selected) {
  const { filter, bar, table, chart, layers, status, actions, picker, streams, renderDetail } = parts;
  const render = () => actions.render();
  return [
    src.onRows((kind, from) => {
      bar.collectOps(kind === "append" ? from : 0);
      if (kind === "append") table.appended(from);
      else {
        filter.invalidate();
        table.invalidate();
        table.refresh();
      }
      chart.update(kind !== "append");
      layers.update(false);
      bar.renderConstants();
      status.render();
      actions.render();
    }),
    src.on("status", () => (status.render(), actions.renderAction(), picker.render())),
    src.on("inputs", () => picker.render()),
    src.on("summary", () => status.render()),
    src.on("timeline", () => streams.render()),
    src.on("details", renderDetail),
    src.on("device", render),
    src.on("cuda_available", render),
    src.on("selected", () => {
      const v = src.get("selected");
      if (typeof v === "number" && v !== selected()) select(v, "model");
    }),
  ];
}
