// Lays out the view and links its parts. `src` abstracts where the state lives: a live
// anywidget model (index.js `render`) or a plain object (index.js `renderStatic`).
import css from "./style.css";
import { h, fmtNum, fmtTime } from "./util.js";
import { VirtualTable } from "./table.js";
import { Chart } from "./chart.js";
import { DetailPanel } from "./detail.js";

const NO_KERNEL = "actions need a running kernel (this is a saved or static view)";

export function mount(el, src) {
  const offs = [];
  const store = src.store;
  let selected = typeof src.get("selected") === "number" ? src.get("selected") : -1;
  let pending = null; // {name, seq}: an action clicked whose result has not arrived
  let seq = 0;

  const select = (i, source) => {
    if (typeof i !== "number" || i < -1 || i >= store.length || (i >= 0 && !store.has(i))) return;
    const changed = i !== selected;
    selected = i;
    table.setSelected(i, source !== "table");
    chart.setSelected(i);
    renderDetail();
    renderButtons();
    if (changed && source !== "model") src.setSelected(i);
  };

  // ---- status line
  const statusEl = h("div", { class: "sbs-status" });
  const renderStatus = () => {
    const st = src.get("status") || {};
    const sm = src.get("summary") || null;
    const state = st.state || (st.finished ? "finished" : "idle");
    const parts = [h("span", { class: `sbs-badge sbs-${state}`, text: state })];
    if (st.total_onnx_nodes) parts.push(h("span", { class: "sbs-progress", text: `${st.done_onnx_nodes ?? 0}/${st.total_onnx_nodes} ONNX nodes` }));
    parts.push(h("span", { class: "sbs-nrows", text: `${store.count} records` }));
    if (st.elapsed) parts.push(h("span", { text: fmtTime(st.elapsed) }));
    if (st.max_err_abs) parts.push(h("span", { text: `worst ${fmtNum(st.max_err_abs)}${st.max_err_name ? ` at ${st.max_err_name}` : ""}` }));
    parts.push(h("span", { class: st.failures ? "sbs-error" : "", text: `${st.failures ?? 0} failing` }));
    if (st.finished || state === "finished" || state === "stopped") parts.push(answer(sm, state === "stopped"));
    statusEl.replaceChildren(...parts.filter(Boolean));
    if (st.error) statusEl.appendChild(h("details", { class: "sbs-error" }, h("summary", { text: "the run raised an exception" }), h("pre", { class: "sbs-pre", text: st.error })));
  };
  const answer = (sm, partial) => {
    const pick = (key, label) => {
      const entry = sm && sm[key];
      if (!entry) return null;
      const i = typeof entry === "string" ? store.find({ onnx_name: entry }) : store.find(entry);
      const name = typeof entry === "string" ? entry : entry.onnx_name || entry.ep_name || (i >= 0 ? store.label(i) : "?");
      return h("span", { class: "sbs-answer" }, `${label}: `, h("button", { class: "sbs-link", title: "select this node", onclick: () => select(i, "link"), disabled: i < 0 }, String(name)));
    };
    // the summary says how it chose the node: only a rerun on torch inputs proves it
    const rule = sm && sm.first_own_failure_rule;
    const ownLabel = !rule || rule === "rerun" ? "first node whose own error fails" : `first suspect (rule: ${rule})`;
    return pick("first_own_failure", ownLabel) || pick("first_failure", "first failing node") || (sm ? h("span", { class: "sbs-answer", text: partial ? "stopped early: every pair compared so far is within tolerance" : "every compared pair is within tolerance" }) : null);
  };

  // ---- buttons
  const live = !!src.live;
  const onCuda = () => String(src.get("device") || "").startsWith("cuda");
  const btnStop = h("button", { class: "sbs-btn-stop", onclick: () => act("stop") }, "Stop");
  const btnRerun = h("button", { class: "sbs-btn-rerun", onclick: () => act("rerun") }, "Rerun in torch");
  const btnCuda = h("button", { class: "sbs-btn-cuda", onclick: () => act("device", { device: onCuda() ? "cpu" : "cuda" }) }, "CUDA");
  const btnReplay = h("button", { class: "sbs-btn-replay", onclick: () => act("save_replay") }, "Save replay");
  const reasonEl = h("span", { class: "sbs-reason" });
  const actionEl = h("span", { class: "sbs-action" });
  const toolbar = h("div", { class: "sbs-toolbar" }, btnStop, btnRerun, btnCuda, btnReplay, reasonEl, actionEl);
  const enable = (btn, why) => {
    btn.disabled = !!why;
    btn.title = why || "";
  };
  const renderButtons = () => {
    const st = src.get("status") || {};
    const running = st.state === "running";
    const busy = pending !== null;
    const cudaOk = !!src.get("cuda_available");
    const nodeWhy = !live ? NO_KERNEL : running ? "wait for the run to end or press Stop" : selected < 0 ? "select a row first" : !store.isOnnxNode(selected) ? "the selected row is not the output of an ONNX node" : busy ? "an action is running" : "";
    enable(btnStop, !live ? NO_KERNEL : running ? "" : "the run is not running");
    enable(btnRerun, nodeWhy);
    enable(btnReplay, nodeWhy);
    const cudaWhy = !live ? NO_KERNEL : !cudaOk ? src.get("cuda_reason") || "CUDA is not available" : busy ? "an action is running" : "";
    enable(btnCuda, cudaWhy);
    const on = onCuda();
    btnCuda.textContent = `CUDA: ${on ? "on" : "off"}`;
    btnCuda.classList.toggle("sbs-on", on);
    reasonEl.textContent = live && !cudaOk ? `CUDA unavailable: ${src.get("cuda_reason") || "no GPU"}` : live ? "" : NO_KERNEL;
  };
  const renderAction = () => {
    const a = src.get("action") || {};
    if (pending && a.seq === pending.seq && a.state !== "working") pending = null;
    const showing = pending && a.seq !== pending.seq ? { name: pending.name, state: "working", message: "" } : a;
    actionEl.className = "sbs-action";
    if (!showing || !showing.name) {
      actionEl.textContent = "";
    } else if (showing.state === "working") {
      actionEl.classList.add("sbs-working");
      actionEl.textContent = `${showing.name}: working…`;
    } else if (showing.state === "error") {
      actionEl.classList.add("sbs-failed");
      actionEl.textContent = `${showing.name} failed: ${showing.message || ""}`;
    } else {
      actionEl.classList.add("sbs-done");
      actionEl.textContent = `${showing.name}: ${showing.message || "done"}`;
    }
    renderButtons();
  };
  const act = (name, extra = {}) => {
    if (!live) return;
    seq += 1;
    pending = { name, seq: `${Date.now()}-${seq}` };
    src.send({ type: "action", name, row: selected, seq: pending.seq, ...extra });
    renderAction();
  };

  // ---- table, chart, detail
  const table = new VirtualTable(store, select);
  const chart = new Chart(store, select);
  const detail = new DetailPanel(store);
  const renderDetail = () => detail.render(selected, src.get("details"), live);

  const root = h(
    "div",
    { class: "sbs-root" },
    h("style", { text: css }),
    statusEl,
    toolbar,
    h("div", { class: "sbs-main" }, h("div", { class: "sbs-left" }, chart.el, table.el), detail.el),
  );
  el.appendChild(root);

  // ---- model updates
  offs.push(
    src.onRows((kind, from) => {
      if (kind === "append") table.appended(from);
      else {
        table.invalidate();
        table.refresh();
      }
      chart.update(kind !== "append");
      renderStatus();
      renderButtons();
    }),
  );
  offs.push(src.on("status", () => (renderStatus(), renderButtons())));
  offs.push(src.on("summary", renderStatus));
  offs.push(src.on("details", renderDetail));
  offs.push(src.on("action", renderAction));
  offs.push(src.on("device", renderButtons));
  offs.push(src.on("cuda_available", renderButtons));
  offs.push(
    src.on("selected", () => {
      const v = src.get("selected");
      if (typeof v === "number" && v !== selected) select(v, "model");
    }),
  );

  const viewState = src.viewState || {};
  if (viewState.table) table.restore(viewState.table);
  else table.refresh();
  table.onState = (st) => (viewState.table = st);
  chart.update(true);
  renderStatus();
  renderAction();
  if (selected >= 0) select(selected, "model");
  else renderDetail();
  if (live) src.requestMissing();

  return {
    root,
    table,
    chart,
    select,
    destroy() {
      for (const off of offs) off && off();
      chart.destroy();
      root.remove();
    },
  };
}
