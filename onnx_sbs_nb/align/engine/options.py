"""RunOptions: every option of a side-by-side run, validated once.

The engine, the session (and through it the widget and ``%sbs``) and the command line
all take a :class:`RunOptions`; each builds it from its own spelling of the options
(keywords, magic flags, CLI flags), and bad values get their :class:`SbsInputError`
here, before anything runs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...compare.verdict_policy import function_name, make_judge
from ...device import device_name
from ...errors import SbsInputError
from ...option_names import RESET_ALL, RUNNER_NAMES

# Earlier spellings still accepted from keywords (and mapped to today's name).
_ALIASES = {"rerun_with_torch_inputs": "own_error"}


@dataclass
class RunOptions:
    """How to run both graphs side by side.

    - ``runner``: how each ONNX node runs: ``"onnxruntime"``, ``"reference"`` (the ONNX
      reference evaluator), ``"torch"`` (our torch evaluator), a runner object with
      ``prepare(node, ctx)`` and ``value_kind``, or a callable ``f(node, inputs)``.
    - ``atol`` / ``rtol``: tolerances of the verdict (None: per dtype).
    - ``exc``: raise at the first pair that fails.
    - ``own_error``: also run each ONNX node on the torch values of its inputs, which
      measures the node's own error (``err_*2`` fields, ``Record.own_error``), as opposed
      to the error it inherits.  ``rerun_with_torch_inputs=`` is the same option.
    - ``reset_names``: ONNX values (or fx node names) whose torch value replaces the ONNX
      value after their comparison, so the error stops propagating there;
      ``reset="all"`` does so for every computed value.
    - ``replay`` (a ReplayConfig, a dict of its fields or the path of its JSON) with
      ``replay_dir``: replay bundles of the selected nodes, written after the run.
    - ``device``: ``"cpu"`` or ``"cuda[:N]"`` (None: where the inputs are).
    - ``optimize``: ``"basic"``, ``"extended"``, ``"layout"`` or ``"all"``: the candidate
      is the graph onnxruntime runs after its optimizations at that level (fused and
      contrib nodes included), each of its nodes run on its own (``align/pairing/deployed.py``).
    - ``providers``: the execution providers whose optimized graph that is (with
      ``optimize``; default CPU); a CUDA provider runs the nodes on ``"cuda"``.
    - ``time_nodes``: time every ONNX node on its own, on every run.  Off, a second run of
      the same model on inputs of the same shapes runs stretches of onnxruntime nodes as
      one session (the same kernels on the same values, every value compared, a few
      times faster), and those nodes' records have no ``onnx_time_run``
      (``align/engine/stretches.py``).
    - ``trust_pickles``: the ``.pt2`` and inputs files given by path are trusted: they are
      loaded as ``torch.export.load`` and ``torch.load(weights_only=False)`` do, which can
      run code from them.  Off by default: a file that needs code to load is refused.
    - ``strict``: a pass that compared under half of the ONNX nodes ("PASS on N of M",
      ``Summary.partial``) is a fail in the summary, the verdict and the exit code.
    - ``verdict``: the verdict on other measures than atol/rtol: ``"snr>=30"``, a list of
      such conditions (all must hold) or a dict per dtype name (``"*"``: the others);
      see ``verdict_policy.py``.  None: atol/rtol.
    - ``compare``: the user's check ``f(expected, got) -> dict`` (torch tensors in):
      its entries land in ``Record.extra``, its ``"passed"`` (a bool) decides the verdict.
    - ``measures``: compute cosine, SNR, L2, quantiles and ulps (``err_cos`` ...); False
      leaves them None for a faster comparison of large values that differ.
    """

    runner: Any = "onnxruntime"
    atol: float | None = None
    rtol: float | None = None
    exc: bool = False
    own_error: bool = False
    reset_names: tuple[str, ...] = ()
    reset: str | None = None
    replay: Any = None
    replay_dir: Path | None = None
    device: str | None = None
    optimize: str | None = None
    providers: tuple[Any, ...] | None = None
    trust_pickles: bool = False
    time_nodes: bool = False
    strict: bool = False
    verdict: Any = None
    compare: Any = None
    measures: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.runner, str) and self.runner not in RUNNER_NAMES:
            raise SbsInputError(
                f"unknown runner {self.runner!r}: use one of {', '.join(RUNNER_NAMES)}, a "
                "runner object with prepare(node, ctx), or a callable f(node, inputs)"
            )
        if not isinstance(self.runner, str) and not (
            callable(self.runner) or hasattr(self.runner, "prepare")
        ):
            raise SbsInputError(
                f"cannot use a {type(self.runner).__name__} as a node runner: use one of "
                f"{', '.join(RUNNER_NAMES)}, a runner object or a callable f(node, inputs)"
            )
        self.atol = _tolerance("atol", self.atol)
        self.rtol = _tolerance("rtol", self.rtol)
        for flag in ("exc", "own_error", "trust_pickles", "time_nodes", "strict", "measures"):
            if not isinstance(getattr(self, flag), bool):
                raise SbsInputError(f"{flag} must be True or False, got {getattr(self, flag)!r}")
        if self.reset not in (None, RESET_ALL):
            raise SbsInputError(f"reset must be None or 'all', got {self.reset!r}")
        if isinstance(self.reset_names, str):
            self.reset_names = (self.reset_names,)
        names = tuple(self.reset_names or ())
        bad = [n for n in names if not isinstance(n, str) or not n]
        if bad:
            raise SbsInputError(f"reset_names must be value names (strings), got {bad[:3]}")
        self.reset_names = names
        if self.device is not None:
            self.device = device_name(self.device)
        self.replay = _replay_config(self.replay)
        if self.replay_dir is not None:
            self.replay_dir = _folder("replay_dir", self.replay_dir)
        if self.replay is not None and self.replay_dir is None:
            raise SbsInputError(
                "replay=ReplayConfig(...) needs replay_dir= (the folder to write to)"
            )
        self._check_deployment()
        # parsed here: a bad expression fails before anything runs
        self.judge = make_judge(self.verdict, self.compare, self.measures)

    def _check_deployment(self) -> None:
        if self.optimize is None and self.providers is None:
            return
        from ..pairing.onnxruntime_session import LEVELS, check_providers

        if self.optimize not in LEVELS:
            if self.optimize is None:
                raise SbsInputError(
                    "providers= names the execution providers whose optimized graph is "
                    f"compared: give optimize= too (one of {', '.join(LEVELS)})"
                )
            raise SbsInputError(
                f"optimize={self.optimize!r} is not a level: use one of {', '.join(LEVELS)}"
            )
        self.providers = tuple(check_providers(self.providers))
        if self.device is None and any(_provider_name(p) == _CUDA_EP for p in self.providers):
            # the CUDA graph holds CUDA kernels: its nodes run there
            self.device = device_name("cuda")

    # ------------------------------------------------------------------ building
    @classmethod
    def from_kwargs(
        cls, options: RunOptions | Mapping[str, Any] | None = None, /, **kwargs: Any
    ) -> RunOptions:
        """Options from keywords (over ``options`` when given); unknown names are an error."""
        names = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        if isinstance(options, Mapping):
            kwargs = {**options, **kwargs}
        elif isinstance(options, RunOptions):
            values = {n: getattr(options, n) for n in names}
        elif options is not None:
            raise SbsInputError(
                f"options must be a RunOptions or a dict, got {type(options).__name__}"
            )
        for key, value in kwargs.items():
            key = _ALIASES.get(key, key)
            if key not in names:
                raise SbsInputError(
                    f"unknown option {key!r}: the options are {', '.join(sorted(names))}"
                )
            values[key] = value
        return cls(**values)

    def replace(self, **changes: Any) -> RunOptions:
        return RunOptions.from_kwargs(self, **changes)

    @property
    def needs_torch_inputs(self) -> bool:
        """Whether ONNX nodes are fed torch values (own errors, resets)."""
        return self.own_error or self.reset == RESET_ALL or bool(self.reset_names)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe, for reports: what the run was asked to do."""
        runner = self.runner if isinstance(self.runner, str) else type(self.runner).__name__
        return {
            "runner": runner,
            "atol": self.atol,
            "rtol": self.rtol,
            "own_error": self.own_error,
            "reset_names": list(self.reset_names),
            "reset": self.reset,
            "replay_dir": str(self.replay_dir) if self.replay_dir else None,
            "device": self.device,
            "optimize": self.optimize,
            "providers": [_provider_name(p) for p in self.providers or ()] or None,
            "trust_pickles": self.trust_pickles,
            "time_nodes": self.time_nodes,
            "strict": self.strict,
            "verdict": self.judge.policy.describe() if self.judge and self.judge.policy else None,
            "compare": function_name(self.compare) if self.compare is not None else None,
            "measures": self.measures,
        }


_CUDA_EP = "CUDAExecutionProvider"


def _provider_name(p: Any) -> str:
    return p if isinstance(p, str) else str(p[0])


def _tolerance(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SbsInputError(f"{name} must be a number or None, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise SbsInputError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


def _replay_config(value: Any) -> Any:
    if value is None:
        return None
    from .replay_config import ReplayConfig

    if isinstance(value, ReplayConfig):
        return value
    try:
        if isinstance(value, Mapping):
            return ReplayConfig(**dict(value))
        if isinstance(value, str | Path):
            return ReplayConfig.load(value)
    except (TypeError, ValueError, OSError) as e:
        raise SbsInputError(f"bad replay configuration: {e}") from None
    raise SbsInputError(
        f"replay must be a ReplayConfig, a dict of its fields or a JSON path, got "
        f"{type(value).__name__}"
    )


def _folder(name: str, value: Any) -> Path:
    if not isinstance(value, str | Path) or "\x00" in str(value) or not str(value):
        raise SbsInputError(f"{name} must be a folder path, got {value!r}")
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise SbsInputError(f"{name} {str(path)!r} is a file: give a folder")
    return path


__all__ = ["RESET_ALL", "RUNNER_NAMES", "RunOptions"]
