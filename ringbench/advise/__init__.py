"""The advisers: answers built on the model and its calibration, the top of the predict wing.

Owns ``ringbench plan`` (planner: which strategy, degrees, placement and ring order; planner_predict: one
candidate priced; placements: groups from a topology), recommend's predicted step times of other ring orders
(order_steps), the simulate command's front (simulation: cases from a scenario or a run, costs from priors or a
calibration, the record written, the scale view in scale_view) and the model's measured accuracy (accuracy).
May import: the simulator and the calibration through their doors (``ringbench.simulate``: predict, simulate_case,
...; ``ringbench.calibration``: fit, cases_like, ...), and the base (the engine, the record, the scenario, the
topology and hardware models); never the measure or the answer wing.
"""
