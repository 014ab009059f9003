"""Debian's Chromium for the browser tests (Playwright's own browser downloads do not work)."""

from __future__ import annotations

import os

CHROMIUM = os.environ.get("SBS_CHROMIUM", "/usr/bin/chromium")
# Without the background-networking flags Chromium keeps dialing out through a closed network.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def launch(playwright, **kwargs):
    """A headless Chromium browser from a sync Playwright instance."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, **kwargs)


# Measures one widget view (its .sbs-root element) for the layout assertions.
GEOMETRY_JS = """(root) => {
  const r = (e) => (e ? e.getBoundingClientRect().toJSON() : null);
  const vp = root.querySelector('.sbs-viewport');
  const heads = {};
  for (const th of root.querySelectorAll('.sbs-th')) heads[th.textContent.replace(/ [▲▼]$/, '')] = r(th);
  const rows = [...root.querySelectorAll('.sbs-tr')]
    .filter((t) => t.style.display !== 'none')
    .sort((a, b) => a.getBoundingClientRect().top - b.getBoundingClientRect().top);
  const drags = [...root.querySelectorAll('.sbs-chart .nsewdrag')].map(r);
  drags.sort((a, b) => b.width * b.height - a.width * a.height);
  const style = (sel, prop) => { const e = root.querySelector(sel); return e ? getComputedStyle(e)[prop] : null; };
  const attr = (sel, a) => { const e = root.querySelector(sel); return e ? (e.getAttribute(a) || getComputedStyle(e)[a]) : null; };
  const R = vp.getBoundingClientRect();
  const wider = [...vp.querySelectorAll('*')]
    .filter((e) => getComputedStyle(e).display !== 'none' && e.getBoundingClientRect().right > R.right + 0.5)
    .slice(0, 4).map((e) => `${e.className}: +${Math.round(e.getBoundingClientRect().right - R.right)} px`);
  return {
    root: r(root), viewport: r(vp), hscroll: vp.scrollWidth - vp.clientWidth, heads, wider,
    template: root.querySelector('.sbs-thead').style.gridTemplateColumns, clientWidth: vp.clientWidth,
    firstKinds: rows.slice(0, 8).map((t) => t.dataset.kind),
    plot: drags[0] || null, chart: r(root.querySelector('.sbs-chart')),
    filters: r(root.querySelector('.sbs-filters')), detail: r(root.querySelector('.sbs-detail')),
    table: r(root.querySelector('.sbs-table')), card: r(root.querySelector('.sbs-card')),
    wide: root.classList.contains('sbs-wide'),
    bg: style('.sbs-detail', 'backgroundColor'), fg: getComputedStyle(root).color,
    titleFill: (root.querySelector('.sbs-chart .g-ytitle text') || {}).textContent ? attr('.sbs-chart .g-ytitle text', 'fill') : attr('.sbs-chart .xtick text', 'fill'),
    gridStroke: attr('.sbs-chart .gridlayer .ygrid', 'stroke'),
  };
}"""


def _rgb(text: str) -> tuple[float, float, float]:
    import re

    r, g, b = (float(v) for v in re.findall(r"[\d.]+", text)[:3])
    return r, g, b


def luminance(text: str) -> float:
    """Relative luminance (WCAG) of a CSS rgb()/rgba() colour."""

    def lin(c: float) -> float:
        c /= 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = _rgb(text)
    return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b)


def contrast(a: str, b: str) -> float:
    la, lb = sorted((luminance(a), luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def _overlap(a: dict, b: dict) -> float:
    w = min(a["right"], b["right"]) - max(a["left"], b["left"])
    h = min(a["bottom"], b["bottom"]) - max(a["top"], b["top"])
    return max(0.0, w) * max(0.0, h)


def check_layout(g: dict, *, dark: bool | None = None) -> None:
    """What the widget promises at any width: the error columns in view without a
    horizontal scroll, computed nodes first, a chart with a usable plot area that
    overlaps neither the filters nor the detail panel, colours that follow the theme."""
    assert g["hscroll"] <= 0, (
        f"the table scrolls sideways by {g['hscroll']} px (view {g['root']['width']:.0f} px, "
        f"table {g['clientWidth']} px wide, "
        f"columns {g['template']}, wider: {g['wider']})"
    )
    vp = g["viewport"]
    for label in ("fx node · module", "err abs", "own err", "verdict"):
        head = g["heads"].get(label)
        assert head is not None, f"column {label!r} folded away: {sorted(g['heads'])}"
        assert vp["left"] - 1 <= head["left"] and head["right"] <= vp["right"] + 1, (label, head)
    kinds = g["firstKinds"]
    assert len(kinds) >= 3 and "weight" not in kinds, f"first rows: {kinds}"
    plot = g["plot"]
    assert plot and plot["width"] >= 300 and plot["height"] >= 150, f"plot area {plot}"
    for other in ("filters", "detail", "table"):
        assert _overlap(g["chart"], g[other]) < 1, f"chart overlaps the {other}"
    for other in ("filters", "table", "card"):
        assert _overlap(g["detail"], g[other]) < 1, f"detail panel overlaps the {other}"
    if dark is not None:
        assert (luminance(g["bg"]) < 0.2) == dark, f"background {g['bg']} (dark={dark})"
        assert contrast(g["fg"], g["bg"]) >= 4.5, (g["fg"], g["bg"])
        if g["titleFill"]:  # (a narrow chart has no y title)
            assert contrast(g["titleFill"], g["bg"]) >= 3, ("axis title", g["titleFill"], g["bg"])
        assert contrast(g["gridStroke"], g["bg"]) <= 2, ("grid lines glare", g["gridStroke"])
