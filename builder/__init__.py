"""Hugging Face encoder -> ONNX (+ FP16 TensorRT) -> Triton model repository (docs/contract.md)."""

BUILDER_VERSION = "1"
