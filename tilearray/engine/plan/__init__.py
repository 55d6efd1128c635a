"""Planning (pure): an expression and a Budget -> sized stages (a Plan) and
the graph that runs them. No store or cluster calls."""

from .types import MIN_TASK_MEMORY, Budget, Plan, Stage, check_worker_memory, parse_memory

__all__ = ["MIN_TASK_MEMORY", "Budget", "Plan", "Stage", "check_worker_memory", "parse_memory"]
