"""The model definitions, and everything that runs in a served graph: frozen configs, shared layers, the ViT and
the byte-level text encoder (with its embeddings and the sliced forward for very long documents), the serving
wrapper with its out-of-distribution scores (`ood`, `ood_input`), the registry of named models
(`create_model`) and the artifact layout (`hub`: config.json + 1/model.safetensors).

What a newcomer changes here: a layer, a model family, a registered configuration, a module of the served
graph. This room may import `lara_serve.kernels` (the attention math) and nothing else of `model_export`:
every other room builds on it.
"""
