"""What an op writes or views, as functionalization sees it.

The exporter's re-trace functionalizes the program: an in-place call on a value the
program made becomes its functional op, and a view of a written value is made again
where it is read.  These predicates say which calls are which, for the support check
(:mod:`.supported`) and the walk (:mod:`.reproduce`).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from .graphs import is_op
from .input_writes import read_only_before, written_input

# in-place ops that only change autograd metadata: functionalization drops them
NO_OPS = (torch.ops.aten.detach_.default,)


# what functionalization records for an op, where it is not the op itself
FUNCTIONAL_FORM = {torch.ops.aten.lift_fresh_copy.default: torch.ops.aten.clone.default}


def functional_form(node: torch.fx.Node) -> Any:
    """The op functionalization records for ``node``, an in-place call (``add_``) on a
    value the program made (``add``: the exported graph reads the call's result from then
    on, and a view of the value made before is made again where it is read); None for any
    other mutation (through a view, into an input)."""
    t = node.target
    args = t._schema.arguments
    written = [a for a in args if a.alias_info is not None and a.alias_info.is_write]
    name = t.overloadpacket.__name__
    if written != args[:1] or not name.endswith("_") or not node.args:
        return None
    packet = getattr(getattr(torch.ops, t.namespace), name[:-1], None)
    functional = getattr(packet, t._overloadname, None) if packet is not None else None
    if not is_op(functional) or functional._schema.is_mutable:
        return None
    target = node.args[0]
    if not isinstance(target, torch.fx.Node):
        return None
    if not _fresh_value(target):
        # an input written in place: the re-trace returns the value it ends with
        if written_input(target) is None or not read_only_before(node, target):
            return None  # a write through a view
    readers = [(u, target) for u in target.users] + [(u, node) for u in node.users]
    if any(
        _views(user, value) and not _replayable(user) for user, value in readers if user is not node
    ):
        return None  # a view written through, or one the walk does not replay
    return functional


def writes(node: torch.fx.Node) -> bool:
    return is_op(node.target) and node.target._schema.is_mutable


def pure_view(node: torch.fx.Node) -> bool:
    """A call returning one view of its first argument (``view``, ``unsqueeze``...)."""
    t = node.target
    if not is_op(t) or t._schema.is_mutable or len(t._schema.returns) != 1:
        return False
    alias = t._schema.returns[0].alias_info
    return alias is not None and not alias.is_write and bool(node.args)


def _replayable(view: torch.fx.Node) -> bool:
    """A view of a written value that functionalization replays where it is read: a chain
    of pure views nothing writes through."""
    if not pure_view(view):
        return False
    for user in view.users:
        if writes(user) and user.args[0] is view:
            return False
        if _aliases(user) and not _replayable(user):
            return False
    return True


def _fresh_value(node: torch.fx.Node) -> bool:
    """``node``'s value is memory of its own: made by an op that returns no alias (or by
    an in-place call on such a value, itself functionalized)."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        source = node.args[0]
        return isinstance(source, torch.fx.Node) and is_op(source.target) and not _aliases(source)
    if not is_op(node.target):
        return False
    if writes(node):
        return functional_form(node) is not None
    return not _aliases(node)


def _views(user: torch.fx.Node, value: torch.fx.Node) -> bool:
    """``user`` makes an alias of ``value`` other than writing to it in place (another
    in-place call on it is functionalized in its turn)."""
    written = writes(user) and user.args[0] is value
    return _aliases(user) and not written


def _aliases(node: torch.fx.Node) -> bool:
    """A call whose result may share memory with an input (a view, an in-place call)."""
    t = node.target
    if not is_op(t):
        return t is operator.getitem and _aliases(node.args[0])
    return any(r.alias_info is not None for r in t._schema.returns)


def aliases_op(target: Any) -> bool:
    return is_op(target) and any(r.alias_info is not None for r in target._schema.returns)


def is_symbolic_arithmetic(target: Any) -> bool:
    """Python arithmetic on sizes (``operator.mul``, ``torch.sym_max``...): the re-trace
    keeps these calls as they are."""
    module = getattr(target, "__module__", None)
    return module in ("_operator", "operator", "math") or (
        module == "torch" and getattr(target, "__name__", "").startswith("sym_")
    )
