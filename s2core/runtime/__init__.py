"""A loaded model and its life cycle: the backend-neutral `SlowARModel` (`model`), its thread
guard (`guard`), prefill chunking (`chunking`), KV prefixes (`prefix`), memory estimates
(`memory`), the choice of backend (`selection`, `codec_selection`) and `load()` (`loading`)."""
