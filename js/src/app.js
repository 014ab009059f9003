// Lays out the view and links its parts. `src` abstracts where the state lives: a live
// anywidget model (index.js `render`) or a plain object (index.js `renderStatic`).
//
// The layout follows the width of the view's own container (not the window): wide, the
// chart, the layers and the table sit beside the detail panel; narrow, everything stacks
// and the table keeps its name, error, own error and verdict columns.
import css from "./style.css";
import { h, fmtNum, fmtTime, onWidth } from "./util.js";
import { VirtualTable } from "./table.js";
import { Chart } from "./chart.js";
import { DetailPanel } from "./detail.js";
import { FilterBar, ViewFilter } from "./filter.js";
import { Graph } from "./graph.js";
import { LayerTree } from "./layers.js";
import { AnswerCard, culpritOf, culpritName, failingText, verdictOf } from "./answer.js";
import { watchTheme } from "./theme.js";

export const WIDE = 980;
// what a view with no run behind it says instead of its buttons
export const DETACHED =
  "saved view: no run behind it in this kernel (the notebook was saved and opened again), so it has no buttons; run its cell again to use Stop, Export report, Save culprit bundle and the node actions"; // px of the view's own width from which the detail panel sits beside

export function mount(el, src) {
  const offs = [];
  const store = src.store;
  const live = !!src.live;
  let selected = typeof src.get("selected") === "number" ? src.get("selected") : -1;
  let pending = null; // {name}: the action asked last, while its answer has not come
  let shown = null; // {name, state, message}: the last answer, as the action line says it
  // a view drawn from a saved notebook has no run behind it: null while unknown, then
  // the kernel's answer to src.probe() (no answer: not backed, the buttons are withdrawn)
  let backed = live && typeof src.probe === "function" ? null : live;

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

  // ---- status line (and, live, the run's buttons)
  const statusEl = h("div", { class: "sbs-status" });
  const renderStatus = () => {
    const st = src.get("status") || {};
    const sm = src.get("summary") || null;
    const state = st.state || (st.finished ? "finished" : "idle");
    const parts = [h("span", { class: `sbs-badge sbs-${state}`, text: state })];
    const verdict = sm ? verdictOf(sm, st) : "";
    if (verdict && verdict !== "running") parts.push(h("span", { class: `sbs-verdict sbs-verdict-${verdict}`, text: verdict.toUpperCase() }));
    const many = st.extra && st.extra.inputs_done !== undefined ? st.extra : null;
    if (many) parts.push(h("span", { class: "sbs-inputs-progress", text: `${many.inputs_done}${many.inputs_total ? `/${many.inputs_total}` : ""} inputs` }));
    if (st.total_onnx_nodes) parts.push(h("span", { class: "sbs-progress", text: `${st.done_onnx_nodes ?? 0}/${st.total_onnx_nodes} ONNX nodes` }));
    parts.push(h("span", { class: "sbs-nrows", text: `${store.count} records` }));
    if (st.elapsed) parts.push(h("span", { text: fmtTime(st.elapsed) }));
    if (st.max_err_abs) parts.push(h("span", { class: "sbs-worst", text: `worst ${fmtNum(st.max_err_abs)}${st.max_err_name ? ` at ${st.max_err_name}` : ""}` }));
    parts.push(h("span", { class: `sbs-failing${st.failures ? " sbs-bad" : ""}`, text: failingText(st.failures ?? 0, (sm && sm.totals && sm.totals.drifted) || 0) }));
    const c = sm ? culpritOf(sm) : null;
    if (c) {
      const i = card.row(c);
      parts.push(h("span", { class: "sbs-answer" }, "culprit: ", h("button", { class: "sbs-link", title: "select the culprit", onclick: () => select(i, "link"), disabled: i < 0 }, culpritName(c))));
    }
    statusEl.replaceChildren(...parts);
    if (st.error) statusEl.appendChild(h("details", { class: "sbs-error" }, h("summary", { text: "the run raised an exception" }), h("pre", { class: "sbs-pre", text: st.error })));
    card.render(sm, st);
    if (c && c.ep_module) layers.setFocus(c.ep_module);
    // the answer in view: with nothing selected yet, the culprit is (its detail and graph)
    if (c && selected < 0 && !autoSelected) {
      autoSelected = true;
      const i = card.row(c);
      if (i >= 0) queueMicrotask(() => selected < 0 && select(i, "card"));
    }
  };
  let autoSelected = false;

  // ---- actions (live widget only: a static view has no kernel, so no buttons)
  const actionEl = h("span", { class: "sbs-action" });
  const onCuda = () => String(src.get("device") || "").startsWith("cuda");
  const btn = (cls, label, fn) => h("button", { class: `sbs-btn ${cls}`, onclick: fn }, label);
  const btnStop = btn("sbs-btn-stop", "Stop", () => act("stop"));
  const btnCuda = btn("sbs-btn-cuda", "CUDA", () => act("device", { device: onCuda() ? "cpu" : "cuda" }));
  const btnExport = btn("sbs-btn-export", "Export report", () => act("export"));
  // the smallest failing piece: the culprit's replay bundle, replayed to check it
  const btnCulprit = btn("sbs-btn-culprit", "Save culprit bundle", () => act("save_culprit"));
  const reasonEl = h("span", { class: "sbs-reason" });
  // a run over many inputs: which one the views show (the worst over all, or one input's
  // own records, which the kernel runs again)
  const inputsEl = h("select", { class: "sbs-inputs", title: "show the worst over all inputs, or one input's own records" });
  inputsEl.addEventListener("change", () => {
    const info = src.get("inputs");
    if (!info) return;
    const v = inputsEl.value === "" ? null : Number(inputsEl.value);
    src.setInputs({ ...info, shown: v });
  });
  const renderInputs = () => {
    const info = live && backed !== false ? src.get("inputs") : null;
    inputsEl.hidden = !info;
    if (!info) return;
    const failing = new Set(info.failing || []);
    const names = info.names || [];
    const n = info.done || info.total || 0;
    const opts = [h("option", { value: "", text: `worst over ${n} inputs${failing.size ? ` (${failing.size} failing)` : ""}` })];
    for (let i = 0; i < n; i++) {
      const name = names[i] ? ` (${names[i]})` : "";
      opts.push(h("option", { value: String(i), text: `input ${i}${name}${failing.has(i) ? " \u2717 fails" : ""}` }));
    }
    inputsEl.replaceChildren(...opts);
    inputsEl.value = info.shown === null || info.shown === undefined ? "" : String(info.shown);
    inputsEl.disabled = running();
  };
  // said instead of the buttons when no run backs the view (a received notebook)
  const detachedEl = h("span", { class: "sbs-detached", hidden: true, text: DETACHED });
  const toolbar = live ? h("div", { class: "sbs-toolbar" }, inputsEl, btnStop, btnCuda, btnExport, btnCulprit, reasonEl, actionEl, detachedEl) : null;
  const nodeButtons = [];
  const enable = (b, why) => {
    b.disabled = !!why;
    b.title = why || "";
  };
  const running = () => (src.get("status") || {}).state === "running";
  const renderButtons = () => {
    if (!live) return;
    const gone = backed === false;
    for (const b of [btnStop, btnCuda, btnExport, btnCulprit, reasonEl]) b.hidden = gone;
    detachedEl.hidden = !gone;
    if (gone) {
      inputsEl.hidden = true;
      for (const b of nodeButtons) b.hidden = true;
    }
    const busy = pending !== null;
    const cudaOk = !!src.get("cuda_available");
    enable(btnStop, running() ? "" : "the run is not running");
    enable(btnCuda, !cudaOk ? src.get("cuda_reason") || "CUDA is not available" : busy ? "an action is running" : "");
    enable(btnExport, busy ? "an action is running" : "");
    const culprit = culpritOf(src.get("summary"));
    enable(btnCulprit, running() ? "wait for the run to end or press Stop" : busy ? "an action is running" : !culprit ? "the run names no culprit" : "");
    btnCuda.textContent = `CUDA: ${onCuda() ? "on" : "off"}`;
    btnCuda.classList.toggle("sbs-on", onCuda());
    reasonEl.textContent = cudaOk ? "" : `CUDA unavailable: ${src.get("cuda_reason") || "no GPU"}`;
    const why = running() ? "wait for the run to end or press Stop" : busy ? "an action is running" : "";
    for (const b of nodeButtons) if (b.isConnected) enable(b, why);
  };
  // Rerun / Save replay, beside the node they act on; only for ONNX node outputs
  const nodeActions = live
    ? (i) => {
        if (!store.isOnnxNode(i) || backed === false) return null;
        nodeButtons.length = 0;
        nodeButtons.push(btn("sbs-btn-rerun", "Rerun in torch", () => act("rerun")), btn("sbs-btn-replay", "Save replay", () => act("save_replay")));
        const bar = h("div", { class: "sbs-node-actions" }, ...nodeButtons);
        queueMicrotask(renderButtons);
        return bar;
      }
    : null;
  const renderAction = () => {
    let a = pending ? { name: pending.name, state: "working", message: "" } : shown;
    // Stop is answered at once, the run ends a node later: then say what it kept
    if (!pending && a && a.name === "stop" && a.state === "done") {
      const st = src.get("status") || {};
      if (st.state === "stopped") a = { ...a, message: `stopped; ${st.rows ?? store.count} rows kept` };
    }
    actionEl.className = "sbs-action";
    if (!a || !a.name) {
      actionEl.textContent = "";
    } else if (a.state === "working") {
      actionEl.classList.add("sbs-working");
      actionEl.textContent = `${a.name}: working…`;
    } else if (a.state === "error") {
      actionEl.classList.add("sbs-failed");
      actionEl.textContent = `${a.name} failed: ${a.message || ""}`;
    } else {
      actionEl.classList.add("sbs-done");
      actionEl.textContent = `${a.name}: ${a.message || "done"}`;
    }
    renderButtons();
  };
  // one of the session's actions (session.py ACTIONS), asked through anywidget's
  // request/response command: "working…" until its answer comes, then the answer
  const act = async (name, extra = {}) => {
    if (!live) return;
    const token = { name };
    pending = token;
    renderAction();
    let answer;
    try {
      // asked again at each click: a kernel that did not answer may have come back
      if (backed !== true && (await checkBacked()) === false) {
        if (pending === token) pending = null;
        shown = { name, state: "error", message: DETACHED };
        renderAction();
        return;
      }
      answer = await src.action({ name, row: selected, ...extra });
    } catch (e) {
      const late = e && (e.name === "TimeoutError" || e.name === "AbortError");
      answer = { name, state: "error", message: late ? "no answer from the kernel (is it running? a saved notebook's view has none)" : String(e) };
    }
    if (pending === token) pending = null;
    shown = answer && typeof answer === "object" ? answer : { name, state: "error", message: "no answer" };
    renderAction();
  };

  const checkBacked = async () => {
    backed = await src.probe();
    renderButtons();
    renderInputs();
    if (backed === false) renderDetail(); // no "loading node detail…" that never loads
    return backed;
  };
  // a run still going in the kernel is live whatever a busy kernel answers; a finished
  // one is asked at once, so a received notebook says so before any click
  if (backed === null && !running()) checkBacked();

  // ---- the parts
  const card = new AnswerCard(store, (i) => select(i, "card"), live);
  const bar = new FilterBar(store, filter);
  const table = new VirtualTable(store, filter, select);
  table.onCount = (n, total) => bar.setCount(n, total);
  const chart = new Chart(store, filter, select);
  const layers = new LayerTree(store, filter, select);
  const detail = new DetailPanel(store, graph, select, nodeActions);
  const renderDetail = () => {
    detail.render(selected, src.get("details"), live && backed !== false);
    card.setDetails(src.get("details"));
    renderButtons();
  };
  filter.subscribe(() => {
    table.refresh();
    chart.update(true);
  });

  const side = h("div", { class: "sbs-side" }, detail.el);
  const left = h("div", { class: "sbs-left" }, chart.picker, chart.el, layers.el, bar.el, table.el);
  const main = h("div", { class: "sbs-main" }, left, side);
  const root = h("div", { class: `sbs-root${live ? " sbs-live" : " sbs-static"}` }, h("style", { text: css }), statusEl, toolbar, card.el, main);
  el.appendChild(root);

  // ---- width: the container's, whatever the window does (JupyterLab side panels)
  let wide = null;
  offs.push(
    onWidth(root, (w) => {
      const isWide = w >= WIDE;
      if (isWide !== wide) {
        wide = isWide;
        root.classList.toggle("sbs-wide", isWide);
        root.classList.toggle("sbs-narrow", !isWide);
      }
      chart.height = isWide ? 320 : 300;
    }),
  );
  offs.push(onWidth(chart.el, (w) => chart.resize(w)));
  offs.push(onWidth(table.el, (w) => table.setWidth(w)));
  offs.push(
    onWidth(side, (w) => {
      if (Math.abs(w - detail.width) > 8) {
        detail.width = w;
        renderDetail();
      }
    }),
  );
  offs.push(watchTheme(() => chart.retheme()));
  if (!live) table.maxHeight = Math.max(360, Math.min(900, (window.innerHeight || 800) - 120));

  // ---- model updates
  offs.push(
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
      renderStatus();
      renderButtons();
    }),
  );
  offs.push(src.on("status", () => (renderStatus(), renderAction(), renderInputs())));
  offs.push(src.on("inputs", renderInputs));
  offs.push(src.on("summary", renderStatus));
  offs.push(src.on("details", renderDetail));
  offs.push(src.on("device", renderButtons));
  offs.push(src.on("cuda_available", renderButtons));
  offs.push(
    src.on("selected", () => {
      const v = src.get("selected");
      if (typeof v === "number" && v !== selected) select(v, "model");
    }),
  );

  bar.collectOps(0);
  bar.sync();
  if (viewState.table) table.restore(viewState.table);
  else table.refresh();
  table.onState = (st) => (viewState.table = st);
  layers.update(true);
  chart.update(true);
  renderStatus();
  renderAction();
  renderInputs();
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
