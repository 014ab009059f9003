"""The notebook front end: the session that owns one run, the widget that shows it, the
``%sbs`` magic, and the run options as flags that ``%sbs`` and ``onnx-sbs run`` share."""
