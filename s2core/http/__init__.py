"""`s2core serve`: the model over HTTP, speaking OpenAI's, fish-speech's and s2.cpp's
protocols (docs/http.md).

    from s2core.http.engine import Engine
    from s2core.http.app import create_app
    app = create_app(Engine.from_args("model.gguf", "tokenizer.json"))

Needs the `serve` extra: pip install 's2core[serve]'.
"""
