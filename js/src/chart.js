// Error per record along execution order (log scale), own error, tolerance, failures, and
// the selected point; the measure drawn is picked in a small select (MEASURES). Exact zeros are not a value on a log axis: they sit on their own
// strip under the plot, labelled 0. Clicking a point selects its row: the linking lives
// here, in the browser, so it also works in a saved notebook or a static report.
import Plotly from "plotly.js-basic-dist-min";
import { h, fmtNum, plotlyText } from "./util.js";
import { readTheme } from "./theme.js";

const MARKER_LIMIT = 2000; // above this, lines only (SVG markers get slow)
const THROTTLE_MS = 500;
const ZERO_DOMAIN = [0, 0.07];
const LOG_DOMAIN = [0.13, 1];
const WHOLE_TICKS = { tickmode: "linear", tick0: 0, dtick: 1 };
const AUTO_TICKS = { tickmode: "auto" };

// The measures the chart can draw (record fields; onnx_sbs_nb/compare/measures.py defines them,
// their labels come from the schema). `own`: the field of the own error, `tol`: the atol
// line applies, `value`: what is drawn and `drawn`: its label (1 - cosine: the distance
// from 1 on the log axis), `linear`: a linear axis (dB).
export const MEASURES = [
  { key: "err_abs", own: "err_abs2", tol: true },
  { key: "err_rel", own: "err_rel2" },
  { key: "err_cos", value: (v) => (v === null ? null : 1 - v), drawn: (label) => `1 - ${label}` },
  { key: "err_snr", linear: true },
  { key: "err_l2" },
  { key: "err_p50" },
  { key: "err_p99" },
  { key: "err_ulp" },
];

function prefixed(prefix, obj) {
  return Object.fromEntries(Object.entries(obj).map(([k, v]) => [prefix + k, v]));
}

function series() {
  return { x: [], y: [], customdata: [], text: [] };
}

function push(sr, x, y, text) {
  sr.x.push(x);
  sr.y.push(y);
  sr.customdata.push(x);
  sr.text.push(text);
}

/** A value series with gaps where the value is 0 or missing, and its exact zeros. */
class Line {
  constructor() {
    this.main = series();
    this.zero = series();
    this.broken = false; // a zero came since the last point on the log axis
  }

  add(i, v, text) {
    if (v === null || Number.isNaN(v) || !Number.isFinite(v)) return;
    if (v === 0) {
      push(this.zero, i, 0, text);
      this.broken = true;
      return;
    }
    if (this.broken && this.main.x.length) push(this.main, i - 0.5, null, ""); // a gap, not a slope through zeros
    this.broken = false;
    push(this.main, i, v, text);
  }

  /** The line as drawn on `buckets` columns: per column its lowest and highest point (in
   * order) and a gap where the line breaks. Above a few points per pixel nothing visible
   * changes (every spike stays), and plotly draws a tenth of the points. */
  decimated(buckets) {
    const m = this.main;
    if (m.x.length <= 2 * buckets) return m;
    const x0 = m.x[0];
    const span = Math.max(1, m.x[m.x.length - 1] - x0);
    const out = series();
    let cur = -1;
    let lo = -1;
    let hi = -1;
    let gap = false;
    const flush = () => {
      if (lo >= 0) {
        for (const k of lo === hi ? [lo] : lo < hi ? [lo, hi] : [hi, lo]) {
          push(out, m.x[k], m.y[k], m.text[k]);
          out.customdata[out.customdata.length - 1] = m.customdata[k];
        }
      }
      if (gap) push(out, out.x.length ? out.x[out.x.length - 1] + 0.5 : x0, null, "");
      lo = hi = -1;
      gap = false;
    };
    for (let k = 0; k < m.x.length; k++) {
      const b = Math.floor(((m.x[k] - x0) / span) * (buckets - 1));
      if (b !== cur) {
        flush();
        cur = b;
      }
      const y = m.y[k];
      if (y === null) {
        gap = true;
        continue;
      }
      if (lo < 0 || y < m.y[lo]) lo = k;
      if (hi < 0 || y > m.y[hi]) hi = k;
    }
    flush();
    return out;
  }

  /** The exact zeros as short segments on the 0 line, one per run of consecutive rows
   * (`pad` wide each side: a pixel or more, so a single zero among thousands still
   * shows); thousands of SVG markers would cost seconds, one path costs nothing. */
  zeroRuns(pad) {
    const z = this.zero;
    const out = series();
    for (let k = 0; k < z.x.length; ) {
      let e = k;
      while (e + 1 < z.x.length && z.x[e + 1] === z.x[e] + 1) e += 1;
      push(out, z.x[k] - pad, 0, z.text[k]);
      out.customdata[out.customdata.length - 1] = z.x[k];
      push(out, z.x[e] + pad, 0, z.text[e]);
      out.customdata[out.customdata.length - 1] = z.x[e];
      push(out, z.x[e] + pad, null, "");
      k = e + 1;
    }
    return out;
  }

  /** Points with no neighbour on the log axis: invisible in lines mode, drawn as markers
   * (at most the highest per bucket when there are thousands). */
  isolated(buckets = Infinity) {
    const m = this.main;
    const out = series();
    for (let k = 0; k < m.x.length; k++) {
      if (m.y[k] === null) continue;
      const prev = k > 0 ? m.y[k - 1] : null;
      const next = k + 1 < m.x.length ? m.y[k + 1] : null;
      if (prev === null && next === null) push(out, m.x[k], m.y[k], m.text[k]);
    }
    if (out.x.length <= MARKER_LIMIT) return out;
    const x0 = out.x[0];
    const span = Math.max(1, out.x[out.x.length - 1] - x0);
    const best = new Map();
    out.x.forEach((x, k) => {
      const b = Math.floor(((x - x0) / span) * (buckets - 1));
      if (!best.has(b) || out.y[k] > out.y[best.get(b)]) best.set(b, k);
    });
    const kept = series();
    for (const k of [...best.values()].sort((a, b) => a - b)) push(kept, out.x[k], out.y[k], out.text[k]);
    return kept;
  }
}

export class Chart {
  constructor(store, filter, onSelect) {
    this.store = store;
    this.filter = filter;
    this.onSelect = onSelect;
    this.el = h("div", { class: "sbs-chart" });
    this.selected = -1;
    this.revision = 0;
    this.plotted = false;
    this.width = 800;
    this.xspan = null; // the width of the zoomed x range in nodes; null: every row shown
    // each measure with its label, from the schema
    this.measures = MEASURES.map((m) => {
      const label = store.schema.label(m.key);
      return { ...m, label: m.drawn ? m.drawn(label) : label };
    });
    this.measure = this.measures[0];
    // the measure drawn: a small select the view puts next to the plot
    this.picker = h(
      "select",
      { class: "sbs-chart-measure", title: "measure drawn by the chart" },
      ...this.measures.map((m) => h("option", { value: m.key, text: m.label })),
    );
    this.picker.addEventListener("change", () => this.setMeasure(this.picker.value));
    this._reset();
  }

  /** Draw another measure (a key of MEASURES). */
  setMeasure(key) {
    const m = this.measures.find((x) => x.key === key);
    if (!m || m === this.measure) return;
    this.measure = m;
    this.picker.value = key;
    this.update(true);
  }

  _value(i, key) {
    const v = this.store.num(i, key);
    return this.measure.value && key === this.measure.key ? this.measure.value(v) : v;
  }

  _reset() {
    this.err = new Line();
    this.own = new Line();
    this.tol = { x: [], y: [] };
    this.fail = series();
    this.done = 0;
  }

  _add(from) {
    const st = this.store;
    for (let i = from; i < st.length; i++) {
      if (!this.filter.pass(i)) continue;
      const name = st.userName(i) || st.get(i, "onnx_name") || "?";
      const mod = st.get(i, "ep_module");
      const label = plotlyText(`#${i} ${name}${mod ? ` · ${mod}` : ""}`);
      const op = plotlyText(st.get(i, "onnx_op_type") ?? "");
      const m = this.measure;
      const e = this._value(i, m.key);
      const what = plotlyText(m.label);
      this.err.add(i, e, `${label}<br>${op} · ${what} ${fmtNum(e)}`);
      if (e !== null && Number.isFinite(e) && st.failed(i)) push(this.fail, i, e > 0 || m.linear ? e : 0, `${label}<br>${plotlyText(st.get(i, "status"))} · ${what} ${fmtNum(e)}`);
      if (m.own) {
        const e2 = st.num(i, m.own);
        this.own.add(i, e2, `${label}<br>${op} · own ${what} ${fmtNum(e2)}`);
      }
      const t = m.tol ? st.num(i, "atol") : null;
      if (t !== null && t > 0 && Number.isFinite(t)) {
        this.tol.x.push(i);
        this.tol.y.push(t);
      }
    }
    this.done = st.length;
  }

  _traces(th) {
    const c = th.colors;
    const many = this.err.main.x.length > MARKER_LIMIT;
    const mode = many ? "lines" : "lines+markers";
    const hov = "%{text}<extra></extra>";
    const buckets = Math.max(200, 2 * Math.round(this.width));
    const line = (name, ln, color, extra = {}) => [
      { name, type: "scatter", mode, ...(many ? ln.decimated(buckets) : ln.main), hovertemplate: hov, line: { width: 1.2, color }, marker: { size: 4, color }, connectgaps: false, legendgroup: name, ...extra },
      { name, type: "scatter", mode: "markers", ...(many ? ln.isolated(Math.round(this.width / 3)) : series()), hovertemplate: hov, marker: { size: 4, color }, legendgroup: name, showlegend: false, ...extra },
      many
        ? { name: `${name} = 0`, type: "scatter", mode: "lines", ...ln.zeroRuns(Math.max(0.4, this.store.length / Math.max(1, this.width))), yaxis: "y2", hovertemplate: hov, line: { width: 3, color }, connectgaps: false, legendgroup: name, showlegend: false, ...extra }
        : { name: `${name} = 0`, type: "scatter", mode: "markers", ...ln.zero, yaxis: "y2", hovertemplate: hov, marker: { size: 5, color, symbol: "line-ns-open", line: { width: 1, color } }, legendgroup: name, showlegend: false, ...extra },
    ];
    const ownShown = this.own.main.x.length + this.own.zero.x.length ? {} : { visible: "legendonly" };
    const traces = [
      // every string plotly draws goes through plotlyText: it reads <a>, <br>... as markup
      ...line(this.measure.key === "err_abs" ? "error vs torch" : plotlyText(this.measure.label), this.err, c.err),
      ...line("own error", this.own, c.own, ownShown),
      { name: "atol", type: "scatter", mode: "lines", ...this.tol, hoverinfo: "skip", line: { width: 1, dash: "dot", color: c.tol, shape: "hv" } },
    ];
    // failing points: on the log axis, or on the zero strip when the error is 0
    const f = this.fail;
    const onLog = series();
    const onZero = series();
    const linear = this.measure.linear;
    f.x.forEach((x, k) => push(f.y[k] > 0 || (linear && f.y[k] !== 0) ? onLog : onZero, x, f.y[k], f.text[k]));
    traces.push({ name: "failing", type: "scatter", mode: "markers", ...onLog, hovertemplate: hov, marker: { size: 8, color: c.fail, symbol: "x" }, legendgroup: "failing" });
    traces.push({ name: "failing", type: "scatter", mode: "markers", ...onZero, yaxis: "y2", hovertemplate: hov, marker: { size: 8, color: c.fail, symbol: "x" }, legendgroup: "failing", showlegend: false });
    traces.push({ name: "selected", type: "scatter", mode: "markers", ...this._selectedPoint(), hoverinfo: "skip", showlegend: false, marker: { size: 15, color: "rgba(0,0,0,0)", line: { width: 2, color: c.sel } } });
    return traces;
  }

  /** The ring around the selected row's point (on the zero strip for an exact zero). */
  _selectedPoint() {
    const sel = this.selected;
    const e = sel >= 0 && sel < this.store.length ? this._value(sel, this.measure.key) : null;
    if (e === null || !Number.isFinite(e)) return { x: [], y: [], yaxis: "y" };
    const onAxis = e > 0 || (this.measure.linear && e !== 0);
    return { x: [sel], y: [onAxis ? e : 0], yaxis: onAxis ? "y" : "y2" };
  }

  _layout(th) {
    const narrow = this.width < 640;
    const tiny = this.width < 480; // the plot area keeps >= 300 px: no y title, thin margins
    const axis = { gridcolor: th.grid, linecolor: th.axis, zerolinecolor: th.grid, tickcolor: th.axis, tickfont: { color: th.fg2 }, title: { font: { color: th.fg2, size: 12 } } };
    return {
      width: this.width,
      height: this.height || 320,
      autosize: false,
      // the toolbar stands upright in the right margin: across the top it sat on the legend
      margin: { l: tiny ? 40 : 64, r: tiny ? 26 : 34, t: narrow ? 50 : 30, b: 40 },
      modebar: { orientation: "v", bgcolor: "rgba(0,0,0,0)", color: th.fg2, activecolor: th.fg },
      font: { color: th.fg, size: 11 },
      xaxis: { ...axis, title: { ...axis.title, text: "node (execution order)" }, zeroline: false, nticks: this._nticks(), anchor: "y2", ...(this._wholeTicks() ? WHOLE_TICKS : AUTO_TICKS) },
      yaxis: { ...axis, type: this.measure.linear ? "linear" : "log", domain: LOG_DOMAIN, title: { ...axis.title, text: tiny ? "" : plotlyText(this.measure.label) }, exponentformat: "power", nticks: 6 },
      yaxis2: { ...axis, domain: ZERO_DOMAIN, range: [-1, 1], tickvals: [0], ticktext: ["0"], showgrid: false, zeroline: true, zerolinecolor: th.axis, fixedrange: true },
      // in the top margin, measured from the figure's edge: it never sits on the plot
      legend: { orientation: "h", x: 0, xanchor: "left", yref: "container", y: 1, yanchor: "top", font: { color: th.fg2, size: 11 }, bgcolor: "rgba(0,0,0,0)" },
      hovermode: "closest",
      hoverlabel: { bgcolor: th.hoverBg, bordercolor: th.axis, font: { color: th.fg } },
      datarevision: ++this.revision,
      uirevision: "user", // a zoom survives the redraws of a live run, a resize, a theme
      paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)",
    };
  }

  _nticks() {
    return Math.max(4, Math.floor(this.width / 90));
  }

  /** Ticks on whole nodes: plotly's own go down to 0.5 or 0.2 when fewer nodes than
   * ticks are in view, and there is no node 220.5. */
  _wholeTicks() {
    return (this.xspan ?? this.store.length) < this._nticks();
  }

  /** The user zoomed, panned or reset the x axis: ticks on whole nodes if needed. */
  _zoomed(ev) {
    if (!ev) return;
    const whole = this._wholeTicks();
    if (ev["xaxis.autorange"]) this.xspan = null;
    else if ("xaxis.range[0]" in ev && "xaxis.range[1]" in ev) this.xspan = Math.abs(ev["xaxis.range[1]"] - ev["xaxis.range[0]"]);
    else if (Array.isArray(ev["xaxis.range"])) this.xspan = Math.abs(ev["xaxis.range"][1] - ev["xaxis.range"][0]);
    else return;
    if (this._wholeTicks() !== whole) Plotly.relayout(this.el, prefixed("xaxis.", this._wholeTicks() ? WHOLE_TICKS : AUTO_TICKS));
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

  /** The container's width changed: lay the plot out again. */
  resize(width) {
    if (Math.abs(width - this.width) < 2) return;
    this.width = width;
    if (this.plotted) this.update(false);
  }

  /** The page theme changed. */
  retheme() {
    if (this.plotted) this.update(false);
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
    const th = readTheme(this.el);
    // the width is the container's (measured by the view), not the window's
    const w = Math.round(this.el.getBoundingClientRect().width);
    if (w > 0) this.width = w;
    Plotly.react(this.el, this._traces(th), this._layout(th), { displaylogo: false, responsive: false, modeBarButtonsToRemove: ["lasso2d", "select2d"] });
    if (!this.plotted) {
      this.plotted = true;
      this.el.on("plotly_click", (ev) => {
        const p = ev && ev.points && ev.points[0];
        if (p && typeof p.customdata === "number") this.onSelect(p.customdata, "chart");
      });
      this.el.on("plotly_relayout", (ev) => this._zoomed(ev));
    }
  }

  /** Move the ring at once (a click must answer now): only that trace is redrawn. */
  setSelected(i) {
    this.selected = i;
    if (!this.plotted || this._timer || !this.el.data) {
      this.update(false);
      return;
    }
    const p = this._selectedPoint();
    Plotly.restyle(this.el, { x: [p.x], y: [p.y], yaxis: [p.yaxis] }, [this.el.data.length - 1]);
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
