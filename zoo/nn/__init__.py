"""Building blocks of nets shared by two or more families (attention)."""
