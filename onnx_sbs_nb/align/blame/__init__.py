"""Blame: which node makes the error, in the user's words, and how sure the run is of it."""
