"""Runnable examples, installed with the package: `deployfuse.examples.tiny_bert:build` works
from any folder, and `python -m deployfuse.examples.tiny_bert FOLDER` saves a Hugging Face
folder to export by `--task`."""
