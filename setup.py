"""Only for the optional C scanner; all other metadata is in pyproject.toml.

The extension is optional: without a compiler the build carries on and
exporter.sources.promtext uses its pure-Python path (same results, slower; the
differential tests run both).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("exporter.sources._scan", ["exporter/sources/_scan.c"], optional=True)])
