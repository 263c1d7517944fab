"""Data for the dense setting: the built-in synthetic benchmark and the real-data readers.

The names a config may give (`data.source`, `data.augment`); the modules that build
them (`experiment`, `data.real`) use these tuples.
"""

SOURCES = ('synthetic', 'real')  # experiment.DATA_SOURCES: what `experiment.build` reads
AUGMENT_MODES = ('host', 'device')  # data.real.AUGMENT_MODES: where samples are augmented
