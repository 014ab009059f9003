// Small helpers shared by the views. Every string that comes from the model (node names,
// targets, messages) is untrusted: it only ever reaches the DOM through textContent.

const SVG_NS = "http://www.w3.org/2000/svg";

function setAttrs(e, attrs) {
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.setAttribute("class", v);
    else if (k === "text") e.textContent = String(v);
    else if (k === "style") e.style.cssText = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
}

function append(e, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    e.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
  }
  return e;
}

/** Create an element; `text` goes through textContent, never innerHTML. */
export function h(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  setAttrs(e, attrs);
  return append(e, children);
}

/** Create an SVG element (same conventions as `h`). */
export function s(tag, attrs = {}, ...children) {
  const e = document.createElementNS(SVG_NS, tag);
  setAttrs(e, attrs);
  return append(e, children);
}

/** Numbers arrive as JSON numbers, or as "nan"/"inf"/"-inf" strings (JSON has none). */
export function num(v) {
  if (v === null || v === undefined || v === "") return null;
  if (typeof v === "number") return v;
  if (v === "nan") return NaN;
  if (v === "inf") return Infinity;
  if (v === "-inf") return -Infinity;
  const x = Number(v);
  return Number.isNaN(x) ? null : x;
}

export function fmtNum(v) {
  const x = num(v);
  if (x === null) return "";
  if (Number.isNaN(x)) return "nan";
  if (!Number.isFinite(x)) return x > 0 ? "inf" : "-inf";
  if (x === 0) return "0";
  const a = Math.abs(x);
  if (a >= 1e-3 && a < 1e5) return String(Number(x.toPrecision(4)));
  return x.toExponential(2);
}

export function fmtTime(sec) {
  const x = num(sec);
  if (x === null) return "";
  if (x < 60) return `${x.toFixed(1)} s`;
  return `${Math.floor(x / 60)} min ${Math.round(x % 60)} s`;
}

/** Escape for plotly text, which parses a few HTML-like tags: the names must show as text. */
export function plotlyText(str) {
  return String(str ?? "")
    .replace(/&/g, "&amp;")
    .replace(/</g, "&lt;")
    .replace(/>/g, "&gt;");
}

/** Column accessors over the row arrays, by field name. */
export function columnIndex(columns) {
  const ci = {};
  (columns || []).forEach((c, i) => (ci[c] = i));
  return ci;
}

/** Calls `fn(width)` when the element's width changes (container width, not window). */
export function onWidth(el, fn) {
  let last = -1;
  let raf = null;
  let width = 0;
  const check = () => {
    raf = null;
    const w = Math.round(width);
    if (w > 0 && w !== last) {
      last = w;
      fn(w);
    }
  };
  if (typeof ResizeObserver === "function") {
    // the observer's own measure: reading the layout here would force it on every change
    const ro = new ResizeObserver((entries) => {
      const box = entries[entries.length - 1].borderBoxSize;
      width = box && box[0] ? box[0].inlineSize : entries[entries.length - 1].contentRect.width;
      if (raf === null) raf = requestAnimationFrame(check);
    });
    ro.observe(el);
    return () => ro.disconnect();
  }
  const t = setInterval(() => {
    width = el.getBoundingClientRect().width;
    check();
  }, 500);
  return () => clearInterval(t);
}
