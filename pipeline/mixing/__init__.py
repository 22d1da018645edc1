"""The mix stage's decisions: how much each source is worth repeated, and how to fill a token
budget."""
