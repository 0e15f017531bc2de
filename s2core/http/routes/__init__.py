"""The endpoints, one module per protocol."""
