"""tunelab: scheduled vLLM tuning experiments with a real server lifecycle, honest numbers and history."""

__version__ = "0.1.0"
