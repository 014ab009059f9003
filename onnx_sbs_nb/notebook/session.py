"""SbsSession: the one stateful controller of a side-by-side run.

It owns one run of any kind (``align/kinds.py``; an AlignedRun when built from ep, onx
and inputs), consumes it through the one consumer (``stream.py``; in the caller's thread
or in a background thread), keeps every record, and owns the one table of post-run
actions (:data:`ACTIONS`, run by name with :meth:`SbsSession.act`).  Views (the widget,
the magic) never compute: they subscribe with :meth:`SbsSession.add_listener` and call the
actions.

Listeners receive ``(event, payload)`` from whichever thread runs the stream:

- ``"rows"``: ``{"start": int, "records": list[Record]}`` — records appended since the
  previous batch (batches are at most every ``batch_interval`` seconds, so a view never
  has to throttle on its own);
- ``"status"``: ``{"status": dict}`` — sent with every batch;
- ``"finished"``: ``{"status": dict, "summary": dict}`` — once, when the stream ends,
  whatever the reason (end, stop, interrupt, error).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..align.blame.summary import Summary
from ..align.contract import NODE_DATA, NODE_DETAIL, RERUN, SAVE_CULPRIT, SAVE_REPLAY
from ..align.engine.options import RunOptions
from ..device import resolve_device
from ..errors import SbsInputError
from ..records import Record
from ..reports.view_state import culprit_of, jsonable
from .stream import (
    FAILED,
    FINISHED,
    IDLE,
    RUNNING,
    STOPPED,
    Listener,
    RunConsumer,
)


class ActionError(RuntimeError):
    """An action cannot run now; the message says why and what to do."""


@dataclass(frozen=True)
class Action:
    """One entry of the session's action table (:data:`ACTIONS`): what a view may ask, and
    what its button needs (views build their buttons from :func:`action_table`)."""

    name: str
    method: str  # the SbsSession method that does it
    needs_node: bool  # acts on one record's ONNX node (its button sits beside the node)
    doc: str
    label: str  # the button's text
    button: str  # the button's class, sbs-btn-<button> (UI tests select on it)
    when: str = "any"  # "running": only while the run goes; "ended": not while it runs
    needs: str = ""  # also needs: "culprit" (the run names one), "cuda" (a usable GPU)
    toggle: str = ""  # a switch of a synced trait ("device": cpu <-> cuda), sent with it
    # where a view shows its result: a widget trait, or "details.<key>" (the node's panel)
    shows: str = ""


@dataclass
class ActionResult:
    """What an action did: ``message`` in the words a view shows, ``result`` its data
    (a rerun's outputs, the replay's paths, a report's path) or None."""

    name: str
    ok: bool
    message: str
    result: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": "done" if self.ok else "error",
            "message": self.message,
            "result": self.result,
        }


#: The one table of what a view can ask of a session: the widget's buttons, in order.
ACTIONS: dict[str, Action] = {
    a.name: a
    for a in (
        Action("stop", "_act_stop", False, "end the run after the current node", "Stop", "stop",
               when="running"),
        Action("device", "_act_device", False, "where actions and a new run execute", "CUDA",
               "cuda", needs="cuda", toggle="device", shows="device"),
        Action("export", "_act_export", False, "write the run as one HTML report",
               "Export report", "export"),
        Action("save_culprit", "_act_save_culprit", False,
               "write the culprit's replay bundle (the smallest failing piece) and replay it",
               "Save culprit bundle", "culprit", when="ended", needs="culprit"),
        Action("rerun", "_act_rerun", True, "rerun one ONNX node in the torch evaluator",
               "Rerun in torch", "rerun", when="ended", shows="details.rerun"),
        Action("save_replay", "_act_save_replay", True, "write the node's replay bundle",
               "Save replay", "replay", when="ended", shows="details.replay"),
    )
}  # fmt: skip


def action_table() -> list[dict[str, Any]]:
    """The table as a front end gets it (the widget's ``actions`` trait): the method, the
    kernel's business, left out."""
    return [{k: v for k, v in asdict(a).items() if k != "method"} for a in ACTIONS.values()]


@dataclass(frozen=True)
class SavedReplay:
    """What :meth:`SbsSession.save_replay` wrote."""

    bundle: Path  # the replay bundle folder of the node
    config: Path  # the ReplayConfig JSON selecting that node, reusable on a new export

    def to_dict(self) -> dict[str, str]:
        return {"bundle": str(self.bundle), "config": str(self.config)}


def many_inputs(inputs: Any) -> bool:
    """Whether *inputs* are many inputs rather than one: a DataLoader, a generator or
    another iterable that is no list, tuple, dict or tensor, or a folder (of ``.pt``
    files); a list of inputs (each a tuple, list or dict), as ``run_aligned(inputs=...)``
    reads it.  A tuple, or a list of tensors, stays one input (positional inputs)."""
    if callable(getattr(inputs, "num_obs", None)):
        return True  # a torch.onnx.InputObserver: its observed calls
    if (
        isinstance(inputs, list)
        and inputs
        and all(isinstance(i, tuple | list | dict) for i in inputs)
    ):
        return True  # [(x1,), (x2,)]: one meaning of inputs= everywhere
    if inputs is None or isinstance(inputs, dict | list | tuple | bytes):
        return False
    if isinstance(inputs, str | Path):
        return Path(inputs).is_dir()
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        torch = None
    if torch is not None and isinstance(inputs, torch.Tensor):
        return False
    return isinstance(inputs, Iterable)


def split_inputs(inputs: Any) -> tuple[Any, Any]:
    """``(args, kwargs)`` for AlignedRun from what a user passes as *inputs*.

    A dict is keyword inputs, a tuple/list positional ones, a path a saved ``.pt`` file,
    a single tensor one positional input.
    """
    if inputs is None:
        return None, None
    if isinstance(inputs, dict):
        return None, inputs
    if isinstance(inputs, list | tuple):
        return tuple(inputs), None
    if isinstance(inputs, str | Path):
        return inputs, None
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        torch = None
    if torch is not None and isinstance(inputs, torch.Tensor):
        return (inputs,), None
    raise TypeError(
        f"inputs must be a tuple or list of tensors, a dict of named tensors, a tensor or "
        f"the path of a torch.save'd file, not {type(inputs).__name__}"
    )


class SbsSession(RunConsumer):
    """Owns one side-by-side run and the actions on it.

    ``SbsSession(ep, onx, inputs, atol=..., own_error=True, ...)`` builds the
    :class:`AlignedRun` at once (so bad inputs fail in the calling cell), then
    :meth:`start` consumes it: in the calling thread by default (an executed notebook
    then always holds the finished run), in a daemon thread with ``background=True``.
    A ``KeyboardInterrupt`` during an in-thread run stops it and keeps every record.
    """

    def __init__(
        self,
        ep: Any,
        onx: Any,
        inputs: Any = None,
        options: RunOptions | None = None,
        *,
        background: bool = False,
        batch_interval: float = 0.25,
        replay_root: str | Path | None = None,
        **run_options: Any,
    ) -> None:
        from ..align.run import AlignedRun

        # validated here, once: a bad option fails in the calling cell
        self.options = RunOptions.from_kwargs(options, **run_options)
        self._factory: Callable[[str | None], Any]
        if many_inputs(inputs):
            from ..align.run import aligned_over_inputs

            # one record per pair over every input; one input's records on demand
            self._factory = lambda dev: aligned_over_inputs(
                ep, onx, inputs, self.options.replace(device=dev)
            )
        else:
            args, kwargs = split_inputs(inputs)
            self._factory = lambda dev: AlignedRun(
                ep, onx, args, kwargs, self.options.replace(device=dev)
            )
        self._init(self._factory(self.options.device), background, batch_interval, replay_root)
        self.device = str(self.run.device or self.options.device or "cpu")

    @classmethod
    def from_run(
        cls,
        run: Any,
        *,
        background: bool = False,
        batch_interval: float = 0.25,
        replay_root: str | Path | None = None,
    ) -> SbsSession:
        """A session over an existing run: any run kind (``align/kinds.py``), or any
        iterable of Records (the actions that do not apply say why)."""
        self = cls.__new__(cls)
        self._factory = None
        self._init(run, background, batch_interval, replay_root)
        # set before the run starts: a background run reads them when it ends
        self.options = self.run.options
        self.device = self.run.device or "cpu"
        return self

    def _init(self, run: Any, background: bool, batch_interval: float, replay_root: Any) -> None:
        RunConsumer.__init__(self, run, background=background, batch_interval=batch_interval)
        self.replay_root = Path(replay_root) if replay_root is not None else Path("sbs_replays")
        # a token id's text for a run that has a timeline (``tokenizer.decode``): views show
        # decoded tokens instead of ids (SbsWidget(decode=...) sets it)
        self.decode: Callable[[int], str] | None = None

    # ------------------------------------------------------------------ state
    @property
    def status(self) -> dict[str, Any]:
        """The run's progress (RunStatus fields) plus ``state``, ``error``, ``rows`` and
        the ``device`` actions run on."""
        d = RunConsumer.status.fget(self)  # type: ignore[attr-defined]
        d["device"] = self.device
        return d

    def run_kind(self) -> dict[str, Any]:
        """The kind of run this session holds (``align/kinds.py``), in a view's words;
        ``answer``: the one-sentence answer of a kind that answers (bisection, advice)."""
        return {"name": self.run.KIND, "label": self.run.LABEL, "answer": self.run.answer()}

    def timeline(self) -> dict[str, Any] | None:
        """The run's two sides step by step as a view draws them (the generation parity's
        token streams, decoded with :attr:`decode`), JSON-safe; None for a kind with none."""
        timeline = self.run.timeline(self.decode)
        return None if timeline is None else jsonable(timeline)

    def why_not(self, action: str) -> str | None:
        """None when ``action`` applies to the run this session holds, else why not."""
        return self.run.why_not(action)

    def action_states(self) -> list[dict[str, Any]]:
        """Every row of :func:`action_table` with whether it applies to the run this
        session holds (``applies``) and, where not, why (``why_not``)."""
        return [
            {
                **row,
                "applies": self.why_not(row["name"]) is None,
                "why_not": self.why_not(row["name"]),
            }
            for row in action_table()
        ]

    def buttons(self) -> list[dict[str, Any]]:
        """The rows of :func:`action_table` that apply to this run's kind: the buttons a
        view shows (those that do not apply are hidden; :meth:`act` says why)."""
        return [row for row in action_table() if self.why_not(row["name"]) is None]

    # ---------------------------------------------------------------- actions
    def act(
        self,
        name: str,
        node: int | str | Record | None = None,
        *,
        device: str | None = None,
        folder: str | Path | None = None,
    ) -> ActionResult:
        """Run one action of :data:`ACTIONS` by name, as a view's button does: never
        raises for what the user can fix (no node selected, the run still going, CUDA
        missing), it says so in the result's message."""
        spec = ACTIONS.get(name) if isinstance(name, str) else None
        if spec is None:
            known = ", ".join(ACTIONS)
            return ActionResult(str(name), False, f"unknown action {name!r} (known: {known})")
        try:
            why = self.run.why_not(name)
            if why is not None:
                raise ActionError(why)
            if spec.needs_node and node is None:
                raise ActionError("select a row first")
            return getattr(self, spec.method)(node=node, device=device, folder=folder)
        except Exception as e:
            msg = str(e) if isinstance(e, ActionError) else f"{type(e).__name__}: {e}"
            return ActionResult(name, False, msg)

    def _act_stop(self, **_: Any) -> ActionResult:
        self.stop()
        return ActionResult("stop", True, "stopping after the current node")

    def _act_device(self, *, device: str | None, **_: Any) -> ActionResult:
        self.set_device(device or "cpu")
        return ActionResult("device", True, f"actions now run on {self.device}", self.device)

    def _act_rerun(self, *, node: Any, **_: Any) -> ActionResult:
        rec = node if isinstance(node, Record) else None
        result = jsonable(self.rerun_in_torch(node))
        if result.get("error"):
            return ActionResult("rerun", False, str(result["error"]), result)
        return ActionResult("rerun", True, _rerun_message(result, rec), result)

    def _act_save_replay(self, *, node: Any, **_: Any) -> ActionResult:
        saved = self.save_replay(node)
        message = f"bundle {saved.bundle} · config {saved.config}"
        return ActionResult("save_replay", True, message, saved.to_dict())

    def _act_save_culprit(self, **_: Any) -> ActionResult:
        bundle = self.save_culprit_bundle()
        if bundle is None:
            return ActionResult("save_culprit", False, "the run names no culprit ONNX node")
        return ActionResult("save_culprit", bundle.reproduced, bundle.to_text(), bundle.to_dict())

    def _act_export(self, *, folder: str | Path | None, **_: Any) -> ActionResult:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = self.save_html(Path(folder or ".") / f"onnx-sbs-report-{stamp}.html")
        return ActionResult("export", True, f"report written to {path.resolve()}", str(path))

    def save_html(self, path: str | Path, *, title: str = "") -> Path:
        """Write the run as one self-contained HTML file that opens offline (the report
        of ``onnx-sbs run ... -o report.html``); a run still going is saved as it is."""
        from ..reports.html import write_report_html

        return write_report_html(
            self.records,
            Path(path),
            summary=self.summary if self.finished else None,
            status=self.status,
            model=self.run.model,
            title=title,
            details=self.culprit_detail() if self.finished else None,
            timeline=self.timeline() if self.finished else None,
        )

    @property
    def inputs(self) -> dict[str, Any] | None:
        """Over many inputs: ``{"total", "done", "failing", "names"}`` (None over one)."""
        return self.run.inputs_info()

    def input_records(self, index: int) -> list[Record]:
        """Over many inputs, the records of input ``index`` alone (run again unless the
        run kept them); an ActionError says why not (one input, a run still going, an
        iterator read once)."""
        if self.run.inputs_info() is None:
            raise ActionError("this run is over one input")
        self._require_idle_run("show one input")
        try:
            return self.run.input_records(index)
        except SbsInputError as e:
            raise ActionError(str(e)) from None

    def culprit_detail(self) -> dict[str, Any] | None:
        """``{"row", "node": node_detail}`` of the culprit's ONNX node (its whole stack
        trace among them), or None: no culprit, not an ONNX node, or no run to ask."""
        culprit = culprit_of(self.summary)
        if culprit is None or culprit.get("step") is None:
            return None
        records = self.records
        row = next((i for i, r in enumerate(records) if r.step == culprit["step"]), -1)
        rec = records[row] if row >= 0 else None
        if rec is None or rec.onnx_id_node is None or rec.onnx_id_node < 0:
            return None
        try:
            return {"row": row, "node": jsonable(self.node_detail(rec))}
        except Exception:  # a session over records alone: the card shows the source line
            return None

    def _action(self, name: str, action: str, *args: Any, **kwargs: Any) -> Any:
        """Calls ``action`` of the run's node actions (``post/actions.RunActions``), for
        the session's action ``name``: an ActionError says why it does not apply to this
        run; its input errors become ActionErrors.  Over many inputs, the actions are
        those of a run over the input of the node's record (where it is worst)."""
        why = self.run.why_not(name)
        if why is not None:
            raise ActionError(why)
        node = args[0] if args and isinstance(args[0], Record) else None
        try:
            return getattr(self.run.node_actions(node), action)(*args, **kwargs)
        except SbsInputError as e:
            raise ActionError(str(e)) from None

    def _require_idle_run(self, action: str) -> None:
        if self.running:
            raise ActionError(f"{action}: the run is still going; press Stop or wait for it to end")

    @staticmethod
    def _node(node: int | str | Record) -> int | str | Record:
        if isinstance(node, Record):
            if node.onnx_id_node is None or node.onnx_id_node < 0:
                raise ActionError(
                    f"{node.ep_name or node.onnx_name!r} is not the output of an ONNX node "
                    "(graph inputs and initializers cannot be rerun or replayed)"
                )
            return node
        if isinstance(node, int) and not isinstance(node, bool):
            return node
        if not isinstance(node, str) or not node:
            raise ActionError(f"expected the name of an ONNX node, got {node!r}")
        return node

    def node_detail(self, node: int | str | Record) -> dict[str, Any]:
        """ONNX op, attributes, inputs with their pairing, fx target and stack trace."""
        return self._action(NODE_DETAIL, "node_detail", self._node(node))

    def rerun_in_torch(self, node: int | str | Record, device: str | None = None) -> dict[str, Any]:
        """Rerun one ONNX node in the torch evaluator, fed as its own-error run is (torch
        values of its inputs, or values computed from them), after the run."""
        node = self._node(node)
        self._require_idle_run("rerun")
        dev = device or self.device
        self._check_device(dev)
        return self._action(RERUN, "rerun_in_torch", node, device=dev)

    def save_replay(self, node: int | str | Record, root: str | Path | None = None) -> SavedReplay:
        """Write the node's replay bundle inside *root*, plus the ReplayConfig JSON that
        selects the same node (reusable with ``run_aligned(replay=...)`` and the CLI)."""
        node = self._node(node)
        self._require_idle_run("save replay")
        k, proto = self._action(SAVE_REPLAY, "find_node", node)
        root = Path(root) if root is not None else self.replay_root
        root.mkdir(parents=True, exist_ok=True)
        bundle = Path(self._action(SAVE_REPLAY, "save_replay", k, root))
        config = self._save_replay_config(proto.name or proto.output[0], root, bundle)
        return SavedReplay(bundle=bundle, config=config)

    def save_culprit_bundle(self, root: str | Path | None = None) -> Any:
        """Write the culprit's replay bundle inside *root* (the session's replay folder by
        default) and replay it: a :class:`~onnx_sbs_nb.reports.culprit_bundle.CulpritBundle`
        saying whether it reproduces the error, or None without a culprit ONNX node."""
        from ..reports.culprit_bundle import save_culprit_bundle

        self._require_idle_run("save the culprit's bundle")
        why = self.run.why_not(SAVE_CULPRIT)
        if why is not None:
            raise ActionError(why)
        summary = self.summary  # summarized again unless the run ended: once here
        summary = summary if isinstance(summary, Summary) else None
        try:
            return save_culprit_bundle(self.run, root or self.replay_root, summary)
        except SbsInputError as e:
            raise ActionError(str(e)) from None

    def save_node_data(self, path: str | Path, metric: str = "err_abs") -> Any:
        """Write the run's per-node errors for Model Explorer (``NAME.node_data.json``).

        For an ``optimize=`` run the graph onnxruntime runs is saved beside it (the node
        keys name its nodes); ``.command()`` of the result is the line that opens them.
        ``metric``: ``err_abs``, ``err_rel``, or the own error ``err_abs2`` / ``err_rel2``.
        """
        from ..reports.model_explorer import save_node_data

        self._require_idle_run("save node data")
        why = self.run.why_not(NODE_DATA)
        if why is not None:
            raise ActionError(why)
        model = self.run.model
        deployed = self.run.deployment is not None
        try:
            return save_node_data(self.records, path, model, save_model=deployed, metric=metric)
        except SbsInputError as e:
            raise ActionError(str(e)) from None

    def _save_replay_config(self, node: str, root: Path, bundle: Path) -> Path:
        from ..align.post.replay import ReplayConfig

        cfg = ReplayConfig(names=[node])
        # the bundle folder name is already sanitised by the engine: reuse it
        folder = root.resolve()
        path = folder / f"{bundle.name}.replay.json"
        if path.parent != folder:
            raise ActionError(f"refusing to write {path}: it is not inside {folder}")
        # written whole to a new file: a link planted at that name is replaced, not followed
        return cfg.save(path)

    def set_device(self, device: str) -> None:
        """Where actions (and a new run, :meth:`restart`) execute: ``"cpu"`` or ``"cuda"``."""
        self._check_device(device)
        self.device = device

    @staticmethod
    def _check_device(device: str) -> None:
        if not isinstance(device, str):
            raise ActionError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}")
        try:
            resolve_device(device)
        except SbsInputError as e:
            raise ActionError(f"cannot use {device!r}: {e}") from None

    def restart(self) -> SbsSession:
        """A new session running the same comparison on the current device."""
        if self._factory is None:
            raise ActionError("restart needs a session built from ep, onx and inputs")
        self._require_idle_run("restart")
        new = SbsSession.__new__(SbsSession)
        new._factory = self._factory
        new._init(
            self._factory(self.device), self.background, self.batch_interval, self.replay_root
        )
        new.device = self.device
        new.options = self.options
        return new

    def __repr__(self) -> str:
        s = self.status
        return (
            f"SbsSession(state={self._state!r}, rows={s['rows']}, failures={s.get('failures', 0)}, "
            f"max_err_abs={s.get('max_err_abs', 0.0):.3g}, device={self.device!r})"
        )


def _rerun_message(result: dict[str, Any], rec: Record | None) -> str:
    """What the rerun found, in the table's words: its own error next to the table's."""
    parts = []
    for out in result.get("outputs") or []:
        bits = [str(out.get("onnx_name"))]
        own = out.get("err_abs_vs_torch")
        if own is not None:
            bits.append(f"own err {_fmt(own)}")
            if (
                rec is not None
                and out.get("onnx_name") == rec.onnx_name
                and rec.err_abs2 is not None
            ):
                # the run's own error came from its runtime: say so when they disagree
                bits.append(f"(table: {_fmt(rec.err_abs2)})")
        else:
            bits.append("no torch value to compare with")
        if out.get("err_abs_vs_first_run") is not None:
            bits.append(f"vs first run {_fmt(out['err_abs_vs_first_run'])}")
        parts.append(" ".join(bits))
    dev = result.get("device", "?")
    return f"reran on {dev}: " + ("; ".join(parts) if parts else "no output compared")


def _fmt(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


__all__ = [
    "ACTIONS",
    "FAILED",
    "FINISHED",
    "IDLE",
    "RUNNING",
    "STOPPED",
    "Action",
    "ActionError",
    "ActionResult",
    "Listener",
    "SavedReplay",
    "SbsSession",
    "many_inputs",
    "split_inputs",
]
