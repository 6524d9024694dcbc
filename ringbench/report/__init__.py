"""ringbench.report"""
