"""The run's configuration: the typed tree of every section with YAML files, ``section.key=value``
overrides, validation and migration (``schema``), the fingerprint of what a run trains and the differences
a refused resume lists (``fingerprint``), ``dist.precision`` and its former spelling ``dist.bf16`` (``precision``),
sweeps (``sweep``), nested mappings as flat ``a.b.c`` keys
(``nested``, a lower layer: the tracker flattens configs with it), and the registry of what a config key names
(``registry``, a lower layer too: methods, backbones, loss backends and data formats register with it).

This file imports nothing, so that ``config.nested`` and ``config.registry`` can be imported without the whole
tree.
"""
