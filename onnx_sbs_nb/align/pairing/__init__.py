"""Which values of the two sides are the same value: pairing rules, each declared once
with its name and strength (:mod:`.rules`), run in order for fx-to-ONNX (:mod:`.names`),
ONNX-to-ONNX (:mod:`.onnx_pairing`), one model on two devices (:mod:`.same_model`) and
the graph onnxruntime deploys (:mod:`.deployed`)."""
