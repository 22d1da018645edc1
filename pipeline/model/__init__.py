"""The transformer (BLOOM- and Llama/Mistral-style) and its files: config.py (the `model` and
`export` sections and the FLOP count, torch-free), transformer.py (the model, ALiBi and RoPE),
model_tensors.py (its tensors one at a time), files.py (base models and checkpoints), base_shape.py,
hf_config.py, hf_import.py and hf_export.py (Hugging Face folders both ways)."""
