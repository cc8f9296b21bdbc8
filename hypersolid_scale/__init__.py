"""hypersolid_scale: a distributed, scalable trainer for the Hypersolid self-supervised objective."""

__version__ = "0.1.0"
