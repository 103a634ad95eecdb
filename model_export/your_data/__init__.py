"""`lara train`: the user's labelled files to a served, calibrated model. The loader (`loader`) reads JSONL,
CSV, TSV and label folders; `command` runs the whole thing (wide path `wide`, training loop `fit`, recipe
`recipe`, data parallelism `dist`, plain baseline `baseline`, model folder `artifact`, report `report`);
`samples` and `sample_data` write user-like and shipped data sets in its input forms.

The top room: it may import every other room of `model_export`; nothing imports it back.
"""
