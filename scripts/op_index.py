"""Prints where each ONNX op the evaluator supports is implemented, one line an op version:

    python scripts/op_index.py [OP_TYPE ...]

Ops registered in a loop (a family of unary ops, say) cannot be found by searching the
source for ``@op("Erf"``; this index is made from the registry itself.
"""

from __future__ import annotations

import sys

from onnx_sbs_nb.evaluator.registry import op_index


def main(argv: list[str]) -> int:
    wanted = set(argv)
    for domain, op_type, since, where in op_index():
        if not wanted or op_type in wanted:
            print(f"{domain or 'ai.onnx'}\t{op_type}\t{since}\t{where}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
