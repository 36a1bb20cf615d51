"""Pure filter functions: node table in, boolean masks and reasons out."""
