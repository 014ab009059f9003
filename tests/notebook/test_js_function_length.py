"""No front-end function over 150 lines (the project guide): the view stays in parts a
reader can hold, rather than one closure that lays out and wires everything."""

from __future__ import annotations

from pathlib import Path

import pytest

from .js_functions import functions, tokenize

SRC = Path(__file__).resolve().parents[2] / "js" / "src"
LIMIT = 150


def _body(n: int) -> str:
    """*n* lines of statements that hide braces where a naive count would see them."""
    tricky = [
        'const s = "}{ not a brace";',
        "const t = '{';",
        "const u = `a ${ {k: 1}.k } and ${`nested ${'}'}`} }`;",
        "const r = /\\{[}]/.test(s); // a regex, then a comment {",
        "/* a comment { */ const q = a / b / c;",
    ]
    return "\n".join(tricky[i % len(tricky)] for i in range(n))


def _lengths(src: str) -> dict[str, int]:
    return {f.name: f.lines for f in functions(src)}


@pytest.mark.parametrize(
    ("form", "head", "tail"),
    [
        ("declaration", "function big(a, b) {", "}"),
        ("async declaration", "async function big() {", "}"),
        ("expression", "const big = function (x) {", "};"),
        ("arrow block", "const big = (x) => {", "};"),
        ("async arrow", "const big = async x => {", "};"),
        ("arrow with parenthesised body", "const big = () => ([", "]);"),
        ("class method", "class A {\n  big(x) {", "  }\n}"),
        ("getter", "class A {\n  get big() {", "  }\n}"),
        ("object method", "const o = {\n  async big(x) {", "  },\n};"),
        ("object arrow", "const o = {\n  big: (x) => {", "  },\n};"),
    ],
)
def test_the_scanner_measures_every_form_of_function(form, head, tail):
    """Each form, 151 lines and 150 lines long: the scanner must see the difference (a
    scanner that missed a form would let a long function of that form through)."""
    for body_lines, expected in ((149, 151), (148, 150)):
        src = f"{head}\n{_body(body_lines)}\n{tail}\nconst after = () => 1;\n"
        lengths = _lengths(src)
        assert lengths.get("big") == expected, (form, lengths)
        assert lengths.get("after") == 1, (form, lengths)


def test_the_scanner_ends_expression_arrows_where_they_end():
    src = (
        "const pick = (a) => a\n"
        "  ? 1\n"
        "  : 2;\n"
        "const call = () => f(\n  1,\n  2,\n);\n"
        "const one = (x) => x + 1\n"
        "const next = 3;\n"
        "list.map((x) => x * 2, this);\n"
    )
    got = {f.name: (f.start, f.end) for f in functions(src)}
    assert got["pick"] == (1, 3) and got["call"] == (4, 7) and got["one"] == (8, 8)
    assert got["=>"] == (10, 10)


def test_the_scanner_counts_a_nested_function_in_its_parent():
    src = "function outer() {\n  const inner = () => {\n    return 1;\n  };\n}\n"
    assert _lengths(src) == {"outer": 5, "inner": 3}


def test_the_scanner_sees_no_function_in_statements():
    src = "if (a) {\n  b();\n} else if (c) {\n} for (;;) {\n} while (x) {}\ntry {} catch (e) {}\n"
    assert functions(src) == []
    # braces inside literals and comments never open anything
    assert [t.text for t in tokenize("x = '{' + `${'}'}` // }\n/* { */ y;")] == [
        "x",
        "=",
        "str",
        "+",
        "str",
        "str",  # the '}' inside the template's ${...}: code, not text
        "y",
        ";",
    ]


def test_the_scanner_reads_the_front_end():
    """The scan is not vacuous on the real sources: it finds their functions, the view's
    entry (mount) among them."""
    names = {f.name for p in SRC.glob("*.js") for f in functions(p.read_text())}
    assert {"mount", "renderStatic", "render", "constructor"} <= names


def test_no_front_end_function_is_over_150_lines():
    sources = sorted(SRC.rglob("*.js"))
    assert sources, SRC
    too_long = [
        f"{p.relative_to(SRC)}:{f.start} {f.name} ({f.lines} lines)"
        for p in sources
        for f in functions(p.read_text())
        if f.lines > LIMIT
    ]
    assert not too_long, f"front-end functions over {LIMIT} lines: {too_long}"
