/**
 * onnx_sbs_nb front end: one ES module used two ways.
 *
 *   export default { render }        anywidget entry (SbsWidget, live kernel)
 *   export function renderStatic(el, state)   no kernel, no network: HTML reports and the
 *                                    notebook-to-HTML export inline this bundle and call it
 *
 * STATE SCHEMA — the widget's synced traits (onnx_sbs_nb/widget.py STATE_TRAITS); a static
 * `state` is a plain object with the same keys and values
 * (`onnx_sbs_nb.widget.widget_state(records, ...)` builds it):
 *   columns        string[]    Record field names (onnx_sbs_nb.records.RECORD_FIELDS), the
 *                              order of the values in each row
 *   rows           any[][]     one array per Record (Record.to_dict() values in `columns`
 *                              order; NaN/inf as the strings "nan"/"inf"/"-inf"); row index
 *                              = position in the stream = row id used everywhere below
 *   status         object      RunStatus fields (total_onnx_nodes, done_onnx_nodes, records,
 *                              failures, errors, max_err_abs, max_err_name, elapsed,
 *                              finished, stopped, current) + state ("idle"|"running"|
 *                              "finished"|"stopped"|"error"), error (traceback|null),
 *                              rows (count), device
 *   summary        object|null onnx_sbs_nb.summary Summary.to_dict() (first_own_failure,
 *                              first_failure, top_suspects, totals, ...), null while running
 *   atol, rtol     number|null tolerances the user gave (null: dtype-aware defaults)
 *   selected       number      selected row index, -1 for none
 *   details        object      {row, node: run.node_detail(...)|null, node_error, rerun:
 *                              actions.rerun_in_torch(...)|null, replay: {bundle, config}|null} for
 *                              the selected row (kept so a saved notebook shows it)
 *   action         object      last action {name, seq, state: "working"|"done"|"error",
 *                              message}
 *   device         string      "cpu" | "cuda": where actions and a new run execute
 *   cuda_available boolean, cuda_reason string (why the CUDA toggle is disabled)
 *
 *   uid            string      (live widget only) identifies the model across its views
 *
 * Messages (live only). Browser -> kernel: {type: "hello", have: n} (send rows from n on),
 * {type: "action", name: "stop"|"rerun"|"save_replay"|"device", row, seq, device?}.
 * Kernel -> browser: {type: "rows", start: n, rows: [...]} appended batches while running;
 * the full `rows` trait is synced once when the run ends.
 */
import { mount } from "./app.js";
import { RowStore } from "./rows.js";
import { feedFor, dropFeed } from "./live.js";

function modelSource(model) {
  const feed = feedFor(model);
  return {
    live: true,
    store: feed.store,
    viewState: feed.viewState,
    onRows: (cb) => feed.subscribe(cb),
    requestMissing: () => feed.requestMissing(),
    get: (k) => model.get(k),
    on(k, cb) {
      model.on(`change:${k}`, cb);
      return () => model.off(`change:${k}`, cb);
    },
    send: (msg) => model.send(msg),
    setSelected(i) {
      model.set("selected", i);
      model.save_changes();
    },
  };
}

function staticSource(state) {
  const s = { ...(state || {}) };
  const listeners = {};
  return {
    live: false,
    store: new RowStore(s.columns, s.rows),
    onRows: () => () => {},
    requestMissing: () => {},
    get: (k) => s[k],
    on(k, cb) {
      (listeners[k] ||= []).push(cb);
      return () => (listeners[k] = listeners[k].filter((f) => f !== cb));
    },
    send: () => {},
    setSelected(i) {
      s.selected = i;
    },
  };
}

// Listen from the moment the model exists, before any view renders: the run may already
// be streaming rows (an in-cell run keeps the kernel busy, so what is missed now can
// only be asked for again once the cell ends).
function initialize({ model }) {
  feedFor(model);
  return () => dropFeed(model);
}

function render({ model, el }) {
  const view = mount(el, modelSource(model));
  return () => view.destroy();
}

/** Render a saved state (same keys as the widget traits) into `el`, with no kernel.
 * Whatever `el` held (e.g. a static fallback) is replaced. */
export function renderStatic(el, state) {
  el.replaceChildren();
  return mount(el, staticSource(state));
}

export default { initialize, render };
