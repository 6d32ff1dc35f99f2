"""Named passes over the loop-nest IR; each is a function from IR to IR."""
