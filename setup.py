# pyproject.toml carries the metadata; setuptools has no declarative hook for cffi's builders.
from setuptools import setup

setup(cffi_modules=["csrc/build.py:ffibuilder"])
