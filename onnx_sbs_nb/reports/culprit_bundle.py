"""The smallest failing piece, saved by itself: the culprit's replay bundle, checked.

A run already knows what ``polygraphy debug reduce`` searches for by hand: the node that
makes the error (the summary's culprit), the nearest values upstream of it that have a
torch twin, and those values.  The culprit's replay bundle is the sub-model from those
values to the culprit, fed with the torch values, so its own error is all it can show.
:func:`save_culprit_bundle` writes it, then opens it as a colleague would
(:func:`~onnx_sbs_nb.align.post.replay_load.load_replay`, executing nothing from it) and
says whether the error shows there as it showed in the run: a bundle that does not
reproduce says so rather than pass for a reproduction.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..files import write_text_atomic

#: A replayed error this close to the run's own error (or larger) reproduces it.
SAME_SIZE = 0.5


@dataclass
class CulpritBundle:
    """What :func:`save_culprit_bundle` wrote and found."""

    folder: Path
    culprit: str  # the culprit as the summary names it
    node: str  # the ONNX node the bundle ends at
    nodes: int  # ONNX nodes in the bundle's sub-model
    own_error: float | None  # the culprit's own error in the run
    replayed_error: float | None  # the bundle's error on the torch values, replayed
    reproduced: bool
    why: str  # how the replay compares with the run, in words
    # a run over many inputs: the input the bundle's values come from
    input_index: int | None = None
    input_name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["folder"] = str(self.folder)
        for k in ("own_error", "replayed_error"):
            v = d[k]
            d[k] = None if v is None else (v if math.isfinite(v) else str(v))
        return d

    def brief(self) -> str:
        """One line, as the culprit's ``bundle`` in the summary and the reports."""
        head = "reproduces" if self.reproduced else "does NOT reproduce"
        on = f" of input {self.input_index}" if self.input_index is not None else ""
        return f"{self.folder} ({self.nodes} ONNX node(s){on}; {head}: {self.why})"

    def to_text(self) -> str:
        from ..align.blame.summary import _printable

        head = "reproduces" if self.reproduced else "does NOT reproduce"
        on = ""
        if self.input_index is not None:
            name = f" ({self.input_name})" if self.input_name else ""
            on = f" on input {self.input_index}{_printable(name)}"
        return (
            f"culprit bundle{on}: {_printable(str(self.folder))}\n"
            f"  {_printable(self.culprit)}: {self.nodes} ONNX node(s) from values with a "
            f"torch twin; {head}: {_printable(self.why)}"
        )


def save_culprit_bundle(run: Any, root: str | Path, summary: Any = None) -> CulpritBundle | None:
    """Writes the replay bundle of ``run``'s culprit inside ``root`` and replays it.

    ``run``: an :class:`~onnx_sbs_nb.align.run.AlignedRun` (its records and actions are
    read; one not yet iterated is run first), what :func:`run_aligned` returns (the
    records not yet consumed are computed first), or a run over many inputs (the input that shows the failure is
    run again alone); ``summary``: its summary when already made.  None when the run
    names no culprit, or the culprit is no ONNX node (a weight, an input).  The bundle's
    ``culprit.json`` records the culprit and the replay's finding.
    """
    from ..align.post.replay_load import load_replay

    run = finished_run(run)
    if summary is None:
        summary = run.summarize()
    culprit = summary.culprit
    if culprit is None:
        return None
    index = culprit.input_index
    if index is not None and run.inputs_info() is not None:
        # a run over many inputs: the input that shows the failure, run alone, feeds it
        one = run.input_run(index)
        list(one)
        bundle = save_culprit_bundle(one, root)
        if bundle is not None:
            bundle.input_index, bundle.input_name = index, culprit.input_name
            _write_finding(bundle, culprit)
        return bundle
    record = next((r for r in run.records if r.step == culprit.step), None)
    if record is None or record.onnx_id_node is None or record.onnx_id_node < 0:
        return None
    actions = run.node_actions(record)
    # by its record (its position), as Save replay does: names are optional in ONNX, and the
    # summary's name of an unnamed node ("Identity_0") is made up for the reader
    k, proto = actions.find_node(record)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    folder = Path(actions.save_replay(k, root))
    replay = load_replay(folder)
    own = culprit.own_error if culprit.own_error is not None else record.err_abs2
    replayed, reproduced, why = _judge(replay, own, record.onnx_name)
    bundle = CulpritBundle(
        folder=folder,
        culprit=culprit.label(),
        node=proto.name or proto.output[0],
        nodes=_node_count(folder / "model.onnx"),
        own_error=own,
        replayed_error=replayed,
        reproduced=reproduced,
        why=why,
    )
    _write_finding(bundle, culprit)
    return bundle


_PASS_THE_RUN = (
    "pass the run itself: `run = run_aligned(ep, onx, args)` (or `AlignedRun(ep, onx, "
    "args)`), then `save_culprit_bundle(run, folder)`: the bundle replays the culprit on "
    "the run's values, which records do not hold"
)


def finished_run(given: Any) -> Any:
    """The run behind ``given``, run to its end: what ``run_aligned`` returns (its records
    not consumed yet are computed), an AlignedRun or a run over many inputs (run if it
    was never iterated); SbsInputError for records or anything else, saying what to pass."""
    from ..align.contract import SAVE_CULPRIT, RecordStream, RunContract
    from ..errors import SbsInputError

    if isinstance(given, RecordStream):
        for _ in given:  # the records the caller has not consumed yet
            pass
        given = given.run
    if not isinstance(given, RunContract):
        what = type(given).__name__
        if isinstance(given, Iterable):
            what = f"records (a {what})"
        raise SbsInputError(f"save_culprit_bundle got {what}, not a run: {_PASS_THE_RUN}")
    why = given.why_not(SAVE_CULPRIT)
    if why is not None:
        raise SbsInputError(f"save_culprit_bundle: {why}")
    if not given.started:
        list(given)  # never iterated: nothing to bundle yet, so it runs now
    elif not given.status.finished:
        raise SbsInputError(
            "the run is still being iterated: consume its records first (or pass what "
            "run_aligned returns, which finishes it)"
        )
    return given


def _write_finding(bundle: CulpritBundle, culprit: Any) -> None:
    payload = {"culprit": culprit.to_dict(), "replay": bundle.to_dict()}
    text = json.dumps(payload, indent=1, default=str)
    write_text_atomic(bundle.folder / "culprit.json", text)


def _judge(replay: Any, own: float | None, output: str | None) -> tuple[float | None, bool, str]:
    """The replayed error at the culprit's output, whether it is the run's own error."""
    entries = [e for e in replay.outputs if e["has_expected"]]
    entry = next((e for e in entries if e["name"] == output), entries[0] if entries else None)
    if entry is None:
        return None, False, "the bundle has no torch value to compare with"
    got = entry.get("torch_inputs")
    if got is None:
        failure = replay.errors.get("torch_inputs", "it did not run")
        return None, True, f"the sub-model fails to run on the torch values: {failure}"
    if got["error"]:
        return None, True, f"on the torch values: {got['error']}"
    if got["nan"]:
        return got["max_abs"], True, f"{got['nan']} NaN/inf mismatch(es) on the torch values"
    replayed = got["max_abs"]
    if own is None or not math.isfinite(own):
        return replayed, replayed > 0, f"max abs error {replayed:.3g} on the torch values"
    same = replayed >= SAME_SIZE * own
    return (
        replayed,
        same,
        f"max abs error {replayed:.3g} on the torch values, {own:.3g} in the run",
    )


def _node_count(path: Path) -> int:
    import onnx

    return len(onnx.load(str(path), load_external_data=False).graph.node)


__all__ = ["CulpritBundle", "finished_run", "save_culprit_bundle"]
