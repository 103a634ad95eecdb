"""A pretrained encoder read through LARA: the teacher (all-MiniLM-L6-v2 from its installed package, loaded
into a plain torch BERT of our own, with its word-piece tokenizer), the student (the same weights with every
softmax attention swapped for LARA, low-rank adapters and positions past 512), the attention transfer and
distillation that train the conversion (`transfer`), and the fidelity report (`fidelity`).

May import `models`, `training` and `lara_serve.kernels`; never `head`, `export` or `your_data` (the serving
head and the export build on this room, not the other way round).
"""
