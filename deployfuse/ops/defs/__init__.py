"""One module per deployfuse op: its `SPEC` (schema, reference math, function body, example
inputs), its torch op and that op's ONNX translation. Register a new one in
`deployfuse.ops.specs`; the native side lives in plugins/<module name>/ (see CONTRIBUTING.md)."""
