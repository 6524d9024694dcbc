"""The model's calibration: the simulator's costs fitted on a measured (or imported) record.

Owns calibrate (the compute, host and link costs of a run, each determined or a stated prior), identify (what a
run can determine: the design matrix's row space), calibrate_host and calibrate_links (their parts),
strategy_fit (the strategies' own host time per event) and coverage (what a prediction extrapolates from the
calibration). May import: the simulator (the costs it fits), the record and its figures, the scenario, the
topology model.
"""
