"""How two values compare: the measures (numpy or the C extension in ``native/``), the
dtype-aware tolerances, the verdict policies and the user's own ``compare=`` function."""
