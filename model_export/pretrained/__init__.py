"""A pretrained encoder read through LARA: the teacher (all-MiniLM-L6-v2 from its installed package, loaded
into the plain torch BERT of `models.bert`, with its word-piece tokenizer), the student (the same weights with
every softmax attention swapped for LARA, low-rank adapters and positions past 512; `models.bert_lara`), the
attention transfer and distillation that train the conversion (`transfer`), the fidelity report (`fidelity`),
and the served classifier built on it (`classifier`, with the forms an article arrives in, `wrappers`).

May import `models`, `training`, `export`, `head` and `lara_serve.kernels`; never `your_data` (which builds
on this room). What the served graph needs (the BERT, the LARA mixer, the classifier) lives in `models`.
"""
