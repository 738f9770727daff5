"""Deployment: export to TorchScript/ONNX and policy bundles on the Hugging Face Hub."""
