"""Pieces of the DeepSeek V4.1 contract test (test_dsv41_contract.py) shared with its worker (dsv41_harness.py)."""
