"""The package list, the one thing pyproject.toml cannot say: setuptools' ``packages.find`` only finds
directories under the package, and the paper's setups live at the top of the repository (configs/), mapped
to ``hypersolid_scale.configs`` (its subfolders too) by pyproject.toml's ``[tool.setuptools.package-dir]``."""

from setuptools import find_namespace_packages, find_packages, setup

setups = ["hypersolid_scale.configs", *(f"hypersolid_scale.configs.{p}" for p in find_namespace_packages("configs"))]
setup(packages=[*find_packages(include=["hypersolid_scale*"]), *setups])
