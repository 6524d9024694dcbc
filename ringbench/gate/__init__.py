"""ringbench.gate"""
