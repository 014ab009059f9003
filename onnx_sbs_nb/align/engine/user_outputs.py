"""The last safety net for a decomposition that fixed a size on the example inputs.

The engine compares the ONNX model with the program the exporter prepared; where a
decomposition read a size off the example inputs, both agree, and both differ from the
user's program at other sizes.  The per-node checks (``source/specialized.py``,
``decomposed_values.py``) catch what they can rerun; this one catches the rest: on a run
whose sizes differ from the example's, the prepared program's outputs are kept as they are
computed and, once every pair passed, compared with the user's own program's outputs
(``ep.module()`` on the same inputs).  Where they differ the ONNX model, which agreed with
the prepared program everywhere, differs from the user's program too: a failing record
says so, and the verdict is not a pass.
"""

from __future__ import annotations

from typing import Any

import torch

from ...compare.diff import compare
from ...compare.value_facts import shape_type
from ...records import KIND_OUTPUT, STATUS_FAIL, STATUS_SHAPE_MISMATCH, Record
from ..judge.judging import comparable

USER_OUTPUTS = "user_program_outputs"  # the record's decided_by
USER_OUTPUTS_NOTE = (
    "every value agreed with the program the exporter prepared, but this output differs "
    "from the user's own program's (ep.module() on the same inputs): a decomposition of the "
    "exporter fixed a size on the example inputs, so the prepared program and the ONNX model "
    "lowered from it are wrong at these sizes (export with an example of these sizes)"
)


class UserOutputs:
    """Keeps the prepared program's user outputs (``names``, in the order the user's
    program returns them) and checks them against the user's program at the run's end."""

    def __init__(
        self,
        user_program: torch.export.ExportedProgram,
        args: Any,
        kwargs: dict[str, Any] | None,
        names: list[str],
        atol: float | None,
        rtol: float | None,
    ) -> None:
        self.user_program, self.args, self.kwargs = user_program, args, kwargs or {}
        self.names, self.atol, self.rtol = names, atol, rtol
        self._wanted = set(names)
        self._kept: dict[str, Any] = {}

    def observe(self, outputs: tuple[str, ...], env: dict[str, Any]) -> None:
        for o in outputs:
            if o in self._wanted and o in env:
                self._kept[o] = env[o]

    def check(self) -> Record | None:
        """The failing record of the first output differing from the user's program's;
        None when they agree (or the user's program cannot be run here)."""
        try:
            with torch.no_grad():
                outs = self.user_program.module()(*self.args, **self.kwargs)
        except Exception:
            return None
        flat = torch.utils._pytree.tree_leaves(outs)
        if len(flat) != len(self.names):
            return None  # not the outputs the names stand for: nothing to say
        for name, want in zip(self.names, flat):
            got = self._kept.get(name)
            if not isinstance(want, torch.Tensor) or not isinstance(got, torch.Tensor):
                continue
            rec = Record(
                ep_name=name,
                kind=KIND_OUTPUT,
                ep_shape_type=shape_type(want),
                onnx_shape_type=shape_type(got),
                decided_by=USER_OUTPUTS,
                comment=USER_OUTPUTS_NOTE,
            )
            if want.shape != got.shape:
                rec.status, rec.passed = STATUS_SHAPE_MISMATCH, False
                return rec
            expected, value = comparable(want, got.to(want.device))
            if expected is None:
                continue
            d = compare(expected, value, self.atol, self.rtol)
            if d.passed is False:
                rec.status, rec.passed = STATUS_FAIL, False
                rec.err_abs, rec.err_rel, rec.atol, rec.rtol = d.err_abs, d.err_rel, d.atol, d.rtol
                return rec
        return None


__all__ = ["USER_OUTPUTS", "USER_OUTPUTS_NOTE", "UserOutputs"]
