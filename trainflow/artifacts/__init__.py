"""What the train stage makes of a model and how it is read back: the exported folder (safetensors and
JSON), its ONNX graph, the manifest that checks its files, loading it without unpickling, and batch prediction."""
