"""SbsSession: the one stateful controller of a side-by-side run.

It owns one :class:`~onnx_sbs_nb.align.run.AlignedRun`, consumes it (in the caller's thread
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

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..align.blame.summary import Summarizer, Summary, summarize
from ..align.engine.options import RunOptions
from ..completion import Completion
from ..device import resolve_device
from ..errors import SbsInputError
from ..records import FAILING_STATUSES, Record, RunStatus
from ..reports.view_state import culprit_of, is_finite, jsonable
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


def _status_dict(status: RunStatus | None) -> dict[str, Any]:
    return status.to_dict() if status is not None else RunStatus().to_dict()


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
        self.device = str(getattr(self.run, "device", None) or self.options.device or "cpu")

    @classmethod
    def from_run(
        cls,
        run: Any,
        *,
        background: bool = False,
        batch_interval: float = 0.25,
        replay_root: str | Path | None = None,
    ) -> SbsSession:
        """A session over an existing run: an AlignedRun, or any iterable of Records
        (the actions then say they are not available)."""
        self = cls.__new__(cls)
        self._factory = None
        # set before the run starts: a background run reads them when it ends
        self.options = getattr(run, "options", None) or RunOptions()
        self._init(run, background, batch_interval, replay_root)
        self.device = getattr(run, "device", None) or "cpu"
        return self

    def _init(self, run: Any, background: bool, batch_interval: float, replay_root: Any) -> None:
        if batch_interval < 0:
            raise ValueError(f"batch_interval must be >= 0, got {batch_interval}")
        self.run = run
        if hasattr(run, "on_input") and run.on_input is None:
            # a run over many inputs yields its records at the end: its views learn of
            # its progress after each input
            run.on_input = lambda _index, _status: self._notify("status", {"status": self.status})
        self.background = bool(background)
        self.batch_interval = float(batch_interval)
        self.replay_root = Path(replay_root) if replay_root is not None else Path("sbs_replays")
        self._lock = threading.RLock()
        self._records: list[Record] = []
        self._listeners: list[Listener] = []
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._state = IDLE
        self._error: str | None = None
        # the Summary once the run ended ({'error': traceback} if summarizing failed)
        self._summary: Summary | dict[str, Any] | None = None
        # fed batch by batch (O(1) a record): the culprit so far while the run goes
        self._so_far = Summarizer()
        self._so_far_n = 0
        self._stop_requested = False
        self._t0: float | None = None
        self._elapsed = 0.0

    # ------------------------------------------------------------------ state
    @property
    def state(self) -> str:
        return self._state

    @property
    def running(self) -> bool:
        return self._state == RUNNING

    @property
    def finished(self) -> bool:
        """True once the stream ended, whatever the reason."""
        return self._state in (FINISHED, STOPPED, FAILED)

    @property
    def error(self) -> str | None:
        """The traceback of an exception that ended the run, if any."""
        return self._error

    @property
    def records(self) -> list[Record]:
        """A snapshot of the records so far (safe to read while the run goes on)."""
        with self._lock:
            return list(self._records)

    def __len__(self) -> int:
        return len(self._records)

    @property
    def status(self) -> dict[str, Any]:
        """The run's progress (RunStatus fields) plus ``state``, ``error``, ``rows``."""
        run_status = getattr(self.run, "status", None)
        d = _status_dict(run_status)
        with self._lock:
            n = len(self._records)
            if run_status is None:
                # a plain iterable has no RunStatus: derive what can be derived
                d["records"] = n
                d["failures"] = sum(1 for r in self._records if r.status in FAILING_STATUSES)
                finite = [r for r in self._records if is_finite(r.err_abs)]
                if finite:
                    worst = max(finite, key=lambda r: r.err_abs)
                    d["max_err_abs"] = worst.err_abs
                    d["max_err_name"] = worst.onnx_name or worst.ep_name
        if self._t0 is not None:  # wall clock of the whole run, as the user lived it
            d["elapsed"] = (time.perf_counter() - self._t0) if self.running else self._elapsed
        d["state"] = self._state
        d["error"] = self._error
        d["rows"] = n
        d["device"] = self.device
        if self.finished:
            d["finished"] = True
            d["stopped"] = d.get("stopped") or self._state == STOPPED
        return d

    @property
    def completion(self) -> Completion:
        """How far the run got: finished, stopped (Stop, an interrupt) or incomplete
        (not started, still going, ended by an error)."""
        status = getattr(self.run, "status", None)
        if self._state == IDLE:
            return Completion.of_run(status, ended=False)
        error = self._error.strip().splitlines()[-1] if self._error else None
        return Completion.of_run(
            status,
            ended=self.finished,
            stopped=self._state == STOPPED,
            error=error if self._state == FAILED else None,
        )

    @property
    def summary(self) -> Summary | dict[str, Any]:
        """The :class:`Summary` (final once the run ended, of the records so far before;
        it reads as its dict too); its verdict is "stopped" or "incomplete" unless the run
        went to its end.  A bug in summarizing leaves ``{"error": traceback}``."""
        if self._summary is not None:
            return self._summary
        return summarize(self.records, completion=self.completion, strict=self.options.strict)

    # ---------------------------------------------------------------- actions
    def stop(self) -> None:
        """End the run after the current node; every record is kept.  Thread-safe."""
        self._stop_requested = True
        self._stop_run()

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
            model=getattr(self.run, "model", None),
            title=title,
            details=self.culprit_detail() if self.finished else None,
        )

    @property
    def inputs(self) -> dict[str, Any] | None:
        """Over many inputs: ``{"total", "done", "failing", "names"}`` (None over one)."""
        if not callable(getattr(self.run, "input_records", None)):
            return None
        extra = getattr(self.run, "status", RunStatus()).extra
        return {
            "total": extra.get("inputs_total"),
            "done": extra.get("inputs_done", 0),
            "failing": list(getattr(self.run, "failing_inputs", [])),
            "names": list(getattr(self.run, "input_names", [])),
        }

    def input_records(self, index: int) -> list[Record]:
        """Over many inputs, the records of input ``index`` alone (run again unless the
        run kept them); an ActionError says why not (one input, a run still going, an
        iterator read once)."""
        fn = getattr(self.run, "input_records", None)
        if not callable(fn):
            raise ActionError("this run is over one input")
        self._require_idle_run("show one input")
        try:
            return fn(index)
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

    def _action(self, action: str, *args: Any, **kwargs: Any) -> Any:
        """Calls one of the run's actions; its input errors become ActionErrors.  Over
        many inputs, the actions are those of a run over the input of the node's record
        (the input where it is worst), made for it."""
        actions = getattr(self.run, "actions", None)
        if actions is None and callable(getattr(self.run, "input_run", None)):
            node = args[0] if args else None
            index = getattr(node, "input_index", None)
            try:
                actions = self.run.input_run(index if isinstance(index, int) else 0).actions
            except SbsInputError as e:
                raise ActionError(str(e)) from None
        fn = getattr(actions, action, None)
        if not callable(fn):
            raise ActionError(
                f"{action} needs an AlignedRun; this session wraps a {type(self.run).__name__}"
            )
        try:
            return fn(*args, **kwargs)
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
        return self._action("node_detail", self._node(node))

    def rerun_in_torch(self, node: int | str | Record, device: str | None = None) -> dict[str, Any]:
        """Rerun one ONNX node in the torch evaluator, fed as its own-error run is (torch
        values of its inputs, or values computed from them), after the run."""
        node = self._node(node)
        self._require_idle_run("rerun")
        dev = device or self.device
        self._check_device(dev)
        return self._action("rerun_in_torch", node, device=dev)

    def save_replay(self, node: int | str | Record, root: str | Path | None = None) -> SavedReplay:
        """Write the node's replay bundle inside *root*, plus the ReplayConfig JSON that
        selects the same node (reusable with ``run_aligned(replay=...)`` and the CLI)."""
        node = self._node(node)
        self._require_idle_run("save replay")
        k, proto = self._action("find_node", node)
        root = Path(root) if root is not None else self.replay_root
        root.mkdir(parents=True, exist_ok=True)
        bundle = Path(self._action("save_replay", k, root))
        config = self._save_replay_config(proto.name or proto.output[0], root, bundle)
        return SavedReplay(bundle=bundle, config=config)

    def save_culprit_bundle(self, root: str | Path | None = None) -> Any:
        """Write the culprit's replay bundle inside *root* (the session's replay folder by
        default) and replay it: a :class:`~onnx_sbs_nb.reports.culprit_bundle.CulpritBundle`
        saying whether it reproduces the error, or None without a culprit ONNX node."""
        from ..reports.culprit_bundle import save_culprit_bundle

        self._require_idle_run("save the culprit's bundle")
        run = self.run
        replayable = callable(getattr(getattr(run, "actions", None), "save_replay", None))
        if not replayable and not callable(getattr(run, "input_run", None)):
            raise ActionError(
                f"save the culprit's bundle needs an AlignedRun; this session wraps a "
                f"{type(self.run).__name__}"
            )
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
        model = getattr(self.run, "model", None)
        if model is None:
            raise ActionError(
                f"save node data needs the run's ONNX model; this session wraps a "
                f"{type(self.run).__name__}"
            )
        deployed = getattr(self.run, "deployment", None) is not None
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
