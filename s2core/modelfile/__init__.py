"""The model file: S2 Pro's hyperparameters (`hparams`), its tensor names and shapes (`layout`)
and a GGUF file checked against both (`file`)."""
