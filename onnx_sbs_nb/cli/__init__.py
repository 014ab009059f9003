"""The command line, ``onnx-sbs``: one module per concern (the parser and subcommands, the
startup that answers ``--help`` before torch loads, the process's garbage collector)."""
