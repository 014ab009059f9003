"""How long each function of the front end's JavaScript is (tests/test_js_function_length.py).

Not a JavaScript parser: a tokenizer that knows what can hide a brace (strings, template
literals with their ``${...}`` parts, comments, regular expression literals), and a pass
over its tokens that recognises the bodies of

- function declarations and expressions (``function f(...) {``, ``function (...) {``),
- methods of classes and object literals (``name(...) {``, ``async name(...) {``,
  ``get name() {``, ``static name() {``, ``[computed]() {``),
- arrow functions, with a block body (``=> {``) or an expression body (``=> (...)``,
  ``=> a ? b : c`` over several lines).

A function's length is its number of physical lines, from the line of ``=>`` or of its
body's ``{`` to the line its body ends on (comments and blank lines count: the limit is
on what a reader scrolls through).  A nested function counts in its parent's length too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# keywords after which a "(...) {" is a statement's block, not a function's body
_CONTROL = {"if", "for", "while", "switch", "catch", "with", "return", "typeof", "await"}
# after these a "/" starts a regular expression literal, not a division
_REGEX_AFTER_WORDS = {
    "return",
    "typeof",
    "case",
    "do",
    "else",
    "in",
    "of",
    "new",
    "delete",
    "void",
    "throw",
    "instanceof",
    "yield",
    "await",
}
# a line that starts (or a line that ends) with one of these continues the expression
_CONTINUES = {
    ".",
    "?.",
    "?",
    ":",
    "&&",
    "||",
    "??",
    "+",
    "-",
    "*",
    "/",
    "%",
    "==",
    "===",
    "!=",
    "!==",
    "<",
    ">",
    "<=",
    ">=",
    "=",
    "=>",
    "(",
    "[",
    "{",
}
_WORD = re.compile(r"[A-Za-z_$][\w$]*|\d[\w.]*")
_PUNCT = re.compile(
    r"\?\?=|\?\?|\?\.|===|!==|\*\*=|\.\.\.|=>|==|!=|<=|>=|&&|\|\||\+\+|--|[-+*/%&|^]=|[{}()\[\];,.<>+\-*/%!?:=&|^~@#]"
)


@dataclass(frozen=True)
class Token:
    text: str  # the token; "str" for a string, template or regex literal
    line: int  # 1-based


@dataclass(frozen=True)
class Function:
    name: str  # what precedes it: "mount", "render", "=>" for an anonymous arrow
    start: int  # first line (1-based)
    end: int  # last line

    @property
    def lines(self) -> int:
        return self.end - self.start + 1


def tokenize(src: str) -> list[Token]:
    """The tokens of *src*: words, punctuation, and one "str" per literal."""
    tokens: list[Token] = []
    line, i, n = 1, 0, len(src)
    # one entry per open "{": True when it opened a template's ${...}
    braces: list[bool] = []

    def template(i: int) -> int:
        """Skip a template literal's text from *i* (just after ` or }) to its end or to
        the next "${" (then pushes a template brace); returns the index after it."""
        nonlocal line
        while i < n:
            c = src[i]
            if c == "\\":
                line += src[i + 1 : i + 2] == "\n"
                i += 2
            elif c == "`":
                return i + 1
            elif c == "$" and src[i + 1 : i + 2] == "{":
                braces.append(True)
                return i + 2
            else:
                line += c == "\n"
                i += 1
        return i

    while i < n:
        c = src[i]
        if c == "\n":
            line += 1
            i += 1
        elif c.isspace():
            i += 1
        elif src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            line += src.count("\n", i, j)
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            tokens.append(Token("str", line))
            line += src.count("\n", i, j)  # a backslash-newline continues the string
            i = j + 1
        elif c == "`":
            tokens.append(Token("str", line))
            i = template(i + 1)
        elif c == "/" and _starts_regex(tokens):
            j, in_class = i + 1, False
            while j < n and src[j] != "\n" and (src[j] != "/" or in_class):
                if src[j] == "\\":
                    j += 1
                elif src[j] == "[":
                    in_class = True
                elif src[j] == "]":
                    in_class = False
                j += 1
            j += 1
            while j < n and (src[j].isalnum() or src[j] == "_"):
                j += 1  # flags
            tokens.append(Token("str", line))
            i = j
        elif c == "{":
            braces.append(False)
            tokens.append(Token("{", line))
            i += 1
        elif c == "}":
            if braces and braces.pop():
                i = template(i + 1)  # the end of a ${...}: back in the template's text
            else:
                tokens.append(Token("}", line))
                i += 1
        else:
            m = _WORD.match(src, i) or _PUNCT.match(src, i)
            text = m.group(0) if m else c
            tokens.append(Token(text, line))
            i += len(text)
    return tokens


def _starts_regex(tokens: list[Token]) -> bool:
    """Whether a "/" after *tokens* opens a regular expression literal (else a division)."""
    if not tokens:
        return True
    prev = tokens[-1].text
    if prev == "str" or prev in (")", "]", "}", "++", "--"):
        return False
    if _WORD.fullmatch(prev):
        return prev in _REGEX_AFTER_WORDS
    return True


def functions(src: str) -> list[Function]:
    """Every function of *src* with its lines, in the order their bodies open."""
    toks = tokenize(src)
    found: list[tuple[int, Function]] = []
    stack: list[tuple[str, int]] = []  # open brackets: (bracket, token index)
    close = {"}": "{", ")": "(", "]": "["}
    opener: dict[int, int] = {}  # index of a closer -> index of its opener
    for k, t in enumerate(toks):
        if t.text in ("{", "(", "["):
            stack.append((t.text, k))
        elif t.text in close and stack and stack[-1][0] == close[t.text]:
            opener[k] = stack.pop()[1]
    closer = {o: c for c, o in opener.items()}
    for k, t in enumerate(toks):
        if t.text == "=>":
            name = _arrow_name(toks, k)
            if k + 1 < len(toks) and toks[k + 1].text == "{" and k + 1 in closer:
                end = toks[closer[k + 1]].line
            else:
                end = _expression_end(toks, k + 1, closer)
            found.append((k, Function(name, t.line, end)))
        elif t.text == "{" and k in closer and k > 0 and toks[k - 1].text == ")":
            name = _head_name(toks, opener.get(k - 1))
            if name is not None:
                found.append((k, Function(name, t.line, toks[closer[k]].line)))
    return [f for _, f in sorted(found, key=lambda p: p[0])]


def _head_name(toks: list[Token], paren: int | None) -> str | None:
    """The function's name when the "(" at index *paren* opens a function's parameters
    (a declaration, a function expression, a method), else None (an if, a for...)."""
    if paren is None or paren == 0:
        return None
    before = toks[paren - 1].text
    if before == "function" or before == "*":
        # an anonymous function expression: named by what it is assigned to
        k = paren - 2
        k -= k >= 0 and toks[k].text == "function"
        k -= k >= 0 and toks[k].text == "async"
        if k >= 1 and toks[k].text in ("=", ":") and _WORD.fullmatch(toks[k - 1].text):
            return toks[k - 1].text
        return "function"
    if before == "]":
        return "[computed]"
    if _WORD.fullmatch(before) and before not in _CONTROL and not before[0].isdigit():
        return before
    return None


def _arrow_name(toks: list[Token], arrow: int) -> str:
    """What the arrow at index *arrow* is assigned to (``const f = (x) => ...``), or "=>"."""
    k = arrow - 1
    if k >= 0 and toks[k].text == ")":
        depth = 0
        while k >= 0:
            depth += {")": 1, "(": -1}.get(toks[k].text, 0)
            if depth == 0:
                break
            k -= 1
    k -= 1  # before the parameters (or the one bare parameter)
    if k >= 0 and toks[k].text == "async":
        k -= 1
    if k >= 1 and toks[k].text in ("=", ":") and _WORD.fullmatch(toks[k - 1].text):
        return toks[k - 1].text
    return "=>"


def _expression_end(toks: list[Token], k: int, closer: dict[int, int]) -> int:
    """The last line of an arrow's expression body starting at token index *k*: it ends
    at a "," or ";" or an unmatched closer, or at a line break where nothing continues
    it (neither the line's last token nor the next line's first is an operator)."""
    last = toks[k - 1].line
    while k < len(toks):
        t = toks[k]
        if t.text in (",", ";", ")", "]", "}"):
            return last
        if t.line > last and toks[k - 1].text not in _CONTINUES and t.text not in _CONTINUES:
            return last
        if t.text in ("(", "[", "{") and k in closer:
            k = closer[k]
        last = toks[k].line
        k += 1
    return last
