"""Real numerical bugs of the dynamo exporter (onnxscript's torch_lib), reproduced.

Each bug was reported or fixed on a public tracker; the model exercising its op is built
in code (tests/corpus/bug_models.py).  The release that had it is installed in its own
venv by scripts/exporter_bug_venvs.sh (torch 2.13.0 pinned); export_bug.py runs there
and writes model.pt2, model.onnx and inputs.pt; the engine then runs on those files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

ROOT = Path(__file__).resolve().parents[2]
EXPORT_SCRIPT = Path(__file__).with_name("export_bug.py")
# keep in sync with the default list of scripts/exporter_bug_venvs.sh
OLD_RELEASES = ("0.7.0", "0.6.0")


@dataclass(frozen=True)
class Bug:
    id: str  # also the bug_models builder name
    aten_op: str  # the op whose lowering is wrong, as in str(fx_node.target)
    buggy: str  # the onnxscript release that has the bug (its venv, or this venv's release)
    fixed: str  # the first release with the fix
    links: tuple[str, ...]
    what: str
    # the release the "fixed" export is made with: None for this venv's; a regression
    # still present in this venv's release is compared with the last release without it
    fixed_export: str | None = None


BUGS: tuple[Bug, ...] = (
    Bug(
        "gru",
        "aten.gru.input",
        "0.7.0",
        "0.7.1",
        (
            "https://github.com/microsoft/onnxscript/issues/2852",
            "https://github.com/microsoft/onnxscript/pull/2853",
        ),
        "aten_gru emitted ONNX GRU with the default linear_before_reset=0; PyTorch applies "
        "the hidden linear before the reset gate (linear_before_reset=1)",
    ),  # fmt: skip
    Bug(
        "pixel_unshuffle",
        "aten.pixel_unshuffle.default",
        "0.7.0",
        "0.7.1",
        ("https://github.com/microsoft/onnxscript/pull/2892",),
        "aten_pixel_unshuffle lowered to SpaceToDepth, whose DCR channel order is not "
        "PixelUnshuffle's (the inverse of DepthToSpace CRD)",
    ),
    Bug(
        "upsample_bilinear_size1",
        "aten.upsample_bilinear2d.vec",
        "0.7.0",
        "0.7.1",
        ("https://github.com/microsoft/onnxscript/pull/2918",),
        "upsample with align_corners=False used Resize coordinate mode pytorch_half_pixel, "
        "which special-cases an output size of 1 differently from PyTorch eager",
    ),
    Bug(
        "masked_scatter",
        "aten.masked_scatter.default",
        "0.7.0",
        "0.7.1",
        (
            "https://github.com/pytorch/pytorch/issues/186146",
            "https://github.com/microsoft/onnxscript/pull/2929",
        ),
        "aten_masked_scatter expanded only by rank: a same-rank broadcast mask (1,S,1) vs "
        "self (1,S,D) left the mask unexpanded, NonZero enumerated a subset, ScatterND wrote "
        "the wrong source elements",
    ),  # fmt: skip
    Bug(
        "bicubic_antialias",
        "aten._upsample_bicubic2d_aa.default",
        "0.7.0",
        "0.7.1",
        (
            "https://github.com/pytorch/pytorch/issues/183546",
            "https://github.com/microsoft/onnxscript/pull/2916",
        ),
        "antialiased upsampling emitted Resize with the default exclude_outside=0; PyTorch "
        "drops out-of-bounds taps and renormalises the filter (exclude_outside=1)",
    ),  # fmt: skip
)
# The second corpus's bugs (tests/corpus/test_exporter_bugs_sdpa_gemm_linear.py): a regression still in
# this venv's release, and two bugs of the optimizer and torch_lib fixed in 0.7.2.
BUGS2: tuple[Bug, ...] = (
    Bug(
        "sdpa_fully_masked_row",
        "aten.scaled_dot_product_attention.default",
        "0.7.2",
        "0.6.0",
        (
            "https://github.com/microsoft/onnxscript/pull/2654",
            "https://github.com/microsoft/onnxscript/issues/2561",
            "https://github.com/microsoft/onnxscript/pull/2479",
        ),
        "a regression: #2479 (0.4.0) matched torch on fully masked rows of a boolean mask "
        "(the -inf mask makes the Softmax row NaN, a Where(IsNaN) turns it into 0, as "
        "torch returns); #2654 (0.6.1) fills the mask with the dtype's lowest finite value "
        "instead, the Softmax row becomes uniform and no NaN is left to catch, so a fully "
        "padded query gets the mean of V. Still in 0.7.2 (this venv); 0.6.0 is correct",
        fixed_export="0.6.0",
    ),
    Bug(
        "gemm_beta_bn",
        "aten._native_batch_norm_legit_no_training.default",
        "0.7.0",
        "0.7.2",
        (
            "https://github.com/microsoft/onnxscript/pull/3027",
            "https://github.com/microsoft/onnxscript/pull/2553",
        ),
        "the optimizer's FuseBatchNormIntoGemm (a default rule since #2553) folds a "
        "BatchNorm into a Gemm whose beta != 1 "
        "(torch.addmm(b, x, w, beta=0.5)) and keeps beta on the fused node: the fused bias "
        "(b - mean) * s + shift gets scaled by beta again. Fixed in 0.7.2 (fused bias "
        "(beta * b - mean) * s + shift, beta dropped); also in 0.6.0 and 0.7.1",
    ),  # fmt: skip
    Bug(
        "linear_1d_weight",
        "aten.linear.default",
        "0.7.0",
        "0.7.2",
        (
            "https://github.com/microsoft/onnxscript/issues/2982",
            "https://github.com/microsoft/onnxscript/pull/2984",
            "https://github.com/pytorch/pytorch/issues/191332",
        ),
        "aten_linear with a 1-D weight unsqueezed it to (in, 1) for MatMul and never "
        "squeezed the added axis back: the result has shape (b, s, 1) where torch returns "
        "(b, s) (the following softmax then normalises over a size-1 axis: all ones)",
    ),
)
# Bugs in this venv's release that no release fixes (tests/corpus/test_live_exporter_bugs.py): the
# control is the same model without the argument that triggers the bug.
BUGS_LIVE: tuple[Bug, ...] = (
    Bug(
        "cross_entropy_label_smoothing",
        "aten.cross_entropy_loss.default",
        "0.7.2",
        "unfixed",
        (
            "https://github.com/microsoft/onnxscript/blob/v0.7.2/onnxscript/function_libs/torch_lib/ops/nn.py",
        ),
        'aten_cross_entropy_loss takes label_smoothing and drops it ("ignored due to ONNX '
        'not support"): the export computes the loss without smoothing, silently '
        "(3.17 against torch's 3.09 here); found by tests/corpus probing, no tracker entry",
    ),
    Bug(
        "avg_pool_divisor_override",
        "aten.avg_pool2d.default",
        "0.7.2",
        "unfixed",
        (
            "https://github.com/microsoft/onnxscript/blob/v0.7.2/onnxscript/function_libs/torch_lib/ops/nn.py",
            "https://github.com/pytorch/pytorch/issues/105349",
        ),
        "aten_avg_pool2d takes divisor_override and drops it (a TODO in its body): each "
        "window is divided by its size instead of the given divisor, silently (the old "
        "exporter refused the argument, pytorch#105349); found by probing ops' arguments",
    ),
    Bug(
        "scatter_reduce_mean",
        "aten.scatter_reduce.two",
        "0.7.2",
        "unfixed",
        (
            "https://github.com/microsoft/onnxscript/blob/v0.7.2/onnxscript/function_libs/torch_lib/ops/core.py",
            "https://github.com/onnx/onnx/issues/5100",
            "https://github.com/pytorch/pytorch/issues/147617",
        ),
        'aten_scatter_reduce maps reduce="mean" to ScatterElements reduction="none" (ONNX '
        "has no mean, onnx#5100): where several sources share an index the last one is "
        "written instead of their mean, silently (a GNN's segment mean, pytorch#147617)",
    ),
    Bug(
        "mean_dim_int_dtype",
        "aten.mean.dim",
        "0.7.2",
        "unfixed",
        (
            "https://github.com/microsoft/onnxscript/blob/v0.7.2/onnxscript/function_libs/torch_lib/ops/core.py",
            "https://github.com/microsoft/onnxscript/issues/3008",
            "https://github.com/microsoft/onnxscript/pull/3009",
        ),
        "aten_mean_dim reduces first and casts to the requested dtype after: an int64 "
        "mask's mean(dim, dtype=float32) is computed in integers and truncated (0.6 "
        "becomes 0); onnxscript#3009 moved the cast before the reduction for aten_mean "
        "without dim only",
    ),
    Bug(
        "log_sigmoid_large_negative",
        "aten.log_sigmoid.default",
        "0.7.2",
        "unfixed",
        (
            "https://github.com/microsoft/onnxscript/blob/v0.7.2/onnxscript/function_libs/torch_lib/ops/nn.py",
            "https://github.com/pytorch/pytorch/issues/1835",
            "https://github.com/pytorch/pytorch/pull/14830",
        ),
        "aten_log_sigmoid is Log(Sigmoid(x)): below about -17 onnxruntime's Sigmoid "
        "underflows and the loss is -inf (or 0.8 off at -17), where torch computes it "
        "stably since pytorch#1835; the old exporter had the same form (pytorch#14830)",
    ),
    Bug(
        "erfcx_lower_tail",
        "aten.special_erfcx.default",
        "0.7.2",
        "unfixed",
        (
            "https://github.com/microsoft/onnxscript/blob/v0.7.2/onnxscript/function_libs/torch_lib/ops/special.py",
        ),
        "aten_special_erfcx is Exp(x*x) * (1 - Erf(x)): 1 - Erf(x) cancels to nothing "
        "beyond x of about 3, so the lower tail of log_ndtr (a probit likelihood), which "
        "torch computes through erfcx, is far off or -inf; found by probing ops",
    ),
)
# the model exporting correctly beside each live bug
LIVE_CONTROLS = {
    "cross_entropy_label_smoothing": "cross_entropy_no_smoothing",
    "avg_pool_divisor_override": "avg_pool_default_divisor",
    "scatter_reduce_mean": "scatter_reduce_amax",
    "mean_dim_int_dtype": "mean_dim_cast_first",
    "log_sigmoid_large_negative": "softplus_same_loss",
    "erfcx_lower_tail": "erfcx_small_arguments",
}
BUGS_BY_ID = {b.id: b for b in (*BUGS, *BUGS2, *BUGS_LIVE)}


def this_release() -> str:
    import onnxscript

    return onnxscript.__version__


def export_release(release: str | None) -> str | None:
    """The venv release to export with: None when it is this venv's own release."""
    return None if release is None or release == this_release() else release


def venv_python(release: str) -> Path:
    return ROOT / f".venv-onnxscript-{release}" / "bin" / "python"


def missing_venv(release: str | None) -> str | None:
    """Why the old release cannot be used (None when its venv is there, or when it is
    this venv's release)."""
    if export_release(release) is None:
        return None
    py = venv_python(release)
    if not py.exists():
        return (
            f"no venv for onnxscript {release} ({py.parent.parent.name}): create it with "
            f"`bash scripts/exporter_bug_venvs.sh {release}`"
        )
    return None


def export_with_release(release: str | None, names: list[str], root: Path) -> dict[str, Path]:
    """Exports the bug models into root/<name>/; release None: this interpreter's
    exporter (in process), else the old venv's (one subprocess for all models)."""
    folders = {n: root / n for n in names}
    release = export_release(release)
    if release is None:
        import importlib.util

        spec = importlib.util.spec_from_file_location("_export_bug", EXPORT_SCRIPT)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        for n, f in folders.items():
            mod.main(n, str(f))
        return folders
    reason = missing_venv(release)
    if reason:
        raise FileNotFoundError(reason)
    code = (
        "import runpy, sys; m = runpy.run_path(sys.argv[1]); "
        "[m['main'](n, d) for n, d in zip(sys.argv[2::2], sys.argv[3::2])]"
    )
    argv = [str(venv_python(release)), "-c", code, str(EXPORT_SCRIPT)]
    for n, f in folders.items():
        argv += [n, str(f)]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    if out.returncode:
        raise RuntimeError(f"export with onnxscript {release} failed:\n{out.stderr[-3000:]}")
    for n, f in folders.items():
        got = json.loads((f / "versions.json").read_text())["onnxscript"]
        if got != release:
            raise RuntimeError(f"{n} was exported with onnxscript {got}, not {release}")
    return folders


@dataclass
class BugRun:
    aten_op: str | None  # the op whose lowering is wrong (None: not checked)
    verdict: str
    named: Any  # naming.Named | None
    named_targets: list[str]  # str(target) of the fx nodes the summary names
    bad: list  # evaluate.BadRecord
    summary_text: str
    paired: int
    unpaired: int

    @property
    def names_op(self) -> bool:
        """The summary names an fx node of the buggy op (the node whose lowering is wrong)."""
        return self.aten_op is not None and self.aten_op in self.named_targets


def run_on_files(folder: Path, aten_op: str | None = None) -> BugRun:
    """The engine on the saved files, with the rerun on torch inputs."""
    from onnx_sbs_nb.align.blame.summary import summarize
    from onnx_sbs_nb.align.run import AlignedRun

    from .evaluate import UNPAIRED, _bad_records
    from .naming import what_summary_names

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = AlignedRun(
            str(folder / "model.pt2"),
            str(folder / "model.onnx"),
            str(folder / "inputs.pt"),
            rerun_with_torch_inputs=True,
        )
        records = list(run)
    model = onnx.load(str(folder / "model.onnx"))
    s = summarize(records, node_inputs=model)
    named = what_summary_names(s, model)
    fx = {n.name: n for n in run.program.graph.nodes}
    targets = []
    if named is not None:
        for name in dict.fromkeys([*named.fx_nodes, named.ep_name]):
            if name in fx:
                targets.append(str(fx[name].target))
    return BugRun(
        aten_op, s.verdict, named, targets, _bad_records(records), s.to_text(),
        sum(r.status not in UNPAIRED for r in records),
        sum(r.status in UNPAIRED for r in records),
    )  # fmt: skip


def evaluate_bug(bug: Bug, root: Path | None = None) -> tuple[BugRun, BugRun]:
    """(run on the buggy release's export, run on this venv's fixed export)."""
    import tempfile

    root = Path(root or tempfile.mkdtemp(prefix=f"bug-{bug.id}-"))
    old = export_with_release(bug.buggy, [bug.id], root / bug.buggy)[bug.id]
    new = export_with_release(bug.fixed_export, [bug.id], root / "fixed")[bug.id]
    return run_on_files(old, bug.aten_op), run_on_files(new, bug.aten_op)


def describe(bug: Bug, res: tuple[BugRun, BugRun]) -> str:
    old, new = res
    lines = [
        f"## {bug.id}: {bug.aten_op} — onnxscript {bug.buggy} (buggy) vs "
        f"{fixed_release_label(bug.fixed_export)} (correct: {bug.fixed})",
        f"   {bug.what}",
        f"   links: {' '.join(bug.links)}",
        f"   buggy: verdict={old.verdict} named={old.named.label() if old.named else 'nothing'}"
        f" targets={old.named_targets} -> {_verdict_of_naming(old)}"
        f" (paired {old.paired}, unpaired {old.unpaired})",
    ]
    if not old.names_op:
        lines += [f"      {b.line()}" for b in old.bad[:5]]
    ok = new.verdict == "pass" and not new.bad
    lines.append(
        f"   fixed: verdict={new.verdict} failing={len(new.bad)} -> {'OK' if ok else 'FALSE ALARM'}"
    )
    if not ok:
        lines += [f"      {b.line()}" for b in new.bad[:5]]
    return "\n".join(lines)


def _verdict_of_naming(res: BugRun) -> str:
    if not res.names_op:
        return "WRONG"
    if any(b.status == "error" for b in res.bad):
        return "WRONG (named only because the node could not run: a tool limit, not a measure)"
    return "OK"


def fixed_release_label(release: str | None = None) -> str:
    if export_release(release) is None:
        return f"{this_release()} (this venv)"
    return f"{release} (.venv-onnxscript-{release})"


if __name__ == "__main__":  # quick look: python -m tests.corpus.exporter_bugs [ids]
    for b in (*BUGS, *BUGS2):
        if len(sys.argv) > 1 and b.id not in sys.argv[1:]:
            continue
        print(describe(b, evaluate_bug(b)), flush=True)
