"""`examples.tiny_bert:build`, as the bench scripts and older commands name it, from a source
checkout's root; the example itself is installed as `deployfuse.examples.tiny_bert`."""

from deployfuse.examples.tiny_bert import build, save_pretrained

__all__ = ["build", "save_pretrained"]
