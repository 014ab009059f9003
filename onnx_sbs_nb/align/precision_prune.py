"""The advisor's block list kept minimal: a node added in a later round (a producer of a
kept node's inputs, or the largest error within tolerance) stays only if the conversion
disagrees without it.  Round-one nodes fail in the type themselves; the later ones were
guesses made while another repair was missing (a Cast round trip, say)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: at most this many conversions are tried (each runs the whole model once)
MOST_TRIES = 8


def prune_block_list(
    later: list[str],
    block: set[str],
    agrees_without: Callable[[set[str]], tuple[bool, Any]],
    most: int = MOST_TRIES,
) -> tuple[set[str], list[str], Any]:
    """(the block list, the nodes dropped from it, what ``agrees_without`` returned for
    the last list that agreed, None if none was dropped).  ``later``: the nodes to try
    dropping, in the order to try them; ``agrees_without(block)``: converts with that
    block list and says whether the outputs agree (and what it made)."""
    dropped: list[str] = []
    kept_result = None
    for name in later[:most]:
        trial = block - {name}
        ok, result = agrees_without(trial)
        if ok:
            block, kept_result = trial, result
            dropped.append(name)
    return block, dropped, kept_result


__all__ = ["MOST_TRIES", "prune_block_list"]
