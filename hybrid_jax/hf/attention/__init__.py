"""The attention classes in and out: Llama, Mistral, SmolLM3 and GraniteSWA (import and export), MiniCPM (import).

Their layers differ only in attention window and RoPE, so one layer plan per model reads and writes every
config.json (`config`), and one tensor-name table per model_type places every tensor (`weights`).
"""
