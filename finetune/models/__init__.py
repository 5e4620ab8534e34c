"""Where a model comes from (a hub id, a folder, a GGUF file, a pulled base) and its facts, read without torch."""
