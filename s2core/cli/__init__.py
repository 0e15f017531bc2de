"""The `s2core` command: every subcommand, its arguments and its reporting (the library
functions they call live in the packages below)."""
