"""The refusal of the program's fast reproduction (light_prep and the walks it calls: in-place
writes into inputs, views of written values): the program then goes to the exporter's
re-trace. Its own module so that those walks and light_prep need not import each other."""


class Unsupported(Exception):
    """The program has something this reproduction does not handle: use the re-trace."""


__all__ = ["Unsupported"]
