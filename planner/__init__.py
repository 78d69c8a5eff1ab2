"""plan3d: a planner for 3D-parallel (TP/PP/DP/ZeRO) training of large transformers."""

__version__ = "0.1.0"
