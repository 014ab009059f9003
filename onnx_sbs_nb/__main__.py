"""``python -m onnx_sbs_nb`` and the ``onnx-sbs`` console script."""

import sys

from .cli.gc import one_command_gc

EXIT_INTERRUPTED = 130  # as cli.EXIT_INTERRUPTED, which may not be imported yet


def main() -> int:
    """The command: :func:`onnx_sbs_nb.cli.main.main`, in a process tuned for one run
    (``cli/gc.py``)."""
    with one_command_gc() as imports_done:
        try:
            from .cli import main as cli  # light: --help is answered before torch loads
            from .cli import startup as cli_startup

            if cli_startup.runs_a_command(sys.argv[1:]):
                cli_startup.import_engine()  # torch: seconds in which Ctrl-C is likely
        except KeyboardInterrupt:
            print("onnx-sbs: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        imports_done()
        return cli.main()


if __name__ == "__main__":
    sys.exit(main())
