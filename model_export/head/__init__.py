"""Fitting the serving head that a trained classifier gets before it ships: temperature calibration and ECE
(`calibration`), and `finalize`, which fits the temperature and the out-of-distribution statistics on the
holdout split, measures them on test and exports the served graph. The head's modules themselves run in
the served graph, so they live in `models` (`models.ood`, `models.ood_input`).

May import `models`, `training` (the holdout batches) and `export`; never `your_data`.
"""
