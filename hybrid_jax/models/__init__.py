"""Model definitions: the hybrid LM, its layers and mixers, the layer pattern and parameter counts."""
