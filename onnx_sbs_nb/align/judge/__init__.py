"""Is this pair right, and whose error is it: the verdict rules, in order, each named."""
