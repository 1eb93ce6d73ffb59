"""The released recurrent hybrids in and out: Qwen3.5, OLMo Hybrid, Nemotron-H, Bamba and Granite-4.0-H.

Their checkpoints fuse several parameters into one tensor and lay each family out its own way, so each family is
written as a config plan and tensor rules (`config`, with the rule builders of `rules`); `weights` applies the
rules both ways, and `export` writes a family's config.json only where its class computes what the model does.
"""
