"""The exporter's own preparation, re-traced here: seconds on a small Llama.

Used where the reproduction (:mod:`.reproduce`) declines the program or the ONNX model
does not vouch for it.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

import torch

from ..quiet import quiet_torch_internals
from .exporter_ops import exporter_ops
from .prepared import PREPARED_BY_EXPORTER, PREPARED_FALLBACK, PreparedProgram


def exporter_preparation(ep: torch.export.ExportedProgram) -> PreparedProgram:
    try:
        # Private in torch 2.13; guarded, and tested against the installed version.
        # Exports run without autograd: some decompositions only trace that way (a
        # float SDPA mask gathered from a Parameter changes strides when it needs grad).
        try:
            with torch.no_grad():
                prepared = _exporter_prepare(ep)
        except Exception:
            prepared = _exporter_prepare(ep)
        return PreparedProgram(prepared, PREPARED_BY_EXPORTER)
    except Exception as e:  # pragma: no cover - depends on torch internals
        try:
            prepared = ep.run_decompositions()
        except Exception:
            prepared = ep
        return PreparedProgram(
            prepared,
            PREPARED_FALLBACK,
            f"could not reproduce the exporter's preparation ({type(e).__name__}: {e}); "
            "pairing relies on ONNX node metadata",
        )


@functools.lru_cache(maxsize=2)
def _decomposition_table(names: frozenset[str]) -> dict[Any, Any]:
    """The exporter's create_onnx_friendly_decomposition_table, from the op names."""
    table: dict[Any, Any] = {}
    for op, fn in itertools.chain(
        torch.export.default_decompositions().items(),
        torch._decomp.decomposition_table.items(),
    ):
        if str(op) in names and op not in table:
            table[op] = fn
    return table


def _exporter_prepare(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``_core._prepare_exported_program_for_export(ep, registry=...)``, with the
    decomposition table built from the cached op names instead of torchlib's registry
    (which costs seconds to build): the same table, the same passes."""
    from torch.onnx._internal.exporter import _fx_passes

    table = dict(_decomposition_table(exporter_ops().table_names()))
    with quiet_torch_internals(), torch.fx.experimental._config.patch(backed_size_oblivious=True):
        prepared = ep.run_decompositions(table)
        graph_module = prepared.graph_module
        _fx_passes.insert_type_promotion_nodes(graph_module)
        graph_module = _fx_passes.remove_assertion_nodes(graph_module)
        prepared._graph_module = graph_module
    return prepared
