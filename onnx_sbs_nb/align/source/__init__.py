"""The program and the model as given: loading (untrusted .pt2 included), the prepared
program, the exporter's metadata and provenance (user names).  The bottom wing of the
engine: it imports nothing from the others."""
