"""File formats and importers: each folder one format, with its readers and writers."""
