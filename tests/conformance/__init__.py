"""The ONNX backend node suite run through the torch evaluator (helpers and baseline)."""
