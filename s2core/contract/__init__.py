"""The backend contract: the `Backend` base class and its `Capabilities` (`backend`), the
checked inputs it receives (`inputs`), the plugin hooks and options (`plugin_spec`, `checks`),
the registry that discovers and probes plugins (`registry`) and the host's memory (`host`).
Plugin authors import all of it through `s2core.plugin`."""
