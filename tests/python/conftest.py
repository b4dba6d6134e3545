"""conftest.py — makes the in-tree package importable for the Python tests.

With FLASHDECODE_LIBRARY set (a built libflashdecode.so, e.g.
build/libflashdecode.so), the tests import python/flashdecode from this
checkout; without it they use the installed package (pip install .).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if os.environ.get("FLASHDECODE_LIBRARY"):
    sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)  # attention_ref
