// Colours come from the page: JupyterLab's CSS variables when they exist (style.css maps
// them onto --sbs-*), else the OS light/dark preference (a standalone report). The chart
// reads the resolved colours here and gets a plotly template for light or dark.

function rgb(str) {
  const m = /rgba?\(\s*([\d.]+)[,\s]+([\d.]+)[,\s]+([\d.]+)(?:[,\s/]+([\d.]+))?/.exec(str || "");
  return m ? { r: +m[1], g: +m[2], b: +m[3], a: m[4] === undefined ? 1 : +m[4] } : null;
}

function css(c, a = c.a) {
  return `rgba(${Math.round(c.r)}, ${Math.round(c.g)}, ${Math.round(c.b)}, ${a})`;
}

function mix(a, b, t) {
  return { r: a.r + (b.r - a.r) * t, g: a.g + (b.g - a.g) * t, b: a.b + (b.b - a.b) * t, a: 1 };
}

/** The colour a CSS expression resolves to under `el`, as {r, g, b, a}. */
function resolve(el, prop, expr) {
  const probe = document.createElement("span");
  probe.style.cssText = `position:absolute;visibility:hidden;${prop}:${expr}`;
  el.appendChild(probe);
  const c = rgb(getComputedStyle(probe)[prop === "color" ? "color" : "backgroundColor"]);
  probe.remove();
  return c;
}

/** The background actually behind `el` (the first ancestor that paints one). */
function background(el) {
  for (let e = el; e && e.nodeType === 1; e = e.parentElement) {
    const c = rgb(getComputedStyle(e).backgroundColor);
    if (c && c.a > 0.5) return c;
  }
  return { r: 255, g: 255, b: 255, a: 1 };
}

export function readTheme(el) {
  const fg = resolve(el, "color", "var(--sbs-fg)") || { r: 31, g: 35, b: 40, a: 1 };
  const bg = background(el);
  const dark = 0.2126 * bg.r + 0.7152 * bg.g + 0.0722 * bg.b < 128;
  const solidFg = mix(bg, fg, fg.a); // text colour as drawn (JupyterLab uses translucent text)
  return {
    dark,
    fg: css(solidFg, 1),
    fg2: css(mix(bg, solidFg, 0.7), 1),
    grid: css(mix(bg, solidFg, dark ? 0.14 : 0.1), 1),
    axis: css(mix(bg, solidFg, 0.35), 1),
    hoverBg: css(bg, 1),
    colors: dark
      ? { err: "#58a6ff", own: "#f0883e", tol: "#56d364", fail: "#ff7b72", sel: "#d2a8ff", zero: "#8b949e" }
      : { err: "#0969da", own: "#d4590b", tol: "#1a7f37", fail: "#cf222e", sel: "#8250df", zero: "#6e7781" },
  };
}

/** Calls `fn` when the page theme changes (JupyterLab theme switch, OS preference). */
export function watchTheme(fn) {
  const offs = [];
  if (typeof MutationObserver === "function" && document.body) {
    const mo = new MutationObserver(() => fn());
    mo.observe(document.body, { attributes: true, attributeFilter: ["data-jp-theme-light", "data-jp-theme-name", "class", "style"] });
    offs.push(() => mo.disconnect());
  }
  if (typeof matchMedia === "function") {
    const mq = matchMedia("(prefers-color-scheme: dark)");
    const cb = () => fn();
    if (mq.addEventListener) {
      mq.addEventListener("change", cb);
      offs.push(() => mq.removeEventListener("change", cb));
    }
  }
  return () => offs.forEach((off) => off());
}
