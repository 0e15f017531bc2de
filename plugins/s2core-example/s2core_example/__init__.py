"""A minimal third-party s2core backend, written for reading: plain NumPy, float32 KV cache."""
