"""Builds the optional compiled hot paths, with Cython: `hutch.amqp._cframes` (from `_cframes.pyx`: the AMQP
frames), `hutch.amqp._ctable` (from `_ctable.pyx`: field tables) and `hutch.spark._crecords` (from `_crecords.pyx`: a Spark read task's stream chunks -> Arrow).

Everything else about the package is in pyproject.toml. The extension is optional: if it cannot be
compiled (no C compiler, no Python headers), the install still succeeds and hutch runs its pure-Python
reference path, saying so once at start (docs/amqp-codec.md, "The compiled hot path"; a Spark read task
says so in its log, docs/spark.md).
"""

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:  # no Cython: nothing to compile; the pure path runs
    ext_modules = []
else:
    ext_modules = cythonize(
        [Extension("hutch.amqp._cframes", ["src/hutch/amqp/_cframes.pyx"], optional=True),
         Extension("hutch.amqp._ctable", ["src/hutch/amqp/_ctable.pyx"], optional=True),
         Extension("hutch.spark._crecords", ["src/hutch/spark/_crecords.pyx"], optional=True)],
        compiler_directives={"language_level": "3"},
        quiet=True,
    )
    for ext in ext_modules:
        ext.optional = True  # cythonize does not carry `optional` over to the extensions it returns

setup(ext_modules=ext_modules)
