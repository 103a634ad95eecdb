"""`lara train`: the user's labelled files to a served, calibrated model. The loader (`loader`) reads JSONL,
CSV, TSV and label folders; `command` runs the whole thing (data, split and model `prepare`, wide path `wide`,
training loop `fit` (over-budget text batches in `pieces`), time budget `budget`, recipe `recipe`, data
parallelism `dist`, plain baseline `baseline`, model folder
`artifact`, report `report`; a word-piece --init such as lara-text-news kept frozen under a fitted head,
`pretrained_init`); `samples` and `sample_data` write user-like and shipped data sets in its input
forms.

The top room: it may import every other room of `model_export`; nothing imports it back.
"""
