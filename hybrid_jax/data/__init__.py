"""Data: tokenizers, document sources (built-in corpus, local files, TFDS) and the grain input pipeline."""
