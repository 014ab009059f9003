"""The program the exporter lowered, prepared in steps walked in one direction
(:mod:`.program` runs them; its docstring lists the walk)."""
