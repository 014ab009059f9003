"""Where a wrong shape starts, when the node that makes it has no torch twin (a node an
optimizer made or rewrote, without the exporter's metadata: a ``Split`` into 4200/4200
where the program splits 8400 rows into 5000/3400).

The first value that mismatches in shape is then a node after it, which only passes the
shape on.  Between the values that agree and that mismatch, the node to blame is the first
whose output has a shape the program does not explain (not its torch twin's, where the
pairing guessed one; else no torch value's), while its inputs' shapes are the program's,
and which carries the wrong size along: the mismatch's size not found in the program is in
its output's shape.  A node that fails to run on such a shape is traced back through values
of shapes the program does not explain.  Either way the value blamed stands for a torch
value (the pairing guessed one, or the program has one without partner, of its rank and
other in one size): a lowering's own intermediates (attention's heads merged into the
batch) stand for none and are never blamed.  Fed record by record (:meth:`ShapeOrigins.add`), asked once
(:meth:`ShapeOrigins.origin`) with the graph's upstream walk; the summary names it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...records import STATUS_ERROR, STATUS_SHAPE_MISMATCH, STATUS_UNPAIRED_EP, Record

RULE_SHAPE_ORIGIN = "shape_origin"  # the first node whose output shape no torch value has

_DIMS = re.compile(r"\[([^\]]*)\]\s*$")


def dims(shape_type: str | None) -> tuple[str, ...] | None:
    """The sizes of ``"float32[1x4200x6]"`` (``("1", "4200", "6")``), None when unknown."""
    if not shape_type:
        return None
    m = _DIMS.search(shape_type)
    if m is None:
        return None
    return tuple(d for d in m.group(1).split("x") if d)


def _wrong_sizes(rec: Record) -> set[str]:
    """The sizes the candidate's value has that the program's value of that pair has not."""
    got, want = dims(rec.onnx_shape_type), dims(rec.ep_shape_type)
    if got is None or want is None:
        return set()
    return set(got) - set(want)


# what a runtime says when a node cannot take its inputs' shapes
_SHAPE_FAILURE = re.compile(r"shape|dimension|broadcast|reshape", re.IGNORECASE)


def _fails_on_shape(rec: Record) -> bool:
    return rec.status == STATUS_ERROR and bool(_SHAPE_FAILURE.search(rec.error or ""))


def _mismatches(rec: Record) -> bool:
    return rec.status == STATUS_SHAPE_MISMATCH or bool(
        rec.ep_shape_type
        and rec.onnx_shape_type
        and dims(rec.ep_shape_type) != dims(rec.onnx_shape_type)
    )


@dataclass
class ShapeOrigins:
    """The shapes a run's records show: every torch value's, each ONNX value's (with its
    record), and the values that agreed."""

    torch_shapes: set[tuple[str, ...]] = field(default_factory=set)
    torch_only: set[tuple[str, ...]] = field(default_factory=set)  # of unpaired torch values
    onnx: dict[str, Record] = field(default_factory=dict)
    agreed: set[str] = field(default_factory=set)
    mismatched: list[Record] = field(default_factory=list)
    whys: dict[str, str] = field(default_factory=dict)  # by origin, as origin() found it
    _asked: tuple[Any, Any] | None = None  # the last question and its answer

    def add(self, rec: Record, failed: bool) -> None:
        if rec.ep_shape_type and (rec.ep_name or rec.status == STATUS_UNPAIRED_EP):
            d = dims(rec.ep_shape_type)
            if d is not None:
                self.torch_shapes.add(d)
                if rec.status == STATUS_UNPAIRED_EP:
                    self.torch_only.add(d)
        if rec.onnx_name:
            self.onnx.setdefault(rec.onnx_name, rec)
            if rec.passed is True and not failed:
                self.agreed.add(rec.onnx_name)
            elif _mismatches(rec) and len(self.mismatched) < 64:
                self.mismatched.append(rec)

    def _explained(self, name: str, node_inputs: Mapping[str, Sequence[str]]) -> bool:
        rec = self.onnx.get(name)
        if rec is None or name in self.agreed or name not in node_inputs:
            return True  # no record, agreed, or no node makes it (a weight, an input)
        if rec.onnx_op_type == "Constant":
            return True
        got, want = dims(rec.onnx_shape_type), dims(rec.ep_shape_type)
        if got is not None and want is not None:
            return got == want  # its partner (or the pairing's guess) says what it should be
        return got is None or got in self.torch_shapes

    def origin(
        self,
        rec: Record,
        node_inputs: Mapping[str, Sequence[str]],
        upstream: Callable[[str], Iterable[str]],
    ) -> tuple[Record, str] | None:
        """The record of the value where ``rec``'s wrong shape starts and why, None when it
        is ``rec``'s own node or cannot be told."""
        if rec.onnx_name is None or not (_mismatches(rec) or _fails_on_shape(rec)):
            return None
        # a view may ask after every record: the walk is made again only on news
        key = (id(rec), len(self.onnx), len(self.agreed), len(self.mismatched))
        if self._asked is not None and self._asked[0] == key:
            return self._asked[1]
        found = self._origin(rec, node_inputs, upstream)
        self._asked = (key, found)
        return found

    def _origin(
        self,
        rec: Record,
        node_inputs: Mapping[str, Sequence[str]],
        upstream: Callable[[str], Iterable[str]],
    ) -> tuple[Record, str] | None:
        if rec.status == STATUS_ERROR:
            return self._origin_of_failure(rec, node_inputs)
        wrong = _wrong_sizes(rec)
        if not wrong:
            return None  # the same sizes in another arrangement: no size to follow
        found: list[Record] = []
        for name in self._between(rec.onnx_name, node_inputs):
            cand = self.onnx.get(name)
            if cand is None or name not in node_inputs or self._explained(name, node_inputs):
                continue
            shape = dims(cand.onnx_shape_type) or ()
            if not wrong <= set(shape) or not self._stands_for_a_torch_value(cand):
                continue  # another odd shape (an intermediate of a decomposition)
            if all(self._explained(i, node_inputs) for i in node_inputs[name] if i):
                found.append(cand)
        if not found:
            return None
        first = min(found, key=lambda r: r.step)
        if first.onnx_node_name and first.onnx_node_name == rec.onnx_node_name:
            return None
        why = self.whys[first.onnx_name or ""] = self._why(first, rec, node_inputs, upstream)
        return first, why

    def _origin_of_failure(
        self, rec: Record, node_inputs: Mapping[str, Sequence[str]]
    ) -> tuple[Record, str] | None:
        """A node that failed to run on a shape: each of its inputs of a shape the program
        does not explain followed back, through such values, to the first node making one
        from inputs the program explains."""
        found: list[Record] = []
        for name in node_inputs.get(rec.onnx_name or "", ()):
            seen: set[str] = set()
            while name and name not in seen and not self._explained(name, node_inputs):
                seen.add(name)
                odd = [i for i in node_inputs[name] if i and not self._explained(i, node_inputs)]
                if not odd:
                    if self._stands_for_a_torch_value(self.onnx[name]):
                        found.append(self.onnx[name])
                    break
                name = min(odd, key=lambda i: self.onnx[i].step)
        if not found:
            return None
        first = min(found, key=lambda r: r.step)
        inputs = [i for i in node_inputs.get(first.onnx_name or "", ()) if i in self.agreed]
        matched = f" while its input {', '.join(inputs)} matched" if inputs else ""
        why = self.whys[first.onnx_name or ""] = (
            f"{self._shape_is(first)}{matched}: it makes the wrong shape, and "
            f"{rec.onnx_name} ({rec.onnx_op_type}) fails to run on it"
        )
        return first, why

    def _stands_for_a_torch_value(self, rec: Record) -> bool:
        """Whether ``rec``'s value is one the program has in another size: its pairing's
        guess, or a torch value without partner of its rank, other in one size only (a
        decomposition's own intermediates stand for none: they are not blamed)."""
        got = dims(rec.onnx_shape_type)
        if got is None:
            return False
        if rec.ep_shape_type:
            return dims(rec.ep_shape_type) != got
        return any(
            len(d) == len(got) and sum(a != b for a, b in zip(d, got)) == 1 for d in self.torch_only
        )

    def _shape_is(self, first: Record) -> str:
        shape = first.onnx_shape_type
        if dims(shape) in self.torch_shapes:  # some torch value has it, not the one it is
            return f"its output shape {shape} is not its torch twin's ({first.ep_shape_type})"
        return f"its output shape {shape} matches no torch value"

    def why_of(self, rec: Record) -> str:
        """Why the origin found for a mismatch is the culprit (:meth:`origin` said)."""
        return self.whys.get(rec.onnx_name or "", "its output shape matches no torch value")

    def _between(self, name: str, node_inputs: Mapping[str, Sequence[str]]) -> set[str]:
        """The values ``name`` is computed from, back to values that agreed."""
        seen: set[str] = set()
        todo = [name]
        while todo:
            for i in node_inputs.get(todo.pop(), ()):
                if i and i not in seen and i not in self.agreed:
                    seen.add(i)
                    todo.append(i)
        return seen

    def _why(
        self,
        first: Record,
        rec: Record,
        node_inputs: Mapping[str, Sequence[str]],
        upstream: Callable[[str], Iterable[str]],
    ) -> str:
        name = first.onnx_name or ""
        node = first.onnx_node_name
        outputs = {n for n, r in self.onnx.items() if node and r.onnx_node_name == node}
        outputs.add(name)
        after = [r for r in self.mismatched if outputs & set(upstream(r.onnx_name or ""))]
        program = sorted(
            {r.ep_shape_type for r in [*after, rec] if r.ep_shape_type},
            key=lambda s: s or "",
        )
        inputs = [i for i in node_inputs.get(name, ()) if i and i in self.agreed]
        matched = f" while its input {', '.join(inputs)} matched" if inputs else ""
        return (
            f"{self._shape_is(first)} (the program has {' / '.join(program)} after it){matched}: it makes the "
            f"wrong shape, {rec.onnx_name} ({rec.onnx_op_type}) only carries it on"
        )


__all__ = ["RULE_SHAPE_ORIGIN", "ShapeOrigins", "dims"]
