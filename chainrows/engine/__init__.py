"""The batch engine: columnar arrays in, decisions and rows out. No file IO here."""
