"""ringbench.analysis"""
