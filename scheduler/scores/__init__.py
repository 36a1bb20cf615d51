"""Pure score functions: node table in, 0–100 vectors out."""
