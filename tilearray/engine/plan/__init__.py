"""Planning (pure): an expression and a Budget -> sized stages (a Plan) and
the graph that runs them. No store or cluster calls."""

from .types import Budget, Plan, Stage

__all__ = ["Budget", "Plan", "Stage"]
