"""How the shipped models were trained: the datasets and their fixed splits (`data`, `brown`), tasks that turn
them into batches (`tasks`, `long_docs`), augmentation, the seeded resumable training loop (`train`; its flags
in `train_args`, per-dataset settings in `defaults`, what its optional flags add in `train_extras`), evaluation
on a split (`evaluate`) and the recipes built on them (a bag-of-words teacher, weight soups, ensembles).

May import `models` only; never `head`, `export` or `your_data`.
"""
