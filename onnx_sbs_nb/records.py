"""The record yielded by :func:`onnx_sbs_nb.run_aligned`: one per aligned pair of values.

Field names follow the ones users of ``onnx-diagnostic`` know (``ep_*``, ``onnx_*``,
``err_*``); the fields after ``comment`` are ours.  Every field is a plain Python value
(``str``, ``int``, ``float``, ``bool`` or ``None``) so that records serialise to JSON and
``pandas.DataFrame(list(run_aligned(...)))`` works with no extra step.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from dataclasses import dataclass, field
from typing import Any

# Values of Record.kind
KIND_INPUT = "input"  # a graph input of both sides
KIND_WEIGHT = "weight"  # parameter / buffer / constant vs ONNX initializer
KIND_NODE = "node"  # an intermediate result
KIND_OUTPUT = "output"  # a graph output

# Values of Record.paired_by: the name of the pairing rule that paired the value, each
# declared once in align/pairing/rules.py (RULES), or UNPAIRED
UNPAIRED = "unpaired"

# Values of Record.status
STATUS_OK = "ok"  # compared, within tolerance
STATUS_FAIL = "fail"  # compared, beyond tolerance
STATUS_SHAPE_MISMATCH = "shape_mismatch"
STATUS_DTYPE_MISMATCH = "dtype_mismatch"
STATUS_ERROR = "error"  # a node failed to run (message in Record.error)
STATUS_UNPAIRED_EP = "unpaired_ep"  # only the torch side has this value
STATUS_UNPAIRED_ONNX = "unpaired_onnx"  # only the ONNX side has this value
STATUS_NOT_COMPARED = "not_compared"  # paired but not a tensor (e.g. a symbolic int)
# an input of the node could not be computed (an upstream node failed): inherited, so
# not this node's failure; its own error is still measured when its torch inputs exist
STATUS_NOT_COMPUTED = "not_computed"
# a weight differs from its torch parameter by design: every node consuming it agrees with
# torch, or the exporter folded fx nodes into it (a BatchNorm into a Conv) and its consumer
# is judged for both
STATUS_WEIGHT_DIFFERS = "weight_differs"
# a graph output only one side has: the model does not compute the program
STATUS_UNPAIRED_OUTPUT = "unpaired_output"
# only the torch side has this value: an optimizer fused it into a kernel (optimize=)
STATUS_INTERNAL = "internal"
# beyond tolerance, but only by what the node's dtype's rounding of its inputs gives through
# the op's sensitivity (cos of a large argument in float16): precision loss, no fault of
# the export (align/judge/precision_loss.py)
STATUS_PRECISION_LOSS = "precision_loss"
# beyond tolerance, but within what the model's own quantization (int8, its scales and zero
# points) explains: its SQNR, and its own rerun's, above what the bit width allows for
# (align/judge/quantization_noise.py)
STATUS_QUANTIZATION_NOISE = "quantization_noise"
# how the comment of such a value begins when its SQNR is under the floor, its own rerun's
# above: it amplifies the quantization noise of the values it is computed from
QUANTIZATION_AMPLIFIED = "quantization noise, amplified"
# the user's compare function failed on the pair (raised, returned no dict): the values were
# measured but not judged, and nothing is said of the model
STATUS_CHECK_ERROR = "check_error"

# the comment of a graph input holding NaN or infinities (read back by the summary)
NONFINITE_INPUT_NOTE = "holds NaN or infinite values"
# how the engine ends the error message of a node that raised in a runner other than
# onnxruntime while onnxruntime runs it on the same inputs: the runner's failure, not the
# model's (align/engine/second_opinion.py; the judge makes it not computed)
ONNXRUNTIME_RUNS_IT = " [onnxruntime runs this node on the same inputs]"
# the comment of a node computing at once fx nodes whose weights the exporter folded into
# its own (a Conv and its BatchNorm): read back by the summary's why
FOLDED_CONSUMER_NOTE = "computes at once the fx nodes"
# the comment of a weight that differs while its consumer agrees, with no own-error rerun
# to tell a fold from rows these inputs do not read: the summary names it
WEIGHT_UNEXPLAINED_NOTE = "own_error=True tells which"
# ... the same with own errors on, where its consumer's rerun could not be made
WEIGHT_UNTRIED_NOTE = "its rerun with the torch parameter could not be made"
# ... and of one whose consumer agrees given either weight: the input does not read what
# differs (a run over many inputs shows an input that does, when one does)
WEIGHT_UNREAD_NOTE = "this input does not read what differs"
# the comment of a weight within the tolerance of computed values but not a faithful copy
# of its torch parameter (judge/exact_weight.py): a change of the model's data
EXACT_WEIGHT_NOTE = "not a copy of its torch parameter"
# the comment of a weight that differs while its consumer agrees, and disagrees given the
# torch parameter: a change the consumer makes up for (a fold): the summary names it
WEIGHT_COMPENSATED_NOTE = "its consumer makes up for it"
# the comment of a node that reads a differing weight (perhaps one the exporter stored once
# for equal parameters) and agrees with torch once given the torch parameter its torch twin
# reads: its own error is the weight's, never a suspect of its own (judge/weights.py)
WEIGHT_READER_NOTE = "its own error is that of the weight"
# the comment of a precision loss that is float32's own rounding of an ill-conditioned
# computation (judge/conditioning.py): torch's value is as far from the exact result
ILL_CONDITIONED_NOTE = "ill-conditioned on these inputs"
# the comment of TopK indices that differ from torch's only among equal values (ties):
# both select the same values (judge/ties.py); where they differ, a tie broken the other
# way, which the values after it may show (blame/decisions.py)
TIE_NOTE = "indices differ only among equal values (ties): both select the same values"
# the comment of an index decision (ArgMax, ArgMin, TopK) that flips where torch's
# candidates are closer than the difference its input carries within tolerance
# (judge/decisions.py): no fault of the export, the model is unstable on these inputs
NEAR_TIE_NOTE = "a near tie flips the decision"
# the comment of a record failed by the user's verdict policy or compare function, not by
# atol/rtol: the culprit's why names what failed it
JUDGED_BY_NOTE = "failed by "
# how the comment of a quantized weight begins whose elements are further from the torch
# weight than half their quantization step (align/judge/quantization_step.py): the
# culprit's why cites it
QUANTIZATION_STEP_FAULT = "beyond its quantization step"
# the comment of a QDQ value whose QuantizeLinear clips its torch twin (judge/saturation.py):
# the culprit's why repeats it
CLIPS_NOTE = " to its calibrated range "
# ... and, when that clipping accounts for the node's own error (judge/saturation.py)
CLIPS_EXPLAIN_NOTE = (
    "the clipping accounts for its own error: the quantization's calibration range is "
    "narrower than these inputs' values (a loss of accuracy, not a fault of the export)"
)


@dataclass(frozen=True)
class StatusSpec:
    """What every view knows of one value of ``Record.status``: declared here only.

    ``failing``: counts as a failure (the summary's count, the widget's "failing" filter,
    the red rows and graph nodes); ``tone``: its colour in every view (``good``, ``bad``,
    ``warn``, ``muted``); ``compared``: the two values were compared; ``own``: a failure of
    the node itself even without a rerun; ``judged_elsewhere``: its ``passed`` flag is no
    verdict of its own (its consumers or an upstream node decide); ``group``: statuses a
    filter offers as one choice; ``doc``: one sentence for a reader; ``by_design``: the
    values were compared and differ by the exporter's design (a BatchNorm folded into a
    weight) while what they feed agrees: counted apart, never as an error.
    """

    label: str
    failing: bool = False
    tone: str = "muted"
    compared: bool = False
    own: bool = False
    judged_elsewhere: bool = False
    group: str | None = None
    doc: str = ""
    by_design: bool = False


#: Every status, in the order views list them.
STATUSES: dict[str, StatusSpec] = {
    STATUS_OK: StatusSpec("ok", tone="good", compared=True, doc="Compared, within tolerance."),
    STATUS_FAIL: StatusSpec(
        "fail", failing=True, tone="bad", compared=True, doc="Compared, beyond tolerance."
    ),
    STATUS_SHAPE_MISMATCH: StatusSpec(
        "shape mismatch",
        failing=True,
        tone="warn",
        compared=True,
        doc="The two values have different shapes: the export changed the computation.",
    ),
    STATUS_DTYPE_MISMATCH: StatusSpec(
        "dtype mismatch",
        failing=True,
        tone="warn",
        compared=True,
        doc="The two values have different element types.",
    ),
    STATUS_ERROR: StatusSpec(
        "error", failing=True, tone="bad", own=True, doc="The node failed to run."
    ),
    STATUS_UNPAIRED_OUTPUT: StatusSpec(
        "unpaired output",
        failing=True,
        tone="bad",
        doc="A graph output only one side has: the model does not compute the program.",
    ),
    STATUS_UNPAIRED_EP: StatusSpec(
        "unpaired (torch only)",
        group="unpaired",
        doc="A value only the torch program has (no ONNX value pairs with it).",
    ),
    STATUS_UNPAIRED_ONNX: StatusSpec(
        "unpaired (ONNX only)",
        group="unpaired",
        doc="A value only the ONNX model has (no torch value pairs with it).",
    ),
    STATUS_NOT_COMPARED: StatusSpec(
        "not compared",
        judged_elsewhere=True,
        doc="Paired, but not a tensor (a symbolic size, say): nothing to compare.",
    ),
    STATUS_NOT_COMPUTED: StatusSpec(
        "not computed",
        judged_elsewhere=True,
        doc="An input of the node could not be computed (an upstream node failed).",
    ),
    STATUS_WEIGHT_DIFFERS: StatusSpec(
        "weight differs",
        tone="warn",
        judged_elsewhere=True,
        by_design=True,
        doc="The weight differs from its torch parameter by design: every consumer agrees "
        "with torch, or the exporter folded other fx nodes into it (a BatchNorm into a Conv) "
        "and its consumer, judged for both, carries any error.",
    ),
    STATUS_CHECK_ERROR: StatusSpec(
        "compare function failed",
        tone="warn",
        # measured but not judged: not counted as compared (the coverage line says why)
        judged_elsewhere=True,
        doc="Your compare function failed on this pair (it raised or returned no dict): "
        "the values were measured, not judged; nothing is said of the model.",
    ),
    STATUS_INTERNAL: StatusSpec(
        "internal",
        doc="Only the torch side has this value: an optimizer fused it into a kernel.",
    ),
    STATUS_PRECISION_LOSS: StatusSpec(
        "precision loss",
        tone="warn",
        compared=True,
        judged_elsewhere=True,
        doc="Beyond tolerance only by its inputs' rounding to the node's dtype, which the "
        "op amplifies (cos of a large argument in float16): computed exactly, it agrees.",
    ),
    STATUS_QUANTIZATION_NOISE: StatusSpec(
        "quantization noise",
        tone="warn",
        compared=True,
        judged_elsewhere=True,
        doc="A quantized model's value beyond tolerance only by quantization noise: its "
        "SQNR, and its own rerun's on the torch values, above what the bit width allows for.",
    ),
}

FAILING_STATUSES = frozenset(k for k, v in STATUSES.items() if v.failing)


@dataclass(slots=True)
class Record:
    """One aligned pair (or one unpaired value) of a side-by-side run.

    ``err_*2`` fields hold the second comparison, made when the ONNX node is rerun on the
    torch values of its inputs (``own_error=True``): that is the node's own
    error, as opposed to the error it inherits from upstream.
    """

    # --- identification (onnx-diagnostic names) ---
    ep_id_node: int | None = None  # position of the fx node in the program's graph
    onnx_id_node: int | None = None  # position of the ONNX node (-1: graph input/initializer)
    ep_name: str | None = None
    onnx_name: str | None = None
    ep_target: str | None = None  # e.g. "aten.linear.default", "placeholder"
    onnx_op_type: str | None = None  # e.g. "Gemm", "initializer", "input"
    onnx_id_output: int | None = None  # which output of the ONNX node
    ep_shape_type: str | None = None  # e.g. "float32[2x3]"
    onnx_shape_type: str | None = None
    # --- first comparison ---
    err_abs: float | None = None
    err_rel: float | None = None
    err_dev: float | None = None  # 0 when both sides ran on the same device, else 1
    err_nan: float | None = None  # positions where NaN/Inf differ between the two sides
    err_h01: float | None = None  # elements with |diff| > 0.1
    err_h001: float | None = None  # elements with |diff| > 0.01
    ep_time_run: float | None = None  # seconds
    onnx_time_run: float | None = None
    # --- second comparison: ONNX node rerun on the torch inputs (own error) ---
    err_abs2: float | None = None
    err_rel2: float | None = None
    err_nan2: float | None = None
    err_h012: float | None = None
    err_h0012: float | None = None
    err_dev2: float | None = None
    # the own error over the largest magnitude of the torch value, where the own error
    # passed yet is not 0: an error made under tolerance, which a later node may amplify
    err_scale2: float | None = None
    comment: str | None = None
    # fx nodes whose lowering had to be recomputed from torch values to feed this node's
    # own-error run (values without a torch twin), comma-separated: if one of them makes
    # an error itself, this own error inherits it
    own_inputs_from: str | None = None
    # --- ours ---
    kind: str = KIND_NODE
    paired_by: str = UNPAIRED
    status: str = STATUS_OK
    passed: bool | None = None  # verdict of the first comparison against atol/rtol
    passed2: bool | None = None  # verdict of the own-error comparison, when rerun
    error: str | None = None  # what went wrong when a node failed to run
    atol: float | None = None  # tolerance used for the verdict (dtype-aware)
    rtol: float | None = None
    onnx_domain: str | None = None
    onnx_node_name: str | None = None  # name of the ONNX node producing onnx_name
    # the fx node (of the prepared program) whose lowering the ONNX node belongs to
    onnx_fx_node: str | None = None
    # --- the torch side in the user's words ---
    ep_user_name: str | None = None  # the fx node of the user's ``ep.graph`` it comes from
    ep_module: str | None = None  # module path, e.g. "model.layers.0.self_attn.q_proj"
    ep_source: str | None = None  # "modeling_llama.py:379 in forward: <code>"
    ep_device: str | None = None
    onnx_device: str | None = None
    reset: bool = False  # the ONNX side continued from the torch value after this pair
    step: int = 0  # position of the record in the stream
    # --- measures of the first comparison (definitions in measures.py) ---
    err_cos: float | None = None  # cosine similarity
    err_snr: float | None = None  # signal-to-noise ratio, dB
    err_l2: float | None = None  # ||e - g|| / ||e||
    err_p50: float | None = None  # median of |diff|
    err_p99: float | None = None  # 99th percentile of |diff|
    err_ulp: float | None = None  # max ulp distance in the ONNX value's dtype
    # what the user's compare function (compare=) returned besides "passed"
    extra: dict[str, Any] = field(default_factory=dict)
    # the fx nodes (the user's names, comma-separated) an ONNX node a graph tool fused
    # computes: it has no metadata of its own, its inputs and outputs pair
    onnx_fuses: str | None = None
    # --- a run over many inputs (align/many_inputs.py): one record per pair, the worst
    # input's, with what the other inputs gave (None on a run over one input) ---
    input_index: int | None = None  # the input this record comes from (0-based)
    input_name: str | None = None  # its file, when the inputs were files
    inputs_failing: int | None = None  # inputs on which this pair fails
    inputs_total: int | None = None  # inputs on which this pair was compared or run
    err_abs_mean: float | None = None  # mean abs error over those inputs
    # the verdict rule that decided the record (``align/judge/rules.py``), None for a value
    # without a partner
    decided_by: str | None = None
    # an elementwise op's own error at its worst element, relative to that element (where
    # the own error passed yet is not 0): the error err_scale2 hides beside large values
    err_elem2: float | None = None
    # zeros of the own rerun with the other sign than torch's (-0.0 against +0.0), where
    # the own error is 0: equal numbers that 1/x or atan2 downstream tell apart
    err_zero2: int | None = None
    # onnx_fx_node was inferred from the pairs (the model carries no exporter metadata):
    # the node is not known to lower that fx node, and its comparison covers no other
    onnx_fx_inferred: bool = False

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (NaN and infinities become strings)."""
        d = dataclasses.asdict(self)
        for k, v in d.items():
            if isinstance(v, float) and not math.isfinite(v):
                d[k] = str(v)
        if d["extra"]:
            d["extra"] = {
                k: str(v) if isinstance(v, float) and not math.isfinite(v) else v
                for k, v in d["extra"].items()
            }
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Record:
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {}
        for k, v in d.items():
            if k not in names:
                continue
            if isinstance(v, str) and v in ("nan", "inf", "-inf") and k.startswith("err_"):
                v = float(v)
            kw[k] = v
        return cls(**kw)

    @property
    def failed(self) -> bool:
        return self.status in FAILING_STATUSES

    @property
    def drifted(self) -> bool:
        """An intermediate value beyond tolerance whose node, rerun on the torch values of
        its inputs, agrees with torch: it carries an error made upstream (or rounding
        that the graph amplified), it makes none. Its failure alone is no verdict."""
        return self.kind == KIND_NODE and self.status == STATUS_FAIL and self.passed2 is True

    @property
    def inherits(self) -> bool:
        """A failing value (a node's or a graph output's) whose producer, rerun on the torch
        values of its inputs, agrees with torch: its error comes from upstream.  Unlike
        :attr:`drifted` it counts graph outputs, which still fail a verdict."""
        return self.kind in (KIND_NODE, KIND_OUTPUT) and self.failed and self.passed2 is True

    @property
    def own_error(self) -> float | None:
        """The node's own error when it was rerun on torch inputs, else None."""
        return self.err_abs2


def join_comments(a: str | None, b: str | None) -> str | None:
    """Two parts of a record's comment, either of which may be missing."""
    if not a:
        return b
    if not b:
        return a
    return f"{a}; {b}"


RECORD_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Record))


@dataclass(frozen=True)
class FieldSpec:
    """How every view shows one Record field: declared here only.

    ``label``: its name for a reader (the detail panel, report headers); ``short``: the
    table header when shorter; ``fmt``: ``text``, ``num`` (an error, a tolerance),
    ``int``, ``bool``, ``pass`` (True: pass, False: fail), ``seconds``, ``status`` or
    ``map`` (a dict, shown as ``key=value`` pairs);
    ``priority``: a column of the record tables, kept in this order as the width shrinks
    (0: always shown, None: no column; reports without scripts show those up to
    :data:`BRIEF_PRIORITY`); ``width``: the column's least width in px.
    """

    label: str
    fmt: str = "text"
    priority: int | None = None
    short: str | None = None
    width: int | None = None


#: Columns of a report with no room to fold them (the static summary): priority up to this.
BRIEF_PRIORITY = 6

#: Every Record field, in the order views list them (the user's words first).  Adding a
#: field to Record means one entry here; the widget, the reports and the detail panel
#: derive their columns from it (``tests/test_schema.py`` checks both sides agree).
FIELDS: dict[str, FieldSpec] = {
    "step": FieldSpec("#", "int", priority=3, width=48),
    "ep_user_name": FieldSpec("fx node", priority=0, short="fx node · module", width=150),
    "ep_name": FieldSpec("fx node (prepared)"),
    "ep_module": FieldSpec("module", priority=4, width=120),
    "ep_source": FieldSpec("source"),
    "ep_target": FieldSpec("fx target"),
    "onnx_name": FieldSpec("ONNX value", priority=5, width=120),
    "onnx_op_type": FieldSpec("op", priority=2, width=92),
    "onnx_domain": FieldSpec("ONNX domain"),
    "onnx_node_name": FieldSpec("ONNX node"),
    "onnx_fx_node": FieldSpec("lowering of"),
    "onnx_fuses": FieldSpec("fused node computing"),
    "onnx_id_output": FieldSpec("output #", "int"),
    "ep_id_node": FieldSpec("fx node position", "int"),
    "onnx_id_node": FieldSpec("ONNX node position", "int"),
    "kind": FieldSpec("kind", priority=8, width=60),
    "paired_by": FieldSpec("paired by", priority=10, width=80),
    "ep_shape_type": FieldSpec("shape/dtype (torch)"),
    "onnx_shape_type": FieldSpec(
        "shape/dtype (onnx)", priority=6, short="shape / dtype", width=150
    ),
    "err_abs": FieldSpec("abs error", "num", priority=0, short="err abs", width=76),
    "err_rel": FieldSpec("rel error", "num", priority=7, short="err rel", width=70),
    "err_abs2": FieldSpec("own abs error", "num", priority=0, short="own err", width=76),
    "err_snr": FieldSpec("SNR (dB)", "num", priority=6, short="snr dB", width=60),
    "err_cos": FieldSpec("cosine similarity", "num", priority=6, short="cos", width=60),
    "err_rel2": FieldSpec("own rel error", "num"),
    "err_nan": FieldSpec("nan/inf mismatches", "num", priority=9, short="nan", width=46),
    "status": FieldSpec("verdict", "status", priority=0, width=104),
    "passed": FieldSpec("verdict (first run)", "pass"),
    "passed2": FieldSpec("own verdict", "pass"),
    "atol": FieldSpec("atol", "num"),
    "rtol": FieldSpec("rtol", "num"),
    "err_h01": FieldSpec("|diff| > 0.1", "num"),
    "err_h001": FieldSpec("|diff| > 0.01", "num"),
    "err_dev": FieldSpec("devices differ", "num"),
    "err_nan2": FieldSpec("own nan/inf mismatches", "num"),
    "err_h012": FieldSpec("own |diff| > 0.1", "num"),
    "err_h0012": FieldSpec("own |diff| > 0.01", "num"),
    "err_dev2": FieldSpec("own devices differ", "num"),
    "err_scale2": FieldSpec("own error / magnitude", "num"),
    "err_elem2": FieldSpec("own error / its element", "num"),
    "err_zero2": FieldSpec("own zeros of the other sign", "int"),
    "err_l2": FieldSpec("relative L2 error", "num"),
    "err_p50": FieldSpec("median |diff|", "num"),
    "err_p99": FieldSpec("99th percentile |diff|", "num"),
    "err_ulp": FieldSpec("max ulp distance", "num"),
    "extra": FieldSpec("your compare function", "map"),
    "input_index": FieldSpec("worst input", "int"),
    "input_name": FieldSpec("worst input's file"),
    "inputs_failing": FieldSpec("inputs failing", "int"),
    "inputs_total": FieldSpec("inputs run", "int"),
    "err_abs_mean": FieldSpec("mean abs error over inputs", "num"),
    "own_inputs_from": FieldSpec("own inputs computed from"),
    "ep_device": FieldSpec("torch device"),
    "onnx_device": FieldSpec("onnx device"),
    "ep_time_run": FieldSpec("time torch", "seconds"),
    "onnx_time_run": FieldSpec("time onnx", "seconds"),
    "reset": FieldSpec("continued from the torch value", "bool"),
    "error": FieldSpec("error"),
    "comment": FieldSpec("comment"),
    "decided_by": FieldSpec("decided by"),
    "onnx_fx_inferred": FieldSpec("lowering inferred (no metadata)", "bool"),
}


def field_label(name: str, short: bool = False) -> str:
    """The reader's name of a field (the table header's with ``short``)."""
    spec = FIELDS.get(name)
    if spec is None:
        return name
    return (spec.short or spec.label) if short else spec.label


def brief_fields() -> tuple[str, ...]:
    """The columns of a report with no room to fold any, in the order of :data:`FIELDS`."""
    return tuple(
        k for k, v in FIELDS.items() if v.priority is not None and v.priority <= BRIEF_PRIORITY
    )


def schema_dict() -> dict[str, Any]:
    """The record schema as the front end takes it (the ``schema`` state key): fields and
    statuses in their view order, each as a plain dict."""
    return {
        "fields": [{"name": k, **dataclasses.asdict(v)} for k, v in FIELDS.items()],
        "statuses": [{"name": k, **dataclasses.asdict(v)} for k, v in STATUSES.items()],
    }


@dataclass
class RunStatus:
    """Progress of a run, readable by any view while the engine runs (plain attributes)."""

    total_onnx_nodes: int = 0
    done_onnx_nodes: int = 0
    total_ep_nodes: int = 0
    done_ep_nodes: int = 0
    records: int = 0
    failures: int = 0  # records whose status is failing
    errors: int = 0  # nodes that failed to run
    max_err_abs: float = 0.0
    max_err_name: str | None = None
    elapsed: float = 0.0
    finished: bool = False
    stopped: bool = False
    current: str | None = None  # name of the ONNX node being run
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def fraction(self) -> float:
        if not self.total_onnx_nodes:
            return 1.0 if self.finished else 0.0
        return self.done_onnx_nodes / self.total_onnx_nodes


_FIELDS = tuple(f.name for f in dataclasses.fields(Record))
_FIELD_VALUES = operator.attrgetter(*_FIELDS)
_ALL_INIT = all(f.init for f in dataclasses.fields(Record))


def copy_record(rec: Record, **changes: Any) -> Record:
    """``dataclasses.replace(rec, **changes)``, faster: a shallow copy with ``changes``."""
    if not _ALL_INIT:  # a field __init__ does not take: replace knows how to copy it
        return dataclasses.replace(rec, **changes)
    new = Record(*_FIELD_VALUES(rec))
    for name, value in changes.items():
        setattr(new, name, value)
    return new
