"""What uses a trained run: evaluation and the retention check, export (merged, GGUF, the model card), serving, run folders, the toy model."""
