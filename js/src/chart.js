// Error per record along execution order (log scale), own error, tolerance, failures, and
// the selected point. Clicking a point selects its row: the linking lives here, in the
// browser, so it also works in a saved notebook or a static report.
import Plotly from "plotly.js-basic-dist-min";
import { h, fmtNum, plotlyText } from "./util.js";

const FLOOR = 1e-12; // where exact zeros sit on the log axis (hover shows the true value)
const MARKER_LIMIT = 2000; // above this, lines only (SVG markers get slow)
const THROTTLE_MS = 500;

function series() {
  return { x: [], y: [], customdata: [], text: [] };
}

export class Chart {
  constructor(store, onSelect) {
    this.store = store;
    this.onSelect = onSelect;
    this.el = h("div", { class: "sbs-chart" });
    this.selected = -1;
    this.revision = 0;
    this.plotted = false;
    this._reset();
  }

  _reset() {
    this.err = series();
    this.own = series();
    this.tol = { x: [], y: [] };
    this.fail = series();
    this.done = 0;
  }

  _add(from) {
    const s = this.store;
    for (let i = from; i < s.length; i++) {
      if (!s.has(i)) continue;
      const label = plotlyText(`${s.get(i, "ep_name") ?? "?"} / ${s.get(i, "onnx_name") ?? "?"}`);
      const op = plotlyText(s.get(i, "onnx_op_type") ?? "");
      const e = s.num(i, "err_abs");
      if (e !== null && !Number.isNaN(e)) {
        const y = e > 0 ? e : FLOOR;
        this.err.x.push(i);
        this.err.y.push(y);
        this.err.customdata.push(i);
        this.err.text.push(`#${i} ${label}<br>op ${op} · err ${fmtNum(e)}`);
        if (s.failed(i)) {
          this.fail.x.push(i);
          this.fail.y.push(y);
          this.fail.customdata.push(i);
          this.fail.text.push(`#${i} ${label}<br>${plotlyText(s.get(i, "status"))} · err ${fmtNum(e)}`);
        }
      }
      const e2 = s.num(i, "err_abs2");
      if (e2 !== null && !Number.isNaN(e2)) {
        this.own.x.push(i);
        this.own.y.push(e2 > 0 ? e2 : FLOOR);
        this.own.customdata.push(i);
        this.own.text.push(`#${i} ${label}<br>op ${op} · own err ${fmtNum(e2)}`);
      }
      const t = s.num(i, "atol");
      if (t !== null && t > 0 && Number.isFinite(t)) {
        this.tol.x.push(i);
        this.tol.y.push(t);
      }
    }
    this.done = s.length;
  }

  _traces() {
    const many = this.err.x.length > MARKER_LIMIT;
    const mode = many ? "lines" : "lines+markers";
    const hov = "%{text}<extra></extra>";
    const traces = [
      { name: "error vs torch", type: "scatter", mode, ...this.err, hovertemplate: hov, line: { width: 1, color: "#1f77b4" }, marker: { size: 4 } },
      { name: "own error", type: "scatter", mode, ...this.own, hovertemplate: hov, line: { width: 1, color: "#ff7f0e" }, marker: { size: 4 }, visible: this.own.x.length ? true : "legendonly" },
      { name: "atol", type: "scatter", mode: "lines", ...this.tol, hoverinfo: "skip", line: { width: 1, dash: "dot", color: "#2ca02c", shape: "hv" } },
      { name: "failing", type: "scatter", mode: "markers", ...this.fail, hovertemplate: hov, marker: { size: 7, color: "#d62728", symbol: "x" } },
    ];
    const sel = this.selected;
    const sx = [];
    const sy = [];
    if (sel >= 0 && sel < this.store.length) {
      const e = this.store.num(sel, "err_abs");
      if (e !== null && !Number.isNaN(e)) {
        sx.push(sel);
        sy.push(e > 0 ? e : FLOOR);
      }
    }
    traces.push({ name: "selected", type: "scatter", mode: "markers", x: sx, y: sy, hoverinfo: "skip", showlegend: false, marker: { size: 15, color: "rgba(0,0,0,0)", line: { width: 2, color: "#9467bd" } } });
    return traces;
  }

  _layout() {
    return {
      height: 260,
      margin: { l: 60, r: 10, t: 24, b: 36 },
      xaxis: { title: { text: "record (execution order)" }, zeroline: false },
      yaxis: { type: "log", title: { text: "abs error" }, exponentformat: "e" },
      legend: { orientation: "h", y: 1.12 },
      hovermode: "closest",
      datarevision: ++this.revision,
      paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)",
    };
  }

  /** Bring the plot up to date with the store, at most every THROTTLE_MS. */
  update(full) {
    if (full) this._reset();
    if (this._timer) return;
    const wait = this._last ? Math.max(0, THROTTLE_MS - (Date.now() - this._last)) : 0;
    this._timer = setTimeout(() => {
      this._timer = null;
      this._draw();
    }, wait);
  }

  _draw() {
    if (!this.el.isConnected) {
      // plotly measures its container: wait until the view is attached
      this._timer = setTimeout(() => {
        this._timer = null;
        this._draw();
      }, 50);
      return;
    }
    this._last = Date.now();
    this._add(this.done);
    Plotly.react(this.el, this._traces(), this._layout(), { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["lasso2d", "select2d"] });
    if (!this.plotted) {
      this.plotted = true;
      this.el.on("plotly_click", (ev) => {
        const p = ev && ev.points && ev.points[0];
        if (p && typeof p.customdata === "number") this.onSelect(p.customdata, "chart");
      });
    }
  }

  setSelected(i) {
    this.selected = i;
    this.update(false);
  }

  destroy() {
    clearTimeout(this._timer);
    this._timer = null;
    try {
      Plotly.purge(this.el);
    } catch (e) {
      /* already gone */
    }
  }
}
