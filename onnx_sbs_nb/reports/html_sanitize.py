"""HTML from a received notebook, made inert before it reaches an exported report.

A notebook someone sent is untrusted: JupyterLab shows its ``text/html`` outputs and its
markdown through a sanitizer (no scripts, no event handlers, no ``javascript:`` URLs).  An
export of it must not be the way around that, so ``onnx-sbs notebook`` cleans every
sender-written HTML string with the same kind of allowlist: the tags and attributes that
format text, tables, images and folds, styles through a CSS sanitizer, links to http(s)
and mailto only, images from http(s) or ``data:image/...``.  Everything else is escaped
(shown as text), so nothing a sender wrote runs in the page.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

# Close to JupyterLab's sanitizer (packages/apputils/src/sanitizer.ts), minus forms and media.
_TAGS = frozenset(
    """a abbr b bdi bdo big blockquote br caption center cite code col colgroup dd del details
    dfn div dl dt em figcaption figure font h1 h2 h3 h4 h5 h6 hr i img ins kbd li mark ol p pre
    q rp rt ruby s samp small span strike strong sub summary sup table tbody td tfoot th thead
    time tr tt u ul var wbr""".split()
)
_GLOBAL_ATTRS = ("class", "id", "title", "style", "dir", "lang", "align", "width", "height")
_URL_ATTRS = {"a": ("href",), "img": ("src",)}
_OTHER_ATTRS = {
    "a": ("name", "target"),
    "img": ("alt",),
    "td": ("colspan", "rowspan", "valign"),
    "th": ("colspan", "rowspan", "valign", "scope"),
    "col": ("span",),
    "colgroup": ("span",),
    "details": ("open",),
    "ol": ("start", "type"),
    "font": ("color", "face", "size"),
}


def _url_allowed(tag: str, value: str) -> bool:
    v = "".join(value.split()).lower()  # "java\nscript:" is javascript: to a browser
    if tag == "img" and v.startswith("data:"):
        return v.startswith("data:image/")
    scheme, colon, _ = v.partition(":")
    if not colon or "/" in scheme or "#" in scheme or "?" in scheme:
        return True  # relative URL or fragment
    return scheme in ("http", "https") or (tag == "a" and scheme == "mailto")


def _attr_allowed(tag: str, name: str, value: str) -> bool:
    name = name.lower()
    if name in _URL_ATTRS.get(tag, ()):
        return _url_allowed(tag, value)
    return name in _GLOBAL_ATTRS or name in _OTHER_ATTRS.get(tag, ())


@lru_cache(maxsize=1)
def _cleaner() -> Any:
    import bleach
    from bleach.css_sanitizer import CSSSanitizer

    return bleach.Cleaner(
        tags=_TAGS,
        attributes=_attr_allowed,
        # bleach checks URL schemes itself too: data is let through here, _url_allowed
        # keeps it to images
        protocols=["http", "https", "mailto", "data"],
        strip=False,
        strip_comments=True,
        css_sanitizer=CSSSanitizer(),
    )


def clean_untrusted_html(value: Any) -> str:
    """``value`` (HTML from an untrusted notebook) with nothing left that runs."""
    text = value.decode() if isinstance(value, bytes) else str(value)
    return _cleaner().clean(text)
