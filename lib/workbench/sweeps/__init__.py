"""Sweeps: grids of notebooks/train.ipynb executed by papermill, locally or on Ray."""
