"""GGUF, the container: a bounds-checked reader of its header (`container`) and the block
layouts of its quantized types (`blocks`). Nothing here knows the model."""
