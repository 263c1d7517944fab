"""Data for the dense setting: the built-in synthetic benchmark and the real-data readers.

The names a config may give (`data.source`, `data.augment`); the modules that build
them (`experiment`, `data.real`) use these tuples.
"""

from fedjax_mtl import fields
from fedjax_mtl.fields import SEED, SIZE, Field, at_least

SOURCES = ('synthetic', 'real')  # experiment.DATA_SOURCES: what `experiment.build` reads
AUGMENT_MODES = ('host', 'device')  # data.real.AUGMENT_MODES: where samples are augmented


# The `data` block: where the dense setting's data comes from and how it is read.
CONFIG = fields.Block('data', {
    'source': Field('synthetic', 'synthetic (the built-in benchmark) or real '
                    '(PASCAL-Context / NYUD-v2 caches)', choices=SOURCES),
    'data_dir': Field('', "real data: folder holding PASCALContext/ and NYUDv2/ "
                      "('' = $FEDJAX_MTL_DATA_DIR)"),
    'cache_dir': Field('', "real data: caches from scripts/prepare_data.py ('' = "
                       '<data_dir>/cache)'),
    'chunk_steps': Field(2, 'real data: local steps per streamed host->device chunk',
                         at_least(1)),
    'workers': Field(0, 'real data: grain worker processes for augmentation (0 = threads '
                     'in this process)', at_least(0)),
    'threads': Field(2, 'real data: grain reader threads when workers = 0', at_least(0)),
    'feed_memory_gib': Field(0., 'real data: host memory the workers\' prefetched chunks may '
                             'hold, GiB (0 = a quarter of the host\'s); fewer workers when '
                             'the chunks would not fit', at_least(0.)),
    # 'host': grain workers, 40-50 images/s per core at 512x512; 'device': the host only
    # decodes and batches, data/device_augment.py applies the same transforms.
    'augment': Field('host', 'real data: where training samples are augmented, host '
                     '(grain workers) or device (the accelerator)',
                     choices=AUGMENT_MODES),
    'reproduce_parts_index_bug': Field(
        False, "real data: the released code's misaligned human flags (spec §1.11 bug 1)"),
    'seed': Field(0, 'seed of the synthetic images, and of real-data order and '
                  'augmentation', SEED),
    'resolution': Field({'pascal': (64, 64), 'nyud': (64, 64)}, 'per dataset: (height, '
                        'width) of training and test images', SIZE, per_dataset=True),
    'synthetic_version': Field(1, 'synthetic data: scene version (1: up to 6 small objects '
                               'of random colours; 2: fewer objects in perspective, a '
                               'colour and stripe texture per class, bumps, a light per '
                               'scene, the nearest object salient; 3: version 2 with '
                               'a size, surface shape and saliency per class, tiled '
                               'NYUD rooms, painted strokes, more and nearer objects; '
                               '4: version 3 with painted patches that are not objects: '
                               'fedjax_mtl/data/synthetic.py)',
                               choices=(1, 2, 3, 4)),
    'num_train': Field({'pascal': 400, 'nyud': 120}, 'synthetic data, per dataset: number '
                       'of train images', at_least(1), per_dataset=True),
    'num_test': Field({'pascal': 100, 'nyud': 60}, 'synthetic data, per dataset: number '
                      'of test images', at_least(1), per_dataset=True),
})
