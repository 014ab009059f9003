"""Runs the whole corpus (tests/corpus) and prints a table, model by model.

For each zoo model: pairing counts and coverage, the faithful verdict and any false alarm (record,
status, error message, comment), and for each injected fault what the summary named
against the node the fault was injected into.  With --bugs, also the real exporter bugs
(needs the venvs of scripts/exporter_bug_venvs.sh).

    .venv/bin/python scripts/corpus_report.py [--models a,b] [--bugs] [--pipelines] [--out FILE]

--pipelines: the deployment pipelines (tests/corpus/pipelines.py), one row per
architecture and pipeline: verdict, coverage (torch nodes compared, and the share of the
plain export's), and the three planted faults.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.corpus.evaluate import choose_fault, fault_plan, run  # noqa: E402
from tests.corpus.zoo import ZOO, export_entry  # noqa: E402
from tests.corpus.zoo_vision_and_program_features import ZOO2  # noqa: E402


def _zoo(names: set[str] | None, emit, zoo=ZOO) -> None:
    faithful_ok = faults_ok = faults_total = 0
    for index, entry in enumerate(zoo):
        if names and entry.name not in names:
            continue
        t0 = time.perf_counter()
        try:
            ex = export_entry(entry)
        except Exception as e:
            emit(f"\n## {entry.name} ({entry.kind}): EXPORT FAILED {type(e).__name__}: {e}"[:400])
            continue
        t_export = time.perf_counter() - t0
        try:
            out = run(ex, ex.onx)
        except Exception as e:  # the engine raised: that is a finding too
            emit(f"\n## {entry.name} ({entry.kind}): ENGINE RAISED {type(e).__name__}: {e}"[:600])
            continue
        faithful_ok += out.faithful_ok
        emit(
            f"\n## {entry.name} ({entry.kind}) — {len(ex.onx.graph.node)} ONNX nodes, "
            f"export {t_export:.1f}s, run {out.seconds:.1f}s"
        )
        emit(
            f"pairing: {out.records} records, {out.paired} paired, "
            f"{out.unpaired_ep} torch-only, {out.unpaired_onnx} onnx-only"
        )
        emit(f"coverage: {out.coverage}")
        status = "OK" if out.faithful_ok else "FALSE ALARM"
        emit(
            f"faithful: verdict={out.verdict} failing={len(out.bad)} "
            f"named={out.named.label() if out.named else 'nothing'} -> {status}"
        )
        for b in out.bad[:8]:
            emit(f"    {b.line()}")
        if len(out.bad) > 8:
            emit(f"    ... {len(out.bad) - 8} more failing records")
        for kind, depth in fault_plan(index):
            faults_total += 1
            try:
                fault, bad = choose_fault(ex, kind, depth)
            except (LookupError, AssertionError) as e:
                emit(f"  fault {kind}-{depth}: NO VALID FAULT ({e})")
                continue
            res = run(ex, bad, fault)
            faults_ok += bool(res.correct)
            mark = "OK" if res.correct else "WRONG"
            emit(
                f"  fault {fault.id} @{fault.position}/{len(ex.onx.graph.node)}: {fault.what}\n"
                f"      injected={fault.target} [{fault.op_type}]  named="
                f"{res.named.label() if res.named else 'nothing'} verdict={res.verdict} -> {mark}"
            )
            if not res.correct:
                for b in res.bad[:4]:
                    emit(f"        {b.line()}")
    emit(f"\nfaithful exports without false alarm: {faithful_ok}")
    emit(f"injected faults named correctly: {faults_ok}/{faults_total}")


def _bugs(emit) -> None:
    from tests.corpus import exporter_bugs as eb

    emit("\n# real exporter bugs")
    for bug in (*eb.BUGS, *eb.BUGS2):
        try:
            res = eb.evaluate_bug(bug)
        except Exception as e:  # a missing venv, an export that fails
            emit(f"## {bug.id}: {type(e).__name__}: {e}")
            continue
        emit(eb.describe(bug, res))


def _pipelines(names: set[str] | None, emit) -> None:
    from tests.corpus.evaluate import fault_plan
    from tests.corpus.naming import named_correctly
    from tests.corpus.pipelines import BROKEN, cases
    from tests.corpus.test_pipelines import PipelineSession

    session = PipelineSession()
    emit("\n# deployment pipelines")
    emit(f"{'architecture':16} {'pipeline':15} {'verdict':8} {'torch compared':>15} "
         f"{'of plain':>8}  faults named")  # fmt: skip
    for index, (arch, pipeline) in enumerate(cases()):
        if names and arch not in names:
            continue
        plain = session.run(arch, "plain")[1].coverage
        _, summary, _, _ = session.run(arch, pipeline)
        c = summary.coverage
        share = c.torch_compared / plain.torch_compared if plain.torch_compared else 0.0
        named = []
        if (arch, pipeline) in BROKEN:
            named.append(f"broken by the tool: {BROKEN[(arch, pipeline)]}")
        else:
            for kind, depth in fault_plan(index):
                try:
                    _, s, proto, fault = session.run(arch, pipeline, (kind, depth))
                except LookupError:
                    named.append(f"{kind}: no fault")
                    continue
                ok = s.verdict == "fail" and named_correctly(s, proto, fault.target)
                named.append(f"{kind}-{depth}: {'named' if ok else 'WRONG'}")
        emit(
            f"{arch:16} {pipeline:15} {summary.verdict:8} "
            f"{f'{c.torch_compared}/{c.torch_nodes}':>15} {share:>8.0%}  {'; '.join(named)}"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="", help="comma-separated zoo model names (default: all)")
    p.add_argument("--bugs", action="store_true", help="also the real exporter bugs")
    p.add_argument("--no-zoo", action="store_true")
    p.add_argument("--pipelines", action="store_true", help="the deployment pipelines")
    p.add_argument(
        "--honest", action="store_true",
        help="the honest-answers cases (tests/corpus/honest.py): NaN inputs, folded weights",
    )  # fmt: skip
    p.add_argument(
        "--zoo", choices=("1", "2", "all"), default="all",
        help="which zoo: 1 (tests/corpus/zoo.py), 2 (zoo_vision_and_program_features.py) or all (default)",
    )  # fmt: skip
    p.add_argument("--out", default=None, help="also write the table to this file")
    a = p.parse_args(argv)
    lines: list[str] = []

    def emit(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    names = {n for n in a.models.split(",") if n} or None
    try:
        if not a.no_zoo:
            zoos = {"1": [ZOO], "2": [ZOO2], "all": [ZOO, ZOO2]}[a.zoo]
            for zoo in zoos:
                _zoo(names, emit, zoo)
        if a.bugs:
            _bugs(emit)
        if a.pipelines:
            _pipelines(names, emit)
        if a.honest:
            from tests.corpus.honest import report as honest_report

            honest_report(emit)
    except Exception:
        emit(traceback.format_exc())
        raise
    finally:
        if a.out:
            Path(a.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
