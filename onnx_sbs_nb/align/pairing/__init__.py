"""Which values of the two sides are the same value: pairing rules, each with its
strength, for fx-to-ONNX, ONNX-to-ONNX and the graph onnxruntime deploys."""
