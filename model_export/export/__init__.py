"""From trained weights to served files: the ONNX export with one `com.lara::LaraAttention` node per LARA
layer, checked in onnxruntime against torch (`exporter`, also `python -m lara_serve.model_export.export`).

May import `models` (and `lara_serve.kernels`) only.
"""
