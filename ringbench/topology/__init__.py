"""ringbench.topology"""
