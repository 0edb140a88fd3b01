"""Migration scripts, oldest first: NNNN_what.py, each revising the one before."""
