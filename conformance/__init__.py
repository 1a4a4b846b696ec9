"""The ONNX backend test corpus pinned per opset, a runner that scores backends, and diffing."""
