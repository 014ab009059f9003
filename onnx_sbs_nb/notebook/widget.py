"""SbsWidget: watch a side-by-side run live in Jupyter, click a node, act on it.

The widget is a view over an :class:`~onnx_sbs_nb.notebook.session.SbsSession`; it renders with
the ES module built from ``js/`` (``onnx_sbs_nb/static/widget.js``).  The same bundle's
``renderStatic(el, state)`` renders HTML reports, from
:func:`~onnx_sbs_nb.reports.view_state.widget_state`.

Everything a saved notebook needs lives in the synced traits named by
:data:`~onnx_sbs_nb.reports.view_state.STATE_TRAITS` (serialised by :mod:`onnx_sbs_nb.reports.view_state`;
schema documented at the top of ``js/src/index.js``):

- ``schema``: the record schema, :func:`~onnx_sbs_nb.records.schema_dict` (field labels,
  formats, column priorities; statuses with their ``failing`` flag and tone): the only
  place the front end learns them;
- ``columns``: Record field names, the order of the columns of ``rows``;
- ``rows``: the records as encoded columns (:func:`~onnx_sbs_nb.reports.view_state.encode_rows`);
  streamed to the browser in appended batches by custom messages while the run goes on,
  and synced in full once when it ends (so the executed notebook holds every row);
- ``graph``: the ONNX model's adjacency, for the neighbourhood view;
- ``status``: RunStatus fields + ``state``, ``error``, ``rows``, ``device``;
- ``summary``: ``Summary.to_dict()`` once the run ended, else None;
- ``atol``, ``rtol``: the tolerances the user gave (None: dtype-aware defaults);
- ``selected``: selected row index (-1: none), set by the browser;
- ``details``: ``{row, node, node_error, rerun, replay}`` for the selected row;
- ``device``, ``cuda_available``, ``cuda_reason``: the CUDA toggle;
- ``timeline``: the run's two sides step by step, or None (``Run.timeline()``: a
  generation parity's token streams, ``js/src/streams.js`` draws them);
- ``actions``: the session's action table (:func:`~onnx_sbs_nb.notebook.session.action_table`):
  the buttons, their labels, which act on the selected node.

Actions are the session's (:data:`~onnx_sbs_nb.notebook.session.ACTIONS`): the browser calls them
through anywidget's request/response commands (``experimental.invoke(model, "action",
{name, row, device})``, answered by :meth:`SbsWidget.action`, which looks the name up in
the table), shows "working" until the answer comes and the answer's message after;
errors are answered, never raised.  A command runs where the kernel handles the widget's
messages: on the comm subshell that JupyterLab >= 4.4 uses with ipykernel >= 7, so cells
(and Stop) are not held by it.

Displayed in a notebook, the widget makes two outputs: the interactive view, and a static
summary (:func:`~onnx_sbs_nb.reports.html.fallback_html`) that the view hides once it
renders.  Viewers that cannot run the widget (a notebook saved without its widget state,
``nbconvert --to html`` offline, GitHub) show the summary, and it says how to get the
interactive view: save the widget state, ``onnx-sbs notebook``, or
:meth:`SbsWidget.save_html`.
"""

from __future__ import annotations

import dataclasses
import threading
import traceback
import uuid
import weakref
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import anywidget
import traitlets as t
from anywidget.experimental import command

from ..align.blame.summary import Summary, failing_text
from ..device import cuda_availability
from ..records import FAILING_STATUSES, RECORD_FIELDS, Record, field_label, schema_dict
from ..reports.html import fallback_html, stack_of, summary_text
from ..reports.view_state import (
    BUNDLE_PATH,
    SHIM_ESM,
    STATE_TRAITS,
    bundle_js,
    culprit_name,
    culprit_of,
    encode_rows,
    graph_state,
    is_finite,
    jsonable,
    widget_state,
)
from .session import ACTIONS, IDLE, ActionError, SbsSession

# BUNDLE_PATH, bundle_js and widget_state are re-exported: callers of the first releases
# imported them from here
__all__ = ["BUNDLE_PATH", "SbsWidget", "build_figure", "bundle_js", "widget_state"]


#: Metadata key of the static summary output shown next to the widget.
FALLBACK_METADATA = "onnx_sbs"


# The widget whose state carries the JS bundle: one copy per notebook (1.3 MB each made
# three widgets a 5.4 MB notebook); the others carry SHIM_ESM, which waits for it.
_HOLDER: weakref.ref[Any] | None = None


def _bundle_holder() -> Any:
    """The live widget carrying the bundle, or None (none yet, or it was closed: its
    model is then gone from the page and from a saved notebook)."""
    w = _HOLDER() if _HOLDER is not None else None
    return w if w is not None and getattr(w, "comm", None) is not None else None


def _summary_json(value: Summary | None, widget: Any) -> dict[str, Any] | None:
    """What the front end and a saved notebook get of the summary: its JSON-safe dict."""
    return None if value is None else jsonable(value)


def _in_kernel() -> bool:
    """True in a Jupyter kernel (a frontend may draw widgets), False in terminal IPython."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython comes with ipywidgets
        return False
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


class SbsWidget(anywidget.AnyWidget):
    """Live view of a side-by-side run: the culprit, status, table, chart, layers, the
    graph around a node, actions.

    ``SbsWidget(ep, onx, inputs, atol=..., own_error=True, ...)`` builds
    the run (bad inputs fail here); displaying the widget runs it in the cell while
    rows stream to the browser (``background=True`` starts it at once in a thread, so
    every button works during the run).  ``SbsWidget(session=...)`` views an existing
    session, ``SbsWidget(records=[...])`` a list of records or a run of any kind
    (``SbsWidget(records=generation_parity(...), decode=tokenizer.decode)`` shows the two
    token streams, decoded).  ``export_dir`` is where the *Export report* button writes
    (default: the current folder).
    """

    # the record schema (records.FIELDS, STATUSES): every view's labels, columns, colours
    schema = t.Dict().tag(sync=True)
    columns = t.List(t.Unicode()).tag(sync=True)
    rows = t.Dict().tag(sync=True)
    graph = t.Dict().tag(sync=True)
    status = t.Dict().tag(sync=True)
    # the Summary in Python (prints as text, reads as its dict), its dict in the front end
    summary = t.Instance(Summary, allow_none=True).tag(sync=True, to_json=_summary_json)
    atol = t.Float(default_value=None, allow_none=True).tag(sync=True)
    rtol = t.Float(default_value=None, allow_none=True).tag(sync=True)
    selected = t.Int(-1).tag(sync=True)
    details = t.Dict().tag(sync=True)
    device = t.Unicode("cpu").tag(sync=True)
    cuda_available = t.Bool(False).tag(sync=True)
    cuda_reason = t.Unicode("").tag(sync=True)
    # the rows of the session's action table that apply to its run (session.buttons()):
    # the buttons the view shows
    actions = t.List(t.Dict()).tag(sync=True)
    # identifies the model across its views in the browser (not part of the state)
    uid = t.Unicode("").tag(sync=True)
    # a run over many inputs (live only, not part of the state): {total, done, failing,
    # names, shown}; ``shown``: the input whose records the views show (None: the worst
    # over all inputs), set by the browser's input picker or :meth:`show_input`
    inputs = t.Dict(allow_none=True, default_value=None).tag(sync=True)
    # the kind of run the session holds (live only): {name, label, answer}; every kind
    # is shown, with the buttons of the actions that apply to it (``actions``)
    run_kind = t.Dict().tag(sync=True)
    # the run's two sides step by step (``Run.timeline()``: a generation parity's token
    # streams, the parting step, its margin, the step the records compare), else None
    timeline = t.Dict(allow_none=True, default_value=None).tag(sync=True)

    def __init__(
        self,
        ep: Any = None,
        onx: Any = None,
        inputs: Any = None,
        options: Any = None,
        *,
        session: SbsSession | None = None,
        records: Iterable[Record] | None = None,
        background: bool = False,
        batch_interval: float = 0.25,
        replay_root: str | Path | None = None,
        export_dir: str | Path | None = None,
        decode: Any = None,
        **run_options: Any,
    ) -> None:
        if session is None:
            if records is not None:
                session = SbsSession.from_run(
                    records,
                    background=background,
                    batch_interval=batch_interval,
                    replay_root=replay_root,
                )
            elif ep is None or onx is None:
                raise TypeError(
                    "SbsWidget needs ep and onx (plus inputs), or session=SbsSession(...), "
                    "or records=[...]"
                )
            else:
                session = SbsSession(
                    ep,
                    onx,
                    inputs,
                    options,
                    background=background,
                    batch_interval=batch_interval,
                    replay_root=replay_root,
                    **run_options,
                )
        if decode is not None:
            session.decode = decode
        cuda_ok, cuda_why = cuda_availability()
        self._model_proto = session.run.model
        carries = _bundle_holder() is None  # the first live widget carries the bundle
        super().__init__(
            _esm=bundle_js() if carries else SHIM_ESM,
            schema=schema_dict(),
            columns=list(RECORD_FIELDS),
            graph=graph_state(self._model_proto) if self._model_proto is not None else {},
            status=jsonable(session.status),
            atol=session.options.atol,
            rtol=session.options.rtol,
            device=session.device,
            cuda_available=cuda_ok,
            cuda_reason=cuda_why,
            uid=uuid.uuid4().hex,
            run_kind=session.run_kind(),
            timeline=session.timeline(),
            # the table's buttons that apply to this kind of run (the others: hidden)
            actions=session.buttons(),
        )
        if carries:
            global _HOLDER
            _HOLDER = weakref.ref(self)
        self.session = session
        self.export_dir = Path(export_dir) if export_dir is not None else Path(".")
        self._lock = threading.RLock()
        self._shown: list[Record] | None = None  # one input's records, when picked
        self._sent = 0  # records streamed to the browser, in order
        self._details_cache: dict[int, dict[str, Any]] = {}
        self._handles: list[Any] = []
        _route_to_frontend_subshell(self.comm)
        self.on_msg(self._on_custom)
        self.observe(self._on_selected, names="selected")
        self.observe(self._on_inputs, names="inputs")
        self._sync_inputs()
        session.add_listener(self._on_event)
        if session.finished:
            self._on_finished()
        elif session.background:
            session.start()

    # ------------------------------------------------------------ run events
    def _on_event(self, event: str, payload: dict[str, Any]) -> None:
        if event == "rows":
            with self._lock:
                start, batch = payload["start"], payload["records"]
                if start != self._sent:  # only ever appended: resync if not
                    start, batch = self._sent, self.session.records[self._sent :]
                if batch:
                    self._sent = start + len(batch)
                    self.send({"type": "rows", "start": start, "rows": encode_rows(batch)})
                    self._culprit_so_far()
        elif event == "status":
            self.status = jsonable(payload["status"])
        elif event == "finished":
            self._on_finished()

    def _culprit_so_far(self) -> None:
        """While the run goes, the card names the culprit as soon as one is known: the
        summary so far is synced when its culprit changes (not every batch)."""
        if not self.session.running:
            return
        so_far = self.session.summary_so_far()
        c, shown = so_far.culprit, self.summary.culprit if self.summary is not None else None
        if c is not None and (
            shown is None or (c.step, c.onnx_name) != (shown.step, shown.onnx_name)
        ):
            self.summary = so_far

    def _on_finished(self) -> None:
        records = self.session.records
        self._sync_inputs()
        with self._lock:
            self._sent = len(records)
            with self.hold_sync():
                self.rows = encode_rows(records)  # the one full sync: what a notebook keeps
                summary = self.session.summary
                self.summary = summary if isinstance(summary, Summary) else None
                self.status = jsonable(self.session.status)
                self.timeline = self.session.timeline()
        for handle in self._handles:
            try:
                data, metadata = self._fallback_output()
                handle.update(data, raw=True, metadata=metadata)
            except Exception:
                traceback.print_exc()

    def send_state(self, key: Any = None) -> None:
        """As ipywidgets does, but ``rows`` and ``graph`` skip the search for binary
        buffers: they hold only JSON scalars, and that walk costs about 0.1 ms a row."""
        keys = list(self.keys) if key is None else [key] if isinstance(key, str) else list(key)
        big = [k for k in keys if k in ("rows", "graph")]
        if not big:
            super().send_state(key=key)
            return
        others = [k for k in keys if k not in big]
        if others:
            super().send_state(key=others)
        state = {k: getattr(self, k) for k in big}
        self._send({"method": "update", "state": state, "buffer_paths": []})

    # ------------------------------------------------------- browser messages
    def _on_custom(self, _widget: Any, content: Any, _buffers: Any = None) -> None:
        self.handle_message(content)

    def handle_message(self, content: Any) -> None:
        """Handle one message from the browser (``hello``: resend the rows it lacks)."""
        if not isinstance(content, dict) or content.get("type") != "hello":
            return
        have = content.get("have", 0)
        have = have if isinstance(have, int) and have >= 0 else 0
        with self._lock:
            batch = self._displayed()[have : self._sent]
            if batch:
                self.send({"type": "rows", "start": have, "rows": encode_rows(batch)})

    @command
    def ping(self, msg: Any, buffers: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
        """Answers a view's "is a run behind you?" (anywidget command ``"ping"``): a view
        drawn from a saved notebook's widget state gets no answer, and then offers no
        button that would wait for one (``js/src/actions.js``)."""
        return {"live": True, "state": self.session.state}, []

    @command
    def action(self, msg: Any, buffers: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
        """The browser's request ``{name, row, device}`` for one of the session's actions
        (anywidget command ``"action"``); answers ``{name, state: done|error, message}``."""
        msg = msg if isinstance(msg, dict) else {}
        return self.act(str(msg.get("name")), row=msg.get("row", -1), device=msg.get("device")), []

    def act(self, name: str, row: Any = -1, device: str | None = None) -> dict[str, Any]:
        """Run one of the session's actions as its button does (``row``: the selected
        record), and show its result where its table entry says (``Action.shows``: the
        device toggle, the row's rerun or replay in the detail panel).  Returns the
        answer the browser gets; never raises."""
        spec = ACTIONS.get(name) if isinstance(name, str) else None
        if spec is None:  # session.act says so, naming the actions it knows
            return self._answer(self.session.act(name))
        node = None
        why = self.session.why_not(name)
        if why is not None:  # the run's kind has no such action: say why, as its button
            return {"name": name, "state": "error", "message": why}
        if spec.needs_node:
            try:
                node = self._record(row)
            except ActionError as e:
                return {"name": name, "state": "error", "message": str(e)}
        done = self.session.act(name, node, device=device, folder=self.export_dir)
        if spec.shows and done.result is not None:
            trait, _, key = spec.shows.partition(".")
            if key:
                self._update_details(int(row), **{key: done.result})
            else:
                setattr(self, trait, done.result)
        return self._answer(done)

    @staticmethod
    def _answer(done: Any) -> dict[str, Any]:
        answer = done.to_dict()
        answer.pop("result")  # what the views need of it is in the traits it showed
        return answer

    def _displayed(self) -> list[Record]:
        """The records the views show: the run's, or one input's (the input picker)."""
        return self._shown if self._shown is not None else self.session.records

    # ------------------------------------------------------ many inputs
    def _sync_inputs(self, shown: int | None = None) -> None:
        info = self.session.inputs
        if info is not None:
            info["shown"] = shown
        self._syncing_inputs = True
        try:
            self.inputs = info
        finally:
            self._syncing_inputs = False

    def _on_inputs(self, change: dict[str, Any]) -> None:
        """The browser's input picker set ``inputs["shown"]``."""
        if getattr(self, "_syncing_inputs", False) or not self.session.finished:
            return
        shown = (change["new"] or {}).get("shown")
        try:
            self.show_input(shown)
        except ActionError as e:
            self._sync_inputs(None if self._shown is None else shown)
            self.status = {**self.status, "error": str(e)}

    def show_input(self, index: int | None) -> list[Record]:
        """Over many inputs: show input ``index``'s own records in the table, the chart and
        the card (run again unless the run kept them); ``None``: the worst over all inputs
        again.  Returns the records shown."""
        if index is None:
            records, shown = self.session.records, None
            summary = self.session.summary
        else:
            if not isinstance(index, int) or isinstance(index, bool):
                raise ActionError(f"an input index is an int, got {index!r}")
            records = self.session.input_records(index)
            shown = records
            from ..align.blame.summary import summarize

            summary = summarize(records, completion=self.session.completion)
        with self._lock:
            self._shown = shown
            self._details_cache.clear()
            self._sent = len(records)
            with self.hold_sync():
                self.selected = -1
                self.details = {}
                self.rows = encode_rows(records)
                self.summary = summary if isinstance(summary, Summary) else None
                self._sync_inputs(index)
        return records

    def _record(self, row: Any) -> Record:
        records = self._displayed()
        if not isinstance(row, int) or isinstance(row, bool) or not 0 <= row < len(records):
            raise ActionError("select a row first")
        return records[row]

    # ------------------------------------------------------------- selection
    def _on_selected(self, change: dict[str, Any]) -> None:
        row = change["new"]
        with self._lock:
            cached = self._details_cache.get(row)
        if cached is not None:
            self.details = dict(cached)
            return
        records = self._displayed()
        if not 0 <= row < len(records):
            return
        rec = records[row]
        if not rec.onnx_name or rec.onnx_id_node is None or rec.onnx_id_node < 0:
            # a weight, a graph input, a torch-only value: the panel says what it is
            self._update_details(row, node=None, node_error=None)
            return
        self._load_details(row, rec)  # reads the graph's metadata only: no value computed

    def _load_details(self, row: int, rec: Record) -> None:
        try:
            node = jsonable(self.session.node_detail(rec))
            self._update_details(row, node=node, node_error=None)
        except Exception as e:
            self._update_details(
                row,
                node=None,
                node_error=str(e) if isinstance(e, ActionError) else f"{type(e).__name__}: {e}",
            )

    def _update_details(self, row: int, **parts: Any) -> None:
        with self._lock:
            d = self._details_cache.setdefault(row, {"row": row})
            d.update(parts)
            if self.selected == row:
                self.details = dict(d)

    # ------------------------------------------------------------ display
    def _summary_now(self) -> Any:
        return self.session.summary if self.session.finished else None

    def _fallback_output(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(data, metadata) of the static summary shown next to the view."""
        records = self.session.records
        summary = self._summary_now()
        detail = self.session.culprit_detail() if summary is not None else None
        html = fallback_html(
            records,
            summary,
            status=self.session.status,
            uid=self.uid,
            sharing=True,
            stack=stack_of(detail),
        )
        text = summary_text(summary) if summary is not None else repr(self)
        return {"text/html": html, "text/plain": text}, {
            FALLBACK_METADATA: {"fallback_for": self.uid}
        }

    def _view_output(self) -> dict[str, Any]:
        data = super()._repr_mimebundle_()
        if isinstance(data, tuple):
            data = data[0]
        data = dict(data or {})
        # what viewers without widgets show of this output: the summary comes next
        data["text/plain"] = "SbsWidget: interactive view of an onnx-sbs run (summary below)"
        return data

    def _repr_mimebundle_(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        data = self._view_output()
        fallback, _ = self._fallback_output()
        data["text/plain"] = repr(self)
        data["text/html"] = fallback["text/html"]
        return data, {}

    def _ipython_display_(self, **kwargs: Any) -> None:
        from IPython.display import display

        if not _in_kernel():
            # terminal IPython draws no widget: run, then say once what was found
            if not self.session.background:
                self._ensure_started()
            display({"text/plain": repr(self)}, raw=True)
            return
        display(self._view_output(), raw=True)
        data, metadata = self._fallback_output()
        handle = display(data, raw=True, metadata=metadata, display_id=True)
        if handle is not None:
            self._handles.append(handle)
        if self.session.state == IDLE and not self.session.background:
            self.session.start()  # in the cell: rows stream while it runs

    # --------------------------------------------------------- Python API
    def _ensure_started(self) -> None:
        if self.session.state == IDLE:
            self.session.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the run ended (running it here if it was not started)."""
        return self.session.wait(timeout)

    def stop(self) -> None:
        self.session.stop()

    @property
    def records(self) -> list[Record]:
        """The records so far (the run is executed first if it was never started)."""
        self._ensure_started()
        return self.session.records

    def to_frame(self) -> Any:
        """The records as a pandas DataFrame (one row per Record)."""
        import pandas as pd

        recs = self.records
        return pd.DataFrame([dataclasses.asdict(r) for r in recs], columns=RECORD_FIELDS)

    def get_summary(self) -> Any:
        """The :class:`~onnx_sbs_nb.align.blame.summary.Summary` of the records so far (a stopped run
        says so: its verdict is never pass)."""
        from ..align.blame.summary import summarize

        return summarize(
            self.records,
            completion=self.session.completion,
            strict=self.session.options.strict,
        )

    def figure(self) -> Any:
        """A plotly Figure of the errors along execution order (log scale, exact zeros
        on their own strip)."""
        import plotly.graph_objects as go

        recs = self.records
        return build_figure(go, recs)

    def save_node_data(self, path: str | Path, metric: str = "err_abs") -> Any:
        """Per-node errors for Model Explorer: see :meth:`SbsSession.save_node_data`."""
        return self.session.save_node_data(path, metric)

    def save_html(self, path: str | Path, *, title: str = "") -> Path:
        """Write this run as one self-contained HTML file that opens offline (the same
        report as ``onnx-sbs run ... -o report.html``); returns its path.  The run is
        executed first if it was never started; a run still going is saved as it is."""
        self._ensure_started()
        return self.session.save_html(path, title=title)

    def state(self) -> dict[str, Any]:
        """The synced traits as a plain dict (what ``renderStatic`` takes)."""
        state = {k: getattr(self, k) for k in STATE_TRAITS}
        state["summary"] = _summary_json(self.summary, self)
        return state

    def __repr__(self) -> str:
        s = self.session.status
        worst = s.get("max_err_abs") or 0.0
        where = f" at {s['max_err_name']!r}" if s.get("max_err_name") else ""
        summary = self._summary_now()
        totals = (summary.get("totals") or {}) if summary is not None else {}
        inherited = totals.get("inherited", totals.get("drifted", 0))
        head = (
            f"SbsWidget({s['state']}: {s['rows']} records, "
            f"{failing_text(s.get('failures', 0), inherited, totals.get('carried', 'upstream'))}, "
            f"worst err_abs {worst:.3g}{where}"
        )
        culprit = culprit_of(summary)
        if culprit is not None:
            head += f", culprit {culprit_name(culprit)!r}"
            if culprit.get("ep_module"):
                head += f" in {culprit['ep_module']}"
        return head + ")"


def _route_to_frontend_subshell(comm: Any) -> None:
    """Let browser messages reach this widget on the subshell the browser chose.

    ipykernel >= 7 routes a comm's incoming messages to the subshell that last published
    on it (for code that blocks waiting for a reply).  An in-cell run publishes rows from
    the main shell, so Stop would queue behind the very cell it must stop.  This widget
    never waits for replies: the frontend's choice (JupyterLab >= 4.4 sends widget
    messages on a comm subshell) is the right one.
    """
    if comm is not None and callable(getattr(comm, "_reply_subshell_for", None)):
        comm._reply_subshell_for = lambda _data, default: default


def build_figure(go: Any, records: Sequence[Record]) -> Any:
    """Plotly figure: error and own error per record (log y), tolerance, failures.

    An exact zero has no place on a log axis: zeros are drawn on a strip of their own
    under the plot, labelled 0, and the lines break there instead of diving to a floor.
    """
    series = {k: ([], [], [], [], []) for k in ("err_abs", "err_abs2")}  # x, y, text, zx, zt
    tol_x, tol_y, fx, fy = [], [], [], []
    for i, r in enumerate(records):
        label = f"{r.ep_name} / {r.onnx_name} ({r.onnx_op_type})"
        for key, (x, y, text, zx, zt) in series.items():
            v = getattr(r, key)
            if not is_finite(v):
                continue
            if v == 0:
                zx.append(i)
                zt.append(label)
                if x and y[-1] is not None:
                    x.append(i - 0.5)
                    y.append(None)
                    text.append("")
                continue
            x.append(i)
            y.append(v)
            text.append(label)
        if r.status in FAILING_STATUSES and is_finite(r.err_abs) and r.err_abs > 0:
            fx.append(i)
            fy.append(r.err_abs)
        if is_finite(r.atol) and r.atol > 0:
            tol_x.append(i)
            tol_y.append(r.atol)
    fig = go.Figure()
    for key in series:
        name = field_label(key)
        x, y, text, zx, zt = series[key]
        fig.add_scatter(x=x, y=y, mode="lines+markers", name=name, hovertext=text, legendgroup=key)
        fig.add_scatter(
            x=zx,
            y=[0] * len(zx),
            yaxis="y2",
            mode="markers",
            name=f"{name} = 0",
            hovertext=zt,
            legendgroup=key,
            showlegend=False,
            marker={"symbol": "line-ns-open"},
        )
    fig.add_scatter(x=tol_x, y=tol_y, mode="lines", name="atol", line={"dash": "dot"})
    fig.add_scatter(x=fx, y=fy, mode="markers", name="failing", marker={"symbol": "x"})
    fig.update_layout(
        xaxis={"title": "node (execution order)", "anchor": "y2"},
        yaxis={"type": "log", "title": "abs error", "domain": [0.13, 1]},
        yaxis2={
            "domain": [0, 0.07],
            "range": [-1, 1],
            "tickvals": [0],
            "ticktext": ["0"],
            "showgrid": False,
            "fixedrange": True,
        },
        height=340,
    )
    return fig
