"""Planners: PipeDream's partitioner and PipeDream-2BW's planner, each plan checked by simulation."""
