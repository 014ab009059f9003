/**
 * onnx_sbs_nb front end: one ES module used two ways.
 *
 *   export default { render }        anywidget entry (SbsWidget, live kernel)
 *   export function renderStatic(el, state)   no kernel, no network: HTML reports and the
 *                                    notebook-to-HTML export inline this bundle and call it
 *
 * STATE SCHEMA — the widget's synced traits (onnx_sbs_nb/reports/view_state.py STATE_TRAITS); a
 * static `state` is a plain object with the same keys and values
 * (`onnx_sbs_nb.reports.view_state.widget_state(records, ...)` builds it):
 *   schema         object      the record schema, declared once in onnx_sbs_nb/records.py
 *                              (schema_dict()): {fields: [{name, label, short, fmt,
 *                              priority, width}], statuses: [{name, label, failing, tone,
 *                              compared, own, judged_elsewhere, group, doc}]}; typed in
 *                              schema.js (SchemaState, WidgetState). Labels, columns,
 *                              the failing filter and colours all derive from it
 *   columns        string[]    Record field names (onnx_sbs_nb.records.RECORD_FIELDS);
 *                              fields a newer engine adds (ep_user_name, ep_module,
 *                              ep_source, onnx_fx_node, ...) may be absent in old states
 *   rows           object      the records as columns: {n, data: [one encoded column per
 *                              `columns` entry]}, a column being a plain array, {c: value}
 *                              (all equal) or {d: distinct values, k: codes}; values are
 *                              JSON scalars, NaN/inf as "nan"/"inf"/"-inf". Row index =
 *                              position in the stream = row id everywhere below. (States
 *                              of the first releases: one array per row, also read.)
 *   graph          object      {values: ONNX value names, op: encoded column of the op of
 *                              each value's producer, parents: flat [count, value index...]
 *                              per value} or {} (no model): the neighbourhood view
 *   status         object      RunStatus fields (total_onnx_nodes, done_onnx_nodes, records,
 *                              failures, errors, max_err_abs, max_err_name, elapsed,
 *                              finished, stopped, current) + state ("idle"|"running"|
 *                              "finished"|"stopped"|"error"), error (traceback|null),
 *                              rows (count), device
 *   summary        object|null onnx_sbs_nb.align.blame.summary Summary.to_dict(): verdict
 *                              ("pass"|"fail"|"stopped"|"incomplete"), culprit ({ep_name,
 *                              ep_user_name, ep_module, ep_source, onnx_node, onnx_op_type,
 *                              onnx_nodes, own_error, atol, rtol, why, rule, step, kind}
 *                              or null), totals, top_suspects, ...; null while running
 *   atol, rtol     number|null tolerances the user gave (null: dtype-aware defaults)
 *   selected       number      selected row index, -1 for none
 *   details        object      {row, node: run.node_detail(...)|null, node_error, rerun:
 *                              actions.rerun_in_torch(...)|null, replay: {bundle, config}|null} for
 *                              the selected row (kept so a saved notebook shows it)
 *   device         string      "cpu" | "cuda": where actions and a new run execute
 *   cuda_available boolean, cuda_reason string (why the CUDA toggle is disabled)
 *   actions        object[]    the session's action table (onnx_sbs_nb/notebook/session.py ACTIONS,
 *                              action_table()), in order: {name, label, button (the
 *                              button's class sbs-btn-<button>), needs_node (beside the
 *                              selected ONNX node, else in the toolbar), when ("any"|
 *                              "running"|"ended"), needs (""|"cuda"|"culprit"), toggle
 *                              (""|a trait it flips and sends, "device"), doc, shows};
 *                              [] in a report (no kernel: no buttons; a static view shows
 *                              none whatever it holds)
 *   timeline       object|null a run's two sides step by step (Run.timeline(), onnx_sbs_nb/
 *                              align/generation_timeline.py; null for the kinds with none):
 *                              {unit, sides: [{name, tokens: [row][step] ids, text: [row]
 *                              [step] decoded strings|null}], steps: [{step, agree,
 *                              parted_by, err_abs, err_rel, passed, margin, cache_err_abs,
 *                              cache_passed, cache_worst}], parted_at, parted_by, margin,
 *                              err_abs, own_err_abs, own_passed, atol, rtol, why,
 *                              records_step (the step the records compare node by node, or
 *                              null), records, decode_error}; drawn by streams.js
 *
 *   inputs         object|null (live widget only) a run over many inputs: {total, done,
 *                              failing: [input index], names: [file name|null], shown:
 *                              index|null}; the toolbar's picker sets `shown` and the
 *                              kernel syncs that input's records as `rows` (null: the
 *                              worst over all inputs)
 *   uid            string      (live widget only) identifies the model across its views;
 *                              the static summary shown next to the widget (a separate
 *                              output, for viewers without widgets) carries the class
 *                              `sbs-for-<uid>` and is hidden once a view renders
 *
 * Messages (live only). Browser -> kernel: {type: "hello", have: n} (send rows from n on).
 * Kernel -> browser: {type: "rows", start: n, rows: {n, data}} appended batches while
 * running; the full `rows` trait is synced once when the run ends.
 * Actions (live only): anywidget's request/response command "action" (experimental.invoke),
 * request {name: one of the `actions` table's names, row: the selected row, <toggle>: the
 * value a switch sends (device: "cpu"|"cuda")}, answer {name, state: "done"|"error",
 * message}; the widget looks the name up in the session's table (session.py ACTIONS) and
 * runs it (an unknown name: state "error", message "unknown action ...").
 */
import { mount } from "./app.js";
import { RowStore } from "./rows.js";
import { feedFor, dropFeed } from "./live.js";

// How long the browser waits for an action's answer: a rerun on a large model takes a while.
const ACTION_TIMEOUT_MS = 10 * 60 * 1000;
// How long a view waits for the kernel's answer to "is a run behind you?" (the "ping"
// command): a live widget answers at once, a view drawn from a saved notebook never does.
export const PROBE_TIMEOUT_MS = 8000;

function modelSource(model, experimental) {
  const feed = feedFor(model);
  const invoke = experimental && typeof experimental.invoke === "function" ? experimental.invoke : null;
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
    /** Whether a run in the kernel backs this model: true once the kernel answered the
     * "ping" command, false when it did not in PROBE_TIMEOUT_MS (a view drawn from a saved
     * notebook's widget state: no object in the kernel answers it), null when this front
     * end cannot ask (no commands: what syncs through the model, the input picker, still
     * works). Kept per model. */
    async probe() {
      if (feed.backed === true) return true;
      if (!invoke) return null;
      try {
        const [answer] = await invoke("ping", {}, { signal: AbortSignal.timeout(PROBE_TIMEOUT_MS) });
        feed.backed = !!(answer && answer.live);
      } catch (e) {
        feed.backed = false;
      }
      return feed.backed;
    },
    /** One of the session's actions (onnx_sbs_nb/notebook/session.py ACTIONS) through anywidget's
     * request/response command "action": resolves to {name, state, message}. */
    async action(request) {
      if (!invoke) return { name: request.name, state: "error", message: "this front end cannot call the kernel (anywidget >= 0.9 is needed)" };
      const [answer] = await invoke("action", request, { signal: AbortSignal.timeout(ACTION_TIMEOUT_MS) });
      return answer;
    },
    setSelected(i) {
      model.set("selected", i);
      model.save_changes();
    },
    /** A run over many inputs: the input the views show ({..., shown: index|null}). */
    setInputs(v) {
      model.set("inputs", v);
      model.save_changes();
    },
  };
}

function staticSource(state) {
  const s = { ...(state || {}) };
  const listeners = {};
  return {
    live: false,
    store: new RowStore(s.columns, s.rows, s.schema),
    onRows: () => () => {},
    requestMissing: () => {},
    get: (k) => s[k],
    on(k, cb) {
      (listeners[k] ||= []).push(cb);
      return () => (listeners[k] = listeners[k].filter((f) => f !== cb));
    },
    send: () => {},
    action: async (request) => ({ name: request.name, state: "error", message: "a static view has no kernel" }),
    setSelected(i) {
      s.selected = i;
    },
    setInputs() {},
  };
}

// Listen from the moment the model exists, before any view renders: the run may already
// be streaming rows (an in-cell run keeps the kernel busy, so what is missed now can
// only be asked for again once the cell ends).
function initialize({ model }) {
  feedFor(model);
  return () => dropFeed(model);
}

// The static summary displayed next to the widget is for viewers that cannot show it:
// where the view renders, it is redundant.
function hideFallbacks(model) {
  const uid = model.get("uid");
  if (!uid || !/^[0-9a-f]+$/.test(uid)) return;
  const id = `sbs-hide-${uid}`;
  if (!document.getElementById(id)) {
    // a rule, not only a style: JupyterLab re-creates the output when it is updated
    const rule = document.createElement("style");
    rule.id = id;
    rule.textContent = `.jp-OutputArea-child:has(.sbs-for-${uid}), .output_area:has(.sbs-for-${uid}) { display: none; }`;
    document.head.appendChild(rule);
  }
  for (const e of document.querySelectorAll(`.sbs-for-${uid}`)) {
    const box = e.closest(".jp-OutputArea-child") || e.closest(".output_area") || e;
    box.style.display = "none";
  }
}

function render({ model, el, experimental }) {
  const view = mount(el, modelSource(model, experimental));
  hideFallbacks(model);
  requestAnimationFrame(() => hideFallbacks(model)); // displayed after the widget output
  return () => view.destroy();
}

/** Render a saved state (same keys as the widget traits) into `el`, with no kernel.
 * Whatever `el` held (e.g. a static fallback) is replaced. */
export function renderStatic(el, state) {
  el.replaceChildren();
  return mount(el, staticSource(state));
}

const entry = { initialize, render };

// One copy of this bundle per notebook: the first SbsWidget carries it, later ones carry a
// few lines (onnx_sbs_nb.reports.view_state.SHIM_ESM) that wait here for it to be loaded.
const shared = (globalThis.__onnxSbsNb ||= { waiters: [] });
shared.module = { default: entry, renderStatic };
for (const resolve of shared.waiters.splice(0)) resolve(shared.module);

export default entry;
