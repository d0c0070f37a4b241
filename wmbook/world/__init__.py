"""The synthetic game world (wmbook.world.env), its codec (wmbook.world.codec), shipped weights (wmbook.world.weights)
and the evaluation of trained world models on held-out episodes (wmbook.world.eval)."""

from .env import ACTION_DIM, STATE_DIM, VIEW, Episode, locate_agent, render_episode

__all__ = ["ACTION_DIM", "STATE_DIM", "VIEW", "Episode", "locate_agent", "render_episode"]
