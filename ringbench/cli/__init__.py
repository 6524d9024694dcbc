"""The `ringbench` command line: one module per command, each a thin layer over one library call.

May import every floor below; nothing imports it.
"""
