"""``modelpatch doctor``: what a model needs on a given engine and GPU, and the recipe that
fixes it."""
