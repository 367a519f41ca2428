"""onnxruntime's ``capi`` import paths, so ``from onnxruntime.capi... import X`` ports unchanged."""
