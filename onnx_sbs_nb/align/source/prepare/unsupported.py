"""The refusal of the program's fast reproduction (:mod:`.reproduce` and the steps it calls:
in-place writes into inputs, views of written values): the program then goes to the
exporter's re-trace (:mod:`.exporter`).  The first step of the walk, so that every step
may raise it."""


class Unsupported(Exception):
    """The program has something this reproduction does not handle: use the re-trace."""


__all__ = ["Unsupported"]
